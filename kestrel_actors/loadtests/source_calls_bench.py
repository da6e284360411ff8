"""The ``kestrel`` source's planner CPU per item, through the source's own calls, without Spark.

``python -m kestrel_actors.loadtests.source_calls_bench [--items 300000] [--runs 3]``

Each run starts a fresh server (``bench.Server``), fills one queue with ``--items`` items of
``--item-bytes`` (pipelined SETs), and makes the calls Spark's planner process makes of the
stream reader, in Spark's order, until the queue is drained: ``latestOffset(start)`` (plan the
next batch: publish the read-ahead's write-ahead file, confirm, read the next batch ahead on a
thread), ``partitions(start, end)`` (the slices; no executor reads them), ``commit(end)``. The
planner's CPU is this process's (its calls and the read-ahead's thread), counted from when the
third batch's read-ahead has ended, over the items of the batches opened after it (the first
batch is small, ``FIRST_BATCH_ITEMS``; the second's pages are fresh). ``first_batches_cpu_us``
is the planner's CPU per item before that, over the four batches opened by then: the first two
full batches' files and buffers are new pages (ADR 0022 point 3), which a query of 200,000
items (``spark_source_bench``) pays on half its rows. What is not here: Spark's
own work in the planner process (pickling partitions, py4j), which is the same for any source.
Prints µs of CPU per item for the planner and the server, each run and their medians as JSON,
with the planner's :class:`~.bench.ProcessCounters` per item over the measured batches.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from typing import Any

import click

import kestrel_actors

from ..client import Connection, set_request
from .bench import ProcessCounters, Server

QUEUE = "bench_source"
_WARM_BATCHES = 3


def one_run(items: int, item_bytes: int, per_batch: int, per_partition: int) -> dict[str, Any]:
    from ..spark_bridge._source import KestrelDataSource, KestrelStreamReader

    server = Server()
    try:
        wire = Connection("127.0.0.1", server.port, 120, use_gevent=False)
        wire.connect()
        stored = wire.store([set_request(QUEUE, b"x" * item_bytes)] * items)
        wire.close()
        if stored != items:
            raise click.ClickException(f"the fill stored {stored} of {items} items")
        with tempfile.TemporaryDirectory(prefix="source-calls-bench-") as wal:
            reader = KestrelDataSource({
                "servers": f"127.0.0.1:{server.port}", "queue": QUEUE, "walLocation": wal,
                "maxItemsPerBatch": str(per_batch), "itemsPerPartition": str(per_partition),
            }).streamReader(None)
            assert isinstance(reader, KestrelStreamReader), reader  # (options it refuses)
            try:
                start = reader.initialOffset()
                _ = reader.live  # connects (and imports what the planner uses) before the clock
                batches = measured = planned = first = 0
                cpu_started = server_started = 0.0
                first_started = time.process_time()
                counters = ProcessCounters.of(os.getpid())
                while planned < items:
                    end = reader.latestOffset(start, None)
                    if end == start:
                        raise click.ClickException(f"no batch after {planned} of {items} items")
                    count = sum(end["items"].values())
                    planned += count
                    batches += 1
                    if batches > _WARM_BATCHES:
                        measured += count
                    if batches <= _WARM_BATCHES + 1:  # opened by the first batches' CPU
                        first += count
                    reader.partitions(start, end)
                    reader.commit(end)
                    start = end
                    if batches == _WARM_BATCHES:
                        prefetch = reader.live.prefetch
                        if prefetch is not None:
                            prefetch.wait()
                        cpu_started, server_started = time.process_time(), server.cpu()[0]
                        first_cpu = cpu_started - first_started
                        counters = ProcessCounters.of(os.getpid())
                cpu = time.process_time() - cpu_started
                planner = ProcessCounters.of(os.getpid()).since(counters)
                server_cpu = server.cpu()[0] - server_started
            finally:
                reader.stop()
    finally:
        server.stop()
    if not measured:
        raise click.ClickException(f"{items} items make no batch after the first {_WARM_BATCHES}: "
                                   f"raise --items or lower --batch")
    return {"planner_cpu_us": round(cpu / measured * 1e6, 3),
            "first_batches_cpu_us": round(first_cpu / first * 1e6, 3),
            "server_cpu_us": round(server_cpu / measured * 1e6, 3),
            "planner": planner.per_item(measured) if measured else {},
            "measured_items": measured, "batches": batches,
            "load_average": round(os.getloadavg()[0], 1)}


@click.command()
@click.option("--items", default=300_000, show_default=True, type=click.IntRange(1))
@click.option("--item-bytes", default=1024, show_default=True, type=click.IntRange(1))
@click.option("--batch", default=50_000, show_default=True, type=click.IntRange(1),
              help="maxItemsPerBatch")
@click.option("--partition", default=12_500, show_default=True, type=click.IntRange(1),
              help="itemsPerPartition")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1))
def main(items: int, item_bytes: int, batch: int, partition: int, runs: int) -> None:
    figures = []
    for _ in range(runs):
        run = one_run(items, item_bytes, batch, partition)
        click.echo(f"planner {run['planner_cpu_us']} µs CPU/item (the first batches "
                   f"{run['first_batches_cpu_us']}), server {run['server_cpu_us']} "
                   f"({run['measured_items']} items measured, load {run['load_average']})")
        figures.append(run)
    click.echo(json.dumps({
        "scenario": "source-calls", "kestrel_actors": kestrel_actors.__file__, "items": items,
        "item_bytes": item_bytes, "batch": batch, "partition": partition,
        "planner_cpu_us_median": statistics.median(r["planner_cpu_us"] for r in figures),
        "server_cpu_us_median": statistics.median(r["server_cpu_us"] for r in figures),
        "first_batches_cpu_us_median": statistics.median(r["first_batches_cpu_us"]
                                                         for r in figures),
        "runs": figures}))


if __name__ == "__main__":
    main()
