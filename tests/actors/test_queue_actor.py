"""The queue actor in process: batches, waiters, fanout copies, expiry moves and journal failures.

Two ways in, both without a server process: a :class:`QueueBatch` told straight to a queue's
actor with a ``ReplyFuture`` as the session (what a batch answers, exactly), and the memcache
bytes of a session of the in-process harness (``tests/helpers.py``: :class:`World`).
"""

from __future__ import annotations

import gc
import time

import gevent
import gevent.event
import pytest

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import FileJournal, MemoryJournal
from kestrel_actors.messages import (
    Add,
    BatchDone,
    Confirm,
    Flush,
    JournalFailure,
    Open,
    OpenMany,
    Peek,
    PutBack,
    QueueBatch,
    Remove,
    RemoveMany,
    Unremove,
    XidRun,
)
from kestrel_actors.queue import QueueCore
from kestrel_actors.runtime import ReplyFuture

from ..helpers import LONG_WAIT_MS, PATIENCE, World, settle
from ..helpers import batch_reply as later
from ..helpers import resolve_queue as resolve
from ..helpers import run_batch as run


def soon() -> float:
    """The deadline of a read that must end for another reason (an item): far beyond the
    test's patience, so a read that waited for it fails the test."""
    return time.monotonic() + LONG_WAIT_MS / 1000


def data(results) -> list:
    return [None if item is None else item.data for item in results]


@pytest.fixture
def jobs(world):
    return resolve(world.collection, "jobs")


# -- batches ----------------------------------------------------------------------------------


def test_a_batch_answers_every_operation_in_order(jobs):
    results = run(jobs, Add(b"a", 0), Add(b"b", 0), Remove(None), Peek(None), Remove(None), Remove(None))
    assert results[:2] == [True, True]
    assert data(results[2:]) == [b"a", b"b", b"b", None]


def test_a_batch_sent_at_a_time_is_run_at_that_time(jobs):
    """A session's batch carries its one clock reading (``sent_at``): its items' add time, and
    the ``now`` its expiries are checked against (behaviour §5.1); without one the queue reads
    the clock."""
    sent_at = time.time() - 5.0
    sent_ms = int(sent_at * 1000)
    reply = ReplyFuture()
    jobs.tell(QueueBatch([Add(b"then", 0)], None, reply, None, sent_at))
    assert reply.get(timeout=PATIENCE).results == [True]
    before_ms = int(time.time() * 1000)
    assert run(jobs, Add(b"now", 0)) == [True]
    then, now = run(jobs, Remove(None), Remove(None))
    assert then.add_time == sent_ms
    assert now.add_time >= before_ms
    # expired now, not at the batch's time: its peek still finds it
    reply = ReplyFuture()
    jobs.tell(QueueBatch([Add(b"late", sent_ms + 1000), Peek(None)], None, reply, None, sent_at))
    assert data(reply.get(timeout=PATIENCE).results[1:]) == [b"late"]


def test_batches_keep_fifo_order_across_batches(jobs):
    for i in range(20):
        assert run(jobs, Add(b"%d" % i, 0)) == [True]
    assert data(run(jobs, *[Remove(None) for _ in range(20)])) == [b"%d" % i for i in range(20)]


def test_remove_many_takes_up_to_max_items(jobs):
    run(jobs, *[Add(b"%d" % i, 0) for i in range(5)])
    (taken,) = run(jobs, RemoveMany(3, None))
    assert [item.data for item in taken] == [b"0", b"1", b"2"]
    (rest,) = run(jobs, RemoveMany(10, None))
    assert [item.data for item in rest] == [b"3", b"4"]


def test_an_open_read_is_held_until_confirmed(jobs):
    run(jobs, Add(b"x", 0))
    (item,) = run(jobs, Open(None))
    assert item.data == b"x"
    assert data(run(jobs, Remove(None))) == [None]  # open elsewhere: nobody else gets it
    assert run(jobs, Confirm((item.xid,))) == [1]
    assert data(run(jobs, Remove(None))) == [None]


def test_an_unremove_gives_an_open_read_back_to_the_head(jobs):
    run(jobs, Add(b"first", 0), Add(b"second", 0))
    (item,) = run(jobs, Open(None))
    run(jobs, Unremove((item.xid,)))
    assert data(run(jobs, Remove(None), Remove(None))) == [b"first", b"second"]


def test_open_many_then_confirm_counts_what_it_confirmed(jobs):
    run(jobs, *[Add(b"%d" % i, 0) for i in range(4)])
    (items,) = run(jobs, OpenMany(4, None))
    assert run(jobs, Confirm(tuple(item.xid for item in items))) == [4]
    assert run(jobs, Confirm(tuple(item.xid for item in items))) == [0]  # already confirmed


def test_a_sessions_runs_are_confirmed_and_given_back_as_its_xids_would_be(jobs):
    run(jobs, *[Add(b"%d" % i, 0) for i in range(5)])
    (items,) = run(jobs, OpenMany(5, None))
    first = items[0].xid
    assert run(jobs, Confirm(runs=[XidRun(first, 2)]), Unremove(runs=[XidRun(first + 2, 3)])) == [2, None]
    assert run(jobs, Confirm(runs=[XidRun(first, 5)])) == [0]  # none is open any more
    assert data(run(jobs, *[Remove(None) for _ in range(4)])) == [b"4", b"3", b"2", None]


def test_put_back_returns_taken_items_to_the_queue(jobs):
    run(jobs, Add(b"a", 0), Add(b"b", 0))
    (taken,) = run(jobs, RemoveMany(1, None))
    run(jobs, PutBack(tuple(taken)))
    assert data(run(jobs, Remove(None), Remove(None), Remove(None))) == [b"b", b"a", None]


def test_flush_empties_the_queue(jobs):
    run(jobs, Add(b"a", 0), Add(b"b", 0))
    assert run(jobs, Flush()) == [None]
    assert data(run(jobs, Remove(None))) == [None]


def test_an_item_over_max_item_size_is_refused(tmp_path):
    world = World(tmp_path, queues={"small": QueueConfig(max_item_size=3)})
    try:
        small = resolve(world.collection, "small")
        assert run(small, Add(b"abc", 0), Add(b"abcd", 0)) == [True, False]
    finally:
        world.collection.stop()


def test_a_full_queue_refuses_or_discards_the_oldest(tmp_path):
    world = World(tmp_path, queues={
        "full": QueueConfig(max_items=2),
        "rolling": QueueConfig(max_items=2, discard_old_when_full=True),
    })
    try:
        full, rolling = resolve(world.collection, "full"), resolve(world.collection, "rolling")
        assert run(full, Add(b"1", 0), Add(b"2", 0), Add(b"3", 0)) == [True, True, False]
        assert run(rolling, Add(b"1", 0), Add(b"2", 0), Add(b"3", 0)) == [True, True, True]
        assert data(run(rolling, Remove(None), Remove(None), Remove(None))) == [b"2", b"3", None]
    finally:
        world.collection.stop()


def test_answering_batches_leaves_nothing_for_the_cyclic_collector(jobs):
    """A batch's answer and everything it holds are freed by reference counting as soon as
    they are told. Answers held in a reference cycle (closures sharing their scope) wait for
    the cyclic collector instead: three tracked objects per request that a young-generation
    pass then has to walk (ADR 0015)."""
    run(jobs, Add(b"warm", 0))
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(20):
            assert run(jobs, Add(b"a", 0)) == [True]
            assert len(run(jobs, Remove(None))) == 1
        gc.collect()
        ours = sorted({type(thing).__qualname__ for thing in gc.garbage
                       if type(thing).__module__.startswith("kestrel_actors.")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []


class _Answers:
    """Where a batch's answer goes (a stand-in, as a future is): the answers told to it."""

    def __init__(self) -> None:
        self.told: list[BatchDone] = []
        self.came = gevent.event.Event()

    def tell(self, done: BatchDone) -> None:
        self.told.append(done)
        self.came.set()


def test_an_answer_that_waited_for_an_fdatasync_carries_when_that_ended(tmp_path):
    """With ``sync_journal`` always, the answers an fdatasync lets go carry one reading of the
    clock taken when it ended (``answered_at``), which their sessions' latency figures take
    (``stats.record_batch``) rather than a reading each; an answer told at once carries none."""
    def file_opener(name, config):
        return QueueCore(name, config, FileJournal(str(tmp_path), name, config))

    world = World(tmp_path, opener=file_opener, queues={"durable": QueueConfig(sync_journal=0.0)})
    try:
        durable, plain = resolve(world.collection, "durable"), resolve(world.collection, "plain")
        for ref, waits in ((durable, True), (plain, False)):
            answers = _Answers()
            before = time.time()
            ref.tell(QueueBatch([Add(b"a", 0)], None, answers))
            assert answers.came.wait(timeout=PATIENCE)
            (done,) = answers.told
            assert done.results == [True]
            if waits:
                assert before <= done.answered_at <= time.time()
            else:
                assert done.answered_at == 0.0
    finally:
        world.collection.stop()


# -- waiters ----------------------------------------------------------------------------------


def test_a_blocking_read_is_woken_by_a_put(jobs):
    waiting = later(jobs, Remove(soon()))
    gevent.sleep(0.05)
    assert not waiting.ready()  # parked on the empty queue
    assert run(jobs, Add(b"late", 0)) == [True]
    assert data(waiting.get(timeout=PATIENCE).results) == [b"late"]


class _Answered:
    """A reply-to that notes, in one list shared with others, who was answered when."""

    def __init__(self, name: str, order: list[str]) -> None:
        self.name, self.order, self.done = name, order, ReplyFuture()

    def tell(self, message) -> None:
        self.order.append(self.name)
        self.done.set(message)


def test_a_put_that_wakes_a_reader_is_answered_before_the_reader(jobs):
    # the writer waits for STORED to send its next item; the woken reader's VALUE can follow
    order: list[str] = []
    reader, writer = _Answered("reader", order), _Answered("writer", order)
    jobs.tell(QueueBatch([Remove(soon())], None, reader))
    gevent.sleep(0.05)
    jobs.tell(QueueBatch([Add(b"item", 0)], None, writer))
    assert data(reader.done.get(timeout=PATIENCE).results) == [b"item"]
    assert writer.done.get(timeout=PATIENCE).results == [True]
    assert order == ["writer", "reader"]


def test_a_blocking_read_times_out_with_a_miss(jobs):
    """A miss at the deadline, not before it (load can only make it later)."""
    deadline = time.monotonic() + 0.15
    waiting = later(jobs, Remove(deadline))
    assert data(waiting.get(timeout=PATIENCE).results) == [None]
    assert time.monotonic() >= deadline - 0.05  # the hub's clock may lag a little


def test_waiters_are_woken_oldest_first_one_item_each(jobs):
    first, second = later(jobs, Remove(soon())), None
    gevent.sleep(0.02)
    second = later(jobs, Remove(soon()))
    gevent.sleep(0.02)
    run(jobs, Add(b"one", 0))
    assert data(first.get(timeout=PATIENCE).results) == [b"one"]
    gevent.sleep(0.05)
    assert not second.ready()
    run(jobs, Add(b"two", 0))
    assert data(second.get(timeout=PATIENCE).results) == [b"two"]


def test_a_parked_batch_goes_on_after_its_fetch(jobs):
    waiting = later(jobs, Remove(soon()), Add(b"after", 0), Peek(None))
    gevent.sleep(0.02)
    run(jobs, Add(b"item", 0))
    results = waiting.get(timeout=PATIENCE).results
    assert results[0].data == b"item" and results[1] is True and results[2].data == b"after"


def test_an_unremove_wakes_a_waiter(jobs):
    run(jobs, Add(b"x", 0))
    (item,) = run(jobs, Open(None))
    waiting = later(jobs, Remove(soon()))
    gevent.sleep(0.02)
    run(jobs, Unremove((item.xid,)))
    assert data(waiting.get(timeout=PATIENCE).results) == [b"x"]


def test_a_blocking_read_over_the_session_wakes_on_a_set_from_another(world):
    reader, writer = world.connect(), world.connect()
    reader.transport.take()
    from kestrel_actors.runtime import Dispatcher
    from kestrel_actors.session import Received

    Dispatcher.current().deliver(reader.ref, Received(reader.decoder.feed(b"get jobs/t=%d\r\n" % LONG_WAIT_MS)))
    settle()
    assert reader.transport.take() == b""
    assert writer.send(b"set jobs 0 0 5\r\nhello\r\n") == b"STORED\r\n"
    settle()
    assert reader.transport.take() == b"VALUE jobs 0 5\r\nhello\r\nEND\r\n"


def test_a_hang_up_cancels_the_wait_and_the_item_goes_to_the_next(world):
    from kestrel_actors.runtime import Dispatcher
    from kestrel_actors.session import Received

    gone, writer = world.connect(), world.connect()
    Dispatcher.current().deliver(gone.ref, Received(gone.decoder.feed(b"get jobs/t=%d\r\n" % LONG_WAIT_MS)))
    settle()
    gone.hang_up()
    assert writer.send(b"set jobs 0 0 1\r\nx\r\n") == b"STORED\r\n"
    assert writer.send(b"get jobs\r\n") == b"VALUE jobs 0 1\r\nx\r\nEND\r\n"
    assert world.stats.waiters_aborted == 1



def test_a_session_keeps_its_waiter_emptied_and_parks_it_again(world, jobs):
    """The queue finds a session's waiter through the session (to cancel it). A waiter that
    leaves (woken, timed out or cancelled) lets go of its batch, results and session, so no item
    outlives its wait there and no cycle runs through the session; woken, it parks again."""
    from kestrel_actors.messages import CancelWaits, Session

    def emptied(waiter) -> bool:
        return not waiter.parked and (waiter.batch, waiter.results, waiter.session) == (None, None, None)

    session = Session(1, "test")
    woken = ReplyFuture()
    jobs.tell(QueueBatch([Remove(soon())], session, woken))
    settle()
    waiter = session.waiter
    assert waiter is not None and waiter.parked and waiter.session is session
    run(jobs, Add(b"one", 0))
    assert data(woken.get(timeout=PATIENCE).results) == [b"one"]
    assert session.waiter is waiter and emptied(waiter)

    timed_out = ReplyFuture()
    jobs.tell(QueueBatch([Remove(time.monotonic() + 0.05)], session, timed_out))
    settle()
    assert session.waiter is waiter and waiter.parked  # parked again, not made anew
    assert data(timed_out.get(timeout=PATIENCE).results) == [None]
    assert emptied(session.waiter)

    cancelled = ReplyFuture()
    jobs.tell(QueueBatch([Remove(soon())], session, cancelled))
    settle()
    jobs.tell(CancelWaits(session))
    assert data(cancelled.get(timeout=PATIENCE).results) == [None]
    assert emptied(session.waiter) and world.stats.waiters_aborted == 1
    jobs.tell(CancelWaits(session))  # nothing parked: nothing to cancel
    settle()
    assert world.stats.waiters_aborted == 1
    assert run(jobs, Add(b"two", 0)) == [True] and data(run(jobs, Remove(None))) == [b"two"]


# -- fanout copies ----------------------------------------------------------------------------


def test_a_set_on_a_fanout_master_copies_to_every_child(world):
    client = world.connect()
    client.send(b"get news\r\n")  # the master first, then its children
    client.send(b"get news+a\r\nget news+b\r\n")
    assert client.send(b"set news 0 0 4\r\nmore\r\n") == b"STORED\r\n"
    assert client.send(b"get news+a\r\n") == b"VALUE news+a 0 4\r\nmore\r\nEND\r\n"
    assert client.send(b"get news+b\r\n") == b"VALUE news+b 0 4\r\nmore\r\nEND\r\n"
    assert client.send(b"get news\r\n") == b"VALUE news 0 4\r\nmore\r\nEND\r\n"


def test_a_fanout_only_master_keeps_nothing_itself(tmp_path):
    world = World(tmp_path, queues={"feed": QueueConfig(fanout_only=True)})
    try:
        client = world.connect()
        client.send(b"get feed\r\nget feed+one\r\n")
        assert client.send(b"set feed 0 0 2\r\nhi\r\n") == b"STORED\r\n"
        assert client.send(b"get feed\r\n") == b"END\r\n"
        assert client.send(b"get feed+one\r\n") == b"VALUE feed+one 0 2\r\nhi\r\nEND\r\n"
    finally:
        world.collection.stop()


def test_a_copy_wakes_a_reader_parked_on_a_child(world):
    from kestrel_actors.runtime import Dispatcher
    from kestrel_actors.session import Received

    writer, reader = world.connect(), world.connect()
    writer.send(b"get topic\r\nget topic+sub\r\n")
    Dispatcher.current().deliver(reader.ref, Received(reader.decoder.feed(b"get topic+sub/t=%d\r\n" % LONG_WAIT_MS)))
    settle()
    assert writer.send(b"set topic 0 0 3\r\nnew\r\n") == b"STORED\r\n"
    settle()
    assert reader.transport.take() == b"VALUE topic+sub 0 3\r\nnew\r\nEND\r\n"


# -- expiry moves -----------------------------------------------------------------------------


def test_expired_items_move_to_the_expire_to_queue(tmp_path):
    world = World(tmp_path, queues={"short": QueueConfig(expire_to_queue="graveyard")})
    try:
        client = world.connect()
        client.send(b"get graveyard\r\n")
        now = int(time.time())
        assert client.send(b"set short 0 %d 4\r\ngone\r\n" % (now + 1)) == b"STORED\r\n"
        assert client.send(b"set short 0 0 4\r\nkept\r\n") == b"STORED\r\n"
        gevent.sleep(2.1)  # past the first item's expiry (whole seconds)
        assert client.send(b"get short\r\n") == b"VALUE short 0 4\r\nkept\r\nEND\r\n"
        settle()
        assert client.send(b"get graveyard\r\n") == b"VALUE graveyard 0 4\r\ngone\r\nEND\r\n"
    finally:
        world.collection.stop()


def test_a_lone_set_that_expires_the_head_moves_it_and_is_answered_stored(tmp_path):
    # the SET's add discards the expired head: forwarded to expire_to before the answer, which
    # goes in a fresh list (QueueActor._run_lone_add), and the next SETs are answered as ever
    world = World(tmp_path, queues={"short": QueueConfig(expire_to_queue="graveyard")})
    try:
        client = world.connect()
        client.send(b"get graveyard\r\n")
        now = int(time.time())
        assert client.send(b"set short 0 %d 4\r\ngone\r\n" % (now + 1)) == b"STORED\r\n"
        assert client.send(b"set short 0 0 4\r\nkept\r\n") == b"STORED\r\n"
        gevent.sleep(2.1)  # past the first item's expiry (whole seconds)
        assert client.send(b"set short 0 0 4\r\nnext\r\n") == b"STORED\r\n"
        assert client.send(b"set short 0 0 4\r\nlast\r\n") == b"STORED\r\n"
        settle()
        assert client.send(b"get graveyard\r\n") == b"VALUE graveyard 0 4\r\ngone\r\nEND\r\n"
        reads = [client.send(b"get short\r\n") for _ in range(4)]
        assert reads == [b"VALUE short 0 4\r\n%s\r\nEND\r\n" % data for data in (b"kept", b"next", b"last")] + [
            b"END\r\n"]
    finally:
        world.collection.stop()


def test_an_item_older_than_max_age_expires_without_a_move(tmp_path):
    world = World(tmp_path, queues={"fresh": QueueConfig(max_age=0.2)})
    try:
        client = world.connect()
        assert client.send(b"set fresh 0 0 3\r\nold\r\n") == b"STORED\r\n"
        gevent.sleep(0.4)
        assert client.send(b"get fresh\r\n") == b"END\r\n"
    finally:
        world.collection.stop()


# -- journal failures -------------------------------------------------------------------------


class FailingJournal(MemoryJournal):
    """A journal whose disk failed: ``failure`` set (adds refused before the queue changes),
    or writes that fail when made durable (``fail_writes``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_writes = False

    def durable_now(self) -> bool:
        return not self.fail_writes

    def after_durable(self, callback, on_error=None) -> None:
        if self.fail_writes and on_error is not None:
            on_error(OSError(28, "No space left on device"))
        else:
            callback()


class FailingOpener:
    def __init__(self) -> None:
        self.journals: dict[str, FailingJournal] = {}

    def __call__(self, name: str, config) -> QueueCore:
        journal = self.journals[name] = FailingJournal()
        return QueueCore(name, config, journal)


@pytest.fixture
def failing(tmp_path):
    opener = FailingOpener()
    world = World(tmp_path, opener=opener)
    yield world, opener
    world.collection.stop()


def test_a_failed_journal_refuses_adds_and_says_why(failing):
    world, opener = failing
    ref = resolve(world.collection, "disk")
    assert run(ref, Add(b"ok", 0)) == [True]
    opener.journals["disk"].failure = OSError(5, "Input/output error")
    (refused,) = run(ref, Add(b"no", 0))
    assert type(refused) is JournalFailure and "Input/output error" in refused.message
    (taken,) = run(ref, Remove(None))  # a GET is refused too: it would take an item for good
    assert type(taken) is JournalFailure
    opener.journals["disk"].failure = None
    assert data(run(ref, Remove(None), Remove(None))) == [b"ok", None]  # the refused add left no item


def test_a_write_that_fails_is_not_acknowledged(failing):
    world, opener = failing
    ref = resolve(world.collection, "disk")
    opener.journals["disk"].fail_writes = True
    (answer,) = run(ref, Add(b"maybe", 0))
    assert type(answer) is JournalFailure and "No space left" in answer.message


def test_a_journal_failure_reaches_the_client_as_server_error_and_the_connection_stays(failing):
    world, opener = failing
    client = world.connect()
    client.send(b"get disk\r\n")
    opener.journals["disk"].failure = OSError(5, "Input/output error")
    reply = client.send(b"set disk 0 0 1\r\nx\r\n")
    assert reply.startswith(b"SERVER_ERROR") and b"Input/output error" in reply
    assert client.send(b"version\r\n") == b"VERSION test\r\n"


def test_a_handler_that_raises_answers_its_batch_as_closed_and_the_queue_reopens(world):
    first = resolve(world.collection, "jobs")
    run(first, Add(b"kept", 0))
    held = later(first, Add(b"x", 0), object())  # an operation the queue does not know
    results = held.get(timeout=PATIENCE).results
    assert results[0] is True and results[1] is None
    gevent.sleep(0.05)
    assert not first.is_alive()
    second = resolve(world.collection, "jobs")
    assert second is not first and second.is_alive()


# -- the collection ---------------------------------------------------------------------------


def test_the_collection_gives_one_actor_per_name(world):
    assert resolve(world.collection, "a") is resolve(world.collection, "a")
    assert resolve(world.collection, "a") is not resolve(world.collection, "b")


def test_a_deleted_queue_is_a_new_one_on_the_next_set(world):
    client = world.connect()
    client.send(b"set gone 0 0 1\r\nx\r\n")
    before = resolve(world.collection, "gone")
    assert client.send(b"delete gone\r\n") == b"DELETED\r\n"
    gevent.sleep(0.02)
    assert not before.is_alive()
    assert client.send(b"get gone\r\n") == b"END\r\n"
    assert resolve(world.collection, "gone") is not before


def test_a_batch_told_to_a_deleted_queue_is_answered_as_closed(world):
    ref = resolve(world.collection, "doomed")
    client = world.connect()
    client.send(b"delete doomed\r\n")
    gevent.sleep(0.02)
    assert not ref.is_alive()
    assert world.collection.is_alive()


def test_flush_all_empties_every_queue(world):
    client = world.connect()
    client.send(b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\n")
    assert client.send(b"flush_all\r\n") == b"Flushed all queues.\r\n"
    assert client.send(b"get a\r\nget b\r\n") == b"END\r\nEND\r\n"
