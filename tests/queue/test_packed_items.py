"""PackedItems (issue 56 point 4): a backlog packed into chunks keeps a deque's order and contents,
through the head taken out of a chunk, items put back at the head, lone long items and a queue
that drains into the items not packed yet."""

from __future__ import annotations

import random

from kestrel_actors.queue import Item, PackedItems
from kestrel_actors.queue._items import CHUNK_BYTES, COMPACT_AT, LONE_ITEM_BYTES


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
        if len(expected) % 16 == 0:
            assert items.expiring == sum(1 for one in expected if one.expiry)
    assert list(items) == expected


def test_a_drain_with_items_put_back_keeps_order_and_lets_taken_slots_go():
    """The list behind the entries: items taken at the head and put back in runs, through the
    compactions of the taken slots, come out as from a deque; a drained queue keeps fewer than
    COMPACT_AT slots."""
    rng = random.Random(21)
    items, expected = PackedItems(), []
    for index in range(5 * COMPACT_AT):
        new = item(index, LONE_ITEM_BYTES if index % 3 else 100)
        items.append(new)
        expected.append(new)
    while expected:
        taken = [items.popleft() for _ in range(min(len(expected), rng.randint(1, 3 * COMPACT_AT)))]
        assert taken == expected[:len(taken)]
        back = rng.randint(0, len(taken) - 1)  # at least one stays taken
        for one in reversed(taken[len(taken) - back:]):
            items.appendleft(one)
        del expected[:len(taken) - back]
        assert len(items) == len(expected) and list(items) == expected
    assert not items and items.head() is None
    assert len(items._entries) < COMPACT_AT


def test_a_run_of_heads_popped_at_once_is_what_popleft_answers_up_to_one_that_may_expire():
    """``pop_run`` against ``popleft`` on twin containers: lone items, packed chunks and items
    not packed yet, taken in runs of random counts and byte budgets; a run stops before an
    item with an expiry, and appends and pops after it keep the twins alike (the unpacked
    run's count and bytes)."""
    rng = random.Random(57)
    runs, ones = PackedItems(), PackedItems()
    serial = 0
    for _ in range(300):
        for _ in range(rng.randint(0, 400)):
            size = rng.choice((8, 100, 100, 700, LONE_ITEM_BYTES))
            new = Item(b"%08d" % serial + b"z" * size, serial, serial if rng.random() < 0.01 else 0)
            serial += 1
            runs.append(new)
            ones.append(new)
        count, budget = rng.randint(1, 600), rng.randint(1, 3 * CHUNK_BYTES)
        taken: list[Item] = []
        size = runs.pop_run(count, budget, taken)
        expected: list[Item] = []
        while len(expected) < count and sum(len(i.data) for i in expected) < budget and ones:
            head = ones.head()
            assert head is not None
            if head.expiry:
                break
            expected.append(ones.popleft())
        assert taken == expected and size == sum(len(i.data) for i in taken)
        assert len(runs) == len(ones) and runs._run == ones._run and runs._run_bytes == ones._run_bytes
        assert runs.expiring == ones.expiring
        if runs and not taken:  # the head may expire: popleft's to take
            assert runs.popleft() == ones.popleft()
    assert list(runs) == list(ones)
    taken = []
    runs.pop_run(1 << 30, 1 << 30, taken)
    assert runs or len(runs._entries) - runs._first == 0
