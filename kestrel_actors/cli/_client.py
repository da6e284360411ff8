"""``kestrel-actors put|get|peek|tail``: the client (:mod:`kestrel_actors.client`) for shells.

Items are one per line (the line end is not part of the item) or, with ``--raw``, the bytes
as they are: ``put --raw`` sends all of stdin as one item, ``get``/``tail --raw`` write items
back to back. Reads are reliable: an item is confirmed only after it was written to stdout
and flushed, so a reader killed or cut off (a closed pipe) leaves it at the head of its queue.

Exit codes (the same for every client command, and in each one's ``--help``): 0 done, 1 nothing
there (``get``, ``peek``, ``move`` found no item), 2 a usage error (click's: a bad option or queue
name, one line on stderr), 3 failed (the servers could not be used, or answered an error),
4 refused (``put``: the queue did not take an item, full or too large), 5 not confirmed at the
prompt (``flush``, ``delete``), 130 interrupted, 141 the reader of stdout went away.

``put`` spreads a long input over the servers (the write set of a ``zk://`` server set) as
Kestrel's clients spread items: batches of :data:`_BATCH` lines, each pipelined to the next
server in turn.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import click

from ..queue_name import MAX_NAME_BYTES, name_problem
from ._errors import EXIT_INTERRUPTED, EXIT_PIPE, describe, fail

__all__ = ["QUEUE", "QueueName", "get", "peek", "put", "tail"]

_BATCH = 100
"""Lines per pipelined ``put_many``: each batch goes to the next server in turn, so an input of
a few hundred lines already reaches every server of a pool of three."""


EXIT_NOTHING = 1
EXIT_REFUSED = 4
EXIT_CODES = ("Exit codes: 0 done, 1 nothing there, 2 usage error, 3 failed (servers unreachable "
              "or an error reply), 4 refused by the queue, 5 not confirmed at the prompt, "
              "130 interrupted, 141 stdout's reader went away.")
QUEUE_RULE = (f"a queue name is 1 to {MAX_NAME_BYTES} bytes, without spaces, control characters, "
              "'/', '.' or '~', and does not start with '+'")


class QueueName(click.ParamType):
    """A queue name the server accepts (behaviour §5.2); anything else is a usage error (exit 2)
    that states the rule, before any server is asked, since the server would drop the
    connection for it."""

    name = "queue"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        name = str(value)
        problem = "it has a space" if " " in name else name_problem(name)
        if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            problem = problem or f"it is longer than {MAX_NAME_BYTES} bytes"
        if problem:
            self.fail(f"{name!r} is not a queue name: {problem}; {QUEUE_RULE}", param, ctx)
        return name


QUEUE = QueueName()


def _servers(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("-s", "--server", "servers", multiple=True,
                        help="host:port of a server; repeat for a pool; or one ZooKeeper server set, "
                             "zk://host:port/path, followed live (default: $KESTREL_SERVERS, "
                             "comma-separated, or 127.0.0.1:22133).")(func)
    return click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
                        help="Seconds to wait for a reply (a blocking read adds its own wait).")(func)


def logs_to_stderr() -> None:
    """A client command's standard output is its items (or its table): the library's log events
    (a server set's listing failed, a member ignored) go to stderr, warnings and worse only.
    Unconfigured, structlog prints every event, debug included, to standard output."""
    from ..logs import configure_logging

    configure_logging("console", "warning")


def _client(servers: tuple[str, ...], timeout: float) -> Any:
    from ..client import Client, KestrelError

    logs_to_stderr()
    names = list(servers) or os.environ.get("KESTREL_SERVERS", "127.0.0.1:22133").split(",")
    try:
        return Client([name for name in names if name.strip()], timeout=timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--server") from None
    except KestrelError as exc:  # a server set whose ZooKeeper cannot be reached
        fail(describe(exc))


def _guard(action: Callable[[], int]) -> None:
    """Run ``action``; its result is the exit code; client errors exit 3 with the reason."""
    from ..client import KestrelError

    try:
        code = action()
    except KestrelError as exc:
        fail(describe(exc))
    except BrokenPipeError:  # the reader went away: the open item was aborted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        code = EXIT_PIPE
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    sys.exit(code)


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    for line in stream:
        yield line[:-2] if line.endswith(b"\r\n") else line.rstrip(b"\n")


def _batches(lines: Iterator[bytes]) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _writer(raw: bool) -> Callable[[bytes], None]:
    out = sys.stdout.buffer
    end = b"" if raw else b"\n"

    def write(item: bytes) -> None:
        out.write(item + end)
        out.flush()

    return write


@click.command()
@click.argument("queue", type=QUEUE)
@click.option("--raw", is_flag=True, help="All of stdin is one item (default: one item per line).")
@click.option("--expiry", type=int, default=None,
              help="Memcache expiry: seconds from now (below 1,000,000) or a Unix time.")
@_servers
def put(queue: str, raw: bool, expiry: int | None, servers: tuple[str, ...], timeout: float) -> None:
    """Add the lines of stdin (or all of it, --raw) to QUEUE. Prints nothing.

    Exit codes: 0 stored, 2 usage error, 3 failed, 4 the queue refused an item (full, or too
    large)."""
    client = _client(servers, timeout)
    stdin = sys.stdin.buffer

    def run() -> int:
        with client:
            if raw:
                return 0 if client.put(queue, stdin.read(), expiry) else EXIT_REFUSED
            refused = 0
            for batch in _batches(_lines(stdin)):
                refused += len(batch) - client.put_many(queue, batch, expiry)
            if refused:
                click.echo(f"{click.get_current_context().command_path}: {refused} item(s) refused "
                           f"by {queue}", err=True)
            return EXIT_REFUSED if refused else 0

    _guard(run)


@click.command()
@click.argument("queue", type=QUEUE)
@click.option("-n", "--count", default=1, show_default=True, type=click.IntRange(min=1),
              help="Items to take (fewer if the queue runs dry).")
@click.option("-w", "--wait", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for each item.")
@click.option("--raw", is_flag=True, help="Write items back to back, without a newline.")
@_servers
def get(queue: str, count: int, wait: float, raw: bool, servers: tuple[str, ...], timeout: float) -> None:
    """Take up to COUNT items from QUEUE and print them, one per line. Each is confirmed after
    it was written.

    Exit codes: 0 printed some, 1 there was none, 2 usage error, 3 failed."""
    client = _client(servers, timeout)
    write = _writer(raw)

    def run() -> int:
        with client:
            got = _read(client, queue, write, count, wait)
        return 0 if got else EXIT_NOTHING

    _guard(run)


@click.command()
@click.argument("queue", type=QUEUE)
@click.option("--raw", is_flag=True, help="Write the item without a newline.")
@_servers
def peek(queue: str, raw: bool, servers: tuple[str, ...], timeout: float) -> None:
    """Print the head item of QUEUE without removing it.

    Exit codes: 0 printed it, 1 the queue is empty, 2 usage error, 3 failed."""
    client = _client(servers, timeout)

    def run() -> int:
        with client:
            item = client.peek(queue)
        if item is None:
            return EXIT_NOTHING
        _writer(raw)(item)
        return 0

    _guard(run)


@click.command()
@click.argument("queue", type=QUEUE)
@click.option("-n", "--count", default=None, type=click.IntRange(min=1),
              help="Stop after this many items (default: never).")
@click.option("--idle", default=None, type=click.FloatRange(min=0),
              help="Stop after this many seconds without an item (default: never).")
@click.option("--raw", is_flag=True, help="Write items back to back, without a newline.")
@_servers
def tail(queue: str, count: int | None, idle: float | None, raw: bool, servers: tuple[str, ...],
         timeout: float) -> None:
    """Follow QUEUE like ``tail -f``: print each item as it arrives, one per line, and confirm
    it once written (reliable reads: an item is never lost by a reader that stops).

    Exit codes: 0 done, 2 usage error, 3 failed."""
    client = _client(servers, timeout)
    write = _writer(raw)

    def run() -> int:
        with client:
            _read(client, queue, write, count, idle, follow=True)
        return 0

    _guard(run)


def _read(client: Any, queue: str, write: Callable[[bytes], None], count: int | None,
          wait: float | None, follow: bool = False) -> int:
    """Reliable reads until ``count`` items, or an empty wait of ``wait`` seconds (``follow``
    with no ``wait``: forever, in waits of a second)."""
    got = 0
    while count is None or got < count:
        with client.reliable(queue, timeout=wait if wait is not None else 1.0) as item:
            if item is not None:
                write(item)
        if item is not None:
            got += 1
        elif not follow or wait is not None:
            break
    return got
