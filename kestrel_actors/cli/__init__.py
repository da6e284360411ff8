"""The ``kestrel-actors`` command line: ``serve``, ``stats``, ``journal``, ``load``, ``bridge`` and
the client commands ``put``, ``get``, ``peek`` and ``tail``.

Each subcommand lives in its own module and imports its heavy dependencies (gevent, pyspark)
only when it runs, so ``kestrel-actors --help`` stays fast and the Spark bridge never loads
gevent.
"""

import click

from ._bridge import bridge
from ._client import get, peek, put, tail
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
for _command in (put, get, peek, tail):
    main.add_command(_command)
main.add_command(stats)
