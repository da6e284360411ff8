"""The ``kestrel-actors`` command line: ``serve``, ``stats``, ``journal``, ``load``, ``bridge``,
the client commands ``put``, ``get``, ``peek`` and ``tail``, and the administration commands
``move``, ``status``, ``flush`` and ``delete``.

Each subcommand lives in its own module and imports its heavy dependencies (gevent, pyspark)
only when it runs, so ``kestrel-actors --help`` stays fast and the Spark bridge never loads
gevent.
"""

import signal
import sys

# First, before any import that takes time: SIGHUP's default action kills, and the server
# installs its reload handler only once its modules are imported (a second or more). Until
# then a SIGHUP (a log rotation's, say) is ignored; only ``serve`` does this, so a client
# command still ends with its terminal.
if sys.argv[1:2] == ["serve"]:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

from typing import Any

import click

from ._bridge import bridge
from ._client import get, peek, put, tail
from ._errors import EXIT_INTERRUPTED, CommandError
from ._journal import journal
from ._load import load
from ._manage import delete, flush, move, status
from ._serve import serve
from ._stats import stats

__all__ = ["main"]


class _OneLineErrors(click.Group):
    """click's group, but every error is one line on stderr, ``kestrel-actors COMMAND: …``
    (:mod:`._errors`): a usage error exits 2 (not click's three lines of usage, hint and
    error), a command's failure with its own code, Ctrl-C 130."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "kestrel-actors"
            click.echo(f"{where}: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except CommandError as exc:
            click.echo(f"{exc.command_path or 'kestrel-actors'}: {exc.format_message()}", err=True)
            sys.exit(exc.code)
        except click.ClickException as exc:  # click's own (a file it could not open)
            click.echo(f"kestrel-actors: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:  # Ctrl-C or end of input at a prompt
            click.echo("kestrel-actors: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(result if isinstance(result, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if isinstance(exc, (click.UsageError, CommandError)):
                raise
            # click's own errors do not name the command: say which one raised it
            error = CommandError(exc.format_message(), exc.exit_code)
            if ctx.invoked_subcommand:
                error.command_path = f"{ctx.command_path} {ctx.invoked_subcommand}"
            raise error from None
@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kestrel-actors")
def main() -> None:
    """kestrel-actors: a Kestrel-compatible durable queue server.

    Exit codes of the client commands (put, get, peek, tail, move, status, flush, delete):
    0 done, 1 nothing there, 2 usage error, 3 failed (servers unreachable or an error reply),
    4 refused by the queue, 5 not confirmed at the prompt, 130 interrupted, 141 stdout's
    reader went away. Every error is one line on stderr: kestrel-actors COMMAND: what."""


main.add_command(serve)
main.add_command(journal)
main.add_command(load)
main.add_command(bridge)
for _command in (put, get, peek, tail, move, status, flush, delete):
    main.add_command(_command)
main.add_command(stats)
