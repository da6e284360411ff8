"""When :class:`_malloc.HeldMemory` has the heap trimmed: once a fall of a step has lasted a
whole look, not while the held memory is still falling, and not for a fall it rose back from
(a reader and producers cycling a queue). The looks are called here in place of the hub's timer;
tests/session/test_memory_return.py runs the same against a server."""

from __future__ import annotations

from kestrel_actors._malloc import SETTLE, TRIM_STEP, HeldMemory

MIB = 1024 * 1024


def watched(start: int) -> tuple[HeldMemory, list[int]]:
    """A HeldMemory holding ``start`` bytes, and the list its falls are recorded in."""
    held = HeldMemory()
    falls: list[int] = []
    held.on_fall = lambda: falls.append(held.total)
    held.moved(start)
    return held, falls


def test_a_fall_that_lasts_a_whole_look_is_trimmed_once():
    held, falls = watched(100 * MIB)
    held.moved(-TRIM_STEP)
    assert falls == [100 * MIB - TRIM_STEP] and held.due
    assert held.look()
    held.trimmed()
    assert (held.trims, held.high, held.due) == (1, 100 * MIB - TRIM_STEP, False)
    held.moved(-MIB)
    assert falls == [100 * MIB - TRIM_STEP]  # a step below the new mark only


def test_a_fall_still_going_on_waits_for_a_look_without_one():
    held, falls = watched(100 * MIB)
    held.moved(-TRIM_STEP)
    held.moved(-SETTLE)  # a reader still reading the backlog out
    assert not held.look() and held.due
    held.moved(-(SETTLE - 1))  # less than SETTLE: reading has stopped
    assert held.look()
    assert len(falls) == 1


def test_a_fall_risen_back_from_is_not_trimmed():
    held, falls = watched(100 * MIB)
    for _ in range(3):  # read out and put back, between two looks
        held.moved(-(TRIM_STEP + 4 * MIB))
        held.moved(TRIM_STEP + 4 * MIB)
    assert not held.look() and not held.due
    held.moved(-(TRIM_STEP + 4 * MIB))  # the next fall starts a wait of its own
    assert len(falls) == 2 and held.due


def test_a_rise_and_a_new_fall_between_two_looks_wait_one_more():
    held, falls = watched(100 * MIB)
    held.moved(-(TRIM_STEP + 4 * MIB))
    held.moved(TRIM_STEP + 4 * MIB)
    held.moved(-(TRIM_STEP + 4 * MIB))  # down again when the look comes
    assert not held.look() and held.due
    assert held.look()
    assert len(falls) == 1
