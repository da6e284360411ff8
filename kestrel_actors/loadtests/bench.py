"""``make bench``: run the standard load tests against fresh servers, write docs/benchmarks.md.

    python -m kestrel_actors.loadtests.bench [--write docs/benchmarks.md] [--runs 5] [--quick] [--only NAME]
                              [--peer /tmp/peers/bin/darner] [--redis PATH | --no-redis]

Each run of a benchmark gets a fresh ``python -m kestrel_actors.cli serve`` on a free loopback
port with a fresh temporary data directory and runs its scenario as a subprocess
(``python -m kestrel_actors.loadtests ... --no-progress``, so each run is exactly the command shown in the
table); the server's CPU time over the run gives its CPU per request. With ``--peer`` (or
``PEER=`` in the environment, as ``make bench PEER=...`` passes it) each of our runs is
followed by one against that binary (darner's command line: ``-p PORT -d DIR``), and the
table gets the peer's figures and the ratio. A row with ``floor`` (the durable one: darner
cannot fsync every write) is compared instead with the floor server
(``python -m kestrel_actors.loadtests.floor_server``) given the row's ``serve`` options, its runs
interleaved with ours whether or not a peer is given (ADR 0018).

Redis's lists are the queue users would pick instead (issue 56): every row whose scenario has
a ``--resp`` mode is also run against Debian's ``redis-server`` (``--redis PATH`` or ``REDIS=``;
default: ``redis-server`` on PATH; ``--no-redis`` or ``REDIS=none`` leaves it out), the same
load test speaking RESP (``RPUSH``/``LPOP``), each run on a fresh ``redis-server`` and data
directory on a free loopback port (never the system service), its runs interleaved with ours,
its CPU per request read from /proc as ours is. Without persistence (``--save ''
--appendonly no``) for the plain rows; the durable row against ``--appendonly yes
--appendfsync always``. Each such row gets a sub-row "↳ Redis" with Redis's figures, the ratio
and the row's Redis goal; the one-client put-many row also a sub-row "↳ Redis (appendfsync no)",
Redis writing its append-only file before each reply as our journal does, reported without a
goal (ADR 0023). The rows are issue 12's: Kestrel's load-test
defaults (one request in flight per client) first, then the concurrent and pipelined rows;
variants that are not Kestrel's defaults are labelled "extra". Client and server share the
machine, so the figures are for the pair, not for the server alone.

After the table (unless ``--only`` leaves them out), ``restart_bench`` and ``memory_bench`` run once
each (issue 56 points 3 and 4: a restart with a backlog, the resident memory per queued item)
and add their own tables.

With ``--write FILE`` the table replaces whatever is between ``<!-- bench:start -->`` and
``<!-- bench:end -->`` in FILE (the markers are appended if missing; other text is kept).
Exit code 1 if any run failed a correctness check (and, with ``--strict``, if a goal was
missed); 3 if a server could not be started.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

__all__ = ["BENCHMARKS", "Benchmark", "Placement", "main", "render", "splice"]

START, END = "<!-- bench:start -->", "<!-- bench:end -->"


@dataclass(frozen=True)
class Benchmark:
    """One row of the table: a scenario command line, the server flags and the goal.

    ``goal`` is the ratio to the peer (darner) that the row must reach when a peer is given, or
    with ``floor`` to the floor server, always measured; ``target`` an absolute rate (items/s)
    used only when no peer is measured. ``redis_goal`` is the ratio to Redis (issue 56), which
    runs the row with ``redis_args`` unless ``redis`` is False (a scenario without ``--resp``);
    ``redis_also``, when given, is a second Redis run with those options, interleaved too and
    reported in a sub-row of its own without a goal.
    """

    name: str
    args: tuple[str, ...]
    unit: str
    goal: float | None = 1.0
    target: float | None = None
    serve_args: tuple[str, ...] = ()
    requires: str | None = None   # a ``serve`` option the server must offer, else skipped
    quick_args: tuple[str, ...] = ()  # replaces -n for --quick
    peer: bool = True             # whether the peer can run it (darner has no fsync knob)
    floor: bool = False           # compared with the floor server instead of the peer (ADR 0018)
    redis: bool = True            # whether Redis runs it (the scenario has a --resp mode)
    redis_goal: float | None = None
    redis_args: tuple[str, ...] = ()  # redis-server's options beyond port, bind and dir
    redis_also: tuple[str, ...] = ()  # a second Redis configuration, reported without a goal

    def load_args(self, quick: bool = False, scale: float = 1.0) -> list[str]:
        """The load-test command; with ``quick``, its ``--quick`` count times ``scale``."""
        args = list(self.args)
        if quick and self.quick_args:
            option, count = self.quick_args
            args[args.index(option) + 1] = str(max(1, round(int(count) * scale)))
        return args


REDIS_PLAIN = ("--save", "", "--appendonly", "no")
"""Redis without persistence, for the rows whose server journals without fsync."""
REDIS_AOF_NO = ("--save", "", "--appendonly", "yes", "--appendfsync", "no")
"""Redis writing every command to its append-only file (the page cache, no fsync) before it
replies, as our journal does: the like-for-like peer of a plain row (ADR 0023)."""
REDIS_DURABLE = ("--save", "", "--appendonly", "yes", "--appendfsync", "always")
"""Redis with every write fsynced before its reply, for the durable row."""

LATENCY_BOUND = (
    Benchmark("put-many, 1 client, one SET in flight", ("put-many", "-c", "1", "-n", "20000"),
              "SET/s", goal=0.95, quick_args=("-n", "2000"), redis_goal=0.9, redis_args=REDIS_PLAIN,
              redis_also=REDIS_AOF_NO),
    Benchmark("get-many (drain), 1 client", ("get-many", "-c", "1", "-n", "20000"),
              "GET/s", goal=0.95, quick_args=("-n", "2000"), redis_args=REDIS_PLAIN),
    Benchmark("flood, 1 producer + 1 consumer", ("flood", "-n", "50000"), "items/s",
              goal=0.95, quick_args=("-n", "5000"), redis_args=REDIS_PLAIN),
    Benchmark("flood, consumer blocking get q/t=1000", ("flood", "-n", "50000", "-B"), "items/s",
              goal=0.95, quick_args=("-n", "5000"), redis_args=REDIS_PLAIN),
    Benchmark("many-clients, 500 consumers get q/t=1000, producer one SET at a time",
              ("many-clients", "-c", "500", "-n", "50000", "-s", "0"), "items/s",
              goal=1.0, quick_args=("-n", "5000"), redis=False),
    Benchmark("many-clients, transactional, 10% of connections dropped",
              ("many-clients", "-c", "500", "-n", "50000", "-s", "0", "-x", "-k", "10"), "items/s",
              goal=1.0, quick_args=("-n", "5000"), redis=False),
)
"""Kestrel's defaults: every client has one request in flight (issue 12's table; goals from issue 56:
many-clients at darner's rate, one client and the floods within 5% of it)."""

CONCURRENT = (
    Benchmark("put-many, 100 clients, one SET in flight each", ("put-many", "-c", "100", "-n", "100000"),
              "SET/s", target=30_000, quick_args=("-n", "10000"), redis_args=REDIS_PLAIN),
    Benchmark("get-many, 100 clients, one GET in flight each", ("get-many", "-c", "100", "-n", "100000"),
              "GET/s", target=50_000, quick_args=("-n", "10000"), redis_args=REDIS_PLAIN),
    Benchmark("mixed, 100 clients each alternating a SET and a GET", ("mixed", "-c", "100", "-n", "50000"),
              "requests/s", quick_args=("-n", "5000"), redis_args=REDIS_PLAIN),
    Benchmark("put-many, 10 clients x 32 SETs per write", ("put-many", "-c", "10", "-r", "32", "-n", "320000"),
              "SET/s", goal=2.0, target=100_000, quick_args=("-n", "32000"), redis_args=REDIS_PLAIN),
    Benchmark("get-many, 10 clients x 32 GETs per write", ("get-many", "-c", "10", "-r", "32", "-n", "320000"),
              "GET/s", goal=2.0, quick_args=("-n", "32000"), redis_goal=0.8, redis_args=REDIS_PLAIN),
)
"""Where concurrency (or pipelining, ``-r``) lets the server batch."""

EXTRA = (
    Benchmark("extra: many-clients, transactional, 10% kills, producer pipelines 16 SETs (-r 16)",
              ("many-clients", "-c", "500", "-n", "50000", "-s", "0", "-k", "10", "-x", "-r", "16"),
              "items/s", goal=None, quick_args=("-n", "5000"), redis=False),
    Benchmark("durable put-many (fsync every write), 100 clients",
              ("put-many", "-c", "100", "-n", "20000"), "SET/s", goal=0.9,
              serve_args=("--sync-journal", "always"), requires="--sync-journal",
              quick_args=("-n", "2000"), peer=False, floor=True, redis_goal=1.0, redis_args=REDIS_DURABLE),
)
"""Not Kestrel's defaults: labelled "extra". The durable row is measured against the floor server
with a group commit (darner cannot fsync every write; ADR 0018 replaced issue 24's absolute
35,000 SET/s with this ratio), and against Redis with ``appendfsync always`` (issue 56)."""

BENCHMARKS = LATENCY_BOUND + CONCURRENT + EXTRA


@dataclass
class Side:
    """One server's runs of one benchmark (ours, or the peer's)."""

    records: list[dict] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)  # µs per request, one per run
    server_sys: list[float] = field(default_factory=list)  # of which system (kernel) µs

    def median(self, key: str, sub: str | None = None) -> float:
        values = [(r[key][sub] if sub else r[key]) for r in self.records]
        return statistics.median(values) if values else 0.0

    def cpu(self) -> float | None:
        return statistics.median(self.server_cpu) if self.server_cpu else None

    def sys(self) -> float | None:
        return statistics.median(self.server_sys) if self.server_sys else None

    def client_busy(self) -> float:
        """Median client CPU time over the headline run, in % of one core."""
        values = [100.0 * r.get("client_cpu_seconds", 0.0) / r["wall_seconds"]
                  for r in self.records if r.get("wall_seconds")]
        return statistics.median(values) if values else 0.0


@dataclass
class Row:
    bench: Benchmark
    command: str
    ours: Side = field(default_factory=Side)
    peer: Side | None = None
    redis: Side | None = None
    redis_also: Side | None = None
    failures: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def records(self) -> list[dict]:
        return self.ours.records

    def median(self, key: str, sub: str | None = None) -> float:
        return self.ours.median(key, sub)

    def ratio(self) -> float | None:
        if self.peer is None or not self.peer.records or not self.ours.records:
            return None
        return self.ours.median("rate") / max(self.peer.median("rate"), 1e-9)

    @property
    def met(self) -> bool | None:
        if not self.records or self.failures:
            return False if self.failures else None
        ratio = self.ratio()
        if ratio is not None and self.bench.goal is not None:
            return ratio >= self.bench.goal
        if self.bench.target is not None and self.peer is None:
            return self.median("rate") >= self.bench.target
        return None

    def redis_ratio(self, side: Side | None = None) -> float | None:
        """Our median rate over Redis's (``side``: that of another Redis configuration)."""
        side = self.redis if side is None else side
        if side is None or not side.records or not self.ours.records:
            return None
        return self.ours.median("rate") / max(side.median("rate"), 1e-9)

    @property
    def redis_met(self) -> bool | None:
        """The Redis goal: None when the row has none or Redis was not measured."""
        ratio = self.redis_ratio()
        if self.bench.redis_goal is None or self.redis is None:
            return None
        if ratio is None or self.failures:
            return False
        return ratio >= self.bench.redis_goal


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_help() -> str:
    return subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "serve", "--help"],
                          capture_output=True, text=True, timeout=60).stdout


class ProcessStat(NamedTuple):
    """What the benches read of a process in ``/proc/<pid>/stat`` (Linux)."""

    parent: int
    cpu: float
    """User + system CPU seconds so far."""
    system: float
    processor: int
    """The CPU it last ran on."""


def process_stat(pid: int) -> ProcessStat:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return ProcessStat(int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, int(fields[12]) / tick,
                       int(fields[36]))


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User + system CPU time of a process so far, and the system part."""
    stat = process_stat(pid)
    return stat.cpu, stat.system


@dataclass(frozen=True)
class ProcessCounters:
    """What a process has done so far, over its live threads (Linux ``/proc``): CPU seconds in
    user and kernel mode, context switches it asked for (it waited: for a socket, a lock) and
    forced on it (preempted), its read- and write-family system calls (``/proc/<pid>/io``:
    ``read``/``recv``/``readv``..., ``write``/``send``/``writev``...) and its page faults (minor:
    a page mapped on first touch; major: read from disk). Read before and after a stretch of
    work (:meth:`since`) to tell where a process's CPU per item went. ``written``: bytes handed
    to ``write``-family calls (sockets and files alike, ``wchar``)."""

    user: float
    system: float
    voluntary: int
    involuntary: int
    reads: int
    writes: int
    minor_faults: int
    major_faults: int
    written: int

    @classmethod
    def of(cls, pid: int) -> ProcessCounters:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        voluntary = involuntary = 0
        for thread in os.listdir(f"/proc/{pid}/task"):
            try:
                status = Path(f"/proc/{pid}/task/{thread}/status").read_text()
            except OSError:  # the thread ended since it was listed
                continue
            for line in status.splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    involuntary += int(line.split()[1])
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        return cls(int(fields[11]) / tick, int(fields[12]) / tick, voluntary, involuntary,
                   int(io["syscr"]), int(io["syscw"]), int(fields[7]), int(fields[9]),
                   int(io["wchar"]))

    def since(self, before: ProcessCounters) -> ProcessCounters:
        return ProcessCounters(self.user - before.user, self.system - before.system,
                               self.voluntary - before.voluntary,
                               self.involuntary - before.involuntary,
                               self.reads - before.reads, self.writes - before.writes,
                               self.minor_faults - before.minor_faults,
                               self.major_faults - before.major_faults,
                               self.written - before.written)

    def per_item(self, items: int) -> dict[str, float]:
        """CPU µs (user, system) and events per item (context switches, system calls)."""
        return {"user_us": round(self.user * 1e6 / items, 2),
                "system_us": round(self.system * 1e6 / items, 2),
                "voluntary_switches": round(self.voluntary / items, 4),
                "involuntary_switches": round(self.involuntary / items, 4),
                "read_calls": round(self.reads / items, 4),
                "write_calls": round(self.writes / items, 4),
                "minor_faults": round(self.minor_faults / items, 4),
                "major_faults": round(self.major_faults / items, 4),
                "written_bytes": round(self.written / items)}


class SyscallCount:
    """Every system call a process makes between construction and :meth:`stop`, by name
    (``perf stat`` on the kernel's ``syscalls:sys_enter_*`` tracepoints: counted in the
    kernel, without ``strace``'s stop per call). Needs ``perf`` and the right to trace."""

    def __init__(self, pid: int, settle: float = 0.5) -> None:
        self.output = tempfile.NamedTemporaryFile(prefix="syscalls-", suffix=".csv")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-e", "syscalls:sys_enter_*",
             "-p", str(pid), "-o", self.output.name], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        # perf attaches to each tracepoint before counting (~0.2 s); ``settle`` 0 for a process
        # that must not wait for it (counted from a moment later)
        time.sleep(settle)

    def stop(self) -> dict[str, int]:
        """Calls by name (``all``: every call), those made at least once."""
        self.proc.send_signal(2)  # SIGINT: perf prints its counts and ends
        self.proc.wait(30)
        counts: dict[str, int] = {}
        for line in Path(self.output.name).read_text().splitlines():
            fields = line.split(",")
            if len(fields) < 3 or not fields[0].isdigit() or fields[0] == "0":
                continue
            name = fields[2].removeprefix("syscalls:sys_enter_")
            counts["all" if name == "raw_syscalls:sys_enter" else name] = int(fields[0])
        self.output.close()
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


class KernelProfile:
    """Samples where a process spends its CPU, kernel and user, between construction and
    :meth:`stop`: ``perf record -e cpu-clock -g`` into ``path`` (read it with ``perf report -i
    path --sort sym``). The clock event works in a guest without hardware counters."""

    def __init__(self, pid: int, path: str, settle: float = 0.3) -> None:
        self.proc = subprocess.Popen(
            ["perf", "record", "-e", "cpu-clock", "-F", "2000", "-g", "-p", str(pid), "-o", path],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(settle)

    def stop(self) -> None:
        self.proc.send_signal(2)
        self.proc.wait(60)


class Placement:
    """Samples, every ``every`` seconds on a thread of its own, whether two processes last ran on
    the same CPU (``/proc/<pid>/stat``), until :meth:`stop` -> the share of samples that did."""

    def __init__(self, first: int, second: int, every: float = 0.01) -> None:
        self.pids = first, second
        self.every = every
        self.same = self.samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        first, second = self.pids
        while not self._done.wait(self.every):
            try:
                same = process_stat(first).processor == process_stat(second).processor
            except (OSError, IndexError, ValueError):  # one has ended
                continue
            self.same += same
            self.samples += 1

    def stop(self) -> float | None:
        self._done.set()
        self._thread.join()
        return self.same / self.samples if self.samples else None


class Server:
    """A server subprocess on a free port with a fresh temporary data directory: ours
    (``kestrel-actors serve``), with ``peer`` that binary (darner's command line), with
    ``floor`` the floor server, or with ``redis`` that ``redis-server`` (in the foreground,
    loopback only, its data in the fresh directory); ``extra`` goes to ours, the floor or Redis."""

    def __init__(self, extra: tuple[str, ...] = (), peer: str | None = None, floor: bool = False,
                 redis: str | None = None) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="kestrel-bench-")
        self.port = free_port()
        self.log = Path(self.tmp.name) / "server.log"
        data = Path(self.tmp.name) / "data"
        data.mkdir()
        if redis:
            command = [redis, "--port", str(self.port), "--bind", "127.0.0.1", "--daemonize", "no",
                       "--protected-mode", "yes", "--dir", str(data), "--logfile", "", *extra]
        elif peer:
            command = [peer, "-p", str(self.port), "-d", str(data)]
        elif floor:
            command = [sys.executable, "-m", "kestrel_actors.loadtests.floor_server", str(self.port),
                       str(data / "journal"), *extra]
        else:
            command = [sys.executable, "-m", "kestrel_actors.cli", "serve", "--text-port", "0", "--admin-port", "0",
                       "--thrift-port", "0",
                       "--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(data),
                       "--log-level", "warning", *extra]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server did not listen within 30 s: {self.tail()}")

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def cpu(self) -> tuple[float, float]:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> int:
        """SIGTERM (SIGKILL after 30 s), then the data directory removed: the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.tmp.cleanup()
        return self.proc.returncode


def handled(record: dict) -> int:
    """Requests the server handled in a run: the measured items plus any fill before them."""
    return int(record.get("items", 0)) + int(record.get("fill", {}).get("items", 0))


def run_once(args: list[str], side: Side, serve_args: tuple[str, ...], peer: str | None,
             label: str, failures: list[str], floor: bool = False, redis: str | None = None) -> None:
    """One run on a fresh server and data directory (with ``redis``, a fresh ``redis-server``
    and the load test's ``--resp``); appends to ``side`` or ``failures``."""
    if redis:
        args = [*args, "--resp"]
    try:
        server = Server(serve_args, peer, floor, redis)
    except RuntimeError as exc:
        failures.append(f"{label}: server did not start: {exc}"[:500])
        return
    try:
        before = server.cpu()
        command = [sys.executable, "-m", "kestrel_actors.loadtests", *args, "-p", str(server.port),
                   "--no-progress", "--timeout", "900"]
        load = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        placement = Placement(server.proc.pid, load.pid)
        try:
            out, err = load.communicate(timeout=1000)
        except subprocess.TimeoutExpired:
            load.kill()
            out, err = load.communicate()
        same_cpu = placement.stop()
        after = server.cpu()
    finally:
        server.stop()
    lines = out.strip().splitlines()
    try:
        record = json.loads(lines[-1])
    except (IndexError, ValueError):
        record = None
    if load.returncode != 0 or record is None:
        failures.append(f"{label}: exit {load.returncode}: {(err or out)[-500:]}")
        return
    side.records.append(record)
    per_request = 1e6 / max(handled(record), 1)
    side.server_cpu.append((after[0] - before[0]) * per_request)
    side.server_sys.append((after[1] - before[1]) * per_request)
    shared = "" if same_cpu is None else f", on the load generator's vCPU {same_cpu:.0%} of the run"
    print(f"  {label}: {record['rate']:,.0f}, server CPU {side.server_cpu[-1]:.0f} µs/request "
          f"(system {side.server_sys[-1]:.0f}){shared}", flush=True)


def run_bench(bench: Benchmark, runs: int, quick: bool, procs: int, help_text: str,
              peer: str | None = None, redis: str | None = None) -> Row:
    """``runs`` runs of ``bench``; with ``peer`` (or the row's ``floor``), the peer's (the floor
    server's) runs interleaved with ours, and with ``redis`` (where the row has a Redis run) Redis's."""
    args = bench.load_args(quick)
    if procs > 1:
        args += ["--procs", str(procs)]
    row = Row(bench, "python -m kestrel_actors.loadtests " + " ".join(args))
    if bench.requires and bench.requires not in help_text:
        row.skipped = f"server has no {bench.requires} option"
        return row
    with_peer = peer if bench.peer else None
    peer_side = row.peer = Side() if with_peer or bench.floor else None
    redis_side = row.redis = Side() if redis and bench.redis else None
    also_side = row.redis_also = Side() if redis_side is not None and bench.redis_also else None
    for number in range(runs):
        run_once(args, row.ours, bench.serve_args, None, f"run {number + 1}", row.failures)
        if peer_side is not None and bench.floor:
            run_once(args, peer_side, bench.serve_args, None, f"floor run {number + 1}", row.failures, floor=True)
        elif peer_side is not None:
            run_once(args, peer_side, (), with_peer, f"peer run {number + 1}", row.failures)
        if redis_side is not None:
            run_once(args, redis_side, bench.redis_args, None, f"Redis run {number + 1}", row.failures,
                     redis=redis)
        if also_side is not None:
            run_once(args, also_side, bench.redis_also, None,
                     f"Redis ({_redis_mode(bench.redis_also)}) run {number + 1}", row.failures, redis=redis)
    return row


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _rate(side: Side | None, floor: bool = False) -> str:
    if side is None or not side.records:
        return "—"
    return ("floor: " if floor else "") + f"{side.median('rate'):,.0f}"


def _cpu(side: Side | None) -> str:
    """CPU µs per request with its system part: ``28 (5)``."""
    cpu = side.cpu() if side is not None else None
    sys_us = side.sys() if side is not None else None
    if cpu is None:
        return "—"
    return f"{cpu:,.0f} ({sys_us:,.0f})" if sys_us is not None else f"{cpu:,.0f}"


def _ratio(ratio: float) -> str:
    """Two decimals, cut rather than rounded: 0.996 is "0.99", never the "1.00" of a goal it missed.
    (The epsilon keeps a ratio of exactly 0.29, stored as 0.28999…, from printing as 0.28.)"""
    return f"{math.floor(ratio * 100 + 1e-9) / 100:.2f}"


def redis_version(redis: str) -> str:
    """``redis-server --version``'s ``v=…``, or "unknown"."""
    try:
        out = subprocess.run([redis, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return "unknown"
    return next((word[2:] for word in out.split() if word.startswith("v=")), "unknown")


def _goal(goal: float | None, against: str = "") -> str:
    if goal is None:
        return "—"
    digits = f"{goal:.2f}"
    digits = digits[:-1] if digits.endswith("0") else digits  # 1.0, 0.9, 0.95
    return f"≥ {digits}×" + (f" {against}" if against else "")


def _met(met: bool | None) -> str:
    return {True: "yes", False: "no", None: "—"}[met]


def _redis_mode(args: tuple[str, ...]) -> str:
    """How a Redis run persists, from its options: the sub-row's name."""
    if "--appendfsync" in args:
        return "appendfsync " + args[args.index("--appendfsync") + 1]
    return "no persistence"


def _redis_row(row: Row, also: bool = False) -> str:
    """The sub-row under a benchmark with Redis's runs: its figures in the peer's columns, the
    ratio of our median to its, the Redis goal; latencies, lost/dup and client CPU of its runs.
    With ``also``, the row's second Redis configuration's, reported without a goal."""
    bench = row.bench
    side = row.redis_also if also else row.redis
    assert side is not None
    name = f"↳ Redis ({_redis_mode(bench.redis_also if also else bench.redis_args)})"
    goal = "—" if also else _goal(bench.redis_goal, "Redis")
    met = "—" if also else _met(row.redis_met)
    command = f"`{row.command} --resp`"
    if not side.records:
        return f"| {name} | | | | failed | | | {goal} | {met} | | | | | {command} |"
    rates = [r["rate"] for r in side.records]
    ratio = row.redis_ratio(side)
    lost = sum(r["lost"] for r in side.records)
    dup = sum(r["duplicated"] for r in side.records)
    return (f"| {name} | | {min(rates):,.0f}–{max(rates):,.0f} | | Redis: {_rate(side)} | {_cpu(side)} "
            f"| {'—' if ratio is None else _ratio(ratio)} | {goal} | {met} "
            f"| {side.median('latency_usec', 'p50'):,.0f} | {side.median('latency_usec', 'p99'):,.0f} "
            f"| {lost} / {dup} | {side.client_busy():.0f}% | {command} |")


def _redis_rows(row: Row) -> list[str]:
    """The Redis sub-rows under a benchmark: its goal's, then a second configuration's."""
    rows = [_redis_row(row)] if row.redis is not None else []
    return rows + ([_redis_row(row, also=True)] if row.redis_also is not None else [])


def render(rows: list[Row], runs: int, load: float | None = None, peer: str | None = None,
           redis: str | None = None) -> str:
    """The markdown that goes between the markers (``load``: 1-min load average at start)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    busy = f" Load average before the runs: {load:.2f} (other work on the machine skews figures)." \
        if load is not None else ""
    peer_text = (f" Peer: `{peer}` (darner), run on the same machine, its runs interleaved with ours, "
                 "each on a fresh server and data directory." if peer else
                 " No peer was given (`make bench PEER=/tmp/peers/bin/darner` adds darner's columns).")
    peer_text += (f" Redis: `{redis}` {redis_version(redis)}, run by the same load tests with `--resp` "
                  "(`RPUSH`/`LPOP`, `BLPOP` for the blocking GET), without persistence (`--save '' "
                  "--appendonly no`), for the durable row with `--appendonly yes --appendfsync always`, and "
                  "under the one-client put-many also with `--appendonly yes --appendfsync no` (its append-only "
                  "file written before each reply, as our journal is; no goal, ADR 0023), "
                  "its runs interleaved with ours, each on a fresh server and data directory; its "
                  "figures are in the \"↳ Redis\" rows under ours." if redis else
                  " Redis was left out (`--no-redis`, or no `redis-server`).")
    out = [
        f"Measured {now} on {machine()}; commit {git_commit()}.{busy}{peer_text}",
        (f"Client and server share the machine. Median of {runs} runs each, a fresh server and data "
         "directory per run; items 1 KiB (many-clients: 751 bytes, Kestrel's lyric size). Rates are "
         "per second. \"CPU µs\" is the server process's CPU time (user + system) over the run "
         "divided by the items it handled (plus the fill of get-many; a flood or many-clients item "
         "is one SET and one GET); in brackets its system (kernel) part, which shows the VM's "
         "regime (about 5 µs per one-client request in the fast one, 25 in the slow one: compare "
         "rows only inside one run). p50/p99 are our "
         "latencies in microseconds per request (per burst for rollups; on a Redis row, Redis's, as "
         "are its runs' range, lost/dup and client CPU). Produced by `make bench` "
         "(`python -m kestrel_actors.loadtests.bench`)."),
        "",
        ("Goals (issue 56): the 100-client and mixed rows at ≥ 1.0× darner, the pipelined rows at ≥ 2.0×, "
         "many-clients (plain and transactional) at ≥ 1.0×, one client and the floods at ≥ 0.95×, the "
         "durable row at ≥ 0.9× the floor server with a group commit (`floor_server.py "
         "--sync-journal always`, its runs interleaved with ours; ADR 0018: darner cannot fsync every "
         "write, and issue 24's absolute 35,000 SET/s measured the VM's phase). Against Redis "
         "(issue 56): the one-client put-many at ≥ 0.9×, the pipelined get-many at ≥ 0.8×, the "
         "durable row at ≥ 1.0× Redis with `appendfsync always`; the other Redis rows are "
         "reported without a goal. Rows marked \"extra\" are not Kestrel's defaults."),
        "",
        ("| Benchmark | kestrel-actors | Runs (min–max) | CPU µs (sys) | Peer | Peer CPU µs (sys) | Ratio "
         "| Goal | Met | p50 | p99 | Lost / dup | Client CPU | Command |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        bench = row.bench
        if bench.goal is not None:
            goal = _goal(bench.goal, "floor" if bench.floor else "")
        elif bench.target is not None:
            goal = f"≥ {bench.target:,.0f}"
        else:
            goal = "—"
        if row.skipped:
            out.append(f"| {bench.name} | skipped | | | | | | {goal} | — | | | | | {row.skipped} |")
            continue
        if not row.records:
            peer_cells = f"{_rate(row.peer, bench.floor)} | {_cpu(row.peer)}"
            out.append(f"| {bench.name} | failed | | | {peer_cells} | | {goal} | no | | | | | `{row.command}` |")
            out += _redis_rows(row)
            continue
        met = _met(row.met)
        lost = sum(r["lost"] for r in row.records)
        dup = sum(r["duplicated"] for r in row.records)
        rates = [r["rate"] for r in row.records]
        ratio = row.ratio()
        out.append(
            f"| {bench.name} | {row.median('rate'):,.0f} {bench.unit} | {min(rates):,.0f}–{max(rates):,.0f} "
            f"| {_cpu(row.ours)} | {_rate(row.peer, bench.floor)} | {_cpu(row.peer)} "
            f"| {'—' if ratio is None else _ratio(ratio)} | {goal} | {met} "
            f"| {row.median('latency_usec', 'p50'):,.0f} | {row.median('latency_usec', 'p99'):,.0f} "
            f"| {lost} / {dup} | {row.ours.client_busy():.0f}% | `{row.command}` |")
        out += _redis_rows(row)
    failures = [f"* {row.bench.name}: {f}" for row in rows for f in row.failures]
    if failures:
        out += ["", "Failed runs:", "", *failures]
    return "\n".join(out)


_HEADER = """# Benchmarks

Throughput of kestrel-actors under the load tests in `kestrel_actors/loadtests/` (Kestrel's
`src/scripts/load` tools, re-done in Python with gevent, plus `get-many`).

* `make bench` (or `.venv/bin/python -m kestrel_actors.loadtests.bench --write docs/benchmarks.md`) starts
  a fresh server per benchmark on a free loopback port, runs each scenario five times and
  rewrites the table below. `--quick` runs 10x fewer items; `--only WORD` picks benchmarks.
* One scenario by hand, against a running server:
  `.venv/bin/python -m kestrel_actors.loadtests put-many -c 100 -n 100000 -p 22133` (or
  `kestrel-actors load put-many ...`); `--help` on each scenario lists Kestrel's option
  letters. Every scenario prints Kestrel's report lines and then one JSON line of figures,
  and exits 1 on a correctness failure (lost, duplicated, reordered or corrupted items, an
  unexpected reply).
* With Debian's `redis-server` on PATH (or `--redis PATH`), rows whose scenario has `--resp`
  also run against Redis lists (`RPUSH`/`LPOP`), each with a "↳ Redis" row under it;
  `--no-redis` leaves them out.
"""


RESTART_ITEMS = 4_000_000
"""Items of 100 B in the restart benchmark's big queue (issue 56 point 3); ``--quick``: a tenth."""


def _restart_figures(quick: bool) -> dict[str, object] | str:
    """``restart_bench``'s figures, or why there are none."""
    items = RESTART_ITEMS // 10 if quick else RESTART_ITEMS
    return _script_figures("restart_bench", "--items", str(items))


def _script_figures(script: str, *args: str) -> dict[str, object] | str:
    """The JSON figures on the last line of ``python -m kestrel_actors.loadtests.SCRIPT ARGS``,
    or why there are none."""
    command = [sys.executable, "-m", f"kestrel_actors.loadtests.{script}", *args]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return "timed out"
    if proc.returncode != 0:
        return f"failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def render_restart(figures: dict[str, object] | str) -> str:
    """The restart benchmark's table (``restart_bench``): seconds from the second start."""
    out = [
        "### Restart with a backlog",
        "",
        ("`python -m kestrel_actors.loadtests.restart_bench`: one queue's backlog of 100 B items, "
        "and a tail SET after its checkpoint, SIGKILL, restart; seconds from the restart's exec."),
        "",
    ]
    if isinstance(figures, str):
        return "\n".join([*out, f"Not measured: {figures}."])
    out += [
        ("| items | journal MiB | ports answer (s) | other queue serves (s) | big queue's first item (s) "
        "| server CPU by then (s) | big queue loaded (s) | journal replayed MiB | RSS MiB (peak) |"),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        (f"| {figures['items']:,} + {figures.get('tail_items', 0):,} | {figures['journal_mib']} "
        f"| {max(float(figures[f'{name}_port_s']) for name in ('memcache', 'text', 'thrift', 'admin')):.2f} "  # type: ignore[arg-type]
        f"| {figures['other_queue_s']} | {figures['big_first_item_s']} | {figures.get('big_first_item_cpu_s', '?')} "
        f"| {figures['big_loaded_s']} "
        f"| {figures.get('replayed_mib', '?')}{'' if figures.get('from_checkpoint') else ' (no checkpoint)'} "
        f"| {figures['rss_mib']} ({figures['peak_rss_mib']}) |"),
    ]
    return "\n".join(out)


MEMORY_ITEMS = 1_000_000
"""Items of 100 B the memory benchmark holds in one queue (issue 56 point 4); ``--quick``: a tenth."""


def _memory_figures(quick: bool) -> dict[str, object] | str:
    """``memory_bench``'s figures, or why there are none."""
    return _script_figures("memory_bench", "--items", str(MEMORY_ITEMS), *(["--quick"] if quick else []))


def render_memory(figures: dict[str, object] | str) -> str:
    """The memory benchmark's table (``memory_bench``): resident memory per item held."""
    out = [
        "### Memory per queued item",
        "",
        ("`python -m kestrel_actors.loadtests.memory_bench`: 100 B items SET into one queue that holds "
         "them all in memory; the server's VmRSS growth per item (goal: at most 150 B)."),
        "",
    ]
    if isinstance(figures, str):
        return "\n".join([*out, f"Not measured: {figures}."])
    out += [
        "| items | item B | RSS before (MiB) | RSS after (MiB) | RSS B per item |",
        "|---:|---:|---:|---:|---:|",
        (f"| {figures['items']:,} | {figures['item_bytes']} | {figures['rss_before_mib']} "
         f"| {figures['rss_after_mib']} | {figures['rss_bytes_per_item']} |"),
    ]
    return "\n".join(out)


def splice(text: str, table: str) -> str:
    """Put ``table`` between the markers of ``text`` (appending the markers if missing)."""
    block = f"{START}\n{table}\n{END}"
    if START in text and END in text and text.index(START) < text.index(END):
        head, rest = text.split(START, 1)
        return head + block + rest.split(END, 1)[1]
    if not text.strip():
        text = _HEADER
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kestrel_actors.loadtests.bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--write", metavar="FILE", help="update the table in this markdown file")
    parser.add_argument("--runs", type=int, default=5, help="runs per benchmark (default 5)")
    parser.add_argument("--quick", action="store_true", help="10x fewer items, for a smoke test")
    parser.add_argument("--procs", type=int, default=1, help="client processes per run")
    parser.add_argument("--only", action="append", default=[],
                        help="run only benchmarks whose name contains this (repeatable)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a goal is missed")
    parser.add_argument("--peer", metavar="BINARY", default=os.environ.get("PEER") or None,
                        help="a darner binary to measure side by side (env PEER)")
    parser.add_argument("--redis", metavar="PATH", default=os.environ.get("REDIS") or None,
                        help="the redis-server to measure beside us (env REDIS; default: redis-server "
                             "on PATH, if any; REDIS=none leaves it out)")
    parser.add_argument("--no-redis", action="store_true", help="no Redis rows")
    opts = parser.parse_args(argv)
    redis = None if opts.no_redis or opts.redis == "none" else (opts.redis or shutil.which("redis-server"))
    if redis is not None and shutil.which(redis) is None:
        print(f"bench: no redis-server at {redis} (make redis installs Debian's; --no-redis leaves it out)",
              file=sys.stderr)
        return 3
    if redis is None and not opts.no_redis and opts.redis != "none":
        print("bench: no redis-server on PATH: the Redis rows are left out (make redis installs it)", flush=True)
    help_text = serve_help()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    rows = []
    for bench in BENCHMARKS:
        if opts.only and not any(word in bench.name for word in opts.only):
            continue
        print(f"{bench.name}:", flush=True)
        row = run_bench(bench, max(1, opts.runs), opts.quick, opts.procs, help_text, opts.peer, redis)
        if row.skipped:
            print(f"  skipped: {row.skipped}", flush=True)
        rows.append(row)
    table = render(rows, max(1, opts.runs), load, opts.peer, redis)
    if not opts.only or any(word in "restart" for word in opts.only):
        print("restart with a backlog:", flush=True)
        table += "\n\n" + render_restart(_restart_figures(opts.quick))
    if not opts.only or any(word in "memory" for word in opts.only):
        print("memory per queued item:", flush=True)
        table += "\n\n" + render_memory(_memory_figures(opts.quick))
    print()
    print(table)
    if opts.write:
        path = Path(opts.write)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(splice(path.read_text() if path.exists() else "", table))
        print(f"\nwrote {path}")
    if any(row.failures for row in rows):
        return 1
    if opts.strict and any(row.met is False or row.redis_met is False for row in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
