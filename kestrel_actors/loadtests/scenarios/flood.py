"""``flood``: producer/consumer throughput through one queue (Kestrel's ``Flood``).

``-R`` producers SET ``-n`` items of ``-k`` KB between them (contiguous id ranges, ``-r`` per
write) while ``-C`` consumers read until the run has received ``n``: plain ``get <q>`` (a miss
is a "spin"), ``get <q>/t=1000`` with ``-B``, or with ``-r`` > 1 ``monitor <q> 1 <r>`` then
``confirm <q> <got>`` (the server needs ``--max-open-transactions`` >= r for that).

``-P`` items are put first and stay in the queue as a backlog, as in Kestrel. Every consumer
checks FIFO order: per producer, ids must increase, and no backlog item may follow a
producer's item. Items are id-stamped, so lost and duplicated items are counted too.
"""

from __future__ import annotations

import math
import time

import click

from kestrel_actors.client import END, UnexpectedReply, confirm_request, monitor_request

from ..admin import flush_queues, queue_stats
from ..command import common_options, resp_option, scenario_entry
from ..dialect import dialect_of
from ..output import say
from ..report import Outcome, tally
from ..runner import ClientContext, ClientSpec, Options, Plan, run
from . import _thrift
from ._stamped import HitChecker, OrderChecker, producer_specs

__all__ = ["command", "consumer"]


def consumer(ctx: ClientContext) -> None:
    """Read until ``total`` items were received run-wide, checking bytes and FIFO order."""
    queue, total, rollup = ctx.args["queue"], ctx.args["total"], ctx.args["rollup"]
    limit, size = ctx.args["limit"], ctx.args["size"]
    dialect, blocking = dialect_of(ctx.options), ctx.args["blocking"]
    check, order = HitChecker.of(dialect, queue, size, limit, blocking), OrderChecker(ctx.args["starts"])
    rec, shared, conn, now = ctx.recorder("get"), ctx.shared, ctx.conn, time.monotonic_ns
    read = dialect.read_take(conn)
    wait_ms = 1000 if blocking else 0
    request = monitor_request(queue, 1, rollup) if rollup > 1 else dialect.take_request(queue, wait_ms)
    while shared.total() < total:
        t0 = now()
        conn.send(request)
        opened = got = 0
        for _ in range(rollup + 1 if rollup > 1 else 1):
            reply = read(check.hit_len)
            if reply is None:
                break
            opened += 1
            item = check.item(reply)
            order.check(item)
            if shared.mark(item):
                got += 1
            else:
                rec.dups += 1
        else:
            if rollup > 1:
                raise UnexpectedReply(f"monitor sent more than {rollup} items")
        if rollup > 1 and opened:
            conn.exchange(confirm_request(queue, opened), END)
        if got:
            rec.done(t0, got)
        elif not opened:
            rec.miss()


def flood(options: Options, flush: bool, epoch: int, total: int, kilobytes: int, queue: str,
          prefill: int, producers: int, consumers: int, rollup: int, blocking: bool, thrift: bool = False,
          thrift_port: int = 2229) -> Outcome:
    size = 1024 * kilobytes
    if options.resp and (thrift or rollup > 1):
        raise click.UsageError("--resp takes one item per request (a Redis list has no monitor/confirm), "
                               "and not --thrift")
    if flush:
        flush_queues(options, [queue])
    if prefill:
        say("prefill: %d items of %dkB" % (prefill, kilobytes))
        if thrift:
            fill = _thrift.producer_specs(queue, prefill, 1, size, thrift_port, rollup=32, recorder="prefill")
        else:
            fill = producer_specs(queue, prefill, 1, size, rollup=32, recorder="prefill")
        filled = run(Plan(fill, progress="prefill", target=prefill, label="prefill"), options, epoch)
        if filled.failures or filled.errors:
            outcome = Outcome("flood", filled.get("prefill"))
            outcome.absorb(filled, headline=False)
            return outcome
    say("flood: producers=%d each sending %d items (in chunks of %d) of %dkB to %s" % (
        producers, math.ceil(total / producers), rollup, kilobytes, queue))
    say("flood: consumers=%d each reading %d items (in chunks of %d) from %s" % (
        consumers, math.ceil(total / consumers), rollup, queue))
    if thrift:
        specs = _thrift.producer_specs(queue, total, producers, size, thrift_port, first=prefill, rollup=rollup)
    else:
        specs = producer_specs(queue, total, producers, size, first=prefill, rollup=rollup)
    starts = [0] + [spec.kwargs["first"] for spec in specs]
    args = {"queue": queue, "total": total, "rollup": rollup, "size": size, "starts": starts,
            "limit": prefill + total, "blocking": blocking}
    if thrift:  # get(max_items=r) removes up to r items per call: no monitor/confirm needed
        role, args = "kestrel_actors.loadtests.scenarios._thrift:flood_consumer", {**args, "thrift_port": thrift_port}
    else:
        role = "kestrel_actors.loadtests.scenarios.flood:consumer"
    specs += [ClientSpec(role, args) for _ in range(consumers)]
    # producers first, then consumers: dealing round-robin spreads each kind over --procs
    specs.sort(key=lambda spec: spec.role.endswith("consumer"))
    result = run(Plan(specs, progress="get", target=total, label="flood",
                      track_ids=prefill + total), options, epoch)
    fig = result.get("get")
    ms = int(result.wall_seconds * 1000)
    say("Finished in %d msec (%.1f usec/put throughput)." % (ms, ms * 1000.0 / (total * consumers)))
    say("Consumer(s) spun %d times in misses." % fig.misses)
    outcome = Outcome("flood", fig, wall_seconds=result.wall_seconds,
                      series={"get": fig, "put": result.get("put")},
                      extra={"producers": producers, "consumers": consumers, "rollup": rollup,
                             "kilobytes": kilobytes, "prefill": prefill, "procs": options.procs,
                             "protocol": "thrift" if thrift else dialect_of(options).name,
                             "put": result.get("put").summary()})
    outcome.absorb(result)
    if not result.errors:
        missing, outcome.duplicated = tally(result.seen)
        left = queue_stats(options, queue).get("items", 0) if missing else 0
        outcome.lost = max(0, len(missing) - left)
    return outcome


@click.command("flood")
@click.option("-n", "total", default=10000, show_default=True, type=click.IntRange(1),
              help="Items to send through the queue.")
@click.option("-k", "kilobytes", default=1, show_default=True, type=click.IntRange(1),
              help="KB per item.")
@click.option("-q", "queue", default="spam", show_default=True, help="Queue name.")
@click.option("-P", "prefill", default=0, show_default=True, type=click.IntRange(0),
              help="Items put first and left in the queue as a backlog.")
@click.option("-R", "producers", default=1, show_default=True, type=click.IntRange(1),
              help="Producers.")
@click.option("-C", "consumers", default=1, show_default=True, type=click.IntRange(1),
              help="Consumers.")
@click.option("-r", "rollup", default=1, show_default=True, type=click.IntRange(1),
              help="SETs per write; consumers then use monitor/confirm in chunks of this size.")
@click.option("-B", "blocking", is_flag=True, help="Blocking reads (get <q>/t=1000).")
@click.option("-M", "monitor", is_flag=True, help="Print the queue's stats every second.")
@_thrift.thrift_options
@resp_option
@common_options
def command(monitor, **kwargs) -> None:
    """Producers and consumers flood items through one queue; FIFO order is checked."""
    scenario_entry(flood)(monitor=kwargs["queue"] if monitor else None, **kwargs)
