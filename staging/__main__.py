"""``python -m lading``: the command line."""

from lading.cli.main import console

console()
