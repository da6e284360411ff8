"""The server's CPU per item opened by ``monitor`` and confirmed: the Spark source's server work, without Spark.

``python -m kestrel_actors.loadtests.monitor_bench [--items 200000] [--item-bytes 1024] [--batch 12500] [--hold 0]
[--runs 3]``

Each run starts a fresh server (``bench.Server``), fills one queue with pipelined SETs (200,000
items of 1 KiB are 195 MiB, over ``max_memory_size``: most items are read back from the journal,
behaviour §5.8), then drains it as the source does (``spark_bridge/_kestrel.py``): ``monitor <q> 1
<batch> stamp`` (each item a REMOVE_TENTATIVE_XID record) and ``confirm <q> <n>`` for what came
back (CONFIRM_REMOVE records, answered after their journal write), until every item is confirmed,
then a SET and a GET (upkeep the journal left for later, such as rule (a)'s rewrite once the reads
are confirmed, is counted in the drain). With ``--hold N`` it holds N items open at a time as the
source's read-ahead does (a micro-batch over ``ceil(N / batch)`` connections, all opened, then all
confirmed), so the journal's upkeep writes what a long-lived reader keeps open (ADR 0022, point 2):
each run counts the server's rotations, rewrites and packs and the bytes they wrote (its log's
lines). The server's CPU time (``/proc/<pid>/stat``) is read when the fill ends and when the drain
ends. Prints one line per run, then one JSON line with every run's figures: the fill's and the
drain's server CPU µs per item (and the system part), the drain's rate, the load average.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import click

from ..client import Connection, confirm_request, get_request, monitor_request, queue_key, set_request
from .bench import KernelProfile, ProcessCounters, Server, SyscallCount

QUEUE = "bench_monitor"


_UPKEEP = re.compile(r"(rotated journal|rewrote journal|packed journal files)\b.*?\bbytes=(\d+)")
_UPKEEP_NAMES = {"rotated journal": "rotations", "rewrote journal": "rewrites", "packed journal files": "packs"}


def journal_upkeep(log: str) -> dict[str, int]:
    """The rotations, rewrites and packs a server's log (at ``info``) reports, and the bytes the
    rewrites and packs wrote (a rotation renames, writing nothing)."""
    upkeep = {"rotations": 0, "rewrites": 0, "packs": 0, "rewrite_bytes": 0, "pack_bytes": 0}
    for match in _UPKEEP.finditer(log):
        name = _UPKEEP_NAMES[match[1]]
        upkeep[name] += 1
        if name != "rotations":
            upkeep[name[:-1] + "_bytes"] += int(match[2])
    return upkeep


def settle(server: Server, wire: Connection) -> None:
    """Count the journal's upkeep left for later in the drain: with every read confirmed, a SET
    and a GET find the queue empty (rule (a) may rewrite it, behaviour §6.6); then wait, up to
    10 s, until the files it replaced are deleted (over 64 MiB, on the server's threadpool)."""
    if wire.store([set_request(QUEUE, b"x")]) != 1:
        raise click.ClickException("the settling SET was not stored")
    wire.send(get_request(QUEUE))
    reply = [wire.read_line() for _ in range(3)]  # VALUE, the item, END
    if reply[1:] != [b"x", b"END"]:
        raise click.ClickException(f"the settling GET answered {reply!r}")
    data = Path(server.tmp.name) / "data"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum(f.stat().st_size for f in data.iterdir() if f.is_file()) > 1 << 20:
        time.sleep(0.01)


def one_run(items: int, item_bytes: int, batch: int, hold: int = 0, syscalls: bool = False,
            profile: str | None = None) -> dict[str, Any]:
    server = Server(("--log-level", "info"))
    wires: list[Connection] = []
    try:
        for _ in range(max(1, math.ceil(hold / batch))):
            wires.append(Connection("127.0.0.1", server.port, 120, use_gevent=False))
            wires[-1].connect()
        wire = wires[0]
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
            # each connection opens its part of the micro-batch; all confirm once it is open
            counts: list[int] = []
            for each in wires:
                want = min(batch, items - confirmed - sum(counts))
                if want <= 0:
                    break
                each.send(monitor_request(QUEUE, 1, want, stamp=True))
                counts.append(each.read_packed_values(key, want, stamped=True).count)
            if not sum(counts):
                raise click.ClickException(f"the queue answered no item after {confirmed} of {items}")
            for each, count in zip(wires, counts, strict=False):
                if count:
                    each.send(confirm_request(QUEUE, count))
                    each.read_end("confirm")
            confirmed += sum(counts)
        settle(server, wire)
        drained = server.cpu()
        if sampled is not None:
            sampled.stop()
        drain_counters = ProcessCounters.of(server.proc.pid).since(counters).per_item(items)
        called = calls.stop() if calls is not None else None
        seconds = time.perf_counter() - drain_started
        for each in wires:
            each.close()
        upkeep = journal_upkeep(server.log.read_text(errors="replace"))
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
        "journal_upkeep": upkeep,
        **({"drain_syscalls_per_item": {name: round(n / items, 4) for name, n in called.items()}}
           if called is not None else {}),
    }


@click.command()
@click.option("--items", default=200_000, show_default=True, type=click.IntRange(1))
@click.option("--item-bytes", default=1024, show_default=True, type=click.IntRange(1))
@click.option("--batch", default=12_500, show_default=True, type=click.IntRange(1),
              help="Items one monitor asks for (the server opens at most --monitor-max-items of them).")
@click.option("--hold", default=0, show_default=True, type=click.IntRange(0),
              help="Items held open at a time, as the Spark source's read-ahead holds a micro-batch "
                   "(over ceil(hold / batch) connections; keep --batch within --monitor-max-items).")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1))
@click.option("--syscalls", is_flag=True,
              help="Count the server's system calls over each drain (perf stat; adds its cost).")
@click.option("--profile", default=None, metavar="PATH",
              help="Sample the server's CPU over the drain into PATH (perf record; the last run's).")
def main(items: int, item_bytes: int, batch: int, hold: int, runs: int, syscalls: bool, profile: str | None) -> None:
    figures = []
    for _ in range(runs):
        run = one_run(items, item_bytes, batch, hold, syscalls, profile)
        click.echo(f"drain {run['drain_cpu_us']} µs/item ({run['drain_sys_us']} sys), "
                   f"fill {run['fill_cpu_us']} µs/item, {run['drain_rate']:,} items/s, load {run['load_average']}, "
                   f"journal {run['journal_upkeep']}")
        figures.append(run)
    click.echo(json.dumps({"scenario": "monitor-confirm", "items": items, "item_bytes": item_bytes, "batch": batch,
                           "hold": hold,
                           "drain_cpu_us_median": statistics.median(r["drain_cpu_us"] for r in figures),
                           "runs": figures}))


if __name__ == "__main__":
    main()
