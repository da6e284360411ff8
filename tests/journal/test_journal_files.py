"""FileJournal on the gevent runtime: logsize, the writer and its sync policies, rotation,
rewrite under crashes, erase, and opening a queue at startup (behaviour §6)."""

from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path

import gevent
import gevent.event
import pytest

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import FileJournal, Item, MemoryJournal, make_file_opener, open_file_journal, replay_queue
from kestrel_actors.journal._format import encode_add, encode_remove_tentative, write_all


class State:
    """What a journal needs to know of its queue to rewrite it."""

    def __init__(self, items=(), open_reads=None):
        self.items = deque(items)
        self.open_reads = dict(open_reads or {})
        self.bytes = sum(len(i.data) for i in self.items)


def durable(journal) -> None:
    """Block this greenlet until everything so far is durable by the journal's policy."""
    done = gevent.event.Event()
    journal.after_durable(done.set)
    assert done.wait(timeout=10)


def summary(result):
    return [i.data for i in result.items], {x: i.data for x, i in result.open_items.items()}


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path)


def test_logsize_arithmetic(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig())
    assert os.path.exists(os.path.join(data_dir, "q")) and journal.size() == 0
    journal.add(Item(b"x" * 11, 1))
    assert journal.size() == 32
    journal.remove()
    assert journal.size() == 33
    journal.add(Item(b"y", 1))
    journal.remove_tentative(1)
    assert journal.size() == 33 + 22 + 5
    journal.confirm_remove(1)
    assert journal.size() == 65
    journal.unremove(2)
    assert journal.size() == 70
    durable(journal)
    assert os.path.getsize(os.path.join(data_dir, "q")) == 70 == journal.size()
    journal.close()


def test_first_second_get_is_54(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig())
    journal.add(Item(b"first", 1))
    journal.add(Item(b"second", 1))
    journal.remove()
    journal.close()
    assert os.path.getsize(os.path.join(data_dir, "q")) == 54


def test_reopen_continues_the_file(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig())
    journal.add(Item(b"abc", 1))
    journal.close()
    again = FileJournal(data_dir, "q", QueueConfig())
    assert again.size() == 24
    again.remove()
    again.close()
    assert summary(replay_queue(data_dir, "q")) == ([], {})


def test_records_pile_up_into_few_writes(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig())
    for i in range(1000):
        journal.add(Item(b"%d" % i, i))
    durable(journal)
    assert journal.writer.writes <= 2 and journal.writer.fsyncs == 0
    assert [i.data for i in replay_queue(data_dir, "q").items] == [b"%d" % i for i in range(1000)]
    journal.close()


def test_never_sync_calls_back_after_the_write_without_fsync(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig(sync_journal=None))
    fired = []
    journal.add(Item(b"a", 1))
    # the write happens before the callback, inline when the file is free: the record is in
    # the file when the callback runs, and nothing was fsynced
    journal.after_durable(lambda: fired.append(os.path.getsize(os.path.join(data_dir, "q"))))
    for _ in range(1000):
        if fired:
            break
        gevent.sleep(0.01)
    assert fired == [22] and journal.writer.fsyncs == 0
    journal.after_durable(lambda: fired.append("now"))
    assert fired[-1] == "now"  # nothing pending: at once
    journal.close()


def test_group_commit_shares_fsyncs_and_waits_for_them(data_dir, monkeypatch):
    journal = FileJournal(data_dir, "q", QueueConfig(sync_journal=0.0))
    writer = journal.writer
    real = os.fdatasync

    def slow_fdatasync(fd):
        gevent.sleep(0)  # (runs on a worker thread: this is a no-op there)
        threading.Event().wait(0.003)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    problems = []
    done = []

    def client(i):
        journal.add(Item(b"item %d" % i, i))
        target = writer.appended
        event = gevent.event.Event()

        def callback():
            if writer.synced < target:
                problems.append(i)
            done.append(i)
            event.set()

        journal.after_durable(callback)
        event.wait(timeout=10)

    gevent.joinall([gevent.spawn(client, i) for i in range(200)], timeout=30)
    assert len(done) == 200 and problems == []
    assert 1 <= writer.fsyncs < 50, writer.fsyncs
    assert len(replay_queue(data_dir, "q").items) == 200
    journal.close()


def test_always_waits_for_the_sessions_the_last_round_answered(data_dir, monkeypatch):
    """Each client sends its next record a moment after its answer (a turn of the loop later,
    as a session's next request comes). A round started as soon as the last one ended would take
    only the first to come back, and leave the rest to the round after: two fdatasyncs per pass
    of the clients. The next round waits for as many records as the last one had (or a short
    while), so that each round takes every client.

    The moment is a loop turn, not a timed sleep: with sleeps of 0.1–0.5 ms, a process held off
    its CPU for 2 ms (four test workers on two cores) let the gathering timer fire before the
    clients' sleeps ended, and the rounds came out at 12.5 records, not 19."""
    journal = FileJournal(data_dir, "q", QueueConfig(sync_journal=0.0))
    writer = journal.writer
    real = os.fdatasync

    def slow_fdatasync(fd):
        threading.Event().wait(0.003)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    clients, records = 20, 600
    added = []

    def client(i):
        while len(added) < records:
            journal.add(Item(b"%d %d" % (i, len(added)), i))
            added.append(i)
            event = gevent.event.Event()
            journal.after_durable(event.set)
            assert event.wait(timeout=10)
            gevent.sleep(0)

    gevent.joinall([gevent.spawn(client, i) for i in range(clients)], timeout=60, raise_error=True)
    assert len(replay_queue(data_dir, "q").items) == len(added)
    # 18 records a round here (600 in 33 fdatasyncs); 10 without the wait: alternately the
    # first client back, then the other 19
    assert len(added) / writer.fsyncs >= 15, (len(added), writer.fsyncs)
    journal.close()


class _Gate:
    """``os.fdatasync`` held, call by call, until the test lets each one go; it then returns
    without syncing, so that how long a call takes is the test's alone, not the disk's (the
    records are written all the same: a replay reads them)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        self.let_go = 0
        self.cond = threading.Condition()

        def gated(_fd):
            with self.cond:
                self.calls += 1
                mine = self.calls
                self.cond.wait_for(lambda: self.let_go >= mine, timeout=10)

        monkeypatch.setattr(os, "fdatasync", gated)

    def entered(self, count: int) -> None:
        for _ in range(10000):
            if self.calls >= count:
                return
            gevent.sleep(0.001)
        raise AssertionError(f"fdatasync call {count} never came ({self.calls})")

    def release(self, count: int) -> None:
        with self.cond:
            self.let_go = count
            self.cond.notify_all()


def test_always_overlaps_rounds_when_many_sessions_wait(data_dir, monkeypatch):
    """Many sessions (5,001 records a pass here: at 20 µs each, 100 ms, which the second
    fdatasync stays well under on a loaded machine) and an fdatasync shorter than serving them
    would take: the record that came during a round's fdatasync starts its own round before
    that round's answers go, so that the disk syncs while the hub answers (issue 24). With
    few sessions the answers go first and the next round waits for them (the test above)."""
    journal = FileJournal(data_dir, "q", QueueConfig(sync_journal=0.0))
    writer = journal.writer
    gate = _Gate(monkeypatch)
    journal.add(Item(b"first", 1))
    journal.after_durable(lambda: None)
    gate.entered(1)  # round 1: one record
    at_answer: list[tuple[int, int]] = []
    for i in range(5000):
        journal.add(Item(b"%d" % i, i + 2))
        journal.after_durable(lambda: at_answer.append((writer.written, writer.appended)))
    gate.release(1)
    gate.entered(2)  # round 2: the 5,000 that came during round 1
    journal.add(Item(b"late", 9000))
    journal.after_durable(lambda: None)
    gate.release(2)  # at once: 5,001 sessions' records need longer than this fdatasync took
    for _ in range(10000):
        if len(at_answer) == 5000:
            break
        gevent.sleep(0.001)
    assert len(at_answer) == 5000
    written, appended = at_answer[0]
    # the late record was already written for round 3 when round 2's first answer went
    assert written == appended, (written, appended)
    gate.release(10**6)
    journal.close()
    assert len(replay_queue(data_dir, "q").items) == 5002


def test_always_holds_the_callback_until_fdatasync_returns(data_dir, monkeypatch):
    journal = FileJournal(data_dir, "q", QueueConfig(sync_journal=0.0))
    release = threading.Event()
    entered = threading.Event()
    real = os.fdatasync

    def blocked_fdatasync(fd):
        entered.set()
        release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", blocked_fdatasync)
    fired = []
    journal.add(Item(b"a", 1))
    journal.after_durable(lambda: fired.append(1))
    for _ in range(2000):
        gevent.sleep(0.005)
        if entered.is_set():
            break
    assert entered.is_set()
    gevent.sleep(0.05)  # the hub runs on while the fsync is stuck in its thread
    assert fired == []
    release.set()
    for _ in range(2000):
        if fired:
            break
        gevent.sleep(0.005)
    assert fired == [1] and journal.writer.synced == journal.writer.appended
    journal.close()


def test_periodic_sync_replies_after_the_write_and_syncs_later(data_dir):
    """The reply comes once the record is written, before any fdatasync (what the durability
    callback sees, in the writer's own turn, the turn that starts the period); the fdatasync
    comes later, and never while the hub's clock (the one the writer's timer runs on, so load
    cannot move one against the other) is short of the period after that turn; then, idle,
    no more."""
    period = 0.5  # long beside an fdatasync's own time: one started early ends inside it
    loop = gevent.get_hub().loop
    journal = FileJournal(data_dir, "q", QueueConfig(sync_journal=period))
    journal.add(Item(b"a", 1))
    replied = []
    journal.after_durable(lambda: replied.append(
        (journal.writer.fsyncs, journal.writer.written == journal.writer.appended, loop.now())))
    durable(journal)  # (its callback comes after the one above)
    [(fsyncs_at_reply, all_written_at_reply, replied_at)] = replied
    assert fsyncs_at_reply == 0 and all_written_at_reply
    period_ends = replied_at + period - 0.01  # (a margin for the clock's rounding)
    while journal.writer.fsyncs == 0:
        assert loop.now() < replied_at + 10, "no fdatasync within 10 s"
        gevent.sleep(0.001)
        if loop.now() < period_ends:
            assert journal.writer.fsyncs == 0, "an fdatasync before the period"
    assert journal.writer.fsyncs == 1 and journal.writer.synced == journal.writer.appended
    gevent.sleep(0.2)
    assert journal.writer.fsyncs == 1  # idle: the timer stopped
    journal.close()


def test_rotation(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig())
    journal.add(Item(b"a", 1))
    first = journal.rotate()
    journal.add(Item(b"b", 2))
    second = journal.rotate()
    journal.add(Item(b"c", 3))
    durable(journal)
    assert first != second and first.startswith("q.") and second.startswith("q.")
    assert int(first[2:]) < int(second[2:])
    assert journal.rotations == 2 and journal.size() == 22 and journal.archived_size == 44
    assert journal.total_size() == 66
    assert sorted(os.listdir(data_dir)) == sorted(["q", first, second])
    assert [i.data for i in replay_queue(data_dir, "q").items] == [b"a", b"b", b"c"]
    journal.close()


def test_rewrite_writes_open_reads_descending_then_items(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig())
    for data in (b"a", b"b", b"c", b"d", b"e"):
        journal.add(Item(data, 1))
    journal.remove_tentative(1)
    journal.remove_tentative(2)
    journal.remove()
    journal.rotate()
    journal.remove_tentative(3)
    durable(journal)
    state = State([Item(b"e", 1)], {1: Item(b"a", 1, 0, 1), 2: Item(b"b", 1, 0, 2), 3: Item(b"d", 1, 0, 3)})
    before = summary(replay_queue(data_dir, "q"))
    assert journal.rewrite(state)
    # files this small are unlinked before the rewrite answers, as Kestrel's are
    assert os.listdir(data_dir) == ["q"] and journal.rewrites == 1 and journal.archived_size == 0
    expected = (encode_add(Item(b"d", 1)) + encode_remove_tentative(3) + encode_add(Item(b"b", 1))
                + encode_remove_tentative(2) + encode_add(Item(b"a", 1)) + encode_remove_tentative(1)
                + encode_add(Item(b"e", 1)))
    assert Path(data_dir, "q").read_bytes() == expected
    assert journal.size() == len(expected)
    assert summary(replay_queue(data_dir, "q")) == before
    journal.add(Item(b"f", 2))
    journal.close()
    assert summary(replay_queue(data_dir, "q"))[0] == [b"e", b"f"]


def test_empty_rewrite_is_a_zero_byte_file(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig())
    journal.add(Item(b"a", 1))
    journal.remove()
    assert journal.rewrite(State())
    assert os.listdir(data_dir) == ["q"] and os.path.getsize(os.path.join(data_dir, "q")) == 0
    journal.close()


def test_a_rewrite_deletes_the_files_it_replaced_off_the_event_loop(data_dir, monkeypatch):
    """From ``DELETE_OFF_LOOP_FROM`` bytes (here any), the archives and the old current file are
    renamed ``q~~<ms>.gone`` by the rewrite and unlinked on the threadpool, never on the loop's
    thread; the queue replays the same."""
    monkeypatch.setattr("kestrel_actors.journal._file.DELETE_OFF_LOOP_FROM", 0)
    journal = FileJournal(data_dir, "q", QueueConfig())
    for data in (b"a", b"b", b"c"):
        journal.add(Item(data, 1))
        journal.rotate()
    journal.remove()
    durable(journal)
    before = summary(replay_queue(data_dir, "q"))
    unlinked = []
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        unlinked.append((str(path), threading.get_ident()))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    assert journal.rewrite(State([Item(b"b", 1), Item(b"c", 1)]))
    left = sorted(os.listdir(data_dir))  # nothing unlinked yet: this greenlet has not yielded
    assert left[0] == "q" and len(left) == 5 and all(f.startswith("q~~") and f.endswith(".gone") for f in left[1:])
    journal._wait_for_deletions()
    # (the others unlinked are the checkpoint's, in its own directory)
    gone = sorted(os.path.basename(path) for path, _thread in unlinked if os.path.dirname(path) == data_dir)
    assert gone == left[1:] and all(thread != threading.get_ident() for _path, thread in unlinked)
    assert os.listdir(data_dir) == ["q"] and summary(replay_queue(data_dir, "q")) == before
    journal.add(Item(b"d", 1))
    journal.close()
    assert summary(replay_queue(data_dir, "q"))[0] == [b"b", b"c", b"d"]


def test_a_leftover_gone_file_is_deleted_at_start_and_never_replayed(data_dir):
    """A stop before a rewrite's deletions finished leaves ``q~~<ms>.gone`` files: the next
    start deletes them and replays only the journal's own files."""
    journal = FileJournal(data_dir, "q", QueueConfig())
    journal.add(Item(b"kept", 1))
    journal.rotate()
    journal.add(Item(b"kept too", 1))
    journal.close()
    for ts in (1, 2**40):  # before and after the archive's timestamp
        with open(os.path.join(data_dir, f"q~~{ts}.gone"), "wb") as gone:
            gone.write(encode_add(Item(b"replaced %d" % ts, 1)))
    journal, state = open_file_journal(data_dir, "q", QueueConfig())
    assert [i.data for i in state.items] == [b"kept", b"kept too"]
    assert not any(f.endswith(".gone") for f in os.listdir(data_dir))
    journal.close()


class Crash(BaseException):
    """The process died here."""


@pytest.mark.parametrize("archives", [0, 2])
def test_a_crash_at_any_step_of_a_rewrite_loses_nothing(tmp_path, monkeypatch, archives):
    step = 0
    while True:
        data_dir = str(tmp_path / f"crash{step}")
        os.mkdir(data_dir)
        journal = FileJournal(data_dir, "q", QueueConfig())
        items = [Item(b"item %d" % i, i) for i in range(6)]
        for n, item in enumerate(items):
            journal.add(item)
            if n < archives:
                journal.rotate()
        journal.remove()
        journal.remove_tentative(1)
        durable(journal)
        expected = summary(replay_queue(data_dir, "q"))
        assert expected == ([i.data for i in items[2:]], {1: b"item 1"})
        state = State(items[2:], {1: Item(b"item 1", 1, 0, 1)})
        calls = 0

        def crashing(real, crash_at=step):
            def wrapper(*args, **kwargs):
                nonlocal calls
                if calls == crash_at:
                    raise Crash()
                calls += 1
                return real(*args, **kwargs)
            return wrapper

        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", crashing(os.replace))
            patch.setattr(os, "unlink", crashing(os.unlink))
            try:
                journal.rewrite(state)
                finished = True
            except Crash:
                finished = False
        journal.writer.close(sync=False)
        assert summary(replay_queue(data_dir, "q")) == expected, (step, os.listdir(data_dir))
        assert not any("~~" in f for f in os.listdir(data_dir))
        if finished:
            assert os.listdir(data_dir) == ["q"]
            break
        step += 1
    assert step >= 4


def test_erase_deletes_every_file_of_the_queue(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig())
    journal.add(Item(b"a", 1))
    journal.rotate()
    for name in ("q.5.pack", "q~~9", "q.stray", "qq", "q+child"):
        open(os.path.join(data_dir, name), "wb").close()
    journal.add(Item(b"b", 1))
    journal.erase()
    assert sorted(os.listdir(data_dir)) == ["q+child", "q.stray", "qq"]
    journal.add(Item(b"late", 1))  # a dead letter after the delete: ignored, no file comes back
    journal.remove()
    fired = []
    journal.after_durable(lambda: fired.append(1))
    gevent.sleep(0.01)
    assert fired == [1] and sorted(os.listdir(data_dir)) == ["q+child", "q.stray", "qq"]


def test_close_flushes_and_later_calls_are_ignored(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig(sync_journal=0.0))
    journal.add(Item(b"a", 1))
    journal.close()
    assert journal.writer.fsyncs == 1
    journal.add(Item(b"b", 1))
    journal.close()
    assert [i.data for i in replay_queue(data_dir, "q").items] == [b"a"]


def test_open_backs_out_open_reads_in_ascending_xid_order(data_dir):
    journal = FileJournal(data_dir, "q", QueueConfig())
    for i, data in enumerate((b"one", b"two", b"three", b"four", b"five")):
        journal.add(Item(data, i))
    for xid in (1, 2, 3, 4):
        journal.remove_tentative(xid)
    journal.confirm_remove(2)
    journal.confirm_remove(4)
    journal.close()
    size_before = os.path.getsize(os.path.join(data_dir, "q"))
    journal, state = open_file_journal(data_dir, "q", QueueConfig())
    assert [i.data for i in state.items] == [b"one", b"three", b"five"]
    assert state.open_items == {} and state.length == 3 and state.bytes == 12 and state.total_items == 5
    assert state.xid == 4 and all(i.xid == 0 for i in state.items)
    assert journal.size() == size_before + 10
    journal.close()
    tail = Path(data_dir, "q").read_bytes()[size_before:]
    assert tail == b"\x05\x03\x00\x00\x00\x05\x01\x00\x00\x00"  # UNREMOVE 3, then UNREMOVE 1
    journal, state = open_file_journal(data_dir, "q", QueueConfig())
    assert [i.data for i in state.items] == [b"one", b"three", b"five"] and journal.size() == size_before + 10
    journal.close()


def test_file_opener_builds_a_queue_core_that_survives_a_restart(data_dir):
    opener = make_file_opener(data_dir)
    config = QueueConfig()
    core = opener("jobs", config)
    assert isinstance(core.journal, FileJournal) and os.path.exists(os.path.join(data_dir, "jobs"))
    for i in range(5):
        assert core.add(b"job %d" % i, 0, 1000 + i)
    assert core.remove(2000).data == b"job 0"
    opened = core.remove(2000, transactional=True)
    assert opened.xid == 1
    stats = dict(core.stats(3000, 0))
    assert stats["logsize"] == 5 * 26 + 1 + 5 and stats["journal_rewrites"] == 0
    core.journal.close()
    again = opener("jobs", config)
    assert [i.data for i in again.items] == [b"job 1", b"job 2", b"job 3", b"job 4"]
    assert again.total_items == 5 and again.bytes == 20
    assert again.remove(4000, transactional=True).xid == 2  # the counter went on from the journal
    again.journal.close()


def test_file_opener_without_journal_erases_old_files(data_dir):
    Path(data_dir, "t").write_bytes(encode_add(Item(b"old", 1)))
    open(os.path.join(data_dir, "t.5"), "wb").close()
    core = make_file_opener(data_dir)("t", QueueConfig(keep_journal=False))
    assert isinstance(core.journal, MemoryJournal) and os.listdir(data_dir) == [] and not core.items


def test_group_commit_through_a_gevent_actor(data_dir):
    """As the queue actor uses it: a handler journals, and the reply waits for the fsync."""
    from kestrel_actors.runtime import GeventActor, ReplyFuture

    journal = FileJournal(data_dir, "q", QueueConfig(sync_journal=0.0))

    class QueueLike(GeventActor):
        def on_receive(self, message):
            data, reply_to = message
            journal.add(Item(data, 1))
            target = journal.writer.appended
            journal.after_durable(lambda: reply_to.tell(journal.writer.synced >= target))

    ref = QueueLike.start()
    futures = []

    def client(i):
        future = ReplyFuture()
        futures.append(future)
        ref.tell((b"%d" % i, future))
        return future.get(timeout=10)

    results = [g.value for g in gevent.joinall([gevent.spawn(client, i) for i in range(100)], timeout=30)]
    assert results == [True] * 100
    assert journal.writer.fsyncs < 100
    ref.stop()
    journal.close()
    assert len(replay_queue(data_dir, "q").items) == 100


def test_write_all_writes_one_record_or_many_in_order(tmp_path):
    # one record goes with os.write, several with os.writev: the same bytes either way
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        write_all(fd, [b"one"], 3)
        write_all(fd, [b"two", b"-", b"three"], 9)
        many = [b"%d," % i for i in range(2000)]  # more chunks than IOV_MAX
        write_all(fd, many, sum(map(len, many)))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"onetwo-three" + b"".join(b"%d," % i for i in range(2000))


def test_a_closed_writer_never_acts_on_the_file_that_took_its_descriptor_number(data_dir):
    """After close the writer's old descriptor number may be another file's: a late switch of
    files (a rotation that lost the race with close) is refused and leaves that file open."""
    journal = FileJournal(str(data_dir), "q", QueueConfig())
    journal.add(Item(b"one", 1_700_000_000_000))
    writer = journal.writer
    journal.close()
    data_dir = Path(data_dir)
    other = data_dir / "other"
    fd = os.open(other, os.O_CREAT | os.O_RDWR)  # the lowest free number: most likely the old one
    try:
        with pytest.raises(OSError):
            writer.switch_file(str(data_dir / "q.next"))
        os.write(fd, b"still mine")
        assert other.read_bytes() == b"still mine"
        assert not (data_dir / "q.next").exists()
    finally:
        os.close(fd)
