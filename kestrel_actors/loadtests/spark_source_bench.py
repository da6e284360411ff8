"""``kestrel`` data source throughput: items/s through a streaming query with a trivial sink.

``python -m kestrel_actors.loadtests.spark_source_bench [--items 200000] [--item-bytes 1024] [--master local[2]]``

The queue is filled first (pipelined SETs) and Spark is started. Then
``spark.readStream.format("kestrel")`` drains the queue into the ``noop`` sink (Spark's "write
nothing" sink: every row is still read, converted and handed to it), Spark's
``rate-micro-batch`` source runs through the same query shape for the same number of rows, and
so does ``python-ceiling`` (:mod:`._ceiling_source`), a Python streaming source that reads
nothing: the bound Spark's Python data source path sets for any Python source. The three run
twice, all the same size, and only the second round is reported: in the first, the JVM's JIT
compiler works on Spark's row path (several CPU seconds on this 2-core machine), and whichever
query ran first would pay for it. The second round opens with an unreported ``python-ceiling``
run, then ``python-ceiling``, ``kestrel``, ``python-ceiling`` again (the ceiling's figures are
the two runs' means) and ``rate-micro-batch``. Each query's figures
come from its progress: the time from its start to the end of its last micro-batch with rows,
to the end of its first one, the steady rows/s after that first one, and CPU µs per row of
each process taking part (the server, the Spark JVM, the source's planner process, the
executors' Python workers). Prints report lines, then one JSON line.

The comparison is like for like: ``python-ceiling`` yields the ``kestrel`` source's schema
(``value`` binary of ``--item-bytes``, ``queue``, ``server``, ``timestamp``: the same four
columns and types) in the same micro-batches (``--max-items-per-batch``) and partitions
(``--items-per-partition``), so Spark plans, generates and runs the same code for both; the
``kestrel`` query has one micro-batch more (its first is small, ADR 0013 decision 7). The JVM's
JIT compiler (``spark-jvm-jit``) is still compiling Spark's own code (Java serialization, its
scheduler, JSON, sockets) in the second round, less with each query, whichever source runs
there, most in the first (ADR 0022 point 4): so the round opens with a ``python-ceiling`` run
that takes that work and is not compared, and the ceiling is measured on both sides of
``kestrel`` (``python_ceiling_runs``). The JIT's CPU per row grows with a query's duration; it is
also shown per second of each query (``jit_cpu_per_second``).

By default a server is started on a free loopback port with a temporary data directory;
``--server host:port`` uses a running one instead (its queue ``bench_source`` is flushed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from .bench import KernelProfile, ProcessCounters, SyscallCount, process_stat
from .spark_bridge_bench import _server, fill_queues

QUEUE = "bench_source"
WARM_QUEUE = "bench_source_warm"


_POLL_SECONDS = 0.25
"""How often the bench looks at a running query. Each look is py4j calls into the JVM (the
query's progress, its exception): at 20 ms they cost the JVM and this process about half a
core of the machine's two, taken from whichever query ran longest. Every figure is read from
the query's progress, so the period does not limit their precision."""


def compile_package() -> None:
    """Write ``kestrel_actors``' bytecode (``__pycache__``), as installing the package does.

    Spark's Python processes import the package from this tree: with ``PYTHONDONTWRITEBYTECODE``
    set and no ``.pyc`` beside the sources, each one (the planner process of every query, the
    two per-query processes, each worker) compiled its pure-Python modules again, ~40 ms of
    CPU in the planner alone (0.2 µs per row of 200,000) that an installed package never
    pays."""
    import compileall

    import kestrel_actors

    compileall.compile_dir(os.path.dirname(kestrel_actors.__file__), quiet=1)


def _processes() -> dict[tuple[int, str], float]:
    """(pid, role) -> CPU seconds used, of this process and its descendants: ``bench`` (this
    process), ``server`` (the one it started), ``spark-jvm``, ``spark-jvm-jit`` (the JVM's JIT
    compiler threads, apart: they compile each new query's generated classes, a cost per query
    rather than per row), ``source-planner`` (the long-lived Python process that runs a
    streaming source's ``latestOffset``, ``partitions`` and ``commit``), ``python-workers``
    (the executors' Python processes that run ``read``, reused from query to query) and
    ``python-per-query`` (the processes Spark forks once per query to create the source and
    plan its reads: ``pyspark.sql.worker.*``, each importing the source's module)."""
    parent: dict[int, int] = {}
    seen: dict[int, tuple[bytes, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as raw:
                cmdline = raw.read()
            stat = process_stat(int(entry))
        except OSError:
            continue
        parent[int(entry)] = stat.parent
        seen[int(entry)] = (cmdline, stat.cpu)

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parent.get(pid, 0)
        return False

    used: dict[tuple[int, str], float] = {}
    for pid, (cmdline, cpu) in seen.items():
        if not ours(pid):
            continue
        role = _role(pid, cmdline)
        if role == "spark-jvm":
            jit = _jit_seconds(pid)
            used[(pid, "spark-jvm-jit")] = jit
            cpu -= jit
        used[(pid, role)] = cpu
    return used


def _jit_seconds(pid: int) -> float:
    """CPU seconds of a JVM's JIT compiler threads (HotSpot names them ``C1 CompilerThre…``
    and ``C2 CompilerThre…``)."""
    total = 0.0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the JVM ended since it was listed
        return total
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/comm") as comm:
                if "CompilerThre" not in comm.read():
                    continue
            fields = Path(f"/proc/{pid}/task/{thread}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _role(pid: int, cmdline: bytes) -> str:
    if pid == os.getpid():
        return "bench"
    if b"kestrel_actors.cli\0serve" in cmdline:
        return "server"
    if os.path.basename(cmdline.split(b"\0", 1)[0]) == b"java":
        return "spark-jvm"
    if b"python_streaming_source_runner" in cmdline:
        return "source-planner"
    if b"pyspark.sql.worker." in cmdline:
        return "python-per-query"
    return "python-workers"  # pyspark.daemon pyspark.worker and the workers it forks


class CpuWatch:
    """CPU seconds per role (:func:`_processes`) between :meth:`start` and :meth:`stop`; a
    process that appeared in between counts from zero, one that ended counts up to its last
    :meth:`sample` (the per-query processes end within the query: counted only if alive at
    the stop, they made ``python-workers`` swing between 3.9 and 12.1 µs per row)."""

    def __init__(self) -> None:
        self.before: dict[tuple[int, str], float] = {}
        self.last: dict[tuple[int, str], float] = {}
        self.seconds: dict[str, float] = {}

    def start(self) -> None:
        self.before = _processes()
        self.last = dict(self.before)

    def sample(self) -> None:
        self.last.update(_processes())

    def stop(self) -> None:
        self.sample()
        seconds: dict[str, float] = {}
        for (pid, role), used in self.last.items():
            seconds[role] = seconds.get(role, 0.0) + used - self.before.get((pid, role), 0.0)
        self.seconds = seconds

    def per_item(self, items: int) -> dict[str, float]:
        """CPU microseconds per item, per role and in all."""
        figures = {role: round(used * 1e6 / items, 1) for role, used in sorted(self.seconds.items())}
        figures["all"] = round(sum(self.seconds.values()) * 1e6 / items, 1)
        return figures


class ServerWatch:
    """The started server's :class:`~.bench.ProcessCounters` (and, with ``syscalls``, its system
    calls by name) over a query: where its CPU per row goes beside Spark, against
    ``monitor_bench``'s drain of the same items without Spark. Nothing when the server is not
    ours (``--server``)."""

    def __init__(self, cpu: CpuWatch, syscalls: bool, profile: str | None = None) -> None:
        pids = [pid for pid, role in cpu.before if role == "server"]
        self.pid = pids[0] if pids else None
        self.before = ProcessCounters.of(self.pid) if self.pid else None
        self.calls = SyscallCount(self.pid) if self.pid and syscalls else None
        self.profile = KernelProfile(self.pid, profile) if self.pid and profile else None

    def stop(self, rows: int) -> dict[str, object]:
        if self.profile is not None:
            self.profile.stop()
        if self.pid is None or self.before is None or not rows:
            return {}
        figures: dict[str, object] = dict(ProcessCounters.of(self.pid).since(self.before)
                                          .per_item(rows))
        if self.calls is not None:
            figures["syscalls"] = {name: round(n / rows, 4) for name, n in self.calls.stop().items()}
        return figures


class PlannerWatch:
    """The query's planner process (``source-planner``, new for each query, so counted from its
    start: its import of pyspark included) as :class:`~.bench.ProcessCounters` per row, with its
    CPU split by thread (``main``: Spark's calls; ``ended``: threads gone before the stop, the
    read-ahead's; ``other``: threads alive at the stop; the switches count live threads only).
    From when it is first seen (at the bench's first look at the query, after its import):
    with ``syscalls`` its system calls by name (:class:`~.bench.SyscallCount`), with
    ``profile`` perf's samples of its CPU (:class:`~.bench.KernelProfile`), with ``spy``
    py-spy's samples of its Python stacks (raw collapsed stacks; ``$PY_SPY`` names the binary)."""

    def __init__(self, syscalls: bool = False, profile: str | None = None,
                 spy: str | None = None) -> None:
        self.pid: int | None = None
        self.last: ProcessCounters | None = None
        self.threads: dict[str, float] = {}
        self.syscalls, self.profile, self.spy = syscalls, profile, spy
        self.calls: SyscallCount | None = None
        self.perf: KernelProfile | None = None
        self.spying: subprocess.Popen | None = None

    def sample(self, cpu: CpuWatch) -> None:
        if self.pid is None:
            pids = [pid for pid, role in cpu.last if role == "source-planner"
                    and (pid, role) not in cpu.before]
            if not pids:
                return
            self.pid = pids[0]
            self.calls = SyscallCount(self.pid, settle=0.0) if self.syscalls else None
            self.perf = KernelProfile(self.pid, self.profile, settle=0.0) if self.profile else None
            if self.spy:
                self.spying = subprocess.Popen(
                    [os.environ.get("PY_SPY", "py-spy"), "record", "--nonblocking", "-r", "250",
                     "-f", "raw", "-t", "-o", self.spy, "-p", str(self.pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.last = ProcessCounters.of(self.pid)
            self.threads = _thread_seconds(self.pid)
        except OSError:  # it ended with the query
            pass

    def stop(self, cpu: CpuWatch, rows: int) -> dict[str, object]:
        self.sample(cpu)
        if self.perf is not None:
            self.perf.stop()
        if self.spying is not None:
            self.spying.send_signal(2)
            self.spying.wait(60)
        if self.last is None or not rows:
            return {}
        figures: dict[str, object] = dict(self.last.per_item(rows))
        total = self.last.user + self.last.system
        main = self.threads.pop("main", 0.0)
        figures["threads_us"] = {"main": round(main * 1e6 / rows, 2),
                                 "other": round(sum(self.threads.values()) * 1e6 / rows, 2),
                                 "ended": round((total - main - sum(self.threads.values()))
                                                * 1e6 / rows, 2)}
        if self.calls is not None:
            figures["syscalls"] = {name: round(n / rows, 4) for name, n in self.calls.stop().items()}
        return figures


def _thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each live thread of ``pid``: ``main`` and by thread id."""
    seconds: dict[str, float] = {}
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{thread}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds["main" if int(thread) == pid else thread] = \
            (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def _batch_end(p) -> float:
    """When a micro-batch ended (seconds since the epoch): its progress ``timestamp`` (its
    start) plus its ``triggerExecution``."""
    from datetime import datetime

    started = datetime.fromisoformat(p["timestamp"]).timestamp()
    return started + p["durationMs"].get("triggerExecution", 0) / 1000


def _with_rows(progress) -> list:
    return [p for p in progress if p.get("numInputRows", 0) > 0]


@dataclass
class QueryFigures:
    """One measured query, every figure from its progress: ``seconds`` from its start until
    its last micro-batch with rows ended, ``first_rows`` until its first one ended (an upper
    bound on when its first rows reached the sink), ``steady`` rows/s after that first one
    (None with fewer than two batches with rows), ``cpu_us`` per row by process role."""

    rows: int
    seconds: float
    first_rows: float
    steady: float | None
    cpu_us: dict[str, float]
    progress: list
    server: dict[str, object] = field(default_factory=dict)
    """The started server's counters per row over the query (:class:`ServerWatch`)."""
    planner: dict[str, object] = field(default_factory=dict)
    """The planner process's counters per row over its life (:class:`PlannerWatch`)."""


def _figures(progress: list, started: float, cpu: CpuWatch) -> QueryFigures:
    batches = _with_rows(progress)
    rows = sum(p["numInputRows"] for p in batches)
    first, last = _batch_end(batches[0]), _batch_end(batches[-1])
    steady = None
    if len(batches) > 1 and last > first:
        steady = sum(p["numInputRows"] for p in batches[1:]) / (last - first)
    return QueryFigures(rows, last - started, first - started, steady, cpu.per_item(rows),
                        progress)


def _watch(query, done, started: float, cpu: CpuWatch,
           server: ServerWatch | None = None, planner: PlannerWatch | None = None) -> QueryFigures:
    """Look at ``query`` every :data:`_POLL_SECONDS` until ``done(progress)``; stop it."""
    planner = planner or PlannerWatch()
    try:
        while True:
            progress = query.recentProgress
            if done(progress):
                cpu.stop()  # before the stop: the planner process ends with the query
                figures = _figures(progress, started, cpu)
                if server is not None:
                    figures.server = server.stop(figures.rows)
                figures.planner = planner.stop(cpu, figures.rows)
                return figures
            if query.exception() is not None:
                raise click.ClickException(str(query.exception()))
            cpu.sample()
            planner.sample(cpu)
            time.sleep(_POLL_SECONDS)
    finally:
        query.stop()


def _rows_through(progress) -> int:
    return sum(p.get("numInputRows", 0) for p in progress)


def _drain(spark, where: str, queue: str, max_items: int, per_partition: int, count: int,
           checkpoint: str, client, read_ahead: bool = True,
           syscalls: bool = False, profile: str | None = None,
           planner: PlannerWatch | None = None) -> QueryFigures:
    """Run the ``kestrel`` source into ``noop`` until ``queue`` is empty with nothing open
    and its ``count`` rows have been through the query."""
    cpu = CpuWatch()
    cpu.start()
    server = ServerWatch(cpu, syscalls, profile)
    started = time.time()
    query = (spark.readStream.format("kestrel").option("servers", where).option("queue", queue)
             .option("maxItemsPerBatch", max_items).option("itemsPerPartition", per_partition)
             .option("readAhead", str(read_ahead).lower())
             .option("walLocation", f"{checkpoint}/kestrel-wal")
             .load().writeStream.format("noop").option("checkpointLocation", checkpoint)
             .start())

    def drained(progress) -> bool:
        if _rows_through(progress) < count:
            return False
        # Items are confirmed when their micro-batch is planned (ADR 0013): an empty queue
        # is not the end, the rows Spark has processed are.
        stats = client.queue_stats(queue)
        return stats.get("items", 0) == 0 and stats.get("open_transactions", 0) == 0

    return _watch(query, drained, started, cpu, server, planner)


def _until_rows(query_of, count: int) -> QueryFigures:
    """Start ``query_of()`` and run it until ``count`` rows have been through it."""
    cpu = CpuWatch()
    cpu.start()
    started = time.time()
    return _watch(query_of(), lambda progress: _rows_through(progress) >= count, started, cpu)


def _rate_micro_batch(spark, rows_per_batch: int, count: int, item_bytes: int,
                      checkpoint: str) -> QueryFigures:
    """Spark's own ``rate-micro-batch`` source through the same query shape (``noop`` sink),
    each row carrying a ``value`` of ``item_bytes``."""
    return _until_rows(lambda: (
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
        .load().selectExpr(f"cast(repeat('x', {item_bytes}) as binary) as value", "timestamp")
        .writeStream.format("noop").option("checkpointLocation", checkpoint).start()), count)


def _python_ceiling(spark, rows_per_batch: int, rows_per_partition: int, count: int,
                    item_bytes: int, checkpoint: str) -> QueryFigures:
    """The ``python-ceiling`` source (:mod:`._ceiling_source`: a Python streaming data source
    that reads nothing) through the same query: what Spark's Python data source path alone
    allows. It plans no rows past ``count``, so it is stopped with no task running, as the
    ``kestrel`` query is once drained (the next query then reuses the Python workers)."""
    return _until_rows(lambda: (
        spark.readStream.format("python-ceiling").option("rowsPerBatch", rows_per_batch)
        .option("rowsPerPartition", rows_per_partition).option("itemBytes", item_bytes)
        .option("rows", count).load().writeStream.format("noop").option("checkpointLocation", checkpoint).start()),
        count)


def _either_side(before: QueryFigures, after: QueryFigures) -> QueryFigures:
    """A query run just before and just after another, as one: each figure the mean of the
    two runs' (both have the same rows). The JIT compiler works less with each query of the
    reported round, so one run on one side would gain or lose that against the other query."""
    steady = [run.steady for run in (before, after) if run.steady is not None]
    return QueryFigures(before.rows, (before.seconds + after.seconds) / 2,
                        (before.first_rows + after.first_rows) / 2,
                        sum(steady) / len(steady) if steady else None,
                        _mean_counters(before.cpu_us, after.cpu_us), before.progress,
                        before.server, _mean_counters(before.planner, after.planner))


def _mean_counters(one: dict, other: dict) -> dict:
    """The mean of two runs' counters, key by key (nested ones too)."""
    mean: dict = {}
    for key, value in one.items():
        if isinstance(value, dict):
            mean[key] = _mean_counters(value, other.get(key, {}))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            mean[key] = round((value + other.get(key, value)) / 2, 4)
        else:
            mean[key] = value
    return mean


def _jit_per_second(query: QueryFigures) -> float:
    """The JIT compiler threads' CPU seconds per second of the query (start to last rows)."""
    return round(query.cpu_us.get("spark-jvm-jit", 0.0) * query.rows / 1e6 / query.seconds, 3)


def _ratio(rows: float | None, against: float | None) -> float | None:
    """``rows / against`` to two places; None when either figure is missing (a run too short
    to have a steady rate)."""
    return round(rows / against, 2) if rows and against else None


def _print_breakdown(progress) -> None:
    batches = [p for p in progress if p.get("numInputRows", 0) > 0]
    if not batches:
        return
    keys = sorted({k for p in batches for k in p.get("durationMs", {})})
    means = {k: sum(p["durationMs"].get(k, 0) for p in batches) / len(batches) for k in keys}
    rows = sum(p["numInputRows"] for p in batches) / len(batches)
    click.echo(f"{len(batches)} micro-batches of {rows:,.0f} rows; mean durationMs: "
               + ", ".join(f"{k} {v:.0f}" for k, v in sorted(means.items(), key=lambda kv: -kv[1])))


@click.command(context_settings={"max_content_width": 100})
@click.option("--items", default=200_000, show_default=True, type=click.IntRange(min=1))
@click.option("--item-bytes", default=1024, show_default=True, type=click.IntRange(min=8))
@click.option("--max-items-per-batch", default=50_000, show_default=True,
              type=click.IntRange(min=1))
@click.option("--items-per-partition", default=12_500, show_default=True,
              type=click.IntRange(min=1))
@click.option("--master", default="local[2]", show_default=True)
@click.option("--server", "address", default=None, help="host:port of a running server.")
@click.option("--serve-arg", "serve_args", multiple=True, metavar="ARG",
              help="an argument added to the started server's ``serve`` command line, e.g. "
                   "``--serve-arg=--busy-poll --serve-arg=0`` (repeatable).")
@click.option("--target", default=20_000, show_default=True, type=int,
              help="items/s the run must reach for exit code 0.")
@click.option("--read-ahead/--no-read-ahead", default=True, show_default=True,
              help="the source's readAhead option.")
@click.option("--breakdown", is_flag=True,
              help="print the mean per-micro-batch durationMs of the measured query.")
@click.option("--syscalls", is_flag=True,
              help="count the started server's system calls over the measured query (perf "
                   "stat; adds its cost to the server's CPU).")
@click.option("--profile", default=None, metavar="PATH",
              help="sample the started server's CPU (kernel and user) over the measured query "
                   "into PATH (perf record; read with perf report -i PATH).")
@click.option("--planner-syscalls", is_flag=True,
              help="count the measured query's planner process's system calls (perf stat).")
@click.option("--planner-profile", default=None, metavar="PATH",
              help="sample the measured query's planner process's CPU into PATH (perf record).")
@click.option("--planner-spy", default=None, metavar="PATH",
              help="sample the measured query's planner process's Python stacks into PATH "
                   "(py-spy record, raw collapsed stacks; $PY_SPY names the binary).")
def main(items, item_bytes, max_items_per_batch, items_per_partition, master, address,
         serve_args, target, read_ahead, breakdown, syscalls, profile, planner_syscalls,
         planner_profile, planner_spy) -> None:
    """Measure the kestrel data source's items/s through a trivial streaming query."""
    import logging

    from kestrel_actors.client import Client, ServerAddress
    from kestrel_actors.logs import configure_logging
    from kestrel_actors.spark_bridge import KestrelDataSource, create_spark_session

    from ._ceiling_source import CeilingSource

    configure_logging("console", "warning")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with _server(address, serve_args) as where, tempfile.TemporaryDirectory(prefix="source-bench-") as tmp:
        server = ServerAddress.parse(where)
        # a loaded machine can keep the server's answer to ``stats`` beyond the default 5 s
        with Client(server, timeout=60) as client:
            fill_queues(client, QUEUE, WARM_QUEUE, items, items, item_bytes)

            compile_package()
            started = time.perf_counter()
            # a loaded machine can take longer than Spark's 15 s to start a Python process
            spark = create_spark_session(master, {"spark.python.authenticate.socketTimeout": "120s"},
                                         "kestrel-source-bench", 2)
            spark.dataSource.register(KestrelDataSource)
            spark.dataSource.register(CeilingSource)
            click.echo(f"spark {master} started in {time.perf_counter() - started:.1f}s")
            try:
                # the unreported first round (see the module's docstring)
                _drain(spark, where, WARM_QUEUE, max_items_per_batch, items_per_partition,
                       items, f"{tmp}/warm", client, read_ahead)
                _rate_micro_batch(spark, max_items_per_batch, items, item_bytes,
                                  f"{tmp}/rate-warm")
                _python_ceiling(spark, max_items_per_batch, items_per_partition, items,
                                item_bytes, f"{tmp}/ceiling-warm")
                load_average = os.getloadavg()[0]
                # the round's first query takes the JIT's leftover work (module docstring)
                settling = _python_ceiling(spark, max_items_per_batch, items_per_partition,
                                           items, item_bytes, f"{tmp}/ceiling-settling")
                before = _python_ceiling(spark, max_items_per_batch, items_per_partition,
                                         items, item_bytes, f"{tmp}/ceiling-before")
                ours = _drain(spark, where, QUEUE, max_items_per_batch, items_per_partition,
                              items, f"{tmp}/run", client, read_ahead, syscalls, profile,
                              PlannerWatch(planner_syscalls, planner_profile, planner_spy))
                after = _python_ceiling(spark, max_items_per_batch, items_per_partition,
                                        items, item_bytes, f"{tmp}/ceiling-after")
                ceiling = _either_side(before, after)
                rate = _rate_micro_batch(spark, max_items_per_batch, items, item_bytes,
                                         f"{tmp}/rate")
            finally:
                spark.stop()

    if breakdown:
        _print_breakdown(ours.progress)

    def rounded(value: float | None) -> int | None:
        return None if value is None else round(value)

    figures = {
        "scenario": "spark_source",
        "master": master,
        "items": items,
        "item_bytes": item_bytes,
        "max_items_per_batch": max_items_per_batch,
        "items_per_partition": items_per_partition,
        "read_ahead": read_ahead,
        "serve_args": list(serve_args),
        "load_average_1m": round(load_average, 1),
        "seconds": round(ours.seconds, 3),
        "items_per_second": round(ours.rows / ours.seconds),
        "first_rows_seconds": round(ours.first_rows, 2),
        "steady_rows_per_second": rounded(ours.steady),
        "cpu_us_per_item": ours.cpu_us,
        "server_per_item": ours.server,
        "planner_per_item": ours.planner,
        "python_ceiling_planner_per_item": ceiling.planner,
        "rate_micro_batch_rows_per_second": round(rate.rows / rate.seconds),
        "rate_micro_batch_steady_rows_per_second": rounded(rate.steady),
        "rate_micro_batch_first_rows_seconds": round(rate.first_rows, 2),
        "rate_micro_batch_cpu_us_per_row": rate.cpu_us,
        "python_ceiling_rows_per_second": round(ceiling.rows / ceiling.seconds),
        "python_ceiling_steady_rows_per_second": rounded(ceiling.steady),
        "python_ceiling_first_rows_seconds": round(ceiling.first_rows, 2),
        "python_ceiling_cpu_us_per_row": ceiling.cpu_us,
    }
    rate_steady_rows = figures["rate_micro_batch_steady_rows_per_second"]
    figures["ratio_to_rate_micro_batch"] = _ratio(figures["items_per_second"],
                                                  figures["rate_micro_batch_rows_per_second"])
    figures["steady_ratio_to_rate_micro_batch"] = _ratio(figures["steady_rows_per_second"],
                                                         rate_steady_rows)
    figures["python_ceiling_steady_ratio_to_rate_micro_batch"] = _ratio(
        figures["python_ceiling_steady_rows_per_second"], rate_steady_rows)
    # issue 57's goals: steady >= 0.8 of the ceiling, first rows within 1 s of the ceiling's
    figures["steady_ratio_to_python_ceiling"] = _ratio(
        figures["steady_rows_per_second"], figures["python_ceiling_steady_rows_per_second"])
    figures["first_rows_after_python_ceiling_seconds"] = round(
        ours.first_rows - ceiling.first_rows, 2)
    figures["jit_cpu_per_second"] = {name: _jit_per_second(query) for name, query in
                                     (("kestrel", ours), ("python-ceiling", ceiling),
                                      ("rate-micro-batch", rate))}
    figures["python_ceiling_runs"] = {  # the settling run's, then the two compared
        "steady_rows_per_second": [rounded(run.steady) for run in (settling, before, after)],
        "jit_cpu_per_second": [_jit_per_second(run) for run in (settling, before, after)]}
    click.echo(f"source: {items:,} items drained and confirmed in {ours.seconds:.2f}s "
               f"({figures['items_per_second']:,} items/s), first rows after "
               f"{figures['first_rows_seconds']}s; rate-micro-batch through the same query: "
               f"{figures['rate_micro_batch_rows_per_second']:,} rows/s, first rows after "
               f"{figures['rate_micro_batch_first_rows_seconds']}s; ratio "
               f"{figures['ratio_to_rate_micro_batch']}; steady (after the first micro-batch) "
               f"{figures['steady_rows_per_second']} vs "
               f"{figures['rate_micro_batch_steady_rows_per_second']} rows/s, ratio "
               f"{figures['steady_ratio_to_rate_micro_batch']}")
    click.echo(f"python-ceiling (a Python streaming source that reads nothing), same query: "
               f"{figures['python_ceiling_rows_per_second']:,} rows/s, first rows after "
               f"{figures['python_ceiling_first_rows_seconds']}s, steady "
               f"{figures['python_ceiling_steady_rows_per_second']} rows/s, steady ratio "
               f"{figures['python_ceiling_steady_ratio_to_rate_micro_batch']}")
    click.echo(f"source against python-ceiling: steady ratio "
               f"{figures['steady_ratio_to_python_ceiling']}, first rows "
               f"{figures['first_rows_after_python_ceiling_seconds']:+}s")
    for name, cpu in (("kestrel", ours.cpu_us), ("python-ceiling", ceiling.cpu_us),
                      ("rate-micro-batch", rate.cpu_us)):
        click.echo(f"CPU µs per row, {name}: " + ", ".join(f"{k} {v}" for k, v in cpu.items())
                   + f"; JIT CPU s per s of the query {figures['jit_cpu_per_second'][name]}")
    click.echo(json.dumps(figures))
    sys.exit(0 if figures["items_per_second"] >= target else 2)


if __name__ == "__main__":
    main()
