"""PackedItems (issue 56 point 4): a backlog packed into chunks keeps a deque's order and contents,
through the head taken out of a chunk, items put back at the head, lone long items and a queue
that drains into the items not packed yet."""

from __future__ import annotations

import random

from kestrel_actors.queue import Item, PackedItems
from kestrel_actors.queue._items import CHUNK_BYTES, LONE_ITEM_BYTES


def item(index: int, size: int = 100) -> Item:
    return Item(b"%08d" % index + b"x" * (size - 8), 1_000 + index, index % 3 * 77)


def test_a_backlog_comes_back_in_order_with_its_times():
    items = PackedItems()
    count = 3 * CHUNK_BYTES // 100 + 17
    for index in range(count):
        items.append(item(index))
    chunks = [entry for entry in items._entries if isinstance(entry, bytes)]
    assert len(items) == count and len(chunks) == 3  # packed, and the items since
    assert list(items) == [item(i) for i in range(count)]
    taken = [items.popleft() for _ in range(count)]
    assert taken == [item(i) for i in range(count)] and not items and items.head() is None


def test_the_head_taken_out_of_its_chunk_is_the_item_popped_next():
    items = PackedItems()
    for index in range(2 * CHUNK_BYTES // 100):
        items.append(item(index))
    head = items.head()
    assert head == item(0) and items.head() is head and len(items) == 2 * CHUNK_BYTES // 100
    assert items.popleft() is head and items.head() == item(1)


def test_items_put_back_go_before_the_packed_ones():
    items = PackedItems()
    for index in range(CHUNK_BYTES // 100 + 5):
        items.append(item(index))
    first, second = items.popleft(), items.popleft()
    items.appendleft(second)
    items.appendleft(first)
    assert list(items)[:3] == [item(0), item(1), item(2)]
    assert [items.popleft() for _ in range(len(items))] == [item(i) for i in range(CHUNK_BYTES // 100 + 5)]


def test_long_items_stay_whole_between_packed_ones():
    items = PackedItems()
    sizes = [100, 100, LONE_ITEM_BYTES, 100, 3 * LONE_ITEM_BYTES, *[500] * 300, 100]
    for index, size in enumerate(sizes):
        items.append(item(index, size))
    lone = [entry for entry in items._entries if isinstance(entry, Item)]
    per_chunk = -(-CHUNK_BYTES // 500)  # items of 500 B that fill a chunk
    assert [len(entry.data) for entry in lone] == [
        LONE_ITEM_BYTES, 3 * LONE_ITEM_BYTES, *[500] * (300 % per_chunk), 100]
    assert [items.popleft() for _ in sizes] == [item(i, size) for i, size in enumerate(sizes)]


def test_a_mixed_workload_matches_a_deque():
    """Appends, pops, heads and puts back at random, sizes from empty to long, against a list."""
    rng = random.Random(56)
    items, expected = PackedItems(), []
    serial = 0
    for _ in range(40_000):
        action = rng.random()
        if action < 0.55:
            size = rng.choice((0, 8, 100, 1000, LONE_ITEM_BYTES + 1))
            new = Item(b"%08d" % serial + b"y" * size, serial, rng.choice((0, serial + 5)))
            serial += 1
            items.append(new)
            expected.append(new)
        elif action < 0.9 and expected:
            assert items.popleft() == expected.pop(0)
        elif action < 0.95 and expected:
            assert items.head() == expected[0]
        elif expected:
            back = items.popleft()
            assert back == expected[0]
            items.appendleft(back)
        assert len(items) == len(expected)
    assert list(items) == expected
