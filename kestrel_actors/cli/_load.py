"""``kestrel-actors load <scenario> [options]``: the load tests of the ``kestrel_actors.loadtests`` package.

All arguments are handed unchanged to ``kestrel_actors.loadtests.cli.main`` (the same command as
``python -m kestrel_actors.loadtests``). The import happens only when the command runs, so
``kestrel-actors --help`` does not load gevent or the load-test code.
"""

from __future__ import annotations

import click

__all__ = ["load"]


@click.command(
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def load(args: tuple[str, ...]) -> None:
    """Run a load-test scenario (put-many, get-many, many-clients, flood, packing,
    leaky-reader) against a running server. `kestrel-actors load --help` lists them."""
    from kestrel_actors.loadtests.cli import main

    # not standalone: a usage error reaches kestrel-actors' own handler, one line and exit 2
    main.main(args=list(args), prog_name="kestrel-actors load", standalone_mode=False)
