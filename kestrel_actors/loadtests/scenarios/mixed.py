"""``mixed``: writes and reads at once — each of ``-c`` clients alternates one SET and one GET.

Not one of Kestrel's tools. Issue 12's table has a "mixed 100" row without saying what it
mixes; this is the plainest mix with Kestrel's one-request-in-flight rule: every client
repeats "``set <q>`` of an id-stamped item, wait for ``STORED``; ``get <q>``, wait for the
reply", so the queue takes as many writes as reads at the same time. A GET returns any
client's item, or misses when the queue happens to be empty. The figure is requests (SETs and
GETs, misses included) per second. Afterwards the queue is drained: every item must have been
received exactly once, during the run or in the drain.
"""

from __future__ import annotations

import dataclasses
import time

import click

from ..admin import flush_queues, queue_stats
from ..command import common_options, resp_option, scenario_entry
from ..dialect import dialect_of
from ..fleet import LeanClient, lean_form
from ..items import make_item
from ..output import say
from ..report import Outcome, tally
from ..runner import ClientContext, ClientSpec, Options, Plan, run
from ._stamped import HitChecker

__all__ = ["command", "mixer"]


class LeanMixer(LeanClient):
    """:func:`mixer` for the lean loop: the same SETs and GETs in turn, checks and counts."""

    __slots__ = ("queue", "size", "check", "get", "next_item", "end", "rec", "shared", "getting", "t0",
                 "put", "stored", "stored_replies", "take_replies")

    def __init__(self, ctx: ClientContext) -> None:
        super().__init__(ctx.conn.buf)
        self.queue, self.size = ctx.args["queue"], ctx.args["size"]
        dialect = dialect_of(ctx.options)
        self.check = HitChecker.of(dialect, self.queue, self.size, ctx.args["total"])
        self.get = dialect.take_request(self.queue)
        self.put, self.stored = dialect.put_request, dialect.stored(1)
        self.stored_replies, self.take_replies = dialect.lean_stored(self), dialect.lean_takes(self)
        self.next_item = ctx.args["first"]
        self.end = self.next_item + ctx.args["count"]
        self.rec, self.shared = ctx.recorder("mixed"), ctx.shared
        self.getting = False  # whether the request in flight is the GET
        self.t0 = 0

    def request(self, t0: int) -> bytes | None:
        self.t0 = t0
        if self.getting:
            return self.get
        if self.next_item == self.end:
            return None
        self.next_item += 1
        return self.put(self.queue, make_item(self.next_item - 1, self.size))

    def feed(self, chunk: bytes) -> bool:
        if not self.getting:
            if not self.stored_replies(chunk, self.stored):
                return False
        else:
            replies = self.take_replies(chunk, 1, self.check.hit_len)
            if replies is None:
                return False
            reply = replies[0]
            if reply is None:
                self.rec.miss()
            elif not self.shared.mark(self.check.item(reply)):
                self.rec.dups += 1
        self.rec.done(self.t0)
        self.getting = not self.getting
        return True


@lean_form(LeanMixer)
def mixer(ctx: ClientContext) -> None:
    """For ids ``first … first+count-1``: SET the item, then one GET; each request counts."""
    queue, first, count = ctx.args["queue"], ctx.args["first"], ctx.args["count"]
    size, total = ctx.args["size"], ctx.args["total"]
    dialect = dialect_of(ctx.options)
    check = HitChecker.of(dialect, queue, size, total)
    get, put, stored = dialect.take_request(queue), dialect.put_request, dialect.stored(1)
    rec, shared, conn, now = ctx.recorder("mixed"), ctx.shared, ctx.conn, time.monotonic_ns
    expect, read = dialect.expect_stored(conn), dialect.read_take(conn)
    for item in range(first, first + count):
        t0 = now()
        conn.send(put(queue, make_item(item, size)))
        expect(stored)
        rec.done(t0)
        t0 = now()
        conn.send(get)
        reply = read(check.hit_len)
        if reply is None:
            rec.miss()
        elif not shared.mark(check.item(reply)):
            rec.dups += 1
        rec.done(t0)


def mixed(options: Options, flush: bool, epoch: int, clients: int, total: int, size: int,
          queue: str) -> Outcome:
    if flush:
        flush_queues(options, [queue])
    clients = min(clients, total)
    say("mixed: %d clients each alternating a SET and a GET of %d-byte items on %s:%d queue %s, "
        "%d items in all." % (clients, size, options.host, options.port, queue, total))
    specs = []
    base, spare = divmod(total, clients)
    first = 0
    for index in range(clients):
        count = base + (1 if index < spare else 0)
        specs.append(ClientSpec("kestrel_actors.loadtests.scenarios.mixed:mixer",
                                {"queue": queue, "first": first, "count": count, "size": size,
                                 "total": total}))
        first += count
    result = run(Plan(specs, progress="mixed", target=2 * total, label="requests", track_ids=total),
                 options, epoch)
    fig = result.get("mixed")
    outcome = Outcome("mixed", fig, wall_seconds=result.wall_seconds, series={"mixed": fig},
                      extra={"clients": clients, "bytes": size, "procs": options.procs,
                             "protocol": dialect_of(options).name})
    outcome.absorb(result)
    ms = int(result.wall_seconds * 1000)
    say("Finished %d requests in %d msec (%.1f usec/request throughput)." % (
        fig.items, ms, ms * 1000.0 / max(fig.items, 1)))
    say(fig.distribution_line())
    if result.errors:
        return outcome
    drained = run(Plan([ClientSpec("kestrel_actors.loadtests.scenarios.get_many:drainer",  # GETs until a miss
                                   {"queue": queue, "total": total, "size": size, "rollup": 1})],
                       progress="get", target=total, label="drain", track_ids=total),
                  dataclasses.replace(options, procs=1), epoch)
    outcome.absorb(drained, headline=False)
    say("GETs: %d hits, %d misses during the run; %d items left for the drain." % (
        total - fig.misses, fig.misses, drained.get("get").items))
    if not drained.errors:
        seen = bytes(a + b for a, b in zip(result.seen or b"", drained.seen or b"", strict=False))
        missing, outcome.duplicated = tally(seen)
        left = queue_stats(options, queue).get("items", 0) if missing else 0
        outcome.lost = max(0, len(missing) - left)
        if left:
            outcome.failures.append(f"{left} items still in {queue} after the drain saw it empty")
    return outcome


@click.command("mixed")
@click.option("-c", "clients", default=100, show_default=True, type=click.IntRange(1),
              help="Concurrent clients, each alternating a SET and a GET.")
@click.option("-n", "total", default=10000, show_default=True, type=click.IntRange(1),
              help="Items to put (as many GETs are sent).")
@click.option("-b", "size", default=1024, show_default=True, type=click.IntRange(8),
              help="Bytes per item.")
@click.option("-q", "queue", default="spam", show_default=True, help="Queue name.")
@resp_option
@common_options
def command(**kwargs) -> None:
    """Writes and reads together: -c clients each alternate one SET and one GET."""
    scenario_entry(mixed)(**kwargs)
