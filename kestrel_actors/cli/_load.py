"""`kestrel-actors load` (not implemented yet)."""

import click


@click.group()
def load() -> None:
    """Not implemented yet."""
