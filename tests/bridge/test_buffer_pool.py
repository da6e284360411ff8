"""The planner's pool of item buffers (``_buffers.BufferPool``): a buffer comes back into use
only once nothing views it (the batch that held it is committed and dropped), and the pool
keeps no more than it was told."""

from __future__ import annotations

from kestrel_actors.client._wire import ValueScan
from kestrel_actors.spark_bridge._buffers import BufferPool


def filled(pool: BufferPool, values: list[bytes]):
    """A monitor reply scanned into a buffer from the pool, as the planner does."""
    into = pool.take()
    scan = ValueScan("monitor", b"q", 100, into=into)
    reply = b"".join(b"VALUE q 0 %d\r\n%s\r\nEND\r\n" % (len(v), v) for v in values) + b"END\r\n"
    assert scan.feed(reply) == len(reply) and scan.done
    return into, scan.values()


def test_a_buffer_whose_items_are_still_viewed_is_not_reused():
    pool = BufferPool(keep=4)
    buffer, items = filled(pool, [b"a" * 100, b"b" * 50])
    pool.give_back([buffer])  # the batch's items still live (not committed)
    assert len(pool) == 0
    assert pool.take() is not buffer
    del items  # committed and dropped
    pool.give_back([buffer])
    assert len(pool) == 1 and pool.take() is buffer


def test_a_reused_buffer_holds_only_the_new_items():
    pool = BufferPool(keep=4)
    buffer, items = filled(pool, [b"x" * 300])
    del items
    pool.give_back([buffer])
    again, items = filled(pool, [b"y", b"zz"])
    assert again is buffer
    assert items.values() == [b"y", b"zz"] and bytes(items.data) == b"yzz"


def test_the_pool_keeps_at_most_what_it_was_told_the_largest_first():
    pool = BufferPool(keep=2)
    pool.give_back([bytearray(10), bytearray(30), bytearray(20)])
    assert len(pool) == 2
    assert len(pool.take()) == 30 and len(pool.take()) == 10
    assert len(pool.take()) == 0  # empty: a new one
