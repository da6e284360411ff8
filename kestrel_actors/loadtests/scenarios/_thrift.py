"""The thrift side of the load tests (``--thrift``, as Kestrel's tools have): roles that speak
Kestrel's thrift protocol through :class:`kestrel_actors.client.thrift.ThriftClient`.

Each role opens its own thrift connection (``thrift_port`` in its arguments) on the run's
gevent hub, so its greenlets share the thread with the others; a reply later than
``--io-timeout`` fails on the socket's timeout. Items are the id-stamped ones of
``items.make_item``, checked byte for byte.
"""

from __future__ import annotations

import random
import time
from typing import Any

import click

from kestrel_actors.client import UnexpectedReply
from kestrel_actors.client.thrift import ThriftClient

from ..items import check_item, filler, make_item
from ..output import say
from ..runner import ClientContext, ClientSpec
from ._stamped import OrderChecker

__all__ = [
    "PRODUCER",
    "connect",
    "flood_consumer",
    "getter",
    "leaky_consumer",
    "producer",
    "producer_specs",
    "putter",
    "thrift_options",
]

PRODUCER = "kestrel_actors.loadtests.scenarios._thrift:producer"


def thrift_options(func: Any) -> Any:
    """``--thrift`` and ``--thrift-port``: the switch Kestrel's load tools have."""
    func = click.option("--thrift-port", default=None, type=int,
                        help="The server's thrift port (with --thrift; default: -p if given, "
                             "else 2229).")(func)
    return click.option("--thrift", "thrift", is_flag=True,
                        help="Use only the thrift protocol (flush and checks too), on port "
                             "--thrift-port, instead of memcache.")(func)


def connect(ctx: ClientContext) -> ThriftClient:
    options = ctx.options
    return ThriftClient(options.host, ctx.args["thrift_port"], timeout=options.io_timeout, use_gevent=True)


def _item(data: bytes, size: int, limit: int) -> int:
    try:
        item = check_item(data, size)
    except ValueError as exc:
        raise UnexpectedReply(str(exc)) from exc
    if not 0 <= item < limit:
        raise UnexpectedReply(f"item id {item:08x} is outside this run's 0..{limit - 1}")
    return item


def producer(ctx: ClientContext) -> None:
    """``put`` ids ``first … first+count-1``, ``rollup`` items per call; each call must
    report every item added."""
    queue, first, count = ctx.args["queue"], ctx.args["first"], ctx.args["count"]
    size, rollup = ctx.args["size"], ctx.args.get("rollup", 1)
    rec = ctx.recorder(ctx.args.get("recorder", "put"))
    now = time.monotonic_ns
    end = first + count
    with connect(ctx) as client:
        for start in range(first, end, rollup):
            stop = min(start + rollup, end)
            t0 = now()
            added = client.put(queue, [make_item(i, size) for i in range(start, stop)])
            if added != stop - start:
                raise UnexpectedReply(f"put of {stop - start} items added {added}")
            rec.done(t0, added)


def producer_specs(queue: str, total: int, producers: int, size: int, thrift_port: int,
                   first: int = 0, **extra: Any) -> list[ClientSpec]:
    """Split ids ``first … first+total-1`` into contiguous ranges, one per thrift producer."""
    specs = []
    base, spare = divmod(total, producers)
    start = first
    for i in range(producers):
        count = base + (1 if i < spare else 0)
        specs.append(ClientSpec(PRODUCER, {"queue": queue, "first": start, "count": count, "size": size,
                                           "thrift_port": thrift_port, **extra}))
        start += count
    return specs


def putter(ctx: ClientContext) -> None:
    """``put-many --thrift``: ``count`` copies of the filler, ``rollup`` per ``put`` call."""
    queue, count, rollup = ctx.args["queue"], ctx.args["count"], ctx.args["rollup"]
    one = filler(ctx.args["size"])
    rec = ctx.recorder("put")
    now = time.monotonic_ns
    with connect(ctx) as client:
        left = count
        while left > 0:
            batch = min(rollup, left)
            t0 = now()
            added = client.put(queue, [one] * batch)
            if added != batch:
                raise UnexpectedReply(f"put of {batch} items added {added}")
            rec.done(t0, batch)
            left -= batch


def getter(ctx: ClientContext) -> None:
    """``put-many --thrift -g``: ``get`` up to ``rollup`` items per call; each must be the filler."""
    queue, count, rollup = ctx.args["queue"], ctx.args["count"], ctx.args["rollup"]
    one = filler(ctx.args["size"])
    rec = ctx.recorder("get")
    now = time.monotonic_ns
    with connect(ctx) as client:
        left = count
        while left > 0:
            batch = min(rollup, left)
            t0 = now()
            items = client.get(queue, max_items=batch)
            for item in items:
                if item.data != one:
                    raise UnexpectedReply(f"get returned other bytes than were put: {item.data[:60]!r}")
            if items:
                rec.done(t0, len(items))
            else:
                rec.miss()
            left -= batch  # one call tries for ``batch`` items, as the memcache getter's GETs


def flood_consumer(ctx: ClientContext) -> None:
    """``flood --thrift``: ``get`` up to ``rollup`` items (waiting 1 s with ``-B``) until the
    run has received ``total``, checking bytes and FIFO order (items are removed: id 0)."""

    queue, total, rollup = ctx.args["queue"], ctx.args["total"], ctx.args["rollup"]
    size, limit = ctx.args["size"], ctx.args["limit"]
    order = OrderChecker(ctx.args["starts"])
    timeout_msec = 1000 if ctx.args["blocking"] else 0
    rec, shared, now = ctx.recorder("get"), ctx.shared, time.monotonic_ns
    with connect(ctx) as client:
        while shared.total() < total:
            t0 = now()
            items = client.get(queue, max_items=rollup, timeout_msec=timeout_msec)
            if len(items) > rollup:
                raise UnexpectedReply(f"get of {rollup} returned {len(items)} items")
            got = 0
            for thrift_item in items:
                if thrift_item.id != 0:
                    raise UnexpectedReply(f"an item removed without auto-abort has id {thrift_item.id}")
                item = _item(thrift_item.data, size, limit)
                order.check(item)
                if shared.mark(item):
                    got += 1
                else:
                    rec.dups += 1
            if got:
                rec.done(t0, got)
            elif not items:
                rec.miss()


def leaky_consumer(ctx: ClientContext) -> None:
    """Kestrel's ``LeakyThriftReader`` consumer (behaviour §8.7): ``get(q, 1, 100, auto_abort)``;
    with probability 1 - ``drop`` confirm the item (which must count 1), otherwise drop it
    silently -- no confirm, no abort -- and go on on a new connection (closing the old one
    aborts nothing: the server's auto-abort timer must return the item)."""
    queue, total, drop = ctx.args["queue"], ctx.args["total"], ctx.args["drop"]
    size, auto_abort = ctx.args["size"], ctx.args["auto_abort_msec"]
    rec, shared, now = ctx.recorder("confirm"), ctx.shared, time.monotonic_ns
    rng = random.Random()
    client = connect(ctx)
    try:
        while shared.total() < total:
            t0 = now()
            items = client.get(queue, max_items=1, timeout_msec=100, auto_abort_msec=auto_abort)
            if not items:
                rec.miss()
                continue
            if len(items) > 1:
                raise UnexpectedReply(f"get of 1 item returned {len(items)}")
            [thrift_item] = items
            if thrift_item.id < 1:
                raise UnexpectedReply(f"an item opened with auto-abort has id {thrift_item.id}")
            item = _item(thrift_item.data, size, total)
            if rng.random() < drop:
                rec.bump("dropped")
                client.close()  # Kestrel's pooled client moves on; the read stays open
                client = connect(ctx)
                continue
            confirmed = client.confirm(queue, {thrift_item.id})
            if confirmed != 1:
                raise UnexpectedReply(f"confirm of id {thrift_item.id} counted {confirmed}")
            if shared.mark(item):
                rec.done(t0)
                done = shared.total()
                if done % 1000 == 0:
                    say(str(done))
            else:
                rec.dups += 1
    finally:
        client.close()
