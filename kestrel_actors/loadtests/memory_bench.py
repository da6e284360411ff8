"""Memory per queued item: the server's resident memory per 100 B item held (issue 56 point 4).

    python -m kestrel_actors.loadtests.memory_bench [--items 1000000] [--size 100] [--quick]

Starts ``python -m kestrel_actors.cli serve`` on a fresh data directory with queue ``memory``'s
``max_memory_size`` large enough to hold every item in memory, makes the queue (one SET and
its GET), reads the server's resident memory (VmRSS in ``/proc/<pid>/status``), SETs ``--items``
items of ``--size`` bytes (pipelined, each numbered), checks that the queue holds them all in
memory (``mem_items``), reads VmRSS again, and answers the growth per item. Then it GETs every
item back and checks each is the one SET in its place. ``--quick``: a tenth of the items. The
last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUEUE = "memory"
BATCH = 1000
"""Requests sent before their replies are read."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def numbered(index: int, size: int) -> bytes:
    """Item ``index`` of ``size`` bytes (at least 11): its number, a colon, dots."""
    head = b"%010d:" % index
    return head + b"." * (size - len(head))


def rss_kib(pid: int) -> int:
    """The resident memory of process ``pid`` (VmRSS), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key == "VmRSS":
                return int(value.split()[0])
    raise RuntimeError(f"no VmRSS for process {pid}")


class Connection:
    """One memcache connection that sends requests in batches and reads their replies."""

    def __init__(self, port: int, timeout: float = 120.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def until(self, end: bytes, count: int = 1) -> bytes:
        """Read until ``end`` has arrived ``count`` times; answer everything up to the last."""
        seen, start = 0, 0
        while True:
            at = self.buffer.find(end, start)
            if at >= 0:
                seen += 1
                start = at + len(end)
                if seen == count:
                    reply, self.buffer = self.buffer[:start], self.buffer[start:]
                    return reply
                continue
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buffer += chunk

    def stats(self) -> dict[str, str]:
        self.sock.sendall(b"stats\r\n")
        lines = self.until(b"END\r\n").decode().splitlines()
        return {line.split()[1]: line.split()[2] for line in lines if line.startswith("STAT ")}


def fill(conn: Connection, queue: str, items: int, size: int) -> None:
    """SET ``items`` numbered items of ``size`` bytes into ``queue``, ``BATCH`` at a time."""
    header = b"set %s 0 0 %d\r\n" % (queue.encode(), size)
    for start in range(0, items, BATCH):
        count = min(BATCH, items - start)
        conn.sock.sendall(b"".join(header + numbered(i, size) + b"\r\n" for i in range(start, start + count)))
        replies = conn.until(b"\r\n", count)
        if replies != b"STORED\r\n" * count:
            raise AssertionError(f"a SET was not stored: {replies[:200]!r}")


def drain(conn: Connection, queue: str, items: int, size: int) -> None:
    """GET ``items`` items from ``queue``, checking each is the one numbered for its place."""
    request = b"get %s\r\n" % queue.encode()
    for start in range(0, items, BATCH):
        count = min(BATCH, items - start)
        conn.sock.sendall(request * count)
        replies = conn.until(b"END\r\n", count)
        expected = b"".join(b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (queue.encode(), size, numbered(i, size))
                            for i in range(start, start + count))
        if replies != expected:
            raise AssertionError(f"items {start}..{start + count} came back wrong or out of order")


def held_in_memory(conn: Connection, queue: str) -> int:
    """The queue's ``mem_items`` stat: the items it holds in memory."""
    return int(conn.stats()[f"queue_{queue}_mem_items"])


def measure(port: int, pid: int, items: int, size: int, check: bool = True) -> dict[str, object]:
    """Fill queue ``memory`` of the server ``pid`` listening on ``port``; the figures."""
    conn = Connection(port)
    try:
        fill(conn, QUEUE, 1, size)
        drain(conn, QUEUE, 1, size)
        before = rss_kib(pid)
        started = time.perf_counter()
        fill(conn, QUEUE, items, size)
        fill_s = time.perf_counter() - started
        in_memory = held_in_memory(conn, QUEUE)
        after = rss_kib(pid)
        if in_memory != items:
            raise AssertionError(f"{in_memory} of {items} items in memory: raise max_memory_size")
        figures: dict[str, object] = {
            "items": items, "item_bytes": size,
            "rss_before_mib": round(before / 1024, 1), "rss_after_mib": round(after / 1024, 1),
            "rss_bytes_per_item": round((after - before) * 1024 / items, 1),
            "fill_s": round(fill_s, 2),
        }
        if check:
            started = time.perf_counter()
            drain(conn, QUEUE, items, size)
            figures["drain_s"] = round(time.perf_counter() - started, 2)
        return figures
    finally:
        conn.close()


def config_text(items: int, size: int) -> str:
    """A configuration whose queue ``memory`` holds ``items`` items of ``size`` in memory."""
    return f'[queues.{QUEUE}]\nmax_memory_size = {2 * items * size + (64 << 20)}\n'


def run(items: int, size: int, check: bool = True, keep: bool = False) -> dict[str, object]:
    """Start a server on a fresh directory, measure, stop it; the figures."""
    root = Path(tempfile.mkdtemp(prefix="memory-bench-"))
    port = free_port()
    config = root / "memory.toml"
    config.write_text(config_text(items, size))
    command = [sys.executable, "-m", "kestrel_actors.cli", "serve", "--host", "127.0.0.1",
               "--port", str(port), "--text-port", "0", "--thrift-port", "0", "--admin-port", "0",
               "--data-dir", str(root / "data"), "--config", str(config), "--log-format", "json"]
    log_path = root / "server.log"
    try:
        with open(log_path, "ab") as log:
            server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"the server did not start; see {log_path}") from None
                    time.sleep(0.05)
            return measure(port, server.pid, items, size, check)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kestrel_actors.loadtests.memory_bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000, help="items held (default 1,000,000)")
    parser.add_argument("--size", type=int, default=100, help="bytes per item (default 100)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the items")
    parser.add_argument("--no-check", action="store_true", help="do not GET the items back")
    parser.add_argument("--keep", action="store_true", help="keep the data directory and the server's log")
    opts = parser.parse_args(argv)
    if opts.size < 11:
        parser.error("--size must be at least 11 (a number and a colon)")
    items = max(1, opts.items // 10) if opts.quick else opts.items
    figures = run(items, opts.size, not opts.no_check, opts.keep)
    for key, value in figures.items():
        print(f"{key}: {value}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
