"""``kestrel`` data source throughput: items/s through a streaming query with a trivial sink.

``python -m kestrel_actors.loadtests.spark_source_bench [--items 200000] [--item-bytes 1024] [--master local[2]]``

The queue is filled first (pipelined SETs), Spark is started and one small query warms the
Python workers up; then ``spark.readStream.format("kestrel")`` drains the queue into the
``noop`` sink (Spark's "write nothing" sink: every row is still read, converted and handed to
it). The figure is items divided by the time from the query's start until the queue is empty
with no item left open and every item has been through the query (the progress's
``numInputRows``). Then Spark's ``rate-micro-batch`` source runs through the same query shape
for the same number of rows, for comparison, and so does ``python-ceiling``
(:mod:`._ceiling_source`), a Python streaming source that reads nothing: the bound Spark's
Python data source path sets for any Python source. Prints report lines, then one JSON line.

By default a server is started on a free loopback port with a temporary data directory;
``--server host:port`` uses a running one instead (its queue ``bench_source`` is flushed).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import click

from .spark_bridge_bench import _server, fill_queues

QUEUE = "bench_source"
WARM_QUEUE = "bench_source_warm"


def _server_cpu_seconds() -> float | None:
    """CPU seconds used so far by the server this process started (None with --server)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and b"kestrel_actors.cli\0serve" in cmdline:
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


class _FirstRows:
    """Seconds from a query's start until its first micro-batch with rows has finished (an
    upper bound on when its first rows reached the sink)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.seconds: float | None = None

    def look(self, query) -> None:
        if self.seconds is None and any(p.get("numInputRows", 0) > 0
                                        for p in query.recentProgress):
            self.seconds = time.perf_counter() - self.started


def steady_rows_per_second(progress) -> float | None:
    """Rows per second after the first micro-batch with rows: the rows of the later batches
    over the time from the end of that first batch to the end of the last one (each batch's
    end is its progress ``timestamp`` plus its ``triggerExecution``). None with fewer than two
    batches with rows."""
    from datetime import datetime

    def end(p) -> float:
        started = datetime.fromisoformat(p["timestamp"]).timestamp()
        return started + p["durationMs"].get("triggerExecution", 0) / 1000

    batches = [p for p in progress if p.get("numInputRows", 0) > 0]
    if len(batches) < 2:
        return None
    seconds = end(batches[-1]) - end(batches[0])
    return sum(p["numInputRows"] for p in batches[1:]) / seconds if seconds > 0 else None


def _drain(spark, where: str, queue: str, max_items: int, per_partition: int, count: int,
           checkpoint: str, client, breakdown: bool = False, read_ahead: bool = True,
           first_rows: list[float] | None = None, steady: list[float] | None = None) -> float:
    """Run a query until ``queue`` is empty with nothing open and its ``count`` rows have been
    through the query; return its seconds (and, with
    ``breakdown``, print the mean per-micro-batch ``durationMs`` of Spark's query progress;
    ``first_rows`` gets the seconds until the first batch with rows was done)."""
    started = time.perf_counter()
    query = (spark.readStream.format("kestrel").option("servers", where).option("queue", queue)
             .option("maxItemsPerBatch", max_items).option("itemsPerPartition", per_partition)
             .option("readAhead", str(read_ahead).lower())
             .option("walLocation", f"{checkpoint}/kestrel-wal")
             .load().writeStream.format("noop").option("checkpointLocation", checkpoint)
             .start())
    first = _FirstRows(started)
    try:
        while True:
            first.look(query)
            stats = client.queue_stats(queue)
            # Items are confirmed when their micro-batch is planned (ADR 0013): an empty queue
            # is not the end, the rows Spark has processed are.
            processed = sum(p.get("numInputRows", 0) for p in query.recentProgress)
            if (stats.get("items", 0) == 0 and stats.get("open_transactions", 0) == 0
                    and processed >= count):
                seconds = time.perf_counter() - started
                first.look(query)
                if first_rows is not None and first.seconds is not None:
                    first_rows.append(first.seconds)
                rate = steady_rows_per_second(query.recentProgress)
                if steady is not None and rate is not None:  # None: too few batches to tell
                    steady.append(rate)
                if breakdown:
                    _print_breakdown(query.recentProgress)
                return seconds
            if query.exception() is not None:
                raise click.ClickException(str(query.exception()))
            time.sleep(0.02)
    finally:
        query.stop()


def _until_rows(query, count: int, started: float) -> tuple[float, float | None, float | None]:
    """Wait until ``count`` rows have been through ``query`` (started at ``started``), stop it:
    (seconds from the start, seconds to the first batch with rows, steady rows/s)."""
    first = _FirstRows(started)
    try:
        while True:
            first.look(query)
            done = sum(p.get("numInputRows", 0) for p in query.recentProgress)
            if done >= count:
                return (time.perf_counter() - started, first.seconds,
                        steady_rows_per_second(query.recentProgress))
            if query.exception() is not None:
                raise click.ClickException(str(query.exception()))
            time.sleep(0.02)
    finally:
        query.stop()


def _rate_micro_batch(spark, rows_per_batch: int, count: int, item_bytes: int,
                      checkpoint: str) -> tuple[float, float | None, float | None]:
    """Spark's own ``rate-micro-batch`` source through the same query shape (``noop`` sink),
    each row carrying a ``value`` of ``item_bytes``: (seconds for ``count`` rows counted from
    the query's start, seconds to the first batch with rows, steady rows/s)."""
    started = time.perf_counter()
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
             .load().selectExpr(f"cast(repeat('x', {item_bytes}) as binary) as value",
                                "timestamp")
             .writeStream.format("noop").option("checkpointLocation", checkpoint).start())
    return _until_rows(query, count, started)


def _python_ceiling(spark, rows_per_batch: int, rows_per_partition: int, count: int,
                    item_bytes: int, checkpoint: str) -> tuple[float, float | None, float | None]:
    """The ``python-ceiling`` source (:mod:`._ceiling_source`: a Python streaming data source
    that reads nothing) through the same query: what Spark's Python data source path alone
    allows. The same three figures as :func:`_rate_micro_batch`."""
    started = time.perf_counter()
    query = (spark.readStream.format("python-ceiling").option("rowsPerBatch", rows_per_batch)
             .option("rowsPerPartition", rows_per_partition).option("itemBytes", item_bytes)
             .load().writeStream.format("noop").option("checkpointLocation", checkpoint)
             .start())
    return _until_rows(query, count, started)


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
@click.option("--target", default=20_000, show_default=True, type=int,
              help="items/s the run must reach for exit code 0.")
@click.option("--read-ahead/--no-read-ahead", default=True, show_default=True,
              help="the source's readAhead option.")
@click.option("--breakdown", is_flag=True,
              help="print the mean per-micro-batch durationMs of the measured query.")
def main(items, item_bytes, max_items_per_batch, items_per_partition, master, address,
         target, read_ahead, breakdown) -> None:
    """Measure the kestrel data source's items/s through a trivial streaming query."""
    import logging

    from kestrel_actors.client import Client, ServerAddress
    from kestrel_actors.logs import configure_logging
    from kestrel_actors.spark_bridge import KestrelDataSource, create_spark_session

    from ._ceiling_source import CeilingSource

    configure_logging("console", "warning")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with _server(address) as where, tempfile.TemporaryDirectory(prefix="source-bench-") as tmp:
        server = ServerAddress.parse(where)
        # a loaded machine can keep the server's answer to ``stats`` beyond the default 5 s
        with Client(server, timeout=60) as client:
            fill_queues(client, QUEUE, WARM_QUEUE, items, min(max_items_per_batch, items), item_bytes)

            started = time.perf_counter()
            spark = create_spark_session(master, {}, "kestrel-source-bench", 2)
            spark.dataSource.register(KestrelDataSource)
            spark.dataSource.register(CeilingSource)
            click.echo(f"spark {master} started in {time.perf_counter() - started:.1f}s")
            try:
                _drain(spark, where, WARM_QUEUE, max_items_per_batch, items_per_partition,
                       min(max_items_per_batch, items), f"{tmp}/warm", client,
                       read_ahead=read_ahead)
                _rate_micro_batch(spark, max_items_per_batch, max_items_per_batch,
                                  item_bytes, f"{tmp}/rate-warm")
                _python_ceiling(spark, max_items_per_batch, items_per_partition,
                                max_items_per_batch, item_bytes, f"{tmp}/ceiling-warm")
                load_average = os.getloadavg()[0]
                cpu_before = _server_cpu_seconds()
                first_rows: list[float] = []
                steady: list[float] = []
                seconds = _drain(spark, where, QUEUE, max_items_per_batch,
                                 items_per_partition, items, f"{tmp}/run", client,
                                 breakdown, read_ahead, first_rows, steady)
                cpu_after = _server_cpu_seconds()
                rate_seconds, rate_first, rate_steady = _rate_micro_batch(
                    spark, max_items_per_batch, items, item_bytes, f"{tmp}/rate")
                ceiling_seconds, ceiling_first, ceiling_steady = _python_ceiling(
                    spark, max_items_per_batch, items_per_partition, items, item_bytes,
                    f"{tmp}/ceiling")
            finally:
                spark.stop()

    figures = {
        "scenario": "spark_source",
        "master": master,
        "items": items,
        "item_bytes": item_bytes,
        "max_items_per_batch": max_items_per_batch,
        "items_per_partition": items_per_partition,
        "read_ahead": read_ahead,
        "load_average_1m": round(load_average, 1),
        "server_cpu_seconds": (None if cpu_before is None or cpu_after is None
                               else round(cpu_after - cpu_before, 2)),
        "seconds": round(seconds, 3),
        "items_per_second": round(items / seconds),
        "first_rows_seconds": round(first_rows[0], 2) if first_rows else None,
        "steady_rows_per_second": round(steady[0]) if steady and steady[0] else None,
        "rate_micro_batch_rows_per_second": round(items / rate_seconds),
        "rate_micro_batch_steady_rows_per_second": round(rate_steady) if rate_steady else None,
        "rate_micro_batch_first_rows_seconds": (None if rate_first is None
                                                else round(rate_first, 2)),
        "python_ceiling_rows_per_second": round(items / ceiling_seconds),
        "python_ceiling_steady_rows_per_second": round(ceiling_steady) if ceiling_steady else None,
        "python_ceiling_first_rows_seconds": (None if ceiling_first is None
                                              else round(ceiling_first, 2)),
    }
    rate_steady_rows = figures["rate_micro_batch_steady_rows_per_second"]
    figures["ratio_to_rate_micro_batch"] = _ratio(figures["items_per_second"],
                                                  figures["rate_micro_batch_rows_per_second"])
    figures["steady_ratio_to_rate_micro_batch"] = _ratio(figures["steady_rows_per_second"],
                                                         rate_steady_rows)
    figures["python_ceiling_steady_ratio_to_rate_micro_batch"] = _ratio(
        figures["python_ceiling_steady_rows_per_second"], rate_steady_rows)
    click.echo(f"source: {items:,} items drained and confirmed in {seconds:.2f}s "
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
    click.echo(json.dumps(figures))
    sys.exit(0 if figures["items_per_second"] >= target else 2)


if __name__ == "__main__":
    main()
