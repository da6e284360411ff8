"""``leaky-reader``: reliable reads, a fraction never confirmed (Kestrel's ``LeakyThriftReader``),
over memcache or, with ``--thrift``, over thrift as Kestrel's is.

One producer SETs items ``%08x`` for ids 0 … n-1. ``-t`` consumers loop until the run has
confirmed n items: ``get <q>/t=100/open``; then with probability 1 - ``-d`` they confirm
with ``get <q>/close`` (which must answer ``END``) and count the id, otherwise they drop the
connection without confirming, so the server must abort the open read and deliver the item
again. Every id must end up confirmed exactly once.

Kestrel's thrift client relies on a 5 s auto-abort; over memcache the hang-up aborts at once.
With ``--thrift`` (behaviour §8.7): one producer ``put``s the items, and consumers
``get(q, 1, 100, auto_abort_msec=-a)``, confirm with probability 1 - ``-d`` (the confirm must
count 1), and otherwise drop the item without a word -- the server's auto-abort timer must
bring it back (the consumer goes on on a new connection; closing one aborts nothing). The
flush and the final check then go over thrift too: the run needs no memcache port, and ``-p``
names the thrift port unless ``--thrift-port`` does, as in Kestrel's tool.
"""

from __future__ import annotations

import random
import time

import click

from kestrel_actors.client import END, get_request

from ..admin import flush_queues, queue_stats
from ..command import common_options, scenario_entry
from ..harness import CONNECT_ATTEMPTS
from ..output import say
from ..report import Outcome, tally
from ..runner import ClientContext, ClientSpec, Options, Plan, run
from . import _thrift
from ._stamped import HitChecker, producer_specs

__all__ = ["command", "consumer"]

ITEM_BYTES = 8  # just the "%08x" id, as in Kestrel


def consumer(ctx: ClientContext) -> None:
    """Open, then confirm (or, with probability ``drop``, hang up) until all are confirmed."""
    queue, total, drop = ctx.args["queue"], ctx.args["total"], ctx.args["drop"]
    check = HitChecker(queue, ITEM_BYTES, total)
    open_request, close_request = get_request(queue, "/t=100/open"), get_request(queue, "/close")
    rec, shared, conn, now = ctx.recorder("confirm"), ctx.shared, ctx.conn, time.monotonic_ns
    rng = random.Random()
    while shared.total() < total:
        if not conn.connected:
            conn.connect(CONNECT_ATTEMPTS)
        t0 = now()
        conn.send(open_request)
        reply = conn.read_get(check.hit_len)
        if reply is None:
            rec.miss()
            continue
        item = check.item(reply)
        if rng.random() < drop:
            conn.close()
            rec.bump("dropped")
            continue
        conn.exchange(close_request, END)
        if shared.mark(item):
            rec.done(t0)
            confirmed = shared.total()
            if confirmed % 1000 == 0:
                say(str(confirmed))
        else:
            rec.dups += 1


def leaky_reader(options: Options, flush: bool, epoch: int, total: int, drop: float, queue: str | None,
                 threads: int, auto_abort_msec: int = 5000, thrift: bool = False,
                 thrift_port: int = 2229) -> Outcome:
    if queue is None:
        queue = "spam-thrift" if thrift else "spam"  # Kestrel's LeakyThriftReader's default
    say("leaky-reader: %d threads each sending %d items through %s" % (threads, total, queue))
    if flush:
        flush_queues(options, [queue])
    if thrift:
        specs = _thrift.producer_specs(queue, total, 1, ITEM_BYTES, thrift_port)
        args = {"queue": queue, "total": total, "drop": drop, "size": ITEM_BYTES,
                "auto_abort_msec": auto_abort_msec, "thrift_port": thrift_port}
        specs += [ClientSpec("kestrel_actors.loadtests.scenarios._thrift:leaky_consumer", args) for _ in range(threads)]
    else:
        specs = producer_specs(queue, total, 1, ITEM_BYTES)
        specs += [ClientSpec("kestrel_actors.loadtests.scenarios.leaky_reader:consumer",
                             {"queue": queue, "total": total, "drop": drop}) for _ in range(threads)]
    result = run(Plan(specs, progress="confirm", target=total, label="confirmed",
                      track_ids=total), options, epoch)
    fig = result.get("confirm")
    ms = int(result.wall_seconds * 1000)
    say("Finished in %d msec (%.1f usec/put throughput)." % (ms, ms * 1000.0 / (total * threads)))
    outcome = Outcome("leaky-reader", fig, wall_seconds=result.wall_seconds,
                      series={"confirm": fig, "put": result.get("put")},
                      extra={"threads": threads, "drop_rate": drop, "procs": options.procs,
                             "dropped": fig.counters.get("dropped", 0),
                             "protocol": "thrift" if thrift else "memcache"})
    outcome.absorb(result)
    if result.errors:
        return outcome
    missing, outcome.duplicated = tally(result.seen)
    if missing:
        say("Missed the following items:")
        for item in missing[:1000]:
            say("\t%08x" % item)
        left = queue_stats(options, queue).get("items", 0)
        outcome.lost = max(0, len(missing) - left)
        if left:
            outcome.failures.append(f"{left} items never confirmed are still in {queue}")
    elif not outcome.failures:
        say("Completed all reads")
    return outcome


@click.command("leaky-reader")
@click.option("-n", "total", default=1000, show_default=True, type=click.IntRange(1),
              help="Items to deliver.")
@click.option("-d", "drop", default=0.01, show_default=True, type=click.FloatRange(0, 0.99),
              help="Fraction of opened items dropped (memcache: hang up; thrift: never confirmed).")
@click.option("-q", "queue", default=None, help="Queue name.  [default: spam; with --thrift: spam-thrift]")
@click.option("-t", "threads", default=1, show_default=True, type=click.IntRange(1),
              help="Consumers.")
@click.option("-a", "auto_abort_msec", default=5000, show_default=True, type=click.IntRange(1),
              help="With --thrift: the get's auto_abort_msec (a dropped item comes back after it).")
@_thrift.thrift_options
@common_options
def command(**kwargs) -> None:
    """Reliable reads (/open then /close) with hang-ups; every item must be confirmed once."""
    scenario_entry(leaky_reader)(**kwargs)
