"""How to install lading: the one line every message, generated script and page shows.

``lading-data`` is the distribution's name (the PyPI name ``lading`` belongs to an unrelated
tool), kept ready for the day it is published; until then ``pip install lading-data`` fails, and
the line that works on a fresh machine installs from a clone of the repository (or from a wheel
built from one: ``pip wheel --no-deps -w dist ./lading``, then ``pip install dist/*.whl``).
"""

from __future__ import annotations

#: The distribution's name on the package index.
DISTRIBUTION = "lading-data"
#: True once DISTRIBUTION is on the package index: install_command() then names it.
PUBLISHED = False
#: Where a clone of the repository is, in the line shown until then.
CLONE = "./lading"


def install_command(extra: str | None = None) -> str:
    """The pip command that installs lading (with an extra such as ``"ray"``) on a fresh machine."""
    target = DISTRIBUTION if PUBLISHED else CLONE
    return f"pip install '{target}[{extra}]'" if extra else f"pip install {target}"
