"""Id-stamped items: the producer role and the hit checker shared by the checking scenarios.

``get-many``, ``many-clients``, ``flood`` and ``leaky-reader`` put items made by
``items.make_item`` (8 hex digits of id + filler), so the consumer side can tell exactly
which item it received, count it once in ``Shared.seen`` and spot lost, duplicated, corrupted
or (for ``flood``) reordered items.
"""

from __future__ import annotations

import bisect
import functools
import time
from collections.abc import Callable

import gevent

from kestrel_actors.client import UnexpectedReply, value_reply

from ..dialect import Dialect, dialect_of
from ..items import ID_WIDTH, make_item
from ..runner import ClientContext, ClientSpec

__all__ = ["HitChecker", "OrderChecker", "producer", "producer_specs"]

PRODUCER = "kestrel_actors.loadtests.scenarios._stamped:producer"


def producer(ctx: ClientContext) -> None:
    """SET ids ``first … first+count-1`` in bursts of ``rollup``, sleeping ``sleep_ms`` between."""
    queue, first, count = ctx.args["queue"], ctx.args["first"], ctx.args["count"]
    size, rollup = ctx.args["size"], ctx.args.get("rollup", 1)
    sleep = ctx.args.get("sleep_ms", 0) / 1000.0
    rec = ctx.recorder(ctx.args.get("recorder", "put"))
    dialect = dialect_of(ctx.options)
    put, stored = dialect.put_request, dialect.stored
    send, expect, now = ctx.conn.send, dialect.expect_stored(ctx.conn), time.monotonic_ns
    end = first + count
    for start in range(first, end, rollup):
        stop = min(start + rollup, end)
        burst = b"".join([put(queue, make_item(i, size)) for i in range(start, stop)])
        t0 = now()
        send(burst)
        expect(stored(stop - start))
        rec.done(t0, stop - start)
        if sleep:
            gevent.sleep(sleep)


def producer_specs(queue: str, total: int, producers: int, size: int, first: int = 0,
                   **extra) -> list[ClientSpec]:
    """Split ids ``first … first+total-1`` into contiguous ranges, one per producer."""
    specs = []
    base, spare = divmod(total, producers)
    start = first
    for i in range(producers):
        count = base + (1 if i < spare else 0)
        specs.append(ClientSpec(PRODUCER, {"queue": queue, "first": start, "count": count,
                                           "size": size, **extra}))
        start += count
    return specs


class HitChecker:
    """Checks a hit (a ``VALUE`` block, or with ``--resp`` a pop's reply) for a stamped item of a
    known size and returns its id. ``reply(queue, data)`` is the whole reply that returns
    ``data``; the bytes before the item and after its id must be exactly that reply's."""

    __slots__ = ("hit_len", "header", "ending", "size", "limit")

    def __init__(self, queue: str, size: int, limit: int,
                 reply: Callable[[str, bytes], bytes] = value_reply) -> None:
        item = make_item(0, size)
        sample = reply(queue, item)
        self.hit_len = len(sample)
        start = sample.index(item)
        self.header = sample[:start]
        self.ending = sample[start + ID_WIDTH:]  # all after the id
        self.size = size
        self.limit = limit  # ids must be below this

    @classmethod
    def of(cls, dialect: Dialect, queue: str, size: int, limit: int, waiting: bool = False) -> HitChecker:
        """The checker of ``dialect``'s hits (``waiting``: of its blocking take)."""
        return cls(queue, size, limit, functools.partial(dialect.hit_reply, waiting=waiting))

    def item(self, reply: bytes) -> int:
        """The id in ``reply``; UnexpectedReply if any byte is not what was put."""
        start = len(self.header)
        if (len(reply) != self.hit_len or not reply.startswith(self.header)
                or not reply.endswith(self.ending)):
            raise UnexpectedReply(f"not an item this run put: {reply[:60]!r}...")
        stamp = reply[start:start + ID_WIDTH]
        try:
            item = int(stamp, 16)
        except ValueError:
            item = -1
        if not 0 <= item < self.limit:
            raise UnexpectedReply(f"item id {stamp!r} is outside this run's 0..{self.limit - 1}")
        return item


class OrderChecker:
    """FIFO check for one consumer: ``starts[i]`` is the first id of source i (0 = backlog)."""

    __slots__ = ("starts", "last", "past_backlog")

    def __init__(self, starts: list[int]) -> None:
        self.starts = starts
        self.last = [-1] * len(starts)
        self.past_backlog = False

    def check(self, item: int) -> None:
        """Raise UnexpectedReply if ``item`` cannot follow what this consumer saw before."""
        source = bisect.bisect_right(self.starts, item) - 1
        if item <= self.last[source]:
            raise UnexpectedReply(f"order violation: item {item} after item {self.last[source]} "
                                  f"from the same producer")
        if source == 0 and self.past_backlog:
            raise UnexpectedReply(f"order violation: backlog item {item} after a newer item")
        self.past_backlog = self.past_backlog or source > 0
        self.last[source] = item
