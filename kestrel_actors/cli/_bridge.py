"""`kestrel-actors bridge` (not implemented yet)."""

import click


@click.group()
def bridge() -> None:
    """Not implemented yet."""
