"""``many-clients``: many consumers, one slow producer (Kestrel's ``ManyClients``).

One producer SETs ``-n`` items of 751 bytes, sleeping ``-s`` ms after each (``-r``, not in
Kestrel, lets it write that many SETs at a time, so that with ``-s 0`` the single producer
does not limit the consumers' throughput). ``-c`` consumers
loop until the run has received ``n`` items, each sending ``get <q>/t=1000`` (with ``-x``,
``get <q>/t=1000/close/open``: confirm the previous item, open the next). With ``-k``
percent probability a consumer hangs up right after sending, before reading the reply, and
reconnects; the server must then abort the open read and hand the item to someone else. At
the end a transactional consumer sends ``get <q>/close`` and requires ``END``.

Unlike Kestrel (which sends the same lyric n times and only counts) every item carries its
id, so the run also proves that no item was lost or delivered twice.
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
from ._stamped import HitChecker, producer_specs

__all__ = ["command", "consumer"]

ITEM_BYTES = 751  # Kestrel's lyric without its final newline


def consumer(ctx: ClientContext) -> None:
    """Blocking GETs until ``total`` items were received run-wide; hang up ``kill`` % of the time."""
    queue, total, kill = ctx.args["queue"], ctx.args["total"], ctx.args["kill"] / 100.0
    transactional = ctx.args["transactional"]
    check = HitChecker(queue, ITEM_BYTES, total)
    request = get_request(queue, "/t=1000" + ("/close/open" if transactional else ""))
    rec, shared, conn, now = ctx.recorder("get"), ctx.shared, ctx.conn, time.monotonic_ns
    rng = random.Random()
    while shared.total() < total:
        if not conn.connected:
            conn.connect(CONNECT_ATTEMPTS)
            rec.bump("reconnects")
        t0 = now()
        conn.send(request)
        if kill and rng.random() < kill:
            conn.close()
            rec.bump("kills")
            continue
        reply = conn.read_get(check.hit_len)
        if reply is None:
            rec.miss()
        elif shared.mark(check.item(reply)):
            rec.done(t0)
        else:
            rec.dups += 1
    if transactional and conn.connected:
        conn.exchange(get_request(queue, "/close"), END)


def many_clients(options: Options, flush: bool, epoch: int, sleep: int, total: int, clients: int,
                 queue: str, kill: int, transactional: bool, rollup: int) -> Outcome:
    transactional = transactional or kill > 0
    if flush:
        flush_queues(options, [queue])
    say("many-clients: %d items to %s using %d clients, kill rate %d%%, at %d msec/item" % (
        total, options.host, clients, kill, sleep))
    specs = [ClientSpec("kestrel_actors.loadtests.scenarios.many_clients:consumer",
                        {"queue": queue, "total": total, "kill": kill,
                         "transactional": transactional}) for _ in range(clients)]
    specs += producer_specs(queue, total, 1, ITEM_BYTES, sleep_ms=sleep, rollup=rollup)
    result = run(Plan(specs, progress="get", target=total, label="received", track_ids=total),
                 options, epoch)
    fig = result.get("get")
    say("Received %d items in %d msec." % (fig.items, result.wall_seconds * 1000))
    outcome = Outcome("many-clients", fig, wall_seconds=result.wall_seconds,
                      series={"get": fig, "put": result.get("put")},
                      extra={"clients": clients, "kill_percent": kill,
                             "transactional": transactional, "sleep_ms": sleep,
                             "kills": fig.counters.get("kills", 0), "procs": options.procs})
    outcome.absorb(result)
    if not result.errors:
        missing, outcome.duplicated = tally(result.seen)
        stats = queue_stats(options, queue)
        left = stats.get("items", 0)
        outcome.lost = max(0, len(missing) - left)
        if left:
            outcome.failures.append(f"{left} items left in {queue} after all {total} were received")
    return outcome


@click.command("many-clients")
@click.option("-s", "sleep", default=100, show_default=True, type=click.IntRange(0),
              help="Milliseconds the producer sleeps between SETs.")
@click.option("-n", "total", default=100, show_default=True, type=click.IntRange(1),
              help="Items to put.")
@click.option("-c", "clients", default=100, show_default=True, type=click.IntRange(1),
              help="Consumers.")
@click.option("-q", "queue", default="spam", show_default=True, help="Queue name.")
@click.option("-k", "kill", default=0, show_default=True, type=click.IntRange(0, 100),
              help="Percent of GETs whose connection is dropped before the reply (implies -x).")
@click.option("-x", "transactional", is_flag=True, help="Transactional GETs (/close/open).")
@click.option("-r", "rollup", default=1, show_default=True, type=click.IntRange(1),
              help="SETs per producer write (an extension; Kestrel's producer writes 1).")
@click.option("-M", "monitor", is_flag=True, help="Print the queue's stats every second.")
@common_options
def command(monitor, **kwargs) -> None:
    """Many consumers doing blocking reads while one producer trickles items in."""
    scenario_entry(many_clients)(monitor=kwargs["queue"] if monitor else None, **kwargs)
