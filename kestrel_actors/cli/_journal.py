"""`kestrel-actors journal` (not implemented yet)."""

import click


@click.group()
def journal() -> None:
    """Not implemented yet."""
