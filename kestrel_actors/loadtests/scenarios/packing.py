"""``packing``: a sustained backlog that exercises read-behind and journal packing (Kestrel's
``JournalPacking``).

Item i is the decimal number i followed by x's, cut to ``-k`` KB, so every item is unique
and the consumer knows exactly which item must come next: any other item is an order
violation (a correctness failure). Phases, each a run with fresh connections: write ``-n``
items; then ``-c`` cycles of writing ``n`` more while reading ``n``, pausing ``-t`` seconds
after each; finally read the last ``n``. The consumer uses ``get <q>/t=1000`` (with ``-x``,
``/t=1000/close/open``); ``END`` is a miss ("spin").
"""

from __future__ import annotations

import dataclasses
import time

import click
import gevent

from kestrel_actors.client import END, STORED, UnexpectedReply, get_request, set_request, value_reply

from ..admin import flush_queues
from ..command import common_options, scenario_entry
from ..figures import Figures
from ..items import packing_item
from ..output import say
from ..report import Outcome
from ..runner import ClientContext, ClientSpec, Options, Plan, run

__all__ = ["command", "reader", "writer"]

_ROLE = "kestrel_actors.loadtests.scenarios.packing:"


def writer(ctx: ClientContext) -> None:
    """SET items ``first … first+count-1`` one at a time."""
    queue, first, count, size = (ctx.args[k] for k in ("queue", "first", "count", "size"))
    rec, conn, now = ctx.recorder("put"), ctx.conn, time.monotonic_ns
    for counter in range(first, first + count):
        request = set_request(queue, packing_item(counter, size))
        t0 = now()
        conn.send(request)
        conn.expect(STORED)
        rec.done(t0)


def reader(ctx: ClientContext) -> None:
    """GET until items ``first … first+count-1`` arrived, each exactly in that order."""
    queue, first, count, size = (ctx.args[k] for k in ("queue", "first", "count", "size"))
    transactional = ctx.args["transactional"]
    request = get_request(queue, "/t=1000/close/open" if transactional else "/t=1000")
    rec, conn, now = ctx.recorder("get"), ctx.conn, time.monotonic_ns
    counter, end = first, first + count
    while counter < end:
        expected = value_reply(queue, packing_item(counter, size))
        t0 = now()
        conn.send(request)
        reply = conn.read_get(len(expected))
        if reply is None:
            rec.miss()
        elif reply != expected:
            raise UnexpectedReply(f"order violation: expected item {counter}, got {reply[:50]!r}...")
        else:
            rec.done(t0)
            counter += 1
    if transactional:
        conn.exchange(get_request(queue, "/close"), END)


def packing(options: Options, flush: bool, epoch: int, queue: str, total: int, kilobytes: int,
            pause: float, cycles: int, transactional: bool) -> Outcome:
    size = 1024 * kilobytes
    if flush:
        flush_queues(options, [queue])
    say("packing: %d items of %dkB with %g second pauses" % (total, kilobytes, pause))
    outcome = Outcome("packing", Figures("get"), extra={"cycles": cycles, "kilobytes": kilobytes,
                                                        "read_msec": [], "procs": 1})
    merged: dict[str, Figures] = {}
    written = read = 0
    phases = [(False, True)] + [(True, True)] * cycles + [(True, False)]
    for number, (reads, writes) in enumerate(phases):
        if 0 < number <= cycles:
            say(f"cycle: {number}")
        specs = []
        common = {"queue": queue, "count": total, "size": size}
        if writes:
            specs.append(ClientSpec(_ROLE + "writer", {**common, "first": written}))
        if reads:
            specs.append(ClientSpec(_ROLE + "reader", {**common, "first": read,
                                                        "transactional": transactional}))
        progress = "get" if reads else "put"
        result = run(Plan(specs, progress=progress, target=total, label=progress),
                     dataclasses.replace(options, procs=1), epoch)
        outcome.absorb(result)
        for name, fig in result.figures.items():
            merged[name] = merged[name].merge(fig) if name in merged else fig
        if outcome.exit_code:
            break
        if writes:
            say("Wrote %d items starting at %d." % (total, written))
            written += total
        if reads:
            ms = int(result.wall_seconds * 1000)
            say("Read %d items in %d msec. Consumer spun %d times in misses." % (
                total, ms, result.get("get").misses))
            outcome.extra["read_msec"].append(ms)
            read += total
        if 0 < number <= cycles and pause:
            gevent.sleep(pause)
    outcome.main = merged.get("get") or Figures("get")
    outcome.series = merged
    outcome.wall_seconds = outcome.main.seconds
    reading = sum(outcome.extra["read_msec"]) / 1000.0
    outcome.extra["read_rate"] = round(read / reading, 1) if reading else 0.0  # pauses excluded
    if not outcome.exit_code:
        outcome.lost = max(0, written - read)
    return outcome


@click.command("packing")
@click.option("-q", "queue", default="spam", show_default=True, help="Queue name.")
@click.option("-n", "total", default=25000, show_default=True, type=click.IntRange(1),
              help="Items written (and read) per cycle.")
@click.option("-k", "kilobytes", default=1, show_default=True, type=click.IntRange(1),
              help="KB per item.")
@click.option("-t", "pause", default=1.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds to pause after each cycle.")
@click.option("-c", "cycles", default=100, show_default=True, type=click.IntRange(0),
              help="Read/write cycles.")
@click.option("-x", "transactional", is_flag=True, help="Transactional reads (/close/open).")
@common_options
def command(**kwargs) -> None:
    """Sustained backlog: write n, then cycles of write n + read n, exact order checked."""
    scenario_entry(packing)(**kwargs)
