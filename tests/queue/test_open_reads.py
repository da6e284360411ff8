"""A queue's open reads held as runs of consecutive xids (``queue/_open.py``): ``OpenReads`` alone,
and a ``QueueCore`` opening and confirming runs through it (ADR 0022)."""

from __future__ import annotations

from kestrel_actors.messages import Confirm, Unremove, XidRun
from kestrel_actors.queue import XID_MAX, Item
from kestrel_actors.queue._open import OpenReads

from .test_queue_core import NOW, drain, make


def items(*names: str) -> list[Item]:
    return [Item(name.encode(), NOW) for name in names]


def table(first: int, *names: str) -> tuple[OpenReads, list[Item]]:
    reads = OpenReads()
    opened = items(*names)
    reads.add_run(first, list(opened))
    return reads, opened


def test_a_run_reads_as_a_dict_of_its_xids_oldest_first():
    reads, opened = table(7, "a", "b", "c")
    more = items("d", "e")
    reads.add_run(10, list(more))  # follows the run: the same run goes on
    reads[20] = Item(b"f", NOW)  # a gap: a run of its own
    assert len(reads) == 6 and list(reads) == [7, 8, 9, 10, 11, 20]
    assert [xid for xid, _ in reads.items()] == list(reads)
    assert reads.get(8) is opened[1] and reads[11] is more[1] and 20 in reads
    assert reads.get(6) is None and reads.get(12) is None and 19 not in reads
    assert reads.oldest() == (7, opened[0])


def test_a_confirm_of_the_run_takes_it_in_one_step():
    reads, opened = table(1, "a", "b", "c", "d")
    assert reads.pop_run((1, 2)) == opened[:2]
    assert list(reads) == [3, 4] and reads.oldest() == (3, opened[2])
    assert reads.pop_run((3, 4)) == opened[2:]
    assert not reads and list(reads) == [] and reads.oldest() is None


def test_a_run_confirmed_out_of_order_or_in_part():
    reads, opened = table(1, "a", "b", "c", "d", "e", "f")
    assert reads.pop_run((2, 4)) is None  # not consecutive: nothing taken
    assert reads.pop_run((3, 2)) is None  # not in order
    assert reads.pop_run((6, 7)) is None  # 7 was never open
    assert len(reads) == 6
    assert reads.pop_run((3, 4)) == opened[2:4]  # from the middle
    assert list(reads) == [1, 2, 5, 6]
    assert reads.pop_run((2, 3)) is None  # 3 is gone
    assert reads.pop(5) is opened[4] and reads.pop(5) is None
    assert reads.pop_run((6,)) == [opened[5]]  # the tail
    assert reads.pop(1) is opened[0] and list(reads) == [2] and reads.oldest() == (2, opened[1])
    reads[7] = Item(b"g", NOW)  # after a tail taken: a run of its own, still in order
    assert list(reads) == [2, 7] and reads.get(7) is not None
    assert reads.pop_run((2,)) == [opened[1]] and list(reads) == [7]


def test_a_read_held_behind_many_confirmed_keeps_no_slot_for_them():
    reads, opened = table(1, "old")
    for first in range(2, 10_002, 100):
        reads.add_run(first, items(*["x"] * 100))
        assert reads.pop_run(tuple(range(first, first + 100))) is not None
    assert list(reads) == [1] and reads.oldest() == (1, opened[0])
    assert sum(len(run.items) for run in reads._runs) < 300  # mostly-empty runs are split


def test_xids_that_wrapped_are_found_in_any_run():
    reads = OpenReads()
    reads.add_run(XID_MAX - 1, items("a", "b"))
    reads.add_run(1, items("c", "d"))  # wrapped: below the run before it
    reads.add_run(5, items("e"))
    assert list(reads) == [XID_MAX - 1, XID_MAX, 1, 2, 5]
    assert [reads[xid].data for xid in (XID_MAX, 2, 5)] == [b"b", b"d", b"e"]
    assert reads.pop_run((1, 2)) is not None and 3 not in reads and XID_MAX in reads
    reads.clear()
    assert not reads and list(reads) == []


def test_an_xid_given_out_again_past_the_wrap_is_found_in_its_own_run():
    reads = OpenReads()
    first = items(*"abcdefghij")
    reads.add_run(100, list(first))
    for xid in range(105, 110):
        assert reads.pop(xid) is first[xid - 100]  # empty slots left in the run's span
    reads.add_run(1, items("k"))  # wrapped
    again = Item(b"again", NOW)
    reads[107] = again  # free again: opened in a run of its own
    assert reads.get(107) is again and 107 in reads and reads.get(108) is None
    assert list(reads) == [100, 101, 102, 103, 104, 1, 107]
    assert reads.pop_run((107,)) == [again] and 107 not in reads and reads.get(104) is first[4]


def test_open_many_opens_runs_under_consecutive_xids_and_a_confirm_takes_them():
    queue = make()
    for i in range(6):
        assert queue.add(b"%d" % i, 0, NOW)
    first = queue.open_many(NOW, 4, 1 << 20)
    second = queue.open_many(NOW, 4, 1 << 20)
    assert [item.xid for item in first + second] == [1, 2, 3, 4, 5, 6] == list(queue.open_reads)
    assert queue.journal.records[-2:] == [("opens", [1, 2, 3, 4]), ("opens", [5, 6])]
    assert len(queue.open_reads._runs) == 1  # the second batch went on the first's run
    confirmed: list = []
    assert queue.confirm_many((1, 2, 3, 4, 5), confirmed) == 5 and confirmed == first + second[:1]
    assert queue.journal.records[-1] == ("confirms", [1, 2, 3, 4, 5]) and list(queue.open_reads) == [6]
    assert queue.confirm_many((6,), confirmed) == 1 and not queue.open_reads
    assert queue.length == 0 and queue.transactions == 6


def test_a_confirm_out_of_order_or_in_part_confirms_what_is_open():
    queue = make()
    for i in range(5):
        assert queue.add(b"%d" % i, 0, NOW)
    opened = queue.open_many(NOW, 5, 1 << 20)
    confirmed: list = []
    assert queue.confirm_many((4, 2), confirmed) == 2 and confirmed == [opened[3], opened[1]]
    assert queue.confirm_many((1, 2, 3), confirmed) == 2  # 2 is gone: 1 and 3 are confirmed
    assert queue.journal.records[-1] == ("confirms", [1, 3]) and list(queue.open_reads) == [5]


def test_an_abort_puts_a_run_back_at_the_head_as_before():
    queue = make()
    for data in (b"a", b"b", b"c", b"d"):
        assert queue.add(data, 0, NOW)
    queue.open_many(NOW, 3, 1 << 20)
    # a session that closes gives its reads back oldest first, each put back at the head
    assert all(queue.unremove(xid) for xid in (1, 2, 3))
    assert not queue.open_reads and queue.canceled_transactions == 3
    assert drain(queue) == [b"c", b"b", b"a", b"d"]


def test_an_abort_of_part_of_a_run_leaves_the_rest_open():
    queue = make()
    for data in (b"a", b"b", b"c", b"d"):
        assert queue.add(data, 0, NOW)
    queue.open_many(NOW, 4, 1 << 20)
    assert queue.unremove(2) and not queue.unremove(2)
    assert list(queue.open_reads) == [1, 3, 4]
    confirmed: list = []
    assert queue.confirm_many((3, 4), confirmed) == 2 and [i.data for i in confirmed] == [b"c", b"d"]
    assert drain(queue) == [b"b"] and list(queue.open_reads) == [1]


def test_a_run_opened_across_the_wrap_skips_the_xids_still_open():
    queue = make()
    for i in range(8):
        assert queue.add(b"%d" % i, 0, NOW)
    assert [item.xid for item in queue.open_many(NOW, 2, 1 << 20)] == [1, 2]
    queue._xid = XID_MAX - 2
    opened = queue.open_many(NOW, 5, 1 << 20)
    assert [item.xid for item in opened] == [XID_MAX - 1, XID_MAX, 3, 4, 5]
    assert list(queue.open_reads) == [1, 2, XID_MAX - 1, XID_MAX, 3, 4, 5]
    confirmed: list = []
    assert queue.confirm_many((XID_MAX - 1, XID_MAX, 3), confirmed) == 3
    assert queue.confirm_many((1, 2), confirmed) == 2 and list(queue.open_reads) == [4, 5]


def test_a_span_is_taken_in_one_step_only_when_all_of_it_is_open():
    reads, opened = table(1, "a", "b", "c", "d", "e")
    assert reads.pop_span(2, 0) is None and reads.pop_span(5, 2) is None  # 6 was never open
    assert reads.pop_span(2, 2) == opened[1:3] and list(reads) == [1, 4, 5]
    assert reads.pop_span(1, 4) is None and len(reads) == 3  # 2 and 3 are gone: nothing taken
    assert reads.pop_span(4, 2) == opened[3:] and reads.pop_span(1, 1) == opened[:1] and not reads


def test_a_confirm_of_a_sessions_runs_takes_each_run_whole_or_what_of_it_is_open():
    queue = make()
    for i in range(7):
        assert queue.add(b"%d" % i, 0, NOW)
    opened = queue.open_many(NOW, 7, 1 << 20)
    assert queue.confirm(3) is opened[2]
    confirmed: list = []
    assert queue.confirm_runs([XidRun(1, 2), XidRun(3, 3), XidRun(9, 1)], confirmed) == 4
    assert confirmed == opened[:2] + opened[3:5]  # 3 was confirmed before, 9 never opened
    assert queue.journal.records[-2:] == [("confirms", [1, 2]), ("confirms", [4, 5])]
    assert list(queue.open_reads) == [6, 7]
    assert queue.confirm_runs([XidRun(6, 2)], confirmed) == 2 and not queue.open_reads
    assert queue.confirm_runs([], confirmed) == 0 and len(confirmed) == 6


def test_an_abort_of_runs_names_each_xid_in_order():
    assert Unremove(runs=[XidRun(XID_MAX - 1, 2), XidRun(1, 2)]).each() == (XID_MAX - 1, XID_MAX, 1, 2)
    assert Confirm((4, 2)).each() == (4, 2) and Confirm(runs=[]).each() == ()
