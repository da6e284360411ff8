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


def test_values_of_every_size_class_in_odd_pieces_over_a_used_buffer():
    """Each value is packed at its offset with zero padding up to its size class, which the
    next value writes over: values of sizes in and across classes, cut anywhere by the pieces
    they arrive in, come out whole over whatever the buffer held."""
    values = [bytes([i % 251]) * size for i, size in
              enumerate([0, 1, 15, 16, 17, 5, 1000, 1024, 1025, 3, 70_000, 2, 0, 65_536, 9])]
    reply = b"".join(b"VALUE q 0 %d\r\n%s\r\nEND\r\n" % (len(v), v) for v in values) + b"END\r\n"
    for step in (1, 7, 4096, 65_536, len(reply)):
        into = bytearray(b"\xff" * 200_000)
        scan = ValueScan("monitor", b"q", 100, into=into)
        for at in range(0, len(reply), step):
            scan.feed(reply[at:at + step])
        assert scan.done
        items = scan.values()
        assert items.values() == values, step
        assert bytes(items.data) == b"".join(values)
