"""The queue actor: one per queue, owning its items, open reads and wait-list of fetchers.

It wraps a :class:`QueueCore` (the queue logic) and adds what needs time and other actors:
fetchers that wait for an item (each a stored promise, answered later, kept in a
:class:`~..queue.WaitList` with one timer for their deadlines), fanout copies to child
queues, and expired items forwarded to ``expire_to_queue``. A handler never blocks.

Durability of what an answer covers: a batch is answered once its records are as durable as
the queue's ``sync_journal`` says, and, if its adds made fanout copies, once every child has
said the same of its copy (:class:`_CopyJoin`), so ``STORED`` covers every copy. If a journal
cannot write or sync (a full disk, an I/O error), the batches waiting for it are answered with a
:class:`JournalFailure` for each add, confirm and removing fetch (the client gets
``SERVER_ERROR``) instead of waiting, and the items those confirms and fetches took go back
to the queue (:class:`_Unanswered`): nothing is answered as done that a crash could bring
back. While it fails, new adds, confirms and removing fetches are refused before they touch
the queue (a refused confirm's items go back to the head, as on a disconnect). An expired
item moved to ``expire_to_queue`` is removed from this queue's journal only after the
target's ADD is durable (a journal hold).
"""

from __future__ import annotations

import functools
import time
from typing import Any, ClassVar, Final, cast

import gevent
import structlog
from pykka import ActorDeadError

from ..config import QueueConfig
from ..messages import (
    BATCH_FETCH_BYTES,
    FETCH_OPS,
    MANY_FETCHES,
    Add,
    AddCopy,
    BatchDone,
    CancelWaits,
    CloseQueue,
    Confirm,
    CopyDone,
    DeleteQueue,
    Flush,
    FlushExpired,
    GetStats,
    Inspect,
    JournalFailure,
    Open,
    OpenMany,
    Peek,
    PutBack,
    QueueBatch,
    QueueStats,
    Remove,
    RemoveMany,
    Session,
    SetChildren,
    SetConfig,
    Sweep,
    Swept,
    Unremove,
    closed_result,
    missed_result,
)
from ..queue import Item, Journal, QueueCore, Waiter, WaitList, epoch_ms, is_fanout_child
from ..runtime import Dispatcher, GeventActor, on_own_greenlet, tell
from ..stats import ServerStats

__all__ = ["QueueActor"]

log = structlog.get_logger("kestrel_actors.queue")


_monotonic: Final = time.monotonic
_time: Final = time.time

_FLUSH_REPLIES: Final = object()
"""A queue's message to itself: send the answers held for the journal write (one per burst)."""

_WAITERS_DUE: Final = object()
"""A queue's message to itself: its deadline timer fired, some parked batches may be due."""


@on_own_greenlet
class _Maintain:
    """A queue's message to itself: the journal's rotation or rewrite, left by a batch that ran
    on the hub (``Journal.maintenance_due``); file work that may wait runs on its own greenlet."""


_MAINTAIN: Final = _Maintain()


def _written() -> None:
    """What waits for records no answer waits for: nothing."""


_WRITTEN: Final = _written
""":func:`_written` through a C static: a function named as a value is looked up in the module's
dict (a parked GET's turn ends with no answer, and passes it)."""


def _reply_to(batch: QueueBatch) -> Any:
    """Where a batch's answer goes: its sender, or the join waiting for its fanout copies."""
    return batch.reply_to if batch.copies is None else batch.copies


def _batch_time_ms(batch: QueueBatch) -> int:
    """The time of ``batch``'s requests: their session's reading when it sent them
    (behaviour §5.1), not a reading more; a batch resumed from the wait-list reads the clock."""
    sent_at = batch.sent_at
    return int(sent_at * 1000) if sent_at and not batch.parked else epoch_ms()


def _tell_answer(reply: BatchDone | CopyDone) -> None:
    """Tell ``reply`` to its ``to``, which it lets go of first: a receiver that keeps the
    answer (a future, a fanout join) would otherwise form a cycle with it, which only the
    cyclic collector frees."""
    # tested on the answer itself: a batch's answer (nearly always) reads ``to`` natively
    if type(reply) is BatchDone:
        to = reply.to
        reply.to = None
    else:
        to = reply.to
        reply.to = None
    try:
        tell(to, reply)
    except ActorDeadError:  # that client's session ended meanwhile
        pass


def _send_all(replies: list[BatchDone | CopyDone]) -> None:
    for reply in replies:
        _tell_answer(reply)


class _HeldReplies:
    """Answers held until the journal write that covers them is durable (``_send_replies``).

    Its bound methods are what the journal calls back. Closures would do the same, but two
    nested functions and their shared scope form a reference cycle, which only the cyclic
    collector frees, with every answer it holds: three collector-tracked objects per request
    on the request path (ADR 0015). ``confirmed_to`` counts the items the queue had confirmed
    when these answers were held (:attr:`QueueActor._confirmed`).
    """

    __slots__ = ("replies", "queue", "confirmed_to")

    def __init__(self, replies: list[BatchDone | CopyDone], queue: QueueActor | None,
                 confirmed_to: int) -> None:
        self.replies = replies
        self.queue = queue
        self.confirmed_to = confirmed_to

    def send(self) -> None:
        queue = self.queue
        if queue is not None:
            queue.confirms_durable(self.confirmed_to)
        # one reading of the clock for the answers this fdatasync lets go, which their sessions'
        # latency figures take rather than one each; not a fanout join's: it waits for its copies
        now = _time()
        for reply in self.replies:
            if type(reply) is BatchDone and type(reply.to) is not _CopyJoin:
                reply.answered_at = now
            _tell_answer(reply)

    def fail(self, error: OSError) -> None:
        # the records stay pending and are written once the journal recovers; the answers
        # are not acknowledged: the queue takes back, on its own turn, what they took
        queue = self.queue
        if queue is not None:
            try:
                queue.actor_ref.tell(_Unanswered(self, error))
                return
            except ActorDeadError:  # closed meanwhile: nothing left to put back into
                pass
        self.unacknowledged(JournalFailure(error))

    def unacknowledged(self, failure: JournalFailure) -> None:
        """Send the answers as the failure makes them: a batch's answer or a fanout copy's
        ack, each says how it reads unacknowledged (an unacknowledged SET may or may not be
        kept; a confirm or a fetch answered so did not take its items)."""
        _send_all([reply.unacknowledged(failure) for reply in self.replies])


class _Unanswered:
    """A queue's message to itself: the journal could not make ``held``'s records durable."""

    __slots__ = ("held", "error")

    def __init__(self, held: _HeldReplies, error: OSError) -> None:
        self.held = held
        self.error = error


class _CopyJoin:
    """A batch's answer, held until every fanout copy of its adds is durable in its child.

    It counts the batch's own answer (told after the master's journal write) and one ack per
    copy; a copy that a child's journal failed turns the master's result for that add into
    the :class:`JournalFailure`, so the client is not told ``STORED``.
    """

    __slots__ = ("reply_to", "waiting", "done", "failures", "ack")

    def __init__(self, reply_to: Any) -> None:
        self.reply_to = reply_to
        self.waiting = 1
        self.done: BatchDone | None = None
        self.failures: dict[int, JournalFailure] | None = None
        self.ack = _CopyAck(self)

    def tell(self, done: BatchDone) -> None:
        """The batch's own answer."""
        self.done = done
        self._count_down()

    def copy_done(self, ack: CopyDone) -> None:
        result = ack.result
        if type(result) is JournalFailure:
            if self.failures is None:
                self.failures = {}
            self.failures[ack.index] = result
        self._count_down()

    def _count_down(self) -> None:
        self.waiting -= 1
        if self.waiting:
            return
        done = self.done
        assert done is not None
        if self.failures:
            results = done.results
            for index, failure in self.failures.items():
                if index < len(results) and results[index] is True:
                    results[index] = failure
        self.reply_to.tell(done)


class _CopyAck:
    """The ``ack`` a child answers a fanout copy to."""

    __slots__ = ("join",)

    def __init__(self, join: _CopyJoin) -> None:
        self.join = join

    def tell(self, ack: CopyDone) -> None:
        self.join.copy_done(ack)


class QueueActor(GeventActor):
    """Serves :class:`QueueBatch` requests for one queue, in arrival order."""

    inline_dispatch: ClassVar[bool] = True
    """A session's batch runs on the session's greenlet when the queue is idle, saving two
    greenlet switches per request; journal file work may suspend that greenlet, never the hub."""

    hot_messages: ClassVar[tuple[type, ...]] = (QueueBatch,)

    def __init__(
        self,
        name: str,
        config: QueueConfig,
        journal: Journal,
        stats: ServerStats,
        core: QueueCore | None = None,
        expire_target: Any = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.core = core or QueueCore(name, config, journal)
        self.stats = stats
        # the queue's ostrich metrics live as long as the queue (the collection drops them
        # when it deletes it); the journal's fsyncs are server-wide figures
        metrics = stats.open_queue(name)
        self.core.metrics = metrics
        self.core.journal.observe(metrics, stats)
        self.waiters = WaitList(self._start_timer)
        self.children: dict[str, Any] = {}
        self.has_children = False
        self.expire_target = expire_target
        self._loop = gevent.get_hub().loop
        self.created_ms = epoch_ms()
        self._replies: list[BatchDone | CopyDone] = []
        """Answers waiting for the journal, each told to its ``to``: sent together at the end
        of the burst."""
        self._dispatcher = Dispatcher.current()
        self._confirmed: list[Item] = []
        """Items confirmed whose CONFIRM records are not known to be durable yet, oldest first:
        they go back to the queue if those records cannot be made durable (:class:`_Unanswered`)."""
        self._confirmed_count = 0
        """Items ever appended to :attr:`_confirmed`."""
        self._flush_due = False
        self._maintaining = False
        self.is_master = not is_fanout_child(name)

    def may_run_on_hub(self) -> bool:
        # File work may wait, and the hub must not: read-behind reads, and a rotation or rewrite
        # due before the next add. One due later in a batch (or after a remove) the journal
        # leaves for _MAINTAIN, which runs on this actor's own greenlet before the answers go.
        journal = self.core.journal
        return not journal.in_read_behind and not journal.rotation_due(self.core)

    # -- dispatch -------------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        # type(message) tested on the message itself, not a local: that narrows its type, so
        # the compiled build reads the message's fields natively
        if type(message) is QueueBatch:
            results: list[Any] = []
            try:
                if not self._run_lone_add(message, results):
                    self._run(message, 0, results)
            except Exception:
                # answered as a closed queue would, so the client is not left waiting
                results += [closed_result(op) for op in message.ops[len(results):]]
                self._replies.append(BatchDone(results, to=_reply_to(message)))
                raise
        elif message is _FLUSH_REPLIES:
            self._flush_due = False
            self._send_replies()
        elif type(message) is _Unanswered:
            self._unanswered(message)
        elif message is _WAITERS_DUE:
            self._expire_due()
        elif message is _MAINTAIN:
            self._maintaining = False
            journal = self.core.journal
            journal.maintenance_due = False
            journal.check_rotate(self.core)
        elif type(message) is AddCopy:
            self._add_copy(message)
        elif type(message) is CancelWaits:
            self._cancel_waits(message.session)
        elif type(message) is GetStats:
            self._reply_stats(message.reply_to)
        elif type(message) is Sweep:
            now_ms = epoch_ms()
            count = self.core.discard_expired(now_ms)
            self._forward_expired()
            if message.reply_to is not None:
                message.reply_to.tell(Swept(self.name, count, self._queue_expired(now_ms)))
        elif type(message) is SetConfig:
            self.core.config = message.config
        elif type(message) is SetChildren:
            self.children = dict(message.children)
            self.has_children = True
        elif type(message) is DeleteQueue:
            # Stop now, not after the inbox drains: a connection holding this ref must see
            # it dead and look the name up again, so a SET after DELETED makes a new queue.
            self._close(erase=True)
            self._stop()
            message.reply_to.tell(True)
        elif type(message) is CloseQueue:
            if message.rewrite_empty and not self.core.length:
                # graceful shutdown (ReadOnly/Quiescent): leave only the open reads on disk
                self.core.journal.rewrite(self.core)
            self._close(erase=False)
            message.reply_to.tell(True)
            self.stop()
        else:
            return super().on_receive(message)
        return None

    def on_inbox_empty(self) -> None:
        if self.core.journal.maintenance_due:
            if not self._maintaining:  # before the answers: they wait for the file work, as before
                self._maintaining = True
                self.actor_ref.tell(_MAINTAIN)
            return
        if self._flush_due:
            return
        if not self._replies:
            # records with no answer to wait for them (a sweep's removes): written now, as
            # the end of a turn with answers writes them (the journal schedules nothing itself)
            self.core.journal.after_durable(_WRITTEN)
            return
        # after the tells already due: every batch of this burst shares one journal write
        if self._dispatcher.after_burst(self.ref, _FLUSH_REPLIES):
            self._flush_due = True
        else:
            self._send_replies()  # nothing else is due in this burst: no reason to wait

    def _send_replies(self) -> None:
        """Answer every batch run since the last time, after one journal write covers them.

        Under load, batches from many connections arrive in one burst (one hub wake-up);
        holding their answers until the dispatcher has made the burst's other tells makes one
        write (and, with ``always``, one fdatasync) serve them all.
        """
        replies = self._replies
        if not replies:
            return
        # a fresh list rather than the same one emptied: emptying a list frees its array, and
        # growing it again costs more than a list from CPython's free list
        self._replies = []
        journal = self.core.journal
        if journal.durable_now():  # written at once (no fsync policy): no holder to make
            if self._confirmed:
                self._confirmed.clear()
            _send_all(replies)
            return
        held = _HeldReplies(replies, self, self._confirmed_count)
        journal.after_durable(held.send, held.fail)

    def confirms_durable(self, count: int) -> None:
        """The CONFIRM records of the first ``count`` items ever confirmed are durable."""
        confirmed = self._confirmed
        if confirmed:
            done = count - (self._confirmed_count - len(confirmed))
            if done > 0:
                del confirmed[:done]

    def _unanswered(self, message: _Unanswered) -> None:
        """The journal could not make the records of ``message.held``'s answers durable: what
        their confirms and plain fetches took goes back to the queue (as an ADD: the journal
        has no record that undoes a CONFIRM or a REMOVE), and they are answered with the
        failure. The records stay pending: written once the journal recovers, they and the
        ADDs after them leave the item in the queue, as a crash before then would."""
        held = message.held
        confirmed = self._confirmed
        count = held.confirmed_to - (self._confirmed_count - len(confirmed))
        core = self.core
        returned = 0
        if count > 0:
            for item in confirmed[:count]:
                if core.put_back(item):
                    returned += 1
            del confirmed[:count]
        for reply in held.replies:
            if type(reply) is BatchDone:
                for item in reply.removed_items():
                    if core.put_back(item):
                        returned += 1
        self._wake_for(returned)
        held.unacknowledged(JournalFailure(message.error))

    def _unremove_all(self, xids: tuple[int, ...]) -> int:
        """Put the open items ``xids`` back at the head -> how many were open."""
        returned = 0
        for xid in xids:
            if self.core.unremove(xid):
                returned += 1
        return returned

    def _wake_for(self, returned: int) -> None:
        """Wake a waiter for each of ``returned`` items put back at the head. They are all back
        before the first waiter reads, so a waiter gets the head a whole abort leaves, never
        the middle of one (behaviour §2.6)."""
        while returned and self.waiters:
            self._wake_one()
            returned -= 1

    def on_failure(self, *_exc_info: Any) -> None:
        """A handler raised (a bug, or a journal file gone): answer what is held and parked,
        and close the journal, so that the collection can replay the queue from disk."""
        self._close(erase=False)

    def on_dead_letter(self, message: Any) -> None:
        """A request that reached a deleted queue is answered as a closed queue would."""
        kind = type(message)
        if kind is QueueBatch:
            self._run(message, 0, [])
            self._send_replies()
        elif kind is AddCopy:
            self._acknowledge_copy(message, False)
        elif kind is GetStats:
            message.reply_to.tell(None)
        elif kind in (Sweep, DeleteQueue, CloseQueue) and message.reply_to is not None:
            message.reply_to.tell(Swept(self.name, 0, False) if kind is Sweep else True)

    # -- batches --------------------------------------------------------------------------

    def _run(self, batch: QueueBatch, start: int, results: list[Any]) -> None:
        # this batch's answer goes before those of the waiters its adds wake (they run inside
        # it): the writer learns first that its item is stored, and sends its next request
        # while the readers' answers are still going out (the many-clients producer). On the
        # hub the runtime keeps this order though the writer's session is busy up the stack
        # (the readers' sessions run after its run: runtime._HubRuns)
        first_answer = len(self._replies)
        core = self.core
        stats = self.stats
        ops = batch.ops
        now_ms = _batch_time_ms(batch)
        fetched = 0
        count = len(ops)
        run_end = start  # where the last run of one shared plain fetch ends
        skip_to = start
        for index in range(start, count):
            if index < skip_to:
                continue  # taken with the run before it
            op = ops[index]
            kind = type(op)
            if kind is Remove and index >= run_end and core.journal.failure is None:
                # a pipelined burst of plain GETs shares one ``Remove`` (the session's): taken
                # in one call while nothing but the head's removal is due (QueueCore.remove_run)
                run_end = index + 1
                while run_end < count and ops[run_end] is op:
                    run_end += 1
                if run_end - index > 1 and op.deadline is None and fetched < BATCH_FETCH_BYTES:
                    before = len(results)
                    fetched += core.remove_run(now_ms, run_end - index, BATCH_FETCH_BYTES - fetched, results)
                    taken = len(results) - before
                    stats.get_hits += taken
                    skip_to = index + taken
                    if taken:
                        continue
            if type(op) is Add:  # on the op itself: narrows its type (see on_receive)
                if op.chained and results[index - 1] is not True:
                    results.append(False)  # an earlier item of the same put was refused
                elif self.has_children:
                    results.append(self._add_with_copies(op.data, op.expiry, now_ms, batch, len(results)))
                else:
                    results.append(self._add(op.data, op.expiry, now_ms))
            # a GET's fetch (Remove, or Open) told apart without hashing into FETCH_OPS
            elif kind is Remove or kind is Open or kind in FETCH_OPS:
                if fetched >= BATCH_FETCH_BYTES:
                    break  # answered in parts: the sender asks for the rest when it can send it
                if (kind is Remove or kind is RemoveMany) and core.journal.failure is not None:
                    results.append(self._refuse(batch, core.journal.failure))  # the items stay
                    continue
                result = self._fetch(op, kind, now_ms)
                if result:
                    many = kind is not Remove and kind is not Open and kind in MANY_FETCHES
                    fetched += BATCH_FETCH_BYTES if many else len(cast(Item, result).data)
                else:
                    deadline = op.deadline
                    if (
                        deadline is not None
                        and not core.closed
                        and (batch.session is None or not (batch.session.closed or batch.session.input_ended))
                        and deadline > _monotonic()
                    ):
                        self._park(batch, index, results, deadline)
                        return
                    stats.get_misses += 1
                results.append(result)
            elif type(op) is Confirm:
                failure = core.journal.failure
                if failure is not None:
                    # refused: the items go back to the head, as on a disconnect
                    self._wake_for(self._unremove_all(op.each()))
                    results.append(self._refuse(batch, failure))
                    continue
                runs = op.runs
                confirmed = (core.confirm_many(op.xids, self._confirmed) if runs is None
                             else core.confirm_runs(runs, self._confirmed))
                self._confirmed_count += confirmed
                results.append(confirmed)
            elif type(op) is Unremove:
                self._wake_for(self._unremove_all(op.each()))
                results.append(None)
            elif type(op) is PutBack:
                returned = 0
                for item in op.items:
                    if core.put_back(item):
                        returned += 1
                self._wake_for(returned)
                results.append(None)
            elif kind is Flush:
                core.flush(now_ms)
                results.append(None)
            elif kind is FlushExpired:
                results.append(core.discard_expired(now_ms))
            elif kind is Inspect:
                results.append(core.stats(now_ms, len(self.waiters)))
            else:
                raise ValueError(f"unknown queue operation {op!r}")
        self._hold_answer(batch, results, first_answer)

    def _run_lone_add(self, batch: QueueBatch, results: list[Any]) -> bool:
        """Run a batch of one add (a SET's) into the one-result list of its sender's last
        answer, which the sender kept (``SessionActor.on_receive``): no list made, nor its
        array grown by an append, per SET. ``False``: not such a batch, nothing run."""
        done = batch.answer
        if done is None or self.has_children:
            return False
        ops = batch.ops
        if len(ops) != 1:
            return False
        op = ops[0]
        kept = done.results
        if type(op) is not Add or len(kept) != 1:
            return False
        first_answer = len(self._replies)
        result = self._add(op.data, op.expiry, _batch_time_ms(batch))
        if self.core.expired_out:
            # expired items to forward first (rare): in ``results``, as _run puts it, the
            # result is what on_receive answers should the forwarding fail
            results.append(result)
            kept = results
        else:
            kept[0] = result
        self._hold_answer(batch, kept, first_answer)
        return True

    def _hold_answer(self, batch: QueueBatch, results: list[Any], first_answer: int) -> None:
        """Hold ``batch``'s answer for the journal write, before any answer its run put at
        ``first_answer`` or after (the waiters its adds woke)."""
        if self.core.expired_out:  # tested here: a call that finds nothing cost ~35 instructions a batch
            self._forward_expired()
        ops = batch.ops
        done = batch.answer
        if done is None:
            done = BatchDone(results, ops, batch.failure, _reply_to(batch))
        else:  # the sender's last answer, refilled: no object made and freed per batch
            batch.answer = None
            done.results = results
            done.ops = ops
            done.failure = batch.failure
            done.to = _reply_to(batch)
            done.answered_at = 0.0  # set again if the answer waits for an fdatasync
        replies = self._replies
        if first_answer == len(replies):  # no waiter's answer went before it (nearly always)
            replies.append(done)  # (CPython's insert at the end costs ~40 instructions more than append)
        else:
            replies.insert(first_answer, done)

    @staticmethod
    def _refuse(batch: QueueBatch, error: OSError) -> JournalFailure:
        """The result of an operation that takes items, refused while the journal fails."""
        failure = batch.failure
        if failure is None:
            failure = batch.failure = JournalFailure(error)
        return failure

    def _add(self, data: bytes, expiry: int, now_ms: int) -> Any:
        """Add to this queue: True, False (refused) or a :class:`JournalFailure`."""
        core = self.core
        limits = core.limits
        if limits.fanout_only and self.is_master:
            # the size check comes first; a child inherits fanout_only to no effect (behaviour §5.9)
            return not core.closed and len(data) <= limits.max_item_size
        failure = core.journal.failure
        if failure is not None:
            return JournalFailure(failure)  # refused before the queue changes
        if not core.add(data, expiry, now_ms):
            return False
        self.stats.total_items += 1
        if self.waiters:
            self._wake_one()
        return True

    def _add_with_copies(self, data: bytes, expiry: int, now_ms: int, batch: QueueBatch, index: int) -> Any:
        """Kestrel's fanout (behaviour §5.9): a copy to every child first, then the item here. The
        batch's answer waits for every child's ack (the copy is durable there)."""
        join = batch.copies
        if join is None:
            join = batch.copies = _CopyJoin(batch.reply_to)
        for child in self.children.values():
            join.waiting += 1
            try:
                child.tell(AddCopy(data, expiry, ack=join.ack, index=index))
            except ActorDeadError:  # a deleted child just stops receiving
                join.waiting -= 1
        return self._add(data, expiry, now_ms)

    def _add_copy(self, message: AddCopy) -> None:
        result: Any = False
        try:
            now_ms = epoch_ms()
            if message.count_total:
                result = self._add(message.data, message.expiry, now_ms)
            else:
                result = self.core.add(message.data, message.expiry, now_ms)
                if result and self.waiters:
                    self._wake_one()
            self._forward_expired()
        finally:
            self._acknowledge_copy(message, result)

    def _acknowledge_copy(self, message: AddCopy, result: Any) -> None:
        """A fanout copy's ack goes out with this burst's answers (after the journal write);
        an expiry move is released once its ADD is durable, whatever the wait."""
        if message.ack is not None:
            self._replies.append(CopyDone(message.index, result, message.ack))
            if self.actor_stopped.is_set():
                self._send_replies()
        if message.release is not None:
            if result is True:
                self.core.journal.after_durable(message.release)
            else:
                message.release()  # refused (a full or closed target): nothing to wait for

    def _fetch(self, op: Any, kind: type, now_ms: int) -> Any:
        core = self.core
        if kind is Remove or kind is Open:
            item = core.remove(now_ms, transactional=kind is Open)
            if item is not None:
                self.stats.get_hits += 1
            return item
        if kind is Peek:
            item = core.peek(now_ms)
            if item is not None:
                self.stats.get_hits += 1
            return item
        limit: int = op.max_items  # typed: a native loop (over ``op``'s, an object, each step boxed and compared)
        if kind is OpenMany:
            items = core.open_many(now_ms, limit, BATCH_FETCH_BYTES)
            self.stats.get_hits += len(items)
            return items
        items = []
        size = 0
        for _ in range(limit):
            item = core.remove(now_ms)
            if item is None:
                break
            items.append(item)
            size += len(item.data)
            if size >= BATCH_FETCH_BYTES:
                break
        self.stats.get_hits += len(items)
        return items

    # -- the wait-list --------------------------------------------------------------------

    def _park(self, batch: QueueBatch, index: int, results: list[Any], deadline: float) -> None:
        batch.parked = True
        session = batch.session
        if session is None:
            self.waiters.park(Waiter(batch, index, results, None), deadline)
            return
        spare = session.waiter  # for _cancel_waits; emptied when it left (_left)
        if spare is not None:
            # typed ``Waiter``, not ``Waiter | None``: native reads and stores (600 less a park)
            waiter: Waiter = spare
            if waiter.reusable:  # its last wake left no entry behind: parked again
                waiter.batch = batch
                waiter.index = index
                waiter.results = results
                waiter.session = session
                self.waiters.park(waiter, deadline)
                return
        waiter = session.waiter = Waiter(batch, index, results, session)
        self.waiters.park(waiter, deadline)

    @staticmethod
    def _left(waiter: Waiter) -> None:
        """``waiter`` has left the wait-list: it lets go of its batch, results and session, so
        that no item outlives the answer and no cycle runs through the session (which keeps it
        to park again: ``Session.waiter``)."""
        waiter.batch = None
        waiter.results = None
        waiter.session = None

    def _start_timer(self, delay: float) -> Any:
        timer = self._loop.timer(delay)
        timer.start(self._dispatcher.deliver, self.actor_ref, _WAITERS_DUE)
        return timer

    def _wake_one(self) -> None:
        """Hand an add (or unremove) to the oldest live waiter, which retries its fetch."""
        waiters = self.waiters
        while waiters:
            waiter = waiters.take()
            if waiter is None:
                return
            session: Session | None = waiter.session  # typed: ``closed`` read natively
            if session is not None and (session.closed or session.input_ended):
                self._answer_with_a_miss(waiter)
                continue
            batch: QueueBatch = waiter.batch
            results = waiter.results
            self._left(waiter)
            assert results is not None  # parked with them
            self._run(batch, waiter.index, results)
            return

    def _expire_due(self) -> None:
        """The deadline timer fired: the batches parked past their deadline go on with a miss."""
        for waiter in self.waiters.take_due():
            batch: QueueBatch = waiter.batch
            results = waiter.results
            self._left(waiter)
            assert results is not None  # parked with them
            self.stats.get_misses += 1
            results.append(missed_result(batch.ops[waiter.index]))
            self._run(batch, waiter.index + 1, results)

    def _answer_with_a_miss(self, waiter: Waiter) -> None:
        """Answer a parked batch with a miss and nothing after it (its client has gone)."""
        batch: QueueBatch = waiter.batch
        results = waiter.results
        self._left(waiter)
        assert results is not None  # parked with them
        results.append(missed_result(batch.ops[waiter.index]))
        try:
            _reply_to(batch).tell(BatchDone(results, batch.ops, batch.failure))
        except ActorDeadError:  # its session ended (a failed handler stops it at once)
            pass

    def _cancel_waits(self, session: Session) -> None:
        # the session's one batch in flight is this queue's (it tells this queue only): a waiter
        # it points at, if still parked, is parked here
        waiter: Waiter | None = session.waiter
        if waiter is not None and waiter.parked:
            self.stats.waiters_aborted += 1
            self.waiters.remove(waiter)
            self._answer_with_a_miss(waiter)

    # -- the rest -------------------------------------------------------------------------

    def _forward_expired(self) -> None:
        core = self.core
        expired = core.expired_out
        if not expired:
            return
        core.expired_out = []
        holds, core.expired_holds = core.expired_holds, []
        target = self.expire_target
        journal = core.journal
        for index, item in enumerate(expired):
            # holds are taken for every moved item, in order, unless it moves to this queue
            release = functools.partial(journal.release, holds[index]) if index < len(holds) else None
            if target is not None:
                try:
                    target.tell(AddCopy(item.data, 0, count_total=False, release=release))
                    continue
                except ActorDeadError:  # the target was deleted: the item is dropped
                    target = None
            if release is not None:
                release()
        for token in holds[len(expired):]:
            journal.release(token)

    def _queue_expired(self, now_ms: int) -> bool:
        """behaviour §5.12: empty in memory (open reads are not checked) and older than max_queue_age."""
        max_age = self.core.config.max_queue_age
        return max_age is not None and not self.core.length and now_ms - self.created_ms > max_age * 1000

    def _reply_stats(self, reply_to: Any) -> None:
        core = self.core
        now_ms = epoch_ms()
        lines = core.stats(now_ms, len(self.waiters))
        if self.has_children:
            lines.append(("children", ",".join(self.children)))
        journal = core.journal
        # ours, after Kestrel's keys: how long the head has waited, and whether the journal
        # cannot write (a full disk), so that memcache ``stats`` shows it per queue too
        lines.append(("oldest_item_age", core.oldest_item_age(now_ms)))
        lines.append(("journal_failing", 0 if journal.failure is None else 1))
        extra = {
            "create_time": self.created_ms // 1000,
            "max_items": core.config.max_items,
            "max_bytes": core.config.max_size,
            "journal_size": getattr(journal, "total_size", journal.size)(),
            "put_bytes": core.put_bytes,
        }
        reply_to.tell(QueueStats(self.name, lines, extra))

    def _close(self, erase: bool) -> None:
        core = self.core
        self._send_replies()
        core.close()
        for waiter in self.waiters.clear():
            self._answer_with_a_miss(waiter)
        if erase:
            core.journal.erase()
        else:
            core.journal.close()
        log.debug("queue closed", queue=self.name, erased=erase)
