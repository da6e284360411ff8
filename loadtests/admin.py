"""Administrative connections outside the timed clients: flush, STATS, and ``-M`` monitoring.

These use an ordinary socket timeout (``--io-timeout``) rather than the runner's watchdog,
and run in the parent process only.
"""

from __future__ import annotations

import gevent

from kestrel_actors.client import Connection, KestrelError

from .output import say

__all__ = ["admin_conn", "flush_queues", "monitor_queue", "queue_stats"]


def admin_conn(host: str, port: int, timeout: float) -> Connection:
    """A connection for set-up and checks."""
    return Connection(host, port, timeout, use_gevent=True).connect()


def flush_queues(options, queues: list[str]) -> None:
    """Kestrel's default first step: ``flush`` each queue, expecting ``END``."""
    say("Flushing queues first.")
    conn = admin_conn(options.host, options.port, options.io_timeout)
    try:
        for queue in queues:
            conn.exchange(b"flush %s\r\n" % queue.encode(), b"END\r\n")
    finally:
        conn.close()


def queue_stats(options, queue: str) -> dict[str, int]:
    """The ``queue_<q>_*`` STATS of one queue, as integers (absent ones are left out)."""
    conn = admin_conn(options.host, options.port, options.io_timeout)
    try:
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
