"""A kill soak: mixed load against a real server that is SIGKILLed and SIGTERMed again and again.

``python -m kestrel_actors.loadtests.kill_soak --kills 50 --terms 15 --seconds-between 1.5``
starts ``kestrel-actors serve`` (memcache and thrift ports, ``--sync-journal always``, a
config with a fanout queue ``fan`` and its children ``fan+a`` and ``fan+b``), runs the load
below in threads, and every ``--seconds-between`` seconds stops the server, by SIGKILL or (a
shuffled ``--terms`` of the times) SIGTERM and a wait for its exit, and starts it again on the
same data directory and ports; the clients reconnect and go on. At the end the load stops,
every queue is drained reliably, and the ledger is checked.

The load: memcache SETs and thrift ``put``s of unique numbered items (acknowledged only when
``STORED`` / the put's count came back) to ``rel``, ``plain`` and ``fan``; reliable readers of
``rel`` (``get rel/open`` then ``get rel/close``, the same with ``/t=500``, ``monitor`` then
``confirm``, thrift ``get`` with ``auto_abort_msec`` then ``confirm``); reliable readers of the
fanout master and of each child; consuming reads of ``plain`` (``get plain/t=500``, thrift
``get`` without ``auto_abort_msec``). A read is *confirmed* only once its close or confirm
was answered as done (a consuming read: once its item arrived).

The checks, per queue: for reliably read queues every acknowledged item was confirmed or is
still in the queue (**lost** otherwise; an item whose confirm was sent but never answered may
have been confirmed, so it is not lost), and no item was delivered after its confirm was
answered (**confirmed again**). An item delivered, not confirmed before a kill and delivered
again is allowed and counted (redelivered-unconfirmed). For ``plain``, a consuming read whose
answer never came may have taken its item (at most once, by design, behaviour §5.3): losses up
to the number of such reads are allowed and reported apart. Exit 1 on any loss beyond that, any
confirmed item delivered again, a SIGTERM whose exit status is not 0 or a server that does not
start again on its data directory; 3 when the run itself could not be carried out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TTransportException

from kestrel_actors.client import (
    ClientError,
    ConnectFailed,
    Connection,
    ConnectionLost,
    KestrelError,
    ServerError,
    confirm_request,
    get_request,
    monitor_request,
    set_request,
)
from kestrel_actors.client.thrift import ThriftClient

from .bench import free_port
from .harness import HarnessError

__all__ = ["Ledger", "SoakOptions", "SoakResult", "main", "run_soak"]

RELIABLE_QUEUES = ("rel", "fan", "fan+a", "fan+b")
PLAIN_QUEUE = "plain"
FANOUT_CHILDREN = ("fan+a", "fan+b")
QUEUE_KINDS = {"rel": "reliable", "fan": "fanout master", "fan+a": "fanout child",
               "fan+b": "fanout child", PLAIN_QUEUE: "plain"}
CONFIG = '[queues.rel]\n[queues.plain]\n[queues.fan]\n[queues."fan+a"]\n[queues."fan+b"]\n'
REPLY_TIMEOUT = 10.0
"""Seconds a client waits for a reply before it gives the connection up (a loaded box)."""
BLOCKING_MS = 500
AUTO_ABORT_MS = 60_000
DRAIN_BATCH = 500

class ServerFailed(Exception):
    """The server did not come back on its data directory after a stop: a verdict (exit 1)."""


class NotSent(Exception):
    """A request that could not be sent (the connection was already gone)."""


_CLIENT_ERRORS = (OSError, KestrelError, TTransportException, TApplicationException, EOFError, NotSent)


@dataclasses.dataclass
class QueueLedger:
    """What the clients of one queue were told."""

    acked: set[bytes] = dataclasses.field(default_factory=set)
    confirmed: dict[bytes, float] = dataclasses.field(default_factory=dict)
    """Item -> when (monotonic) its confirm's answer (or a consuming read's item) arrived."""
    last_delivered: dict[bytes, float] = dataclasses.field(default_factory=dict)
    deliveries: dict[bytes, int] = dataclasses.field(default_factory=dict)
    confirm_unanswered: set[bytes] = dataclasses.field(default_factory=set)
    """Items whose confirm was sent and never answered: done or not, nobody knows."""
    unanswered_takes: int = 0
    """Consuming reads sent whose answer never came (each may have taken one item per slot)."""
    confirmed_again: list[bytes] = dataclasses.field(default_factory=list)
    left: list[bytes] = dataclasses.field(default_factory=list)
    """What the final drain found."""


class Ledger:
    """Every client's bookkeeping, under one lock (threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues = {queue: QueueLedger() for queue in (*RELIABLE_QUEUES, PLAIN_QUEUE)}
        self.by_reader: dict[str, int] = {}
        """Items confirmed per reader kind."""
        self.server_errors: list[str] = []
        self.serial = 0

    def payloads(self, tag: str, count: int) -> list[bytes]:
        with self.lock:
            first = self.serial
            self.serial += count
        return [b"%s-%d" % (tag.encode(), first + i) for i in range(count)]

    def acked(self, queues: tuple[str, ...], items: list[bytes]) -> None:
        with self.lock:
            for queue in queues:
                self.queues[queue].acked.update(items)

    def delivered(self, queue: str, items: list[bytes], at: float) -> None:
        with self.lock:
            ledger = self.queues[queue]
            for item in items:
                ledger.deliveries[item] = ledger.deliveries.get(item, 0) + 1
                ledger.last_delivered[item] = max(at, ledger.last_delivered.get(item, 0.0))
                done = ledger.confirmed.get(item)
                if done is not None and at > done:
                    ledger.confirmed_again.append(item)

    def confirmed(self, queue: str, items: list[bytes], at: float, reader: str) -> None:
        with self.lock:
            ledger = self.queues[queue]
            self.by_reader[reader] = self.by_reader.get(reader, 0) + len(items)
            for item in items:
                ledger.confirm_unanswered.discard(item)
                if item in ledger.confirmed or ledger.last_delivered.get(item, 0.0) > at:
                    ledger.confirmed_again.append(item)  # confirmed twice, or seen after
                ledger.confirmed[item] = at

    @contextmanager
    def confirming(self, queue: str, items: list[bytes]) -> Iterator[None]:
        """Around sending a confirm and reading its answer: the items count as unanswered
        (maybe confirmed) unless the confirm never left or the server refused it."""
        with self.lock:
            self.queues[queue].confirm_unanswered.update(items)
        try:
            yield
        except (ServerError, ClientError, TApplicationException, NotSent):
            with self.lock:
                self.queues[queue].confirm_unanswered.difference_update(items)
            raise

    def take_unanswered(self, queue: str, slots: int) -> None:
        with self.lock:
            self.queues[queue].unanswered_takes += slots

    def server_error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            self.server_errors.append(f"{where}: {exc}")


@dataclasses.dataclass(frozen=True)
class QueueSummary:
    queue: str
    kind: str
    acknowledged: int
    confirmed: int
    left: int
    lost: int
    confirmed_again: int
    redelivered_unconfirmed: int
    confirm_unanswered: int
    unanswered_confirms_done: int
    """Of those, how many the drain did not find: the confirm was done, its answer lost."""
    unanswered_takes: int
    """Plain queue only: consuming reads that may have taken an item unseen (loss allowed)."""


@dataclasses.dataclass(frozen=True)
class SoakResult:
    queues: list[QueueSummary]
    kills: int
    terms: int
    term_exit_codes: list[int]
    by_reader: dict[str, int]
    server_errors: list[str]
    seconds: float

    @property
    def lost(self) -> int:
        """Losses that break a promise (a plain queue's in-flight takes excepted)."""
        return sum(q.lost for q in self.queues if q.kind != "plain") + sum(
            max(0, q.lost - q.unanswered_takes) for q in self.queues if q.kind == "plain")

    @property
    def confirmed_again(self) -> int:
        return sum(q.confirmed_again for q in self.queues)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.confirmed_again == 0 and all(c == 0 for c in self.term_exit_codes)


def summarize(ledger: Ledger) -> list[QueueSummary]:
    rows = []
    for queue, q in ledger.queues.items():
        left = set(q.left)
        gone = q.acked - set(q.confirmed) - left
        if queue != PLAIN_QUEUE:
            gone -= q.confirm_unanswered
        # the drain's deliveries are counted too: an item read, not confirmed, and left
        again = set(q.confirmed_again)
        redelivered = sum(count - 1 for item, count in q.deliveries.items() if count > 1 and item not in again)
        rows.append(QueueSummary(
            queue, QUEUE_KINDS[queue], len(q.acked), len(q.confirmed), len(q.left), len(gone),
            len(q.confirmed_again) + (len(q.left) - len(left)), redelivered,
            len(q.confirm_unanswered), len(q.confirm_unanswered - left), q.unanswered_takes))
    return rows


# -- the server --------------------------------------------------------------------------------


@dataclasses.dataclass
class SoakOptions:
    kills: int = 50
    terms: int = 15
    seconds_between: float = 1.5
    settle_seconds: float = 3.0
    """Load after the last restart, before the drain."""
    port: int = 0
    thrift_port: int = 0
    data_dir: Path | None = None
    seed: int = 53
    serve_args: tuple[str, ...] = ("--sync-journal", "always")
    verbose: bool = False


class SoakServer:
    """``kestrel-actors serve`` on fixed ports and data directory, started again at will."""

    def __init__(self, work: Path, port: int, thrift_port: int, serve_args: tuple[str, ...]) -> None:
        self.data_dir = work / "data"
        self.config = work / "kestrel.toml"
        self.config.write_text(CONFIG)
        self.log_path = work / "server.log"
        self.port = port
        self.thrift_port = thrift_port
        self.serve_args = serve_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnation = 0

    def command(self) -> list[str]:
        return [sys.executable, "-m", "kestrel_actors.cli", "serve", "--host", "127.0.0.1",
                "--port", str(self.port), "--thrift-port", str(self.thrift_port), "--text-port", "0",
                "--admin-port", "0", "--data-dir", str(self.data_dir), "--config", str(self.config),
                "--log-level", "warning", *self.serve_args]

    def start(self, timeout: float = 120.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        self.incarnation += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"server exited with {self.proc.returncode} while starting: {self.tail()}")
            try:
                for port in (self.port, self.thrift_port):
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise HarnessError(f"server did not listen within {timeout} s: {self.tail()}")

    def stop(self, sig: int, timeout: float = 120.0) -> int:
        """Send ``sig`` and wait for the exit: the exit status (-9 for a SIGKILL)."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = -999  # a SIGTERM that did not end the server in time
        self.proc = None
        return code

    def tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


# -- the clients ----------------------------------------------------------------------------------


def send(conn: Connection, request: bytes) -> None:
    """Send, telling a request that never left (:class:`NotSent`) from one left unanswered."""
    try:
        conn.send(request)
    except (ConnectionLost, OSError) as exc:
        raise NotSent(str(exc)) from exc


@dataclasses.dataclass
class Load:
    server: SoakServer
    ledger: Ledger
    stop: threading.Event

    def memcache(self) -> Iterator[Connection]:
        """Connections, one after another: a new one each time the last one failed."""
        while not self.stop.is_set():
            conn = Connection("127.0.0.1", self.server.port, timeout=REPLY_TIMEOUT)
            try:
                conn.connect()
            except ConnectFailed:
                time.sleep(0.05)
                continue
            try:
                yield conn
            finally:
                conn.close()

    def thrift(self) -> Iterator[ThriftClient]:
        while not self.stop.is_set():
            try:
                client = ThriftClient("127.0.0.1", self.server.thrift_port, timeout=REPLY_TIMEOUT,
                                      use_gevent=False)
            except TTransportException:
                time.sleep(0.05)
                continue
            try:
                yield client
            finally:
                client.close()

    def loop(self, name: str, connections: Iterator[object], body: Callable[..., None]) -> None:
        """Run ``body(connection)`` until stopped; a failed connection is replaced by the next."""
        for conn in connections:
            try:
                while not self.stop.is_set():
                    body(conn)
            except _CLIENT_ERRORS as exc:
                if not isinstance(exc, ConnectionLost | OSError | TTransportException | EOFError | NotSent):
                    self.ledger.server_error(name, exc)

    # -- producers

    def memcache_sets(self, queue: str) -> None:
        copies = FANOUT_CHILDREN if queue == "fan" else ()

        def body(conn: Connection) -> None:
            [item] = self.ledger.payloads(f"{queue}-mc", 1)
            conn.send(set_request(queue, item))
            if conn.read_line() == b"STORED":
                self.ledger.acked((queue, *copies), [item])

        self.loop("memcache set", self.memcache(), body)

    def thrift_puts(self, queue: str) -> None:
        copies = FANOUT_CHILDREN if queue == "fan" else ()

        def body(client: ThriftClient) -> None:
            items = self.ledger.payloads(f"{queue}-th", 3)
            stored = client.put(queue, items)
            self.ledger.acked((queue, *copies), items[:stored])

        self.loop("thrift put", self.thrift(), body)

    # -- reliable readers

    def open_close(self, queue: str, wait_ms: int) -> None:
        reader = "open/close" + (f" t={wait_ms}" if wait_ms else "")
        options = f"/t={wait_ms}/open" if wait_ms else "/open"

        def body(conn: Connection) -> None:
            with conn.waiting(wait_ms / 1000):
                conn.send(get_request(queue, options))
                item = conn.read_value(queue.encode())
            if item is None:
                if not wait_ms:
                    time.sleep(0.01)
                return
            self.ledger.delivered(queue, [item], time.monotonic())
            with self.ledger.confirming(queue, [item]):
                send(conn, get_request(queue, "/close"))
                conn.read_end("get")
            self.ledger.confirmed(queue, [item], time.monotonic(), reader)

        self.loop(reader, self.memcache(), body)

    def monitor_confirm(self, queue: str) -> None:
        def body(conn: Connection) -> None:
            with conn.waiting(1):
                conn.send(monitor_request(queue, 1, 4))
                items = conn.read_values(queue.encode(), 4)
            if not items:
                return
            self.ledger.delivered(queue, items, time.monotonic())
            with self.ledger.confirming(queue, items):
                send(conn, confirm_request(queue, len(items)))
                conn.read_end("confirm")
            self.ledger.confirmed(queue, items, time.monotonic(), "monitor+confirm")

        self.loop("monitor+confirm", self.memcache(), body)

    def thrift_reliable(self, queue: str) -> None:
        def body(client: ThriftClient) -> None:
            got = client.get(queue, 1, BLOCKING_MS, auto_abort_msec=AUTO_ABORT_MS)
            if not got:
                return
            items = [item.data for item in got]
            self.ledger.delivered(queue, items, time.monotonic())
            with self.ledger.confirming(queue, items):
                done = client.confirm(queue, [item.id for item in got])
            if done == len(got):
                self.ledger.confirmed(queue, items, time.monotonic(), "thrift get+confirm")
            else:  # auto_abort_msec passed first: the item is back in the queue, not confirmed
                with self.ledger.lock:
                    self.ledger.queues[queue].confirm_unanswered.difference_update(items)
                self.ledger.server_error("thrift confirm", RuntimeError(f"{queue}: confirmed {done} of {len(got)}"))

        self.loop("thrift get+confirm", self.thrift(), body)

    # -- consuming readers (plain)

    def plain_gets(self, queue: str) -> None:
        def body(conn: Connection) -> None:
            self.ledger.take_unanswered(queue, 1)
            with conn.waiting(BLOCKING_MS / 1000):
                conn.send(get_request(queue, f"/t={BLOCKING_MS}"))
                item = conn.read_value(queue.encode())
            self.ledger.take_unanswered(queue, -1)
            if item is not None:
                now = time.monotonic()
                self.ledger.delivered(queue, [item], now)
                self.ledger.confirmed(queue, [item], now, "plain get")

        self.loop("plain get", self.memcache(), body)

    def thrift_plain(self, queue: str) -> None:
        def body(client: ThriftClient) -> None:
            self.ledger.take_unanswered(queue, 2)
            got = client.get(queue, 2, BLOCKING_MS)
            self.ledger.take_unanswered(queue, -2)
            items = [item.data for item in got]
            if items:
                now = time.monotonic()
                self.ledger.delivered(queue, items, now)
                self.ledger.confirmed(queue, items, now, "thrift plain get")

        self.loop("thrift plain get", self.thrift(), body)

    def workers(self) -> list[Callable[[], None]]:
        return [
            lambda: self.memcache_sets("rel"), lambda: self.memcache_sets("rel"),
            lambda: self.memcache_sets("fan"), lambda: self.memcache_sets(PLAIN_QUEUE),
            lambda: self.thrift_puts("rel"), lambda: self.thrift_puts("fan"),
            lambda: self.thrift_puts(PLAIN_QUEUE),
            lambda: self.open_close("rel", 0), lambda: self.open_close("rel", BLOCKING_MS),
            lambda: self.monitor_confirm("rel"), lambda: self.thrift_reliable("rel"),
            lambda: self.open_close("fan", BLOCKING_MS), lambda: self.monitor_confirm("fan"),
            lambda: self.open_close("fan+a", BLOCKING_MS), lambda: self.thrift_reliable("fan+a"),
            lambda: self.monitor_confirm("fan+b"), lambda: self.thrift_reliable("fan+b"),
            lambda: self.plain_gets(PLAIN_QUEUE), lambda: self.thrift_plain(PLAIN_QUEUE),
        ]


# -- the drain and the run ----------------------------------------------------------------------


def drain(server: SoakServer, ledger: Ledger, deadline_seconds: float = 120.0) -> None:
    """Read every queue empty with ``monitor`` + ``confirm`` (reliable, and one fdatasync per
    batch), until it has no items and no open reads (readers' hang-ups give theirs back a
    moment after they close)."""
    conn = Connection("127.0.0.1", server.port, timeout=REPLY_TIMEOUT).connect(attempts=1000, pause=0.05)
    try:
        for queue in (*RELIABLE_QUEUES, PLAIN_QUEUE):
            left = ledger.queues[queue].left
            deadline = time.monotonic() + deadline_seconds
            while True:
                with conn.waiting(1):
                    conn.send(monitor_request(queue, 1, DRAIN_BATCH))
                    items = conn.read_values(queue.encode(), DRAIN_BATCH)
                if items:
                    ledger.delivered(queue, items, time.monotonic())
                    conn.send(confirm_request(queue, len(items)))
                    conn.read_end("confirm")
                    left.extend(items)
                    continue
                conn.send(b"stats\r\n")
                stats = conn.read_stats()
                busy = int(stats.get(f"queue_{queue}_items", "0")) + int(
                    stats.get(f"queue_{queue}_open_transactions", "0"))
                if not busy:
                    break
                if time.monotonic() > deadline:
                    raise HarnessError(f"{queue} did not drain: {busy} items or open reads left")
                time.sleep(0.1)
    finally:
        conn.close()


@contextmanager
def _work_dir(data_dir: Path | None) -> Iterator[Path]:
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        yield data_dir
        return
    with tempfile.TemporaryDirectory(prefix="kestrel-kill-soak-") as tmp:
        yield Path(tmp)


def run_soak(options: SoakOptions, log: Callable[[str], None] = lambda line: None) -> SoakResult:
    """The soak, start to finish: the verdict is the result's ``ok``."""
    signals = [signal.SIGKILL] * options.kills + [signal.SIGTERM] * options.terms
    random.Random(options.seed).shuffle(signals)
    pace = random.Random(options.seed + 1)
    ledger = Ledger()
    term_codes: list[int] = []
    began = time.monotonic()
    with _work_dir(options.data_dir) as work:
        server = SoakServer(work, options.port or free_port(), options.thrift_port or free_port(),
                            options.serve_args)
        server.start()
        stop = threading.Event()
        load = Load(server, ledger, stop)
        threads = [threading.Thread(target=work_, daemon=True) for work_ in load.workers()]
        for thread in threads:
            thread.start()
        try:
            for number, sig in enumerate(signals, 1):
                time.sleep(options.seconds_between * pace.uniform(0.6, 1.4))
                stopping = time.monotonic()
                code = server.stop(sig)
                if sig == signal.SIGTERM:
                    term_codes.append(code)
                stopped = time.monotonic()
                server.start()
                log(f"{number}/{len(signals)}: {signal.Signals(sig).name} -> exit {code} in "
                    f"{stopped - stopping:.1f} s, started again in {time.monotonic() - stopped:.1f} s; "
                    f"{sum(len(q.acked) for q in ledger.queues.values())} acknowledged so far")
            time.sleep(options.settle_seconds)
        finally:
            stop.set()
            for thread in threads:
                thread.join(REPLY_TIMEOUT * 3)
        try:
            if any(thread.is_alive() for thread in threads):
                raise HarnessError("a load thread did not stop")
            draining = time.monotonic()
            drain(server, ledger)
            log(f"drained in {time.monotonic() - draining:.1f} s")
        finally:
            if server.proc is not None:
                term_codes.append(server.stop(signal.SIGTERM))
        if any(code != 0 for code in term_codes):
            log(server.tail())
    return SoakResult(summarize(ledger), options.kills, options.terms, term_codes, dict(ledger.by_reader),
                      list(ledger.server_errors), time.monotonic() - began)


def render(result: SoakResult) -> str:
    lines = [(f"kill soak: {result.kills} SIGKILLs, {result.terms} SIGTERMs in {result.seconds:.0f} s; "
             f"SIGTERM exit codes {sorted(set(result.term_exit_codes))}"),
             (f"{'queue':8} {'kind':14} {'acked':>8} {'confirmed':>9} {'left':>6} {'lost':>5} "
             f"{'conf-again':>10} {'redeliv-unconf':>14} {'conf-unanswered(done)':>21} {'takes-unanswered':>16}")]
    for q in result.queues:
        lines.append(f"{q.queue:8} {q.kind:14} {q.acknowledged:>8} {q.confirmed:>9} {q.left:>6} {q.lost:>5} "
                     f"{q.confirmed_again:>10} {q.redelivered_unconfirmed:>14} "
                     f"{f'{q.confirm_unanswered}({q.unanswered_confirms_done})':>21} "
                     f"{q.unanswered_takes:>16}")
    lines.append("confirmed per reader: " + ", ".join(f"{k} {v}" for k, v in sorted(result.by_reader.items())))
    if result.server_errors:
        lines.append(f"{len(result.server_errors)} error replies, e.g. {result.server_errors[:3]}")
    lines.append(f"acknowledged {sum(q.acknowledged for q in result.queues)}, lost {result.lost} "
                 f"(plain in-flight takes excepted), confirmed delivered again {result.confirmed_again}: "
                 + ("OK" if result.ok else "FAILED"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kestrel_actors.loadtests.kill_soak",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=50, help="SIGKILLs (default 50)")
    parser.add_argument("--terms", type=int, default=15, help="SIGTERMs (default 15)")
    parser.add_argument("--seconds-between", type=float, default=1.5,
                        help="seconds of load between stops, on average (default 1.5)")
    parser.add_argument("--settle-seconds", type=float, default=3.0,
                        help="seconds of load after the last restart (default 3)")
    parser.add_argument("--port", type=int, default=0, help="memcache port (default: a free one)")
    parser.add_argument("--thrift-port", type=int, default=0, help="thrift port (default: a free one)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="work directory for data, config and server.log (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=53, help="order of the SIGKILLs and SIGTERMs")
    parser.add_argument("--serve-arg", action="append", default=None,
                        help="extra argument for serve (repeat; default: --sync-journal always)")
    parser.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per stop")
    args = parser.parse_args(argv)
    options = SoakOptions(args.kills, args.terms, args.seconds_between, args.settle_seconds, args.port,
                          args.thrift_port, args.data_dir, args.seed,
                          tuple(args.serve_arg) if args.serve_arg else SoakOptions.serve_args, args.verbose)
    try:
        result = run_soak(options, (lambda line: print(line, flush=True)) if args.verbose else (lambda line: None))
    except ServerFailed as exc:
        print(f"kill soak FAILED: {exc}", file=sys.stderr)
        return 1
    except (HarnessError, OSError, KestrelError) as exc:
        print(f"kill soak could not run: {exc}", file=sys.stderr)
        return 3
    print(render(result))
    if args.json:
        print(json.dumps(dataclasses.asdict(result)))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
