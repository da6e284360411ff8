"""The thrift open-read map on a real gevent hub: ids, counts, and the auto-abort timer."""

from __future__ import annotations

import gevent

from kestrel_actors.messages import QueueBatch, Unremove
from kestrel_actors.session._thrift_reads import ThriftReads, first_id


class Inbox:
    """A queue's place in the map: records what the timer tells it."""

    def __init__(self) -> None:
        self.messages: list[QueueBatch] = []

    def tell(self, message: QueueBatch) -> None:
        self.messages.append(message)


def aborted(inbox: Inbox) -> list[int]:
    xids = []
    for batch in inbox.messages:
        for op in batch.ops:
            assert type(op) is Unremove
            xids.extend(op.xids)
    return xids


def test_first_id_is_boot_time_based_and_never_below_1():
    assert first_id(0) == 1
    assert first_id(1_800_000_000_000) == 1_800_000_000_000 * 1024
    assert first_id() > first_id(1_000)


def test_ids_count_up_and_close_only_known_ones():
    reads = ThriftReads(gevent.get_hub(), next_id=7)
    queue = Inbox()
    owner = {"q": 2}
    assert reads.open("q", 1, queue, owner, 60_000) == 7
    assert reads.open("q", 2, queue, owner, 60_000) == 8
    closed = reads.close([8, 99, 8])
    assert [read.xid for read in closed] == [2]
    assert owner == {"q": 1}
    reads.close([7])
    assert owner == {} and reads.reads == {}


def test_the_timer_aborts_due_reads_through_the_dispatcher_and_skips_closed_ones():
    reads = ThriftReads(gevent.get_hub(), next_id=1)
    one, two = Inbox(), Inbox()
    owner = {"a": 2, "b": 1}
    reads.open("a", 10, one, owner, 50)
    kept = reads.open("a", 11, one, owner, 50)
    reads.open("b", 20, two, owner, 2000)
    reads.close([kept])  # confirmed before its time: never aborted
    assert wait(lambda: aborted(one))
    assert aborted(one) == [10] and aborted(two) == []  # b's time has not come
    assert owner == {"b": 1}
    assert wait(lambda: aborted(two))
    assert aborted(two) == [20]
    assert owner == {} and reads.reads == {}


def wait(check, timeout: float = 5.0) -> bool:
    """Let the hub run (the timer, then the dispatcher's tell) until ``check`` holds."""
    for _ in range(int(timeout / 0.01)):
        if check():
            return True
        gevent.sleep(0.01)
    return bool(check())
