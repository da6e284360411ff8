"""Loop operations per lone request: what one client's SET or GET asks of the event loop (issue 24).

    python -m kestrel_actors.loadtests.loop_bench [--requests 2000] [--no-strace]

A real server (file journals in a temporary directory, memcache on a free loopback port, no
expiry sweep, no busy poll) runs in this process on a thread of its own, with a hub whose libev loop counts
what the request path asks of it; one client on the main thread sends requests one at a time
over a real socket and waits for each reply, so every request finds its session and its queue
idle. Counted on the server's thread, per request: loop iterations (libev's ``iteration``),
callbacks scheduled (``run_callback``), timer starts, async watchers made, threadpool hand-offs,
greenlet switches (``greenlet.settrace``), reads of the loop's clock (``now``) and I/O watcher
stops; with ``strace`` on the path, the system calls of
the server's threads too (``strace -c`` attached to each of them, the client's thread left out;
threads started after the warm-up are not traced). The floor (``loadtests/floor_server.py``)
does one iteration, one watcher callback and its system calls (``epoll_wait``, ``recv``,
``writev``, ``send``) per SET, and none of the rest.

Scenarios: ``set`` (``set q 0 0 5``, the default ``--sync-journal``), ``get`` (``get q`` of
the items those SETs left), ``set-always`` (``--sync-journal always``: a durable SET) and
``connect`` (each request a connection of its own: connect, ``get q`` of an empty queue, close;
counted once the server has closed them all).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, cast

import gevent
import gevent.event
import gevent.libev.corecext as libev
import greenlet
from gevent.hub import Hub, set_hub  # type: ignore[attr-defined]
from gevent.threadpool import ThreadPool

__all__ = ["LoopCounts", "Measured", "main", "measure"]

SCENARIOS = ("set", "get", "set-always", "connect")
WARM_UP = 100
"""Requests sent before counting: the queue exists, the threadpool's workers run."""
SETTLE = 0.05
"""Seconds left for work that follows a reply (it belongs to the request) before a count is read."""


@dataclass(slots=True)
class LoopCounts:
    """What the server's event loop did, as running totals (or a difference of two)."""

    iterations: int = 0
    callbacks: int = 0
    timer_starts: int = 0
    async_watchers: int = 0
    threadpool: int = 0
    switches: int = 0
    clock_reads: int = 0
    watcher_stops: int = 0

    def minus(self, before: LoopCounts) -> LoopCounts:
        return LoopCounts(*(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)))

    def per(self, requests: int) -> dict[str, float]:
        return {f.name: getattr(self, f.name) / requests for f in fields(self)}


_LibevTimer: Any = libev.timer  # type: ignore[attr-defined]


class _CountingTimer(_LibevTimer):
    """A libev timer that counts its starts on its loop's counts."""

    def start(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.loop.counts.timer_starts += 1
        super().start(callback, *args, **kwargs)

    def again(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.loop.counts.timer_starts += 1
        super().again(callback, *args, **kwargs)


_LibevIo: Any = libev.io  # type: ignore[attr-defined]


class _CountingIo(_LibevIo):
    """A libev I/O watcher that counts its stops on its loop's counts."""

    def stop(self) -> None:
        self.loop.counts.watcher_stops += 1
        super().stop()


class CountingLoop(libev.loop):
    """gevent's libev loop, counting the operations a request may ask of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts = LoopCounts()

    def run_callback(self, func: Callable[..., Any], *args: Any) -> Any:  # type: ignore[override]
        self.counts.callbacks += 1
        return super().run_callback(func, *args)

    def timer(self, after: float, repeat: float = 0.0, ref: bool = True, priority: int | None = None) -> Any:
        return _CountingTimer(self, after, repeat, ref, priority)

    def async_(self, ref: bool = True, priority: int | None = None) -> Any:
        self.counts.async_watchers += 1
        return super().async_(ref, priority)

    def io(self, fd: int, events: int, ref: bool = True, priority: int | None = None) -> Any:
        return _CountingIo(self, fd, events, ref, priority)

    def now(self) -> float:
        self.counts.clock_reads += 1
        return super().now()

    def snapshot(self) -> LoopCounts:
        counts = self.counts
        return LoopCounts(self.iteration, counts.callbacks, counts.timer_starts, counts.async_watchers,
                          counts.threadpool, counts.switches, counts.clock_reads, counts.watcher_stops)


class _CountingPool(ThreadPool):
    """gevent's threadpool, counting its hand-offs on its hub's loop."""

    def spawn(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        cast(CountingLoop, self.hub.loop).counts.threadpool += 1
        return super().spawn(func, *args, **kwargs)


class _CountingHub(Hub):
    threadpool_class = _CountingPool


class InProcessServer:
    """A server on its own thread and counting hub; :meth:`stop` ends both."""

    def __init__(self, sync_journal: float | None) -> None:
        from kestrel_actors.config import QueueConfig, ServerConfig

        self.data_dir = tempfile.mkdtemp(prefix="loop-bench-")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.port: int = port
        self.config = ServerConfig(
            port=port, text_port=0, thrift_port=0, admin_port=0, data_dir=self.data_dir,
            # no expiry sweep: once a second it would add its own loop work to the counts; no
            # busy poll: its empty turns (ADR 0025) are waiting, not work a request asks for
            expiration_timer_frequency=None, busy_poll=0.0, queue_defaults=QueueConfig(sync_journal=sync_journal))
        self.loop: CountingLoop | None = None
        self.stats: Any = None
        """The server's statistics (its open connections), once it has started."""
        self.tids: list[int] = []
        self._ready = threading.Event()
        self._stop_watcher: Any = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="loop-bench-server", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._failure is not None:
            raise RuntimeError("the server did not start") from self._failure

    def _run(self) -> None:
        from kestrel_actors.journal import make_file_opener, queue_names
        from kestrel_actors.messages import ForAll, ForAllKind
        from kestrel_actors.runtime import ReplyFuture
        from kestrel_actors.server import Server

        # never libev's default loop: it is one per process, and a test's hub may run it
        loop = CountingLoop(default=False)
        set_hub(_CountingHub(loop=cast(Any, loop)))
        counts = loop.counts

        def on_switch(event: str, _args: Any) -> None:
            if event in ("switch", "throw"):
                counts.switches += 1

        greenlet.settrace(on_switch)
        stop = gevent.event.Event()
        self._stop_watcher = loop.async_()
        self._stop_watcher.start(stop.set)
        try:
            data_dir = self.data_dir
            server = Server(self.config, opener=make_file_opener(data_dir, read_behind=True),
                            discover=lambda: queue_names(data_dir))
            server.start()
        except BaseException as exc:  # noqa: BLE001 - reported by the constructor
            self._failure = exc
            self._ready.set()
            return
        self.loop = loop
        self.stats = server.stats
        self.tids.append(threading.get_native_id())
        self._ready.set()
        stop.wait()
        greenlet.settrace(None)
        # not Server.shutdown: its ActorRegistry.stop_all would reach actors of other hubs
        # in this process (a test's)
        for listener in server._listeners:  # the bench's own server: no shutdown of its own
            listener.close()
        closed: ReplyFuture[Any] = ReplyFuture()
        server.collection.tell(ForAll(ForAllKind.CLOSE, closed))
        closed.get(timeout=30)
        server.collection.stop()

    def server_tids(self) -> list[int]:
        """The server thread and the threads it started (the threadpool's), not the caller's."""
        mine = threading.get_native_id()
        return [int(tid) for tid in os.listdir("/proc/self/task") if int(tid) != mine]

    def stop(self) -> None:
        if self._stop_watcher is not None:
            self._stop_watcher.send()
        self._thread.join(10)
        shutil.rmtree(self.data_dir, ignore_errors=True)


class _Client:
    """One blocking client on the caller's thread: a request, then its whole reply."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ask(self, request: bytes, reply_end: bytes) -> bytes:
        self.sock.sendall(request)
        reply = b""
        while not reply.endswith(reply_end):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            reply += chunk
        return reply

    def close(self) -> None:
        self.sock.close()


@dataclass(slots=True)
class Measured:
    """One scenario's figures per request."""

    scenario: str
    requests: int
    loop: dict[str, float]
    syscalls: dict[str, float] | None = field(default=None)


_SET = b"set q 0 0 5\r\nhello\r\n"
_GET = b"get q\r\n"
_HIT = b"VALUE q 0 5\r\nhello\r\nEND\r\n"


class _Strace:
    """``strace -c`` attached to the given threads until :meth:`finish`."""

    def __init__(self, tids: list[int]) -> None:
        self.out = tempfile.mktemp(prefix="loop-bench-strace-")
        command = ["strace", "-c", "-o", self.out]
        for tid in tids:
            command += ["-p", str(tid)]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        for _ in tids:  # one "attached" line per thread
            self.proc.stderr.readline()

    def finish(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(10)
        calls: dict[str, int] = {}
        with open(self.out, encoding="utf-8") as summary:
            for line in summary:
                match = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
                if match and match.group(2) != "total":
                    calls[match.group(2)] = int(match.group(1))
        os.unlink(self.out)
        return calls


def measure(scenario: str, requests: int, trace_syscalls: bool = False) -> Measured:
    """Run ``scenario`` (one of :data:`SCENARIOS`) on a fresh in-process server."""
    server = InProcessServer(0.0 if scenario == "set-always" else None)
    client = _Client(server.port)
    try:
        if scenario == "connect":
            client.ask(_SET, b"STORED\r\n")  # the queue exists, and is empty again
            client.ask(_GET, b"END\r\n")
            for _ in range(WARM_UP):
                _connection(server)
        else:
            if scenario == "get":
                for _ in range(requests + WARM_UP):
                    client.ask(_SET, b"STORED\r\n")
                request, reply_end, expected = _GET, b"END\r\n", _HIT
            else:
                request, reply_end, expected = _SET, b"\r\n", b"STORED\r\n"
            for _ in range(WARM_UP):
                client.ask(request, reply_end)
        time.sleep(SETTLE)
        strace = _Strace(server.server_tids()) if trace_syscalls else None
        loop = server.loop
        assert loop is not None
        before = loop.snapshot()
        for _ in range(requests):
            if scenario == "connect":
                _connection(server)
                continue
            reply = client.ask(request, reply_end)
            if reply != expected:
                raise AssertionError(f"{scenario}: unexpected reply {reply!r}")
        time.sleep(SETTLE)
        counted = loop.snapshot().minus(before)
        syscalls = None
        if strace is not None:
            syscalls = {name: count / requests for name, count in strace.finish().items()}
        return Measured(scenario, requests, counted.per(requests), syscalls)
    finally:
        client.close()
        server.stop()


def _connection(server: InProcessServer) -> None:
    """One connection of the ``connect`` scenario, closed by the server before this returns (its
    closing is counted with it): then only the scenario's first client is open."""
    one = _Client(server.port)
    reply = one.ask(_GET, b"END\r\n")
    one.close()
    if reply != b"END\r\n":
        raise AssertionError(f"connect: unexpected reply {reply!r}")
    deadline = time.monotonic() + 30
    while server.stats.curr_connections > 1:
        if time.monotonic() > deadline:
            raise AssertionError("connect: the server did not close the connection")
        time.sleep(0.001)


def _report(measured: Measured) -> str:
    loop = "  ".join(f"{name} {value:.2f}" for name, value in measured.loop.items())
    lines = [f"{measured.scenario:10s} per request: {loop}"]
    if measured.syscalls is not None:
        total = sum(measured.syscalls.values())
        shown = "  ".join(f"{name} {value:.2f}" for name, value in
                          sorted(measured.syscalls.items(), key=lambda kv: -kv[1]) if value >= 0.01)
        lines.append(f"{'':10s} system calls {total:.2f}: {shown}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--only", action="append", choices=SCENARIOS)
    parser.add_argument("--no-strace", action="store_true", help="Do not count system calls.")
    args = parser.parse_args(argv)
    from kestrel_actors.logs import configure_logging

    configure_logging(level="warning")
    trace = not args.no_strace and shutil.which("strace") is not None
    for scenario in args.only or SCENARIOS:
        print(_report(measure(scenario, args.requests, trace)), flush=True)


if __name__ == "__main__":
    main()
