"""The pieces every scenario command shares: the common options and the run/exit wrapper.

Kept apart from ``cli`` (which imports every scenario to register it) so that a worker
process importing one scenario module does not import the others.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

__all__ = ["common_options", "resp_option", "scenario_entry"]


def common_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the options every scenario shares (host, port, flush, processes, plot …)."""
    options = [
        click.option("-H", "--host", "host", default="127.0.0.1", show_default=True,
                     help="Server host (Kestrel's tools: -h; here -h is help)."),
        click.option("-p", "port", default=22133, show_default=True, type=int,
                     help="Server memcache port."),
        click.option("-F", "no_flush", is_flag=True, help="Don't flush the queue(s) first."),
        click.option("--procs", default=1, show_default=True, type=click.IntRange(1, 64),
                     help="Split the clients over this many processes."),
        click.option("--plot", type=click.Path(dir_okay=False),
                     help="Write throughput and latency plots to this PNG file (the load extra: "
                          "pip install '.[load]')."),
        click.option("--json-out", type=click.Path(dir_okay=False),
                     help="Also write the JSON figures to this file."),
        click.option("--csv", "csv_out", type=click.Path(dir_okay=False),
                     help="Also write the summary to this file as CSV (a header row and one row)."),
        click.option("--progress/--no-progress", default=None,
                     help="Progress bar (default: when stderr is a terminal)."),
        click.option("--timeout", default=600.0, show_default=True, type=float,
                     help="Stop the run (exit 3) after this many seconds."),
        click.option("--io-timeout", default=30.0, show_default=True, type=float,
                     help="Longest wait for one reply."),
        click.option("--allow-remote", is_flag=True,
                     help="Allow a non-loopback host (load tests default to 127.0.0.1 only)."),
        click.option("--greenlets", is_flag=True,
                     help="Run every client on a greenlet of its own, not on the one epoll "
                          "loop of put-many, get-many and mixed (slower: to compare with)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def resp_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--resp``: the scenarios a Redis list can run (put-many, get-many, mixed, flood)."""
    return click.option("--resp", "resp", is_flag=True,
                        help="Speak Redis's protocol (RESP) to a Redis server on -p, a list as the "
                             "queue: RPUSH for SET, LPOP (BLPOP when waiting) for GET, DEL for the "
                             "flush; the checks are the same.")(func)


DEFAULT_THRIFT_PORT = 2229


def _thrift_port(thrift_port: int | None, port: int) -> int:
    """With ``--thrift``: ``--thrift-port`` if given, else ``-p`` if given (Kestrel's tools take
    ``--thrift`` to mean port 2229 unless ``-p`` names another), else 2229."""
    if thrift_port is not None:
        return thrift_port
    source = click.get_current_context().get_parameter_source("port")
    if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
        return port
    return DEFAULT_THRIFT_PORT


def scenario_entry(body: Callable[..., Any]) -> Callable[..., None]:
    """Wrap a scenario body ``body(options, flush, **scenario_args) -> Outcome``.

    Builds the shared ``runner.Options`` from the common options, runs the body, prints the
    JSON line via ``report.finish`` and exits with its code.
    """

    def entry(host, port, no_flush, procs, plot, json_out, csv_out, progress, timeout, io_timeout,
              allow_remote, greenlets, monitor: str | None = None, **args: Any) -> None:
        from .figures import Figures
        from .harness import HarnessError, check_loopback, is_failure, is_harness_error
        from .report import EXIT_HARNESS, Outcome, Reports, finish
        from .runner import Options

        where = click.get_current_context().command_path
        if plot and importlib.util.find_spec("matplotlib") is None:
            raise click.UsageError("--plot needs matplotlib, the load extra: pip install '.[load]'")
        if progress is None:
            progress = sys.stderr.isatty()
        try:
            if not allow_remote:
                check_loopback(host)
        except HarnessError as exc:
            click.echo(f"{where}: {exc}", err=True)
            sys.exit(EXIT_HARNESS)
        resp = bool(args.pop("resp", False))
        thrift_port = None
        if args.get("thrift"):
            thrift_port = args["thrift_port"] = _thrift_port(args["thrift_port"], port)
        options = Options(host=host, port=port, procs=procs, timeout=timeout,
                          io_timeout=io_timeout, progress=progress, monitor=monitor,
                          thrift_port=thrift_port, resp=resp, greenlets=greenlets)
        name = body.__name__.replace("_", "-")
        try:
            outcome = body(options, not no_flush, epoch=time.monotonic_ns(), **args)
        except Exception as exc:  # raised by a set-up or check step outside the runner
            if is_failure(exc):
                outcome = Outcome(name, Figures(name), failures=[f"set-up/check: {exc}"])
            elif is_harness_error(exc):
                outcome = Outcome(name, Figures(name), errors=[f"set-up/check: {exc}"])
            else:
                raise
        sys.exit(finish(outcome, Reports(where, plot, json_out, csv_out)))

    entry.__name__ = body.__name__
    entry.__doc__ = body.__doc__
    return entry
