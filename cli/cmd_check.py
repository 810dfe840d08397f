"""`lading check` (placeholder until the check module lands)."""

import click


@click.command()
@click.argument("context_dir", default=".", type=click.Path(file_okay=False))
def check(context_dir: str) -> None:
    """Will det accept CONTEXT_DIR? (not implemented yet)"""
    raise click.UsageError("not implemented yet")
