"""``put-many``: write throughput (Kestrel's ``PutMany``), optionally read everything back (-g).

Each of ``-c`` clients opens one connection and issues ``n / c`` SETs of the same ``-b``-byte
lyric, ``-r`` at a time in one write (a "burst"), waiting for exactly ``STORED\\r\\n`` × r
before the next burst. Latency is measured per burst. With ``-Q`` queues, client i uses
``<q><i % Q>``. With ``-g`` a second run does the same number of GETs (in batches of ``-r``)
and checks each hit byte for byte; a miss means an item was lost.
"""

from __future__ import annotations

import time

import click

from kestrel_actors.client import UnexpectedReply

from ..admin import flush_queues
from ..command import common_options, resp_option, scenario_entry
from ..dialect import dialect_of
from ..fleet import LeanClient, lean_form
from ..items import filler
from ..output import say
from ..report import Outcome
from ..runner import ClientContext, ClientSpec, Options, Plan, run
from . import _thrift

__all__ = ["command", "getter", "putter", "queue_names"]

_ROLE = "kestrel_actors.loadtests.scenarios.put_many:"


def queue_names(queue: str, queues: int) -> list[str]:
    """Kestrel's naming: one queue is ``q``; several are ``q0 … q<Q-1>``."""
    return [queue] if queues <= 1 else [f"{queue}{i}" for i in range(queues)]


class LeanPutter(LeanClient):
    """:func:`putter` for the lean loop: the same bursts, the same check, the same recorder."""

    __slots__ = ("one", "burst", "stored", "items", "bursts", "rest", "rec", "t0", "replies", "dialect")

    def __init__(self, ctx: ClientContext) -> None:
        super().__init__(ctx.conn.buf)
        queue, count, rollup = ctx.args["queue"], ctx.args["count"], ctx.args["rollup"]
        self.dialect = dialect = dialect_of(ctx.options)
        self.one = dialect.put_request(queue, filler(ctx.args["size"]))
        self.burst, self.stored, self.items = self.one * rollup, dialect.stored(rollup), rollup
        self.replies = dialect.lean_stored(self)
        self.bursts, self.rest = divmod(count, rollup)
        self.rec = ctx.recorder("put")
        self.t0 = 0

    def request(self, t0: int) -> bytes | None:
        if self.bursts:
            self.bursts -= 1
        elif self.rest:  # the last, shorter burst
            self.items, self.rest = self.rest, 0
            self.burst, self.stored = self.one * self.items, self.dialect.stored(self.items)
        else:
            return None
        self.t0 = t0
        return self.burst

    def feed(self, chunk: bytes) -> bool:
        if not self.replies(chunk, self.stored):
            return False
        self.rec.done(self.t0, self.items)
        return True


@lean_form(LeanPutter)
def putter(ctx: ClientContext) -> None:
    """Put ``count`` copies of the filler in bursts of ``rollup``; require STORED for each."""
    queue, count, rollup = ctx.args["queue"], ctx.args["count"], ctx.args["rollup"]
    dialect = dialect_of(ctx.options)
    one = dialect.put_request(queue, filler(ctx.args["size"]))
    rec = ctx.recorder("put")
    send, expect, now = ctx.conn.send, dialect.expect_stored(ctx.conn), time.monotonic_ns
    bursts, rest = divmod(count, rollup)
    burst, stored = one * rollup, dialect.stored(rollup)
    for _ in range(bursts):
        t0 = now()
        send(burst)
        expect(stored)
        rec.done(t0, rollup)
    if rest:
        t0 = now()
        send(one * rest)
        expect(dialect.stored(rest))
        rec.done(t0, rest)


def getter(ctx: ClientContext) -> None:
    """GET ``count`` items in batches of ``rollup``; every reply must be the exact hit."""
    queue, count, rollup = ctx.args["queue"], ctx.args["count"], ctx.args["rollup"]
    dialect = dialect_of(ctx.options)
    hit = dialect.hit_reply(queue, filler(ctx.args["size"]))
    request = dialect.take_request(queue)
    rec = ctx.recorder("get")
    conn, read, now = ctx.conn, dialect.read_take(ctx.conn), time.monotonic_ns
    left = count
    while left > 0:
        batch = min(rollup, left)
        t0 = now()
        conn.send(request * batch)
        hits = 0
        for _ in range(batch):
            reply = read(len(hit))
            if reply is None:
                rec.miss()
            elif reply != hit:
                raise UnexpectedReply(f"GET returned other bytes than were put: {reply[:60]!r}")
            else:
                hits += 1
        rec.done(t0, hits)
        left -= batch


def _plan(role: str, name: str, clients: int, per_client: int, size: int, rollup: int,
          queues: list[str], thrift_port: int | None = None) -> Plan:
    # with --thrift the same roles from the thrift module: ``rollup`` items per put/get call
    prefix, extra = (_ROLE, {}) if thrift_port is None else (_thrift.__name__ + ":", {"thrift_port": thrift_port})
    specs = [ClientSpec(prefix + role, {"queue": queues[i % len(queues)], "count": per_client,
                                        "size": size, "rollup": rollup, **extra}) for i in range(clients)]
    return Plan(specs, progress=name, target=clients * per_client, label=name)


def _report(verb: str, result, total: int) -> None:
    fig = result.get(verb)
    ms = int(result.wall_seconds * 1000)
    say("Finished in %d msec (%.1f usec/%s throughput)." % (ms, ms * 1000.0 / max(total, 1), verb))
    if result.retries:
        say(f"Had to retry {result.retries} times to make all connections.")
    say(fig.distribution_line())


def put_many(options: Options, flush: bool, epoch: int, clients: int, total: int, size: int,
             rollup: int, queue: str, queues: int, also_get: bool, thrift: bool = False,
             thrift_port: int = 2229) -> Outcome:
    names = queue_names(queue, queues)
    if thrift and options.resp:
        raise click.UsageError("--thrift and --resp are two protocols: give one")
    port = thrift_port if thrift else options.port
    via = thrift_port if thrift else None
    per_client = total // clients
    if flush:
        flush_queues(options, names)
    say("Put %d items of %d bytes in bursts of %d to %s:%d in %d queues named %s "
        "using %d clients." % (total, size, rollup, options.host, port, queues, queue,
                               clients))
    result = run(_plan("putter", "put", clients, per_client, size, rollup, names, via), options, epoch)
    outcome = Outcome("put-many", result.get("put"), wall_seconds=result.wall_seconds,
                      extra={"clients": clients, "rollup": rollup, "bytes": size,
                             "procs": options.procs, "protocol": "thrift" if thrift else dialect_of(options).name})
    outcome.absorb(result)
    outcome.series["put"] = result.get("put")
    _report("put", result, per_client * clients)
    if also_get and outcome.exit_code == 0:
        say("Get %d items of %d bytes in batches of %d from %s:%d in %d queues named %s "
            "using %d clients." % (total, size, rollup, options.host, port, queues,
                                   queue, clients))
        got = run(_plan("getter", "get", clients, per_client, size, rollup, names, via), options, epoch)
        outcome.absorb(got, headline=False)
        _report("get", got, per_client * clients)
        fig = got.get("get")
        outcome.series["get"] = fig
        outcome.extra["get"] = fig.summary()
        if flush and not got.errors and not got.failures:
            outcome.lost = max(0, per_client * clients - fig.items)
    return outcome


@click.command("put-many")
@click.option("-c", "clients", default=100, show_default=True, type=click.IntRange(1),
              help="Concurrent clients.")
@click.option("-n", "total", default=10000, show_default=True, type=click.IntRange(1),
              help="Total items (rounded down to a multiple of -c).")
@click.option("-b", "size", default=1024, show_default=True, type=click.IntRange(0),
              help="Bytes per item.")
@click.option("-r", "rollup", default=1, show_default=True, type=click.IntRange(1),
              help="SETs per write (burst); with --thrift, items per put call.")
@click.option("-q", "queue", default="spam", show_default=True, help="Queue name (prefix with -Q).")
@click.option("-Q", "queues", default=1, show_default=True, type=click.IntRange(1),
              help="Number of queues.")
@click.option("-g", "also_get", is_flag=True, help="Also GET every item back and check it.")
@_thrift.thrift_options
@resp_option
@common_options
def command(**kwargs) -> None:
    """Write throughput: -c clients each SET n/c items of -b bytes, -r per write."""
    scenario_entry(put_many)(**kwargs)
