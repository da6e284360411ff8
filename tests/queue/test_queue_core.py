"""QueueCore, the queue logic without actors or I/O (behaviour §5), with a recording journal."""

from __future__ import annotations

import pytest

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import MemoryJournal
from kestrel_actors.protocol import expiry_from_exptime
from kestrel_actors.queue import XID_MAX, Item, QueueCore

NOW = 1_700_000_000_000


class RecordingJournal(MemoryJournal):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple] = []

    def add(self, item):
        self.records.append(("add", item.data))

    def remove(self):
        self.records.append(("remove",))

    def remove_tentative(self, xid):
        self.records.append(("open", xid))

    def remove_tentative_many(self, xids):
        self.records.append(("opens", list(xids)))

    def unremove(self, xid):
        self.records.append(("unremove", xid))

    def confirm_remove(self, xid):
        self.records.append(("confirm", xid))

    def confirm_remove_many(self, xids):
        self.records.append(("confirms", list(xids)))


def make(**settings) -> QueueCore:
    return QueueCore("q", QueueConfig(**settings), RecordingJournal())


def drain(queue: QueueCore, now: int = NOW) -> list[bytes]:
    out = []
    while (item := queue.remove(now)) is not None:
        out.append(item.data)
    return out


def test_fifo_and_counters():
    queue = make()
    for i in range(5):
        assert queue.add(b"%d" % i, 0, NOW)
    assert (len(queue.items), queue.bytes, queue.total_items) == (5, 5, 5)
    assert drain(queue) == [b"0", b"1", b"2", b"3", b"4"]
    assert queue.bytes == 0


@pytest.mark.parametrize(
    ("exptime", "expected"),
    [(0, 0), (10, NOW + 10_000), (-1, NOW - 1000), (999_999, NOW + 999_999_000), (1_000_000, 1_000_000_000)],
)
def test_memcache_expiry(exptime, expected):
    assert expiry_from_exptime(exptime, NOW) == expected


def test_expired_items_are_never_delivered_and_are_counted():
    queue = make()
    queue.add(b"old", NOW + 10, NOW)
    queue.add(b"new", 0, NOW)
    assert queue.peek(NOW + 11).data == b"new"
    assert queue.expired_items == 1
    assert queue.journal.records[-1] == ("remove",)


def test_expiry_is_strictly_less_than_now():
    queue = make()
    queue.add(b"x", NOW, NOW)
    assert queue.peek(NOW).data == b"x"
    assert queue.peek(NOW + 1) is None


def test_an_expired_item_behind_a_live_one_waits_for_the_head():
    queue = make()
    queue.add(b"live", 0, NOW)
    queue.add(b"dead", NOW + 1, NOW)
    assert queue.discard_expired(NOW + 5) == 0
    assert queue.remove(NOW + 5).data == b"live"
    assert queue.remove(NOW + 5) is None
    assert queue.expired_items == 1


def test_an_item_that_expires_is_discarded_at_the_head_wherever_it_was_kept():
    """A queue looks at its head for expiry only while some item in memory has an expiry
    (``PackedItems.expiring``): one packed in a chunk behind items that never expire, and one
    opened and put back at the head, are still discarded by the first add after they expired."""
    queue = make()
    for i in range(1000):  # about 1.5 chunks of 100 B items: the one with an expiry packed
        assert queue.add(b"%04d" % i + b"." * 96, NOW + 10 if i == 500 else 0, NOW)
    for i in range(500):
        assert queue.remove(NOW).data[:4] == b"%04d" % i
    assert queue.add(b"later", 0, NOW + 20)
    assert queue.expired_items == 1 and queue.remove(NOW + 20).data[:4] == b"0501"
    drain(queue, NOW + 20)
    queue.add(b"opened", NOW + 30, NOW + 20)
    queue.add(b"live", 0, NOW + 20)
    opened = queue.remove(NOW + 20, transactional=True)
    assert opened is not None and queue.items.expiring == 0
    assert queue.unremove(opened.xid)  # back at the head, with its expiry
    assert queue.add(b"last", 0, NOW + 40)
    assert queue.expired_items == 2 and drain(queue, NOW + 40) == [b"live", b"last"]


def test_max_age_caps_expiry_and_is_recomputed_at_sweep():
    queue = make(max_age=10.0)
    queue.add(b"a", 0, NOW)
    assert queue.items.head().expiry == NOW + 10_000
    queue = make()
    queue.add(b"b", 0, NOW)
    queue.config = QueueConfig(max_age=1.0)  # reload lowered max_age
    assert queue.discard_expired(NOW + 2000) == 1


def test_max_expire_sweep_limits_every_sweep():
    queue = make(max_expire_sweep=2)
    for _ in range(5):
        queue.add(b"x", NOW + 1, NOW)
    assert queue.discard_expired(NOW + 10) == 2
    assert len(queue.items) == 3


def test_expire_to_queue_collects_expired_items():
    queue = make(expire_to_queue="later")
    queue.add(b"x", NOW + 1, NOW)
    queue.discard_expired(NOW + 10)
    assert [item.data for item in queue.expired_out] == [b"x"]


def test_max_items_refuses_at_the_edge():
    queue = make(max_items=2)
    assert queue.add(b"a", 0, NOW) and queue.add(b"b", 0, NOW)
    assert not queue.add(b"c", 0, NOW)
    assert queue.discarded == 0


def test_max_size_is_checked_before_the_add_so_one_add_overshoots():
    queue = make(max_size=510)
    assert queue.add(b"x" * 256, 0, NOW)
    assert queue.add(b"x" * 256, 0, NOW)
    assert not queue.add(b"x", 0, NOW)


def test_max_item_size_refuses_only_larger_items():
    queue = make(max_item_size=4)
    assert queue.add(b"1234", 0, NOW)
    assert not queue.add(b"12345", 0, NOW)


def test_discard_old_when_full_drops_the_head():
    queue = make(max_items=2, discard_old_when_full=True)
    for data in (b"a", b"b", b"c"):
        assert queue.add(data, 0, NOW)
    assert queue.discarded == 1
    assert drain(queue) == [b"b", b"c"]


def test_open_confirm_and_unremove_to_the_head():
    queue = make()
    for data in (b"a", b"b", b"c"):
        queue.add(data, 0, NOW)
    first = queue.remove(NOW, transactional=True)
    second = queue.remove(NOW, transactional=True)
    assert (first.xid, second.xid) == (1, 2)
    assert len(queue.items) == 1 and len(queue.open_reads) == 2
    assert queue.unremove(1)
    assert queue.confirm(2)
    assert not queue.confirm(2)
    assert drain(queue) == [b"a", b"c"]
    assert queue.canceled_transactions == 1
    assert ("open", 1) in queue.journal.records and ("confirm", 2) in queue.journal.records


def test_xids_past_the_wrap_skip_the_ids_still_open():
    # xids rise with no look-up until they wrap; then each skips an id still open
    queue = make()
    for data in (b"a", b"b", b"c", b"d", b"e", b"f"):
        queue.add(data, 0, NOW)
    assert [item.xid for item in queue.open_many(NOW, 3, 1 << 20)] == [1, 2, 3]
    assert queue.confirm(2)
    queue._xid = XID_MAX - 1  # as if 2**31 - 4 opens had come and gone since, 1 and 3 open all along
    assert [item.xid for item in queue.open_many(NOW, 2, 1 << 20)] == [XID_MAX, 2]
    assert queue.remove(NOW, transactional=True).xid == 4
    assert sorted(queue.open_reads) == [1, 2, 3, 4, XID_MAX]


def test_transactions_counts_attempts_on_a_non_empty_queue():
    queue = make()
    queue.remove(NOW, transactional=True)
    assert queue.transactions == 0
    queue.add(b"a", 0, NOW)
    queue.remove(NOW, transactional=True)
    assert queue.transactions == 1


def test_open_transaction_timeout_redelivers_in_order():
    queue = make(open_transaction_timeout=1.0)
    for data in (b"one", b"two", b"three"):
        queue.add(data, 0, NOW)
    for _ in range(3):
        queue.remove(NOW, transactional=True)
    later = NOW + 2000
    assert [queue.remove(later, transactional=True).data for _ in range(3)] == [b"one", b"two", b"three"]


def test_flush_leaves_open_reads_alone():
    queue = make()
    queue.add(b"a", 0, NOW)
    queue.add(b"b", 0, NOW)
    queue.remove(NOW, transactional=True)
    queue.flush(NOW)
    assert (len(queue.items), len(queue.open_reads), queue.total_flushes) == (0, 1, 1)


def test_age_is_zero_when_empty_else_time_since_last_removed_add():
    queue = make()
    queue.add(b"a", 0, NOW)
    queue.add(b"b", 0, NOW + 5)
    queue.remove(NOW + 10)
    stats = dict(queue.stats(NOW + 100, waiters=0))
    assert stats["age"] == 100
    queue.remove(NOW + 10)
    assert dict(queue.stats(NOW + 100, waiters=0))["age"] == 0


def test_a_closed_queue_refuses_and_answers_nothing():
    queue = make()
    queue.add(b"a", 0, NOW)
    queue.close()
    assert not queue.add(b"b", 0, NOW)
    assert queue.remove(NOW) is None and queue.peek(NOW) is None


def test_no_limit_is_held_above_the_compiled_builds_unboxed_int_range():
    # Kestrel's "no limit" (LONG_MAX) is above 2**62 - 1, past which a compiled comparison boxes
    # both sides on every SET; the request path's copy is clamped, and means the same limit
    limits = QueueCore("q", QueueConfig(), MemoryJournal()).limits
    assert QueueConfig().max_size > 2**62 - 1
    for name in ("max_items", "max_size", "max_item_size", "max_memory_size",
                 "max_journal_size", "default_journal_size"):
        assert getattr(limits, name) <= 2**62 - 1, name
    core = QueueCore("q", QueueConfig(max_items=2), MemoryJournal())
    assert [core.add(b"x", 0, NOW) for _ in range(3)] == [True, True, False]
    assert QueueCore("q", QueueConfig(), MemoryJournal()).add(b"y" * 100_000, 0, NOW)


# -- a run of plain removes (a pipelined burst of GETs) ----------------------------------------


def test_a_run_of_removes_takes_the_heads_in_order_with_one_remove_record_each():
    queue = make()
    for i in range(5):
        queue.add(b"%d" % i, 0, NOW + i)
    queue.journal.records.clear()
    taken: list = []
    assert queue.remove_run(NOW + 10, 3, 1 << 20, taken) == 3  # bytes taken
    assert [item.data for item in taken] == [b"0", b"1", b"2"]
    assert queue.journal.records == [("remove",)] * 3
    assert (queue.length, queue.bytes, queue.mem_bytes, len(queue.items)) == (2, 2, 2, 2)
    assert queue.last_removed_add_time == NOW + 2  # the last one's, as three removes leave it
    assert drain(queue) == [b"3", b"4"]


def test_a_run_of_removes_stops_at_an_empty_queue_and_at_its_byte_budget():
    queue = make()
    for data in (b"aaaa", b"bbbb", b"cccc"):
        queue.add(data, 0, NOW)
    taken: list = []
    # taken while less than the budget is held: the second item passes it, the third waits
    assert queue.remove_run(NOW, 10, 5, taken) == 8
    assert [item.data for item in taken] == [b"aaaa", b"bbbb"]
    assert queue.remove_run(NOW, 10, 100, taken) == 4
    assert queue.remove_run(NOW, 10, 100, taken) == 0
    assert len(taken) == 3 and queue.journal.records.count(("remove",)) == 3


def test_a_run_of_removes_leaves_an_item_that_may_expire_to_remove():
    queue = make()
    queue.add(b"a", 0, NOW)
    queue.add(b"old", NOW + 1, NOW)
    queue.add(b"b", 0, NOW)
    taken: list = []
    assert queue.remove_run(NOW + 5, 3, 100, taken) == 1  # stops before "old"
    assert queue.remove(NOW + 5).data == b"b"  # which remove discards, as it would have
    assert queue.expired_items == 1
    taken.clear()
    with_age = make(max_age=60.0)
    with_age.add(b"x", 0, NOW)
    assert with_age.remove_run(NOW, 1, 100, taken) == 0 and not taken  # every item may expire


# -- a monitor's batch (ADR 0022) ---------------------------------------------------------------

def test_a_monitor_batch_journals_its_opens_together_in_the_order_of_its_removals():
    queue = make()
    for data, expiry in ((b"a", 0), (b"b", 0), (b"stale", NOW + 5), (b"c", 0), (b"d", 0)):
        assert queue.add(data, expiry, NOW)
    queue.journal.records.clear()
    items = queue.open_many(NOW + 10, 10, 1 << 20)
    assert [(i.data, i.xid, i.opened) for i in items] == [(b"a", 1, NOW + 10), (b"b", 2, NOW + 10),
                                                         (b"c", 3, NOW + 10), (b"d", 4, NOW + 10)]
    # one record run per batch, split only by the expired head's REMOVE, which comes where it was taken
    assert queue.journal.records == [("opens", [1, 2]), ("remove",), ("opens", [3, 4])]
    assert sorted(queue.open_reads) == [1, 2, 3, 4] and queue.length == 0 and queue.expired_items == 1
    assert (queue.transactions, queue.last_removed_add_time) == (4, NOW)


def test_a_monitor_batch_stops_at_its_count_or_its_bytes():
    queue = make()
    for i in range(10):
        assert queue.add(b"%03d" % i, 0, NOW)
    assert [i.data for i in queue.open_many(NOW, 3, 1 << 20)] == [b"000", b"001", b"002"]
    assert [i.data for i in queue.open_many(NOW, 10, 7)] == [b"003", b"004", b"005"]  # 9 bytes >= 7
    assert queue.journal.records[-2:] == [("opens", [1, 2, 3]), ("opens", [4, 5, 6])]
    assert queue.open_many(NOW, 0, 1 << 20) == [] and queue.journal.records[-1] == ("opens", [4, 5, 6])


def test_with_an_open_timeout_a_batch_opens_one_by_one_so_a_timed_out_read_comes_between():
    queue = make(open_transaction_timeout=0.001)
    for data in (b"a", b"b", b"c"):
        assert queue.add(data, 0, NOW)
    assert [i.xid for i in queue.open_many(NOW, 1, 1 << 20)] == [1]
    queue.journal.records.clear()
    items = queue.open_many(NOW + 10, 2, 1 << 20)
    # the oldest open read times out before the next open: its UNREMOVE lies between the records
    assert queue.journal.records == [("unremove", 1), ("open", 2), ("open", 3)]
    assert [i.data for i in items] == [b"a", b"b"]


def test_a_monitor_batch_hands_out_its_xids_in_the_order_of_the_open_reads():
    queue = make()
    queue._xid = 1000
    for data in (b"a", b"b", b"c"):
        assert queue.add(data, 0, NOW)
    items = queue.open_many(NOW, 3, 1 << 20)
    assert [item.xid for item in items] == list(queue.open_reads) == [1001, 1002, 1003]
    timed = make(open_transaction_timeout=60.0)  # opened one by one: the same order
    assert timed.add(b"a", 0, NOW) and timed.add(b"b", 0, NOW)
    assert [i.xid for i in timed.open_many(NOW, 2, 1 << 20)] == list(timed.open_reads) == [1, 2]


def test_a_confirm_of_every_xid_sent_journals_them_in_the_order_sent():
    queue = make()
    for i in range(5):
        assert queue.add(b"%d" % i, 0, NOW)
    opened = queue.open_many(NOW, 5, 1 << 20)
    confirmed: list = []
    assert queue.confirm_many((3, 1, 2), confirmed) == 3
    assert confirmed == [opened[2], opened[0], opened[1]]
    assert queue.journal.records[-1] == ("confirms", [3, 1, 2]) and list(queue.open_reads) == [4, 5]
    assert queue.confirm_many((4, 5, 99), confirmed) == 2  # the last unknown: the others journaled
    assert queue.journal.records[-1] == ("confirms", [4, 5]) and not queue.open_reads


def test_a_confirm_of_a_batch_journals_its_confirms_together():
    queue = make()
    for i in range(4):
        assert queue.add(b"%d" % i, 0, NOW)
    opened = queue.open_many(NOW, 4, 1 << 20)
    confirmed: list = []
    assert queue.confirm_many((2, 99, 1, 4), confirmed) == 3  # 99 was never open
    assert confirmed == [opened[1], opened[0], opened[3]]
    assert queue.journal.records[-1] == ("confirms", [2, 1, 4]) and list(queue.open_reads) == [3]
    assert queue.confirm_many((99,), confirmed) == 0 and queue.journal.records[-1] == ("confirms", [2, 1, 4])


class ReadBehindJournal(RecordingJournal):
    """Keeps the adds made in read-behind as its backlog, as a file journal does, and notes at
    each read behind which open reads have no record yet: a file journal's fill may wait for
    the disk, and a checkpoint taken meanwhile would see them open with no record."""

    def __init__(self) -> None:
        super().__init__()
        self.backlog: list[bytes] = []
        self.behind = False
        self.queue: QueueCore | None = None
        self.unjournaled_at_fills: list[list[int]] = []

    def add(self, item):
        super().add(item)
        if self.behind:
            self.backlog.append(item.data)

    @property
    def in_read_behind(self):
        return self.behind

    def start_read_behind(self):
        self.behind = True

    def read_behind(self):
        journaled = {xid for record in self.records if record[0] == "opens" for xid in record[1]}
        self.unjournaled_at_fills.append(sorted(set(self.queue.open_reads) - journaled))
        if not self.backlog:
            self.behind = False
            return None
        return Item(self.backlog.pop(0), NOW)


def test_a_monitor_batch_journals_its_opens_before_each_read_behind_fill():
    journal = ReadBehindJournal()
    queue = journal.queue = QueueCore("q", QueueConfig(max_memory_size=4), journal)
    for i in range(10):
        assert queue.add(b"%02d" % i, 0, NOW)
    assert len(queue.items) == 2 and journal.backlog  # the rest only "on disk"
    items = queue.open_many(NOW, 10, 1 << 20)
    assert [i.data for i in items] == [b"%02d" % i for i in range(10)]
    assert journal.unjournaled_at_fills and not any(journal.unjournaled_at_fills)
    opens = [xid for record in journal.records if record[0] == "opens" for xid in record[1]]
    assert opens == list(range(1, 11))


class RemovesAtFillsJournal(ReadBehindJournal):
    """Notes at each read behind how many of the run's items have no REMOVE record yet."""

    def __init__(self, taken: list) -> None:
        super().__init__()
        self.taken = taken
        self.unjournaled_removes_at_fills: list[int] = []

    def read_behind(self):
        self.unjournaled_removes_at_fills.append(len(self.taken) - self.records.count(("remove",)))
        return super().read_behind()


def test_a_run_of_removes_journals_its_removes_before_each_read_behind_fill():
    taken: list = []
    journal = RemovesAtFillsJournal(taken)
    queue = journal.queue = QueueCore("q", QueueConfig(max_memory_size=4), journal)
    for i in range(10):
        assert queue.add(b"%02d" % i, 0, NOW)
    assert len(queue.items) == 2 and journal.backlog  # the rest only "on disk"
    total = 0
    while len(taken) < 10:
        got = queue.remove_run(NOW, 10, 1 << 20, taken)
        if not got:
            taken.append(queue.remove(NOW))  # a head still to be read back: remove's own turn
        total += 1
        assert total < 20
    assert [item.data for item in taken] == [b"%02d" % i for i in range(10)]
    assert journal.unjournaled_removes_at_fills and not any(journal.unjournaled_removes_at_fills)
    assert journal.records.count(("remove",)) == 10
