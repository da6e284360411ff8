"""The server's CPU per item opened by ``monitor`` and confirmed: the Spark source's server work, without Spark.

``python -m kestrel_actors.loadtests.monitor_bench [--items 200000] [--item-bytes 1024] [--batch 12500] [--runs 3]``

Each run starts a fresh server (``bench.Server``), fills one queue with pipelined SETs (200,000
items of 1 KiB are 195 MiB, over ``max_memory_size``: most items are read back from the journal,
behaviour §5.8), then drains it as the source does (``spark_bridge/_kestrel.py``): ``monitor <q> 1
<batch> stamp`` (each item a REMOVE_TENTATIVE_XID record) and ``confirm <q> <n>`` for what came back
(CONFIRM_REMOVE records, answered after their journal write), until every item is confirmed. The
server's CPU time (``/proc/<pid>/stat``) is read when the fill ends and when the drain ends.
Prints one line per run, then one JSON line with every run's figures: the fill's and the drain's
server CPU µs per item (and the system part), the drain's rate, the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import click

from ..client import Connection, confirm_request, monitor_request, queue_key, set_request
from .bench import KernelProfile, ProcessCounters, Server, SyscallCount

QUEUE = "bench_monitor"


def one_run(items: int, item_bytes: int, batch: int, syscalls: bool = False,
            profile: str | None = None) -> dict[str, Any]:
    server = Server()
    try:
        wire = Connection("127.0.0.1", server.port, 120, use_gevent=False)
        wire.connect()
        started = server.cpu()
        stored = wire.store([set_request(QUEUE, b"x" * item_bytes)] * items)
        if stored != items:
            raise click.ClickException(f"the fill stored {stored} of {items} items")
        filled = server.cpu()
        counters = ProcessCounters.of(server.proc.pid)
        calls = SyscallCount(server.proc.pid) if syscalls else None
        sampled = KernelProfile(server.proc.pid, profile) if profile else None
        drain_started = time.perf_counter()
        key = queue_key(QUEUE)
        confirmed = 0
        while confirmed < items:
            want = min(batch, items - confirmed)
            wire.send(monitor_request(QUEUE, 1, want, stamp=True))
            count = wire.read_packed_values(key, want, stamped=True).count
            if not count:
                raise click.ClickException(f"the queue answered no item after {confirmed} of {items}")
            wire.send(confirm_request(QUEUE, count))
            wire.read_end("confirm")
            confirmed += count
        drained = server.cpu()
        if sampled is not None:
            sampled.stop()
        drain_counters = ProcessCounters.of(server.proc.pid).since(counters).per_item(items)
        called = calls.stop() if calls is not None else None
        seconds = time.perf_counter() - drain_started
        wire.close()
    finally:
        server.stop()
    return {
        "fill_cpu_us": round((filled[0] - started[0]) / items * 1e6, 2),
        "fill_sys_us": round((filled[1] - started[1]) / items * 1e6, 2),
        "drain_cpu_us": round((drained[0] - filled[0]) / items * 1e6, 2),
        "drain_sys_us": round((drained[1] - filled[1]) / items * 1e6, 2),
        "drain_rate": round(items / seconds),
        "load_average": round(os.getloadavg()[0], 1),
        "drain_counters": drain_counters,
        **({"drain_syscalls_per_item": {name: round(n / items, 4) for name, n in called.items()}}
           if called is not None else {}),
    }


@click.command()
@click.option("--items", default=200_000, show_default=True, type=click.IntRange(1))
@click.option("--item-bytes", default=1024, show_default=True, type=click.IntRange(1))
@click.option("--batch", default=12_500, show_default=True, type=click.IntRange(1),
              help="Items one monitor asks for (the server opens at most --monitor-max-items of them).")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1))
@click.option("--syscalls", is_flag=True,
              help="Count the server's system calls over each drain (perf stat; adds its cost).")
@click.option("--profile", default=None, metavar="PATH",
              help="Sample the server's CPU over the drain into PATH (perf record; the last run's).")
def main(items: int, item_bytes: int, batch: int, runs: int, syscalls: bool, profile: str | None) -> None:
    figures = []
    for _ in range(runs):
        run = one_run(items, item_bytes, batch, syscalls, profile)
        click.echo(f"drain {run['drain_cpu_us']} µs/item ({run['drain_sys_us']} sys), "
                   f"fill {run['fill_cpu_us']} µs/item, {run['drain_rate']:,} items/s, load {run['load_average']}")
        figures.append(run)
    click.echo(json.dumps({"scenario": "monitor-confirm", "items": items, "item_bytes": item_bytes, "batch": batch,
                           "drain_cpu_us_median": statistics.median(r["drain_cpu_us"] for r in figures),
                           "runs": figures}))


if __name__ == "__main__":
    main()
