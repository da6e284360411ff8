"""The queue's wait-list: arrival order, deadlines on one timer."""

from __future__ import annotations

import random
import time

from kestrel_actors.queue import Waiter, WaitList


class _Batch:
    """What a waiter parks: the wait-list never looks inside it."""


class _Timer:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.closed = False

    def close(self) -> None:
        self.closed = True


def make() -> tuple[WaitList, list[_Timer]]:
    timers: list[_Timer] = []

    def arm(delay: float) -> _Timer:
        timers.append(_Timer(delay))
        return timers[-1]

    return WaitList(arm), timers


def test_oldest_first():
    waits, _ = make()
    a, b = Waiter(_Batch(), 0, [], "s1"), Waiter(_Batch(), 0, [], "s2")
    now = time.monotonic()
    waits.park(a, now + 10)
    waits.park(b, now + 5)
    assert (len(waits), waits.oldest()) == (2, a)
    waits.remove(a)
    assert waits.oldest() is b
    waits.remove(b)
    assert not waits and waits.oldest() is None


def test_take_gives_the_oldest_and_marks_it_reusable_only_when_it_leaves_no_entry():
    waits, _ = make()
    now = time.monotonic()
    a, gone, b, early = (Waiter(_Batch(), 0, [], None) for _ in range(4))
    waits.park(a, now + 10)
    waits.park(gone, now + 20)
    waits.park(b, now + 30)
    waits.park(early, now + 5)  # earlier than the last deadline: on the heap
    waits.remove(gone)  # hung up: its entries stay, passed when they come up
    assert waits.take() is a and a.reusable and not a.parked
    assert waits.take() is b and not b.reusable  # gone's entry was before b's in deadline order
    assert waits.take() is early and not early.reusable  # its heap entry stays until it comes up
    assert waits.take() is None and not waits


def test_a_reused_waiter_keeps_its_place_in_arrival_order_and_piles_up_nothing():
    waits, _ = make()
    deadline = time.monotonic() + 60
    keep, other = Waiter(_Batch(), 0, [], None), Waiter(_Batch(), 0, [], None)
    waits.park(keep, deadline)
    waits.park(other, deadline)
    for _ in range(10_000):  # many-clients: each woken client parks its waiter again, last
        waiter = waits.take()
        assert waiter is not None and waiter.reusable
        waits.park(waiter, deadline)
    assert len(waits) == 2 and len(waits._arrivals) < 100 and len(waits._in_order) < 100
    assert [waits.take(), waits.take(), waits.take()] == [keep, other, None]


def test_one_timer_follows_the_earliest_deadline():
    waits, timers = make()
    now = time.monotonic()
    waits.park(Waiter(_Batch(), 0, [], None), now + 10)
    waits.park(Waiter(_Batch(), 0, [], None), now + 20)  # later: the timer stays
    assert len(timers) == 1 and 9 < timers[0].delay <= 10
    waits.park(Waiter(_Batch(), 0, [], None), now + 1)  # earlier: the timer moves
    assert len(timers) == 2 and timers[0].closed and timers[1].delay <= 1


def test_take_due_returns_only_past_deadlines_and_sets_the_timer_for_the_next():
    waits, timers = make()
    now = time.monotonic()
    late, gone, due_second, due_first = (Waiter(_Batch(), i, [], None) for i in range(4))
    waits.park(late, now + 30)
    waits.park(gone, now - 2)
    waits.park(due_second, now - 0.5)
    waits.park(due_first, now - 1)
    waits.remove(gone)  # woken by an item: its deadline entry is skipped
    assert waits.take_due() == [due_first, due_second]
    assert 29 < timers[-1].delay <= 30 and not timers[-1].closed
    assert list(waits.clear()) == [late]
    assert timers[-1].closed


def test_entries_of_woken_waiters_do_not_pile_up():
    waits, _ = make()
    deadline = time.monotonic() + 60
    keep = Waiter(_Batch(), 0, [], None)
    waits.park(keep, deadline)
    for _ in range(10_000):  # many-clients: park, then woken by the next item
        waiter = Waiter(_Batch(), 0, [], None)
        waits.park(waiter, deadline)
        waits.remove(waiter)
    assert len(waits._in_order) < 100
    assert len(waits._deadlines) < 100
    assert len(waits._arrivals) < 100
    assert waits.oldest() is keep


def test_entries_of_woken_waiters_with_earlier_deadlines_do_not_pile_up():
    waits, _ = make()
    now = time.monotonic()
    keep = Waiter(_Batch(), 0, [], None)
    waits.park(keep, now + 60)
    for _ in range(10_000):  # each deadline earlier than keep's: each goes on the heap
        waiter = Waiter(_Batch(), 0, [], None)
        waits.park(waiter, now + 30)
        waits.remove(waiter)
    assert len(waits._deadlines) < 100
    assert waits.oldest() is keep


def test_deadlines_in_park_order_and_out_of_it_come_due_together_earliest_first():
    waits, timers = make()
    now = time.monotonic()
    first, third, second, later = (Waiter(_Batch(), i, [], None) for i in range(4))
    waits.park(first, now - 3)
    waits.park(third, now - 1)
    waits.park(second, now - 2)  # earlier than the last deadline parked
    waits.park(later, now + 30)
    assert waits.take_due() == [first, second, third]
    assert 29 < timers[-1].delay <= 30
    assert waits.oldest() is later


def test_once_every_waiter_has_gone_any_deadline_is_in_order_again():
    waits, _ = make()
    now = time.monotonic()
    long_wait, short_wait = Waiter(_Batch(), 0, [], None), Waiter(_Batch(), 1, [], None)
    waits.park(long_wait, now + 30)
    waits.remove(long_wait)  # woken: nothing parked is left
    waits.park(short_wait, now - 1)
    assert not waits._deadlines
    assert waits.take_due() == [short_wait]
    assert not waits and waits.take_due() == []


def test_waking_parking_and_leaving_in_any_order_keep_arrival_order_and_deadlines():
    """Against a plain list: oldest first after any mix of parks, wakes of the oldest, leaves from
    the middle (hang-ups) and deadlines coming due, past the point where passed entries are cut."""
    rng = random.Random(56)
    waits, _ = make()
    parked: list[Waiter] = []  # the model: arrival order
    now = time.monotonic()
    for step in range(20_000):
        action = rng.random()
        due_only = step // 500 % 4 == 3
        if action < 0.45 or not parked:
            # mostly one timeout (in order), some earlier ones (the heap), some already due; in
            # every fourth stretch all are due, so that take_due also takes every waiter there is
            deadline = now + (-1.0 if due_only else rng.choice((1000.0, 1000.0, 1000.0, 500.0, -1.0)))
            waiter = Waiter(_Batch(), step, [], None)
            waits.park(waiter, deadline)
            parked.append(waiter)
        elif action < 0.85:
            assert waits.oldest() is parked[0]
            waits.remove(parked.pop(0))
        elif action < (0.9 if due_only else 0.97):
            waits.remove(parked.pop(rng.randrange(len(parked))))
        else:
            due = waits.take_due()
            expected = [waiter for waiter in parked if waiter.deadline <= time.monotonic()]
            assert set(due) == set(expected) and len(due) == len(expected)
            assert [waiter.deadline for waiter in due] == sorted(waiter.deadline for waiter in due)
            parked = [waiter for waiter in parked if waiter not in due]
        assert len(waits) == len(parked)
        assert waits.oldest() is (parked[0] if parked else None)
        # what is passed is cut off, and what is kept is bounded by what is parked
        assert waits._first < 32 and waits._in_order_first < 32
        assert len(waits._arrivals) - waits._first <= 2 * len(parked) + 65
        assert len(waits._in_order) - waits._in_order_first <= 2 * len(parked) + 65
    assert list(waits.clear()) == parked
