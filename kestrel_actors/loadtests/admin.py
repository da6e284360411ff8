"""Administrative connections outside the timed clients: flush, STATS, and ``-M`` monitoring.

These use an ordinary socket timeout (``--io-timeout``) rather than the runner's watchdog,
and run in the parent process only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gevent

from kestrel_actors.client import Connection, KestrelError

from . import resp
from .harness import HarnessError
from .output import say

__all__ = ["admin_conn", "flush_queues", "monitor_queue", "queue_stats"]


def admin_conn(host: str, port: int, timeout: float) -> Connection:
    """A connection for set-up and checks."""
    return Connection(host, port, timeout, use_gevent=True).connect()


@contextmanager
def _thrift_client(options) -> Iterator[Any]:
    """A thrift connection for set-up and checks; a transport failure is a harness error."""
    from thriftpy2.transport import TTransportException

    from kestrel_actors.client.thrift import ThriftClient

    try:
        with ThriftClient(options.host, options.thrift_port, timeout=options.io_timeout,
                          use_gevent=True) as client:
            yield client
    except TTransportException as exc:
        raise HarnessError(f"thrift port {options.host}:{options.thrift_port}: {exc}") from exc


def flush_queues(options, queues: list[str]) -> None:
    """Kestrel's default first step: ``flush`` each queue, expecting ``END`` (with
    ``--thrift``: ``flush_queue``, as Kestrel's thrift tools do; with ``--resp``: ``DEL``)."""
    say("Flushing queues first.")
    if options.thrift_port is not None:
        with _thrift_client(options) as client:
            for queue in queues:
                client.flush_queue(queue)
        return
    conn = admin_conn(options.host, options.port, options.io_timeout)
    try:
        for queue in queues:
            if options.resp:
                conn.send(resp.delete_request(queue))
                resp.parse_integer(conn.read_line())
                continue
            conn.exchange(b"flush %s\r\n" % queue.encode(), b"END\r\n")
    finally:
        conn.close()


def queue_stats(options, queue: str) -> dict[str, int]:
    """The ``queue_<q>_*`` STATS of one queue, as integers (absent ones are left out; with
    ``--thrift``, the figures ``peek``'s ``QueueInfo`` has, under their STATS names; with
    ``--resp``, only ``items``: the list's ``LLEN``)."""
    if options.thrift_port is not None:
        with _thrift_client(options) as client:
            info = client.peek(queue)
        return {"items": info.items, "bytes": info.bytes, "logsize": info.journal_bytes,
                "age": info.age, "waiters": info.waiters,
                "open_transactions": info.open_transactions}
    conn = admin_conn(options.host, options.port, options.io_timeout)
    try:
        if options.resp:
            conn.send(resp.length_request(queue))
            return {"items": resp.parse_integer(conn.read_line())}
        conn.send(b"stats\r\n")
        stats = conn.read_stats()
    finally:
        conn.close()
    prefix = f"queue_{queue}_"
    result: dict[str, int] = {}
    for key, value in stats.items():
        if key.startswith(prefix):
            try:
                result[key[len(prefix):]] = int(value)
            except ValueError:
                pass
    return result


def monitor_queue(options) -> None:
    """``-M`` (a greenlet): once a second, print Kestrel's stats line for ``options.monitor``."""
    queue = options.monitor
    start_total: int | None = None
    while True:
        try:
            s = queue_stats(options, queue)
        except (KestrelError, OSError) as exc:
            say(f"{queue}: stats failed: {exc}")
        else:
            total = s.get("total_items", 0)
            start_total = total if start_total is None else start_total
            say("%s: items=%d total_items=%d (%d) bytes=%d mem_items=%d mem_bytes=%d "
                "journal_bytes=%d" % (
                queue, s.get("items", 0), total, total - start_total, s.get("bytes", 0),
                s.get("mem_items", 0), s.get("mem_bytes", 0), s.get("logsize", 0)))
        gevent.sleep(1.0)
