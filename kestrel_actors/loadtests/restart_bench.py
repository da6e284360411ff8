"""A restart with a big backlog: how soon the ports answer and the queues serve (issue 56 point 3).

    python -m kestrel_actors.loadtests.restart_bench [--items 4000000] [--size 100] [--json]

Writes a data directory with ``--items`` items of ``--size`` bytes in queue ``big`` (the ADDX
records a server writes for SETs, written here directly: four million SETs would take minutes)
and one item in queue ``other``; starts ``python -m kestrel_actors.cli serve`` on it with every
port on (memcache, text, thrift, admin, each on a free loopback port), SETs one more item into
each queue (the big queue's SET waits for its whole replay: the directory has no checkpoint,
as an old one would not; the SET rotates the journal, which writes the queue's checkpoint), then
``--tail`` more into the big queue (by default 30,000 of 100 B, 3.5 MiB: nearly the 4 MiB after
which the next checkpoint is written, so the restart replays about the most it ever has to),
SIGKILLs it and starts it again. From the second start it times: when each port first accepts a
connection, when ``get other`` first answers its item, when ``get big/peek`` first answers the
big queue's first item (and the server's CPU seconds by then), when stats no longer show
``queue_big_loading`` (the queue is served); then the server's resident memory (VmRSS, and its
peak VmHWM) and the big queue's item count, which must be the items written plus one plus the
tail; and, from the log, whether the big queue restarted from its checkpoint and how many bytes
of journal it replayed. The last line is the figures as JSON.
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

from ..journal import Item, encode_add

PORTS = ("memcache", "text", "thrift", "admin")
BATCH = 20_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_backlog(data_dir: Path, items: int, size: int) -> int:
    """Queue ``big``'s journal with ``items`` items (each numbered, ``size`` bytes) and queue
    ``other``'s with one; answers the big journal's bytes."""
    now = int(time.time() * 1000)
    with open(data_dir / "big", "wb") as journal:
        for start in range(0, items, BATCH):
            journal.write(b"".join(encode_add(Item(_numbered(i, size), now))
                                   for i in range(start, min(items, start + BATCH))))
        written = journal.tell()
    (data_dir / "other").write_bytes(encode_add(Item(b"other item", now)))
    return written


def _numbered(i: int, size: int) -> bytes:
    head = b"%010d:" % i
    return head + b"." * (size - len(head))


def _command(data_dir: Path, ports: dict[str, int]) -> list[str]:
    return [sys.executable, "-m", "kestrel_actors.cli", "serve", "--host", "127.0.0.1",
            "--port", str(ports["memcache"]), "--text-port", str(ports["text"]),
            "--thrift-port", str(ports["thrift"]), "--admin-port", str(ports["admin"]),
            "--data-dir", str(data_dir), "--log-format", "json"]


def _ask(port: int, request: bytes, timeout: float = 60.0) -> bytes | None:
    """The answer (up to END) to ``request``; ``None`` if nothing listens."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(request)
            reply = b""
            while not reply.endswith(b"END\r\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                reply += chunk
            return reply
    except OSError:
        return None


def _memory_kib(pid: int) -> dict[str, int]:
    figures = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                figures[key] = int(value.split()[0])
    return figures


def _set_tail(port: int, first: int, count: int, size: int) -> None:
    """SET items ``first`` .. ``first + count - 1`` into ``big``, pipelined a thousand at a time."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        for start in range(first, first + count, 1000):
            numbers = range(start, min(first + count, start + 1000))
            sock.sendall(b"".join(b"set big 0 0 %d\r\n%s\r\n" % (size, _numbered(i, size)) for i in numbers))
            expected = b"STORED\r\n" * len(numbers)
            reply = b""
            while len(reply) < len(expected):
                chunk = sock.recv(65536)
                if not chunk:
                    raise SystemExit("the server closed the connection during the tail's SETs")
                reply += chunk
            assert reply == expected, reply[:200]


def _replay_event(log_path: Path) -> dict[str, object]:
    """The last "replayed journal" line of queue ``big`` in the server's log."""
    found: dict[str, object] = {}
    with open(log_path, errors="replace") as log:
        for line in log:
            if '"replayed journal"' in line and '"big"' in line:
                try:
                    found = json.loads(line)
                except ValueError:
                    pass
    return found


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used: the work behind a figure, which a
    loaded machine stretches in wall-clock time but not in CPU time."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(data_dir: Path, log_path: Path, items: int, deadline: float, tail: int = 0,
            size: int = 100) -> dict[str, object]:
    ports = {name: free_port() for name in PORTS}
    command = _command(data_dir, ports)
    with open(log_path, "ab") as log:
        first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            while _ask(ports["memcache"], b"set other 0 0 5\r\nother\r\nget nothing\r\n", 5) is None:
                if first.poll() is not None:
                    raise SystemExit(f"the server exited with {first.returncode}; see {log_path}")
                time.sleep(0.05)
            _ask(ports["memcache"], b"set big 0 0 4\r\nlast\r\nget nothing\r\n")  # waits for the replay
            _set_tail(ports["memcache"], items + 1, tail, size)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        started = time.perf_counter()
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    figures: dict[str, object] = {}
    try:
        pending = set(PORTS)
        while pending and time.perf_counter() - started < deadline:
            for name in sorted(pending):
                try:
                    socket.create_connection(("127.0.0.1", ports[name]), timeout=1).close()
                except OSError:
                    continue
                figures[f"{name}_port_s"] = round(time.perf_counter() - started, 3)
                pending.discard(name)
            if server.poll() is not None:
                raise SystemExit(f"the server exited with {server.returncode}; see {log_path}")
            time.sleep(0.005)
        other = _ask(ports["memcache"], b"get other\r\n")
        figures["other_queue_s"] = round(time.perf_counter() - started, 3)
        assert other == b"VALUE other 0 10\r\nother item\r\nEND\r\n", other
        head = _ask(ports["memcache"], b"get big/peek\r\n", timeout=deadline)
        figures["big_first_item_s"] = round(time.perf_counter() - started, 3)
        figures["big_first_item_cpu_s"] = round(_cpu_seconds(server.pid), 2)
        assert head is not None and head.startswith(b"VALUE big 0 ") and b"\r\n0000000000:" in head, head
        while True:
            stats = _ask(ports["memcache"], b"stats\r\n") or b""
            if b"queue_big_loading" not in stats:
                break
            time.sleep(0.01)
        figures["big_loaded_s"] = round(time.perf_counter() - started, 3)
        count = next(int(line.split()[2]) for line in stats.splitlines() if line.startswith(b"STAT queue_big_items "))
        figures["big_items"] = count
        assert count == items + 1 + tail, f"{count} items in big after the restart, expected {items + 1 + tail}"
        replay = _replay_event(log_path)
        figures["from_checkpoint"] = replay.get("from_checkpoint", False)
        figures["replayed_mib"] = round(int(replay.get("replayed_bytes", 0)) / (1 << 20), 1)  # type: ignore[call-overload]
        memory = _memory_kib(server.pid)
        figures["rss_mib"] = round(memory["VmRSS"] / 1024, 1)
        figures["peak_rss_mib"] = round(memory["VmHWM"] / 1024, 1)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return figures


def run(items: int, size: int, deadline: float = 600.0, keep: bool = False, tail: int = 30_000) -> dict[str, object]:
    """Build the backlog in a fresh directory, restart on it, answer the figures."""
    root = Path(tempfile.mkdtemp(prefix="restart-bench-"))
    try:
        data_dir = root / "data"
        data_dir.mkdir()
        journal_bytes = write_backlog(data_dir, items, size)
        figures: dict[str, object] = {"items": items, "item_bytes": size,
                                      "journal_mib": round(journal_bytes / (1 << 20), 1)}
        figures["tail_items"] = tail
        figures.update(measure(data_dir, root / "server.log", items, deadline, tail, size))
        return figures
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kestrel_actors.loadtests.restart_bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=4_000_000, help="items in the big queue (default 4,000,000)")
    parser.add_argument("--size", type=int, default=100, help="bytes per item (default 100)")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds the restart may take")
    parser.add_argument("--tail", type=int, default=30_000,
                        help="items SET after the checkpoint, before the SIGKILL (default 30,000)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory and the server's log")
    opts = parser.parse_args(argv)
    if opts.size < 11:
        parser.error("--size must be at least 11 (a number and a colon)")
    figures = run(opts.items, opts.size, opts.deadline, opts.keep, opts.tail)
    for key, value in figures.items():
        print(f"{key}: {value}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
