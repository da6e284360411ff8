"""``get-many``: read throughput. Fill a queue with n id-stamped items, then drain it with GETs.

Not one of Kestrel's tools; it is put-many's mirror image, so GET/s can be measured on its
own. The fill uses 10 clients writing 32 SETs per burst and is timed separately. Then ``-c``
clients issue plain ``get <q>`` (``-r`` per write) until they see a miss: nothing else writes
to the queue, so the first miss means it is empty. Every hit is checked byte for byte and
counted by id, so a lost or twice-delivered item fails the run.
"""

from __future__ import annotations

import time

import click

from ..admin import flush_queues, queue_stats
from ..command import common_options, resp_option, scenario_entry
from ..dialect import dialect_of
from ..fleet import LeanClient, lean_form
from ..output import say
from ..report import Outcome, tally
from ..runner import ClientContext, ClientSpec, Options, Plan, run
from ._stamped import HitChecker, producer_specs

__all__ = ["command", "drainer"]

FILL_CLIENTS = 10
FILL_ROLLUP = 32


class LeanDrainer(LeanClient):
    """:func:`drainer` for the lean loop: the same GETs, checks and counts."""

    __slots__ = ("check", "request_bytes", "rollup", "total", "rec", "shared", "empty", "t0", "replies")

    def __init__(self, ctx: ClientContext) -> None:
        super().__init__(ctx.conn.buf)
        queue, self.total, self.rollup = ctx.args["queue"], ctx.args["total"], ctx.args["rollup"]
        dialect = dialect_of(ctx.options)
        self.check = HitChecker.of(dialect, queue, ctx.args["size"], self.total)
        self.request_bytes = dialect.take_request(queue) * self.rollup
        self.replies = dialect.lean_takes(self)
        self.rec, self.shared = ctx.recorder("get"), ctx.shared
        self.empty = False
        self.t0 = 0

    def request(self, t0: int) -> bytes | None:
        if self.empty or self.shared.total() >= self.total:
            return None
        self.t0 = t0
        return self.request_bytes

    def feed(self, chunk: bytes) -> bool:
        replies = self.replies(chunk, self.rollup, self.check.hit_len)
        if replies is None:
            return False
        rec, mark, item = self.rec, self.shared.mark, self.check.item
        hits = 0
        for reply in replies:
            if reply is None:
                rec.miss()
                self.empty = True
            elif mark(item(reply)):
                hits += 1
            else:
                rec.dups += 1
        rec.done(self.t0, hits)
        return True


@lean_form(LeanDrainer)
def drainer(ctx: ClientContext) -> None:
    """GET (``rollup`` per write) until a miss or until the run has all ``total`` items."""
    queue, total, rollup = ctx.args["queue"], ctx.args["total"], ctx.args["rollup"]
    dialect = dialect_of(ctx.options)
    check = HitChecker.of(dialect, queue, ctx.args["size"], total)
    request = dialect.take_request(queue) * rollup
    rec, shared, conn, now = ctx.recorder("get"), ctx.shared, ctx.conn, time.monotonic_ns
    hit_len, mark, read = check.hit_len, shared.mark, dialect.read_take(conn)
    empty = False
    while not empty and shared.total() < total:
        t0 = now()
        conn.send(request)
        hits = 0
        for _ in range(rollup):
            reply = read(hit_len)
            if reply is None:
                rec.miss()
                empty = True
            elif mark(check.item(reply)):
                hits += 1
            else:
                rec.dups += 1
        rec.done(t0, hits)


def get_many(options: Options, flush: bool, epoch: int, clients: int, total: int, size: int,
             rollup: int, queue: str) -> Outcome:
    if flush:
        flush_queues(options, [queue])
    say("get-many: %d items of %d bytes from %s:%d queue %s using %d clients in batches of %d." % (
        total, size, options.host, options.port, queue, clients, rollup))
    fill = Plan(producer_specs(queue, total, min(FILL_CLIENTS, total), size, rollup=FILL_ROLLUP,
                               recorder="fill"), progress="fill", target=total, label="fill")
    filled = run(fill, options, epoch)
    fill_fig = filled.get("fill")
    outcome = Outcome("get-many", fill_fig, extra={"clients": clients, "rollup": rollup,
                                                   "bytes": size, "procs": options.procs,
                                                   "protocol": dialect_of(options).name})
    outcome.absorb(filled, headline=False)
    say("Filled %d items in %d msec (%.0f SET/s)." % (fill_fig.items, filled.wall_seconds * 1000,
                                                     fill_fig.rate))
    outcome.extra["fill"] = fill_fig.summary()
    if outcome.exit_code:
        return outcome
    specs = [ClientSpec("kestrel_actors.loadtests.scenarios.get_many:drainer",
                        {"queue": queue, "total": total, "size": size, "rollup": rollup})
             for _ in range(clients)]
    result = run(Plan(specs, progress="get", target=total, label="get", track_ids=total),
                 options, epoch)
    outcome.absorb(result)
    fig = result.get("get")
    outcome.main, outcome.wall_seconds = fig, result.wall_seconds
    outcome.series = {"fill": fill_fig, "get": fig}
    ms = int(result.wall_seconds * 1000)
    say("Finished in %d msec (%.1f usec/get throughput)." % (ms, ms * 1000.0 / max(total, 1)))
    say(fig.distribution_line())
    say("Got %d items; %d misses." % (fig.items, fig.misses))
    if not result.errors:
        missing, outcome.duplicated = tally(result.seen)
        left = queue_stats(options, queue).get("items", 0) if missing else 0
        outcome.lost = max(0, len(missing) - left)
        if left:
            outcome.failures.append(f"{left} items still in {queue} after the clients saw it empty")
    return outcome


@click.command("get-many")
@click.option("-c", "clients", default=100, show_default=True, type=click.IntRange(1),
              help="Concurrent reading clients.")
@click.option("-n", "total", default=10000, show_default=True, type=click.IntRange(1),
              help="Items to fill and then read.")
@click.option("-b", "size", default=1024, show_default=True, type=click.IntRange(8),
              help="Bytes per item.")
@click.option("-r", "rollup", default=1, show_default=True, type=click.IntRange(1),
              help="GETs per write.")
@click.option("-q", "queue", default="spam", show_default=True, help="Queue name.")
@resp_option
@common_options
def command(**kwargs) -> None:
    """Read throughput: fill -n items, then -c clients drain them with plain GETs."""
    scenario_entry(get_many)(**kwargs)
