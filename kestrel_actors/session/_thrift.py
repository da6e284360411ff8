"""The thrift protocol handler (port 2229, behaviour §4; ADR 0004).

Same queues, same session as memcache and text; what differs is how reliable reads are held.
A thrift ``get`` with ``auto_abort_msec > 0`` opens its items under process-global ids
(:mod:`._thrift_reads`), which any connection may confirm or abort and an abort timer returns;
the session's own open reads (what a memcache hang-up aborts) are never used, so closing a
thrift connection aborts nothing. Without ``auto_abort_msec`` the items are removed outright
and their id is 0.

A ``get`` is Kestrel's ``monitorUntil`` loop, collecting instead of streaming: one fetch of up
to the items still due per step (``OpenMany`` or ``RemoveMany``), repeated as a step marker at
the head of the session's requests until ``max_items`` arrived, the deadline passed, the queue
had nothing (without a timeout), reads were blocked, or the connection's open-read limit on the
queue was reached; then one reply with the list. Ids and abort timers are given only then, so
items fetched for a client that hung up meanwhile go back at once (:meth:`release` and the
session's give-back of a step in flight).

Refusals follow Kestrel: a status refusal (ReadOnly/Quiescent, or the connection limits) and
``set_status(NOT_CONFIGURED)`` are exceptions there, which Finagle answers by closing the
connection without a reply; so do we. A queue error (a journal that cannot be created) is a
``TApplicationException(INTERNAL_ERROR)`` and the connection stays; so is a ``put`` that a
journal failed to write (a full disk: memcache's ``SERVER_ERROR``), since a count would read as
a full queue's refusal (as in Kestrel, where the write's ``IOException`` reaches Finagle).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pykka import ActorDeadError
from thriftpy2.thrift import TApplicationException

from .. import protocol as p
from ..messages import (
    BATCH_FETCH_BYTES,
    FLUSH,
    INSPECT,
    Add,
    AliasAdd,
    Confirm,
    ForAllKind,
    Gather,
    JournalFailure,
    OpenMany,
    Peek,
    PutBack,
    QueueBatch,
    RemoveMany,
    Resolved,
    Unremove,
    first_failure,
)
from ..protocol import thrift as th
from ..queue import epoch_ms
from ..status import Status
from ._handler import Answer, Handler, HandlerSession
from ._opened import OpenXids
from ._thrift_reads import ThriftReads

__all__ = ["ThriftHandler"]

MAX_STEP = 1000
"""Items asked for in one step of a get with no limit (``max_items`` < 0)."""

_STATUS_TO_THRIFT = {
    Status.UP: th.ThriftStatus.UP,
    Status.READ_ONLY: th.ThriftStatus.READ_ONLY,
    Status.QUIESCENT: th.ThriftStatus.QUIESCENT,
}
"""Kestrel's ``current_status``: WriteAvoid and Down have no thrift name (NOT_CONFIGURED)."""
_THRIFT_TO_STATUS = {value: key for key, value in _STATUS_TO_THRIFT.items()}


class _GetStep:
    """The next fetch of the thrift get in progress (at the head of the session's requests)."""

    __slots__ = ("queue",)

    def __init__(self, queue: str) -> None:
        self.queue = queue


@dataclass(slots=True, eq=False)
class _Get:
    """A thrift get in progress: what it asked for and what it has so far."""

    call: th.ThriftGet
    deadline: float | None
    remaining: int
    """Items still due; negative: no limit (the loop runs until a miss or the deadline)."""
    opening: bool
    items: list[Any] = field(default_factory=list)
    asked: int = 0
    """Items the step in flight asked for."""


class _NoQuit:
    """Thrift has no quit call: a client ends its session by closing the connection."""


class ThriftHandler(Handler):
    """Kestrel's ``ThriftHandler``: thrift calls to queue operations, results to framed replies."""

    QUEUE_KINDS: ClassVar[frozenset[type]] = frozenset(
        (th.ThriftPut, th.ThriftGet, th.ThriftPeek, th.ThriftFlushQueue, _GetStep))
    MONITOR_END: ClassVar[bytes] = b""  # a thrift session runs no monitor stream
    QUIT: ClassVar[type] = _NoQuit
    # a FIN is a hang-up, as before: a get that waits for more items holds those it took, and
    # answered after a FIN that came with a close they would be lost (auto-abort 0) or held
    # open until the auto-abort; a hang-up gives them back at once
    ANSWERS_AFTER_FIN: ClassVar[bool] = False
    WRITE_REFUSALS: ClassVar[dict[type, p.Bad]] = {
        th.ThriftPut: p.DROP,
        th.ThriftFlushQueue: p.DROP,
        th.ThriftFlushAllQueues: p.DROP,
        th.ThriftDeleteQueue: p.DROP,
    }
    """Writes refused while the server blocks writes: Kestrel throws, Finagle closes."""

    def __init__(self, session: HandlerSession) -> None:
        self.s = session
        self.context = session.context
        self.reads = ThriftReads.current()
        self.counts: dict[str, int] = {}
        """Items this connection opened and nobody closed yet, by queue (Kestrel's
        ``countPendingReads``): a get stops at ``max_open_transactions``."""
        self.get: _Get | None = None
        self.current: Any = None
        """The call at the head of the session's requests (for an error reply to it)."""
        self.answering: Any = None
        """The call waiting for an answer from the collection (delete, flush_all, alias put)."""

    # -- which calls go to a queue ----------------------------------------------------------

    def goes_to_queue(self, command: Any) -> bool:
        self.current = command
        kind = type(command)
        if kind is th.ThriftPut:
            return bool(command.items)  # an empty put touches (and creates) no queue
        if kind is th.ThriftGet:
            if not self.context.reads_allowed(self.s.session):
                return False
            return command.max_items != 0 and command.timeout_msec >= 0 and not self._at_limit(command.queue)
        if kind is _GetStep:
            return not self._get_over()
        return True

    def creates(self, command: Any) -> bool:
        # Kestrel's get, peek and put reach the queue through ``queues(name)``, which creates
        return type(command) in (th.ThriftPut, th.ThriftGet, th.ThriftPeek)

    def _at_limit(self, queue: str) -> bool:
        """Kestrel checks the connection's open count on every step, opening or not."""
        limit: int = self.context.config.max_open_transactions
        return self.counts.get(queue, 0) >= limit

    def _get_over(self) -> bool:
        get = self.get
        assert get is not None
        return (
            get.remaining == 0
            or (get.deadline is not None and time.monotonic() >= get.deadline)
            or not self.context.reads_allowed(self.s.session)
            or self._at_limit(get.call.queue)
        )

    # -- queue operations -----------------------------------------------------------------

    def compile(self, command: Any, ops: list[Any]) -> tuple[p.Bad | None, bool]:
        kind = type(command)
        s = self.s
        context = self.context
        if kind is _GetStep:
            self._step(ops)
            return None, True
        if kind is th.ThriftPut:
            ms = command.expiration_msec
            expiry = 0 if ms == 0 else max(1, epoch_ms() + ms)  # a negative time: expired already
            ops.extend(Add(item, expiry, chained=index > 0) for index, item in enumerate(command.items))
            return None, False
        if kind is th.ThriftGet:
            deadline = None if command.timeout_msec == 0 else time.monotonic() + command.timeout_msec / 1000.0
            self.get = _Get(command, deadline, command.max_items, command.auto_abort_msec > 0)
            self._step(ops)
            return None, True
        if kind is th.ThriftPeek:
            if not context.reads_allowed(s.session):
                return p.DROP, True
            context.stats.cmd_peek += 1
            ops.append(Peek(None))
            ops.append(INSPECT)
            return None, False
        if kind is th.ThriftFlushQueue:
            ops.append(FLUSH)
            return None, False
        raise AssertionError(command)

    def _step(self, ops: list[Any]) -> None:
        get = self.get
        assert get is not None
        asked = get.remaining if get.remaining > 0 else MAX_STEP
        if get.opening:
            limit = self.context.config.max_open_transactions
            asked = min(asked, limit - self.counts.get(get.call.queue, 0))
        get.asked = asked
        ops.append((OpenMany if get.opening else RemoveMany)(asked, get.deadline))

    def reply(self, command: Any, results: list[Any]) -> bytes:
        kind = type(command)
        if kind is th.ThriftPut:
            stored = 0
            for result in results:
                if result is not True:
                    break
                stored += 1
            # Kestrel counts every item it tried: those stored and the first refused
            self.context.stats.cmd_set += min(len(results), stored + 1)
            failure = first_failure(results)
            if failure is not None:  # not acknowledged, like text put's error line
                return self._server_error(command, failure.message)
            return th.encode_thrift_result(command, stored)
        if kind is th.ThriftGet or kind is _GetStep:
            return self._got(results[-1] if results else [])
        if kind is th.ThriftPeek:
            head, lines = results[0], results[1]
            return th.encode_thrift_result(command, _queue_info(head, lines))
        if kind is th.ThriftFlushQueue:
            return th.encode_thrift_result(command)
        raise AssertionError(command)

    def _got(self, items: list[Any]) -> bytes:
        """One step's items: go on with the next step, or answer the get."""
        get = self.get
        assert get is not None
        queue = get.call.queue
        get.items.extend(items)
        if get.opening and items:
            self.counts[queue] = self.counts.get(queue, 0) + len(items)
        if get.remaining > 0:
            get.remaining -= len(items)
        if items:
            # without a deadline, fewer than asked means the queue had no more just now
            short = len(items) < get.asked and sum(len(item.data) for item in items) < BATCH_FETCH_BYTES
            if not (get.deadline is None and short) and not self._get_over():
                self.s.run_next(_GetStep(queue))
                return b""
        # a miss: nothing now (no timeout), the deadline, or a closed queue
        return self._answer_get()

    def _answer_get(self) -> bytes:
        """The get's reply; opened items get their ids and abort timers now (Kestrel starts
        the timers once the reply is ready)."""
        get = self.get
        assert get is not None
        self.get = None
        call = get.call
        self.context.stats.cmd_get += len(get.items)
        if get.opening and get.items:
            ref = self.s.refs.get(call.queue)
            open_read = self.reads.open
            counts = self.counts
            result = [
                th.ThriftItem(item.data, open_read(call.queue, item.xid, ref, counts, call.auto_abort_msec))
                for item in get.items
            ]
        else:
            result = [th.ThriftItem(item.data, 0) for item in get.items]
        return th.encode_thrift_result(call, result)

    def missing_queue_reply(self, command: Any, opened: OpenXids | None) -> bytes:
        if type(command) is _GetStep:  # the queue was deleted during the get
            return self._answer_get()
        return th.encode_thrift_result(command)  # flush_queue of a queue that does not exist

    def item_reply(self, queue: str, data: bytes) -> bytes:
        raise AssertionError("a thrift session runs no monitor stream")

    def failed_reply(self, command: Any, message: str) -> bytes:
        kind = type(command)
        if kind is th.ThriftGet or kind is _GetStep:
            # a step's items went back to the queue; those of earlier steps are answered
            get = self.get
            assert get is not None
            if get.items:
                return self._answer_get()
            self.get = None
            return self._server_error(get.call, message)
        return self._server_error(command, message)

    def server_error_reply(self, message: str) -> bytes:
        call = self.current
        if type(call) is _GetStep:  # the queue failed during the get: answer what it has
            return self._answer_get()
        return self._server_error(call, message)

    @staticmethod
    def _server_error(call: Any, message: str) -> bytes:
        return th.encode_thrift_exception(call.method, call.seqid, TApplicationException.INTERNAL_ERROR,
                                          message)

    def release(self) -> None:
        """The client has gone: items a get in progress has fetched (their ids never sent)
        go back to the head of the queue. Reads already answered stay open: Kestrel's thrift
        session aborts nothing on close; their timers or another connection close them."""
        get = self.get
        self.get = None
        if get is None or not get.items:
            return
        if get.opening:
            self.s.tell_queue(get.call.queue, Unremove(tuple(item.xid for item in get.items)))
        else:
            self.s.tell_queue(get.call.queue, PutBack(tuple(get.items)))

    # -- calls answered without a queue batch -------------------------------------------------

    def local(self, command: Any) -> None:
        kind = type(command)
        s = self.s
        context = self.context
        if kind is th.ThriftGet:
            if not context.reads_allowed(s.session):
                self._refuse()
            else:  # max_items 0, a deadline passed already, or the open-read limit
                s.send_reply(th.encode_thrift_result(command, []))
        elif kind is _GetStep:
            s.send_reply(self._answer_get())
        elif kind is th.ThriftPut:  # no items
            s.send_reply(th.encode_thrift_result(command, 0))
        elif kind is th.ThriftConfirm or kind is th.ThriftAbort:
            self._close_reads(command)
        elif kind is th.ThriftDeleteQueue:
            self.answering = command
            s.delete_queue(command.queue)
        elif kind is th.ThriftFlushAllQueues:
            self.answering = command
            s.ask_all(ForAllKind.FLUSH, Answer.FLUSH_ALL)
        elif kind is th.ThriftCurrentStatus:
            s.send_reply(th.encode_thrift_result(
                command, _STATUS_TO_THRIFT.get(context.status.status, th.ThriftStatus.NOT_CONFIGURED)))
        elif kind is th.ThriftSetStatus:
            status = _THRIFT_TO_STATUS.get(command.status)
            if status is None:  # NOT_CONFIGURED: an unknown name to Kestrel, which throws
                self._refuse()
                return
            context.status.set(status)
            s.send_reply(th.encode_thrift_result(command))
        elif kind is th.ThriftGetVersion:
            s.send_reply(th.encode_thrift_result(command, context.version))
        else:
            raise AssertionError(command)

    def _refuse(self) -> None:
        """Kestrel's refusals are exceptions: Finagle closes the connection without a reply."""
        self.s.refuse_silently()

    def _close_reads(self, command: Any) -> None:
        """confirm/abort: each known id, from any connection, on the queue that opened it (the
        ``queue_name`` argument is not used, as in Kestrel). Answers how many ids were known,
        once every queue concerned has answered: as a SET's, a queue's answer comes only when
        its records are as durable as ``sync_journal`` says, so a confirmed item never comes
        back after a crash."""
        closed = self.reads.close(command.ids)
        op = Confirm if type(command) is th.ThriftConfirm else Unremove
        by_queue: dict[int, tuple[Any, list[int]]] = {}
        for read in closed:
            if read.ref is not None:
                by_queue.setdefault(id(read.ref), (read.ref, []))[1].append(read.xid)
        if not by_queue:
            self.s.send_reply(th.encode_thrift_result(command, len(closed)))
            return
        self.answering = command
        reply_to = self.s.reply_to(Answer.CLOSE_READS)
        known = len(closed)

        def answered(answers: list[Any]) -> None:
            # a confirm a journal could not make durable is an error: its items went back
            failure = next((done.failure for done in answers if done is not None and done.failure is not None),
                           None)
            reply_to.tell(known if failure is None else failure)

        gather = Gather(len(by_queue), answered)
        for ref, xids in by_queue.values():
            try:
                ref.tell(QueueBatch([op(tuple(xids))], None, gather))
            except ActorDeadError:  # a deleted queue: the item went with it
                gather.tell(None)

    def answered(self, tag: Answer, value: Any) -> None:
        call = self.answering
        self.answering = None
        if tag is Answer.CLOSE_READS:
            if type(value) is JournalFailure:
                self.s.send_reply(self._server_error(call, value.message))
            else:
                self.s.send_reply(th.encode_thrift_result(call, value))
        elif tag is Answer.ALIAS_PUT:
            failure = first_failure(result for results in value for result in results)
            if failure is not None:
                self.s.send_reply(self._server_error(call, failure.message))
                return
            stored = 0
            for results in value:
                if not all(result is True for result in results):
                    break
                stored += 1
            self.s.send_reply(th.encode_thrift_result(call, stored))
        else:  # DELETE, FLUSH_ALL: void
            self.s.send_reply(th.encode_thrift_result(call))

    def alias_request(self, command: Any, resolved: Resolved) -> None:
        """Calls on an alias (behaviour §5.10): put adds each item to every destination; get finds
        nothing; peek answers an empty ``QueueInfo`` (Kestrel fails it: an alias has no
        ``items`` stat); flush does nothing."""
        kind = type(command)
        s = self.s
        context = self.context
        if kind is th.ThriftPut:
            if not context.writes_allowed(s.session):
                self._refuse()
                return
            items = command.items
            context.stats.cmd_set += len(items)
            ms = command.expiration_msec
            expiry = 0 if ms == 0 else max(1, epoch_ms() + ms)
            self.answering = command
            gather = Gather(len(items), s.reply_to(Answer.ALIAS_PUT).tell)
            for item in items:
                context.collection.tell(AliasAdd(resolved.name, item, expiry, gather))
        elif kind is th.ThriftGet:
            self.get = None
            s.send_reply(th.encode_thrift_result(command, []))
        elif kind is th.ThriftPeek:
            if not context.reads_allowed(s.session):
                self._refuse()
                return
            context.stats.cmd_peek += 1
            s.send_reply(th.encode_thrift_result(command, _queue_info(None, [])))
        else:
            s.send_reply(th.encode_thrift_result(command))


def _queue_info(head: Any, lines: list[tuple[str, Any]]) -> Any:
    """Kestrel's ``QueueInfo`` from the queue's stats lines (``journal_bytes`` is ``logsize``)."""
    stats = dict(lines)
    return th.ThriftQueueInfo(
        head_item=None if head is None else head.data,
        items=stats.get("items", 0),
        bytes=stats.get("bytes", 0),
        journal_bytes=stats.get("logsize", 0),
        age=stats.get("age", 0),
        waiters=stats.get("waiters", 0),
        open_transactions=stats.get("open_transactions", 0),
    )
