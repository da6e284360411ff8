"""The ``kestrel-actors`` command line: ``serve``, ``stats``, ``journal``, ``load`` and ``bridge``.

Each subcommand lives in its own module and imports its heavy dependencies (gevent, pyspark)
only when it runs, so ``kestrel-actors --help`` stays fast and the Spark bridge never loads
gevent.
"""

import click

from ._bridge import bridge
from ._journal import journal
from ._load import load
from ._serve import serve
from ._stats import stats

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kestrel-actors")
def main() -> None:
    """kestrel-actors: a Kestrel-compatible durable queue server."""


main.add_command(serve)
main.add_command(journal)
main.add_command(load)
main.add_command(bridge)
main.add_command(stats)
