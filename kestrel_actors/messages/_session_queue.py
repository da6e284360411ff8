"""Messages between a session and a queue actor: a batch of operations and its answer.

A session sends a queue a :class:`QueueBatch` of operations, consecutive requests for one
queue, and gets one :class:`BatchDone` back, so an actor hop is paid per batch, not per
request. ``reply_to`` is anything with ``tell()``: an ``ActorRef``, or a ``ReplyFuture``.
Each operation is a small slotted record; its result is listed beside it. The records made per
request have a written-out ``__init__``, not a dataclass's: mypyc compiles a dataclass's class but
not the ``__init__`` the dataclasses module generates, which would run as interpreted Python for
every request (ADR 0015), and so do the two made once per connection (``Session``, and
``CancelWaits`` when it ends with a fetch waiting).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "BATCH_FETCH_BYTES",
    "FETCH_OPS",
    "FLUSH",
    "FLUSH_EXPIRED",
    "IGNORE",
    "INSPECT",
    "MANY_FETCHES",
    "Add",
    "BatchDone",
    "CancelWaits",
    "Confirm",
    "Flush",
    "FlushExpired",
    "Inspect",
    "JournalFailure",
    "Open",
    "OpenMany",
    "Peek",
    "PutBack",
    "QueueBatch",
    "Remove",
    "RemoveMany",
    "Session",
    "Unremove",
    "XidRun",
    "closed_result",
    "failed_result",
    "first_failure",
    "missed_result",
    "peer_name",
]


class Session:
    """What a queue may know of a client connection: whether it has gone, and who it is.

    A queue skips the waiters of a closed session, so a client that hung up never swallows an
    item, and parks no fetch of a session whose input has ended. Actors share it read-only but
    for ``closed`` and ``input_ended``, which only the session's own side (its transport's
    callbacks, then the session actor) sets, and the server's shutdown for
    a session its drain had to cut off (ADR 0010); see ADR 0003 for why it is shared rather
    than told.

    Its ``__init__`` is written out (see the module docstring): one is made for every connection.
    """

    __slots__ = ("id", "address", "closed", "input_ended", "refuse_reads", "refuse_writes", "waiter")

    def __init__(self, id: int, address: Any) -> None:  # noqa: A002 - the connection's number, as Kestrel names it
        self.id = id
        self.address = address
        """The client's address as ``accept`` gave it (or a label): :attr:`peer` names it."""
        self.closed = False
        self.input_ended = False
        """The client sent its last request (its FIN came, behaviour §1): it may still read the
        replies, but none of its fetches waits any more, as if it had hung up."""
        self.refuse_reads = False
        """Set for the session's lifetime by ``connection_limit_refuse_*`` (behaviour §1)."""
        self.refuse_writes = False
        self.waiter: Any = None
        """The queue's ``Waiter`` of this session's batch while it is parked there (a session has
        one batch in flight): how that queue finds it to cancel (``CancelWaits``, if still
        ``parked``). Only a queue's actor sets it; kept after the waiter leaves, emptied (no item
        outlives it, no cycle), to be parked again."""

    @property
    def peer(self) -> str:
        """The client's ``host:port``, written out only when something logs it: most sessions
        never do, and formatting it cost every connection about 1,200 instructions."""
        return peer_name(self.address)


def peer_name(address: Any) -> str:
    """``host:port`` of an address ``accept`` gave (IPv4 or IPv6); any other as ``str``."""
    if type(address) is tuple and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


# -- operations (one per request, or two: a GET that confirms and opens) -------------------


class Add:
    """Append ``data`` (expiring at epoch ms ``expiry``, 0 never) -> ``bool`` stored, or a
    :class:`JournalFailure`."""

    __slots__ = ("data", "expiry", "chained")

    def __init__(self, data: bytes, expiry: int, chained: bool = False) -> None:
        self.data = data
        self.expiry = expiry
        self.chained = chained
        """Refused without being tried (``False``) unless the operation before it in the batch
        stored its item: thrift's ``put`` stops at its first refusal (behaviour §4)."""


class Remove:
    """Take the head for good -> ``Item | None``. ``deadline``: ``time.monotonic()`` or None."""

    __slots__ = ("deadline",)

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline


class Open(Remove):
    """Open the head under a new xid (a tentative read) -> ``Item | None``."""

    __slots__ = ()


class Peek(Remove):
    """Look at the head -> ``Item | None``."""

    __slots__ = ()


class OpenMany:
    """Open up to ``max_items`` (a monitor step) -> ``list[Item]`` (empty on timeout)."""

    __slots__ = ("max_items", "deadline")

    def __init__(self, max_items: int, deadline: float | None) -> None:
        self.max_items = max_items
        self.deadline = deadline


class RemoveMany:
    """Take up to ``max_items`` for good (a thrift get without auto-abort) -> ``list[Item]``."""

    __slots__ = ("max_items", "deadline")

    def __init__(self, max_items: int, deadline: float | None) -> None:
        self.max_items = max_items
        self.deadline = deadline


class XidRun:
    """Open reads of the consecutive xids ``first`` .. ``first + count - 1``: how a session holds
    what a ``monitor`` step opened, and hands it back in a :class:`Confirm`, as one object."""

    __slots__ = ("first", "count")

    def __init__(self, first: int, count: int) -> None:
        self.first = first
        self.count = count

    def __repr__(self) -> str:
        return f"XidRun({self.first}, {self.count})"


class Confirm:
    """Confirm the open items ``xids``, or those of ``runs`` (oldest first) when it is given ->
    number confirmed."""

    __slots__ = ("xids", "runs")

    def __init__(self, xids: tuple[int, ...] = (), runs: list[XidRun] | None = None) -> None:
        self.xids = xids
        self.runs = runs

    def each(self) -> tuple[int, ...]:
        """Every xid named, in order."""
        runs = self.runs
        if runs is None:
            return self.xids
        xids: list[int] = []
        for run in runs:
            xids.extend(range(run.first, run.first + run.count))
        return tuple(xids)


class Unremove(Confirm):
    """Put the open items named (:meth:`Confirm.each`) back at the head -> ``None``."""

    __slots__ = ()


class PutBack:
    """Put ``items`` a plain GET took but could not deliver back at the head -> ``None``."""

    __slots__ = ("items",)

    def __init__(self, items: tuple[Any, ...]) -> None:
        self.items = items


class Flush:
    """Remove every ready item -> ``None``."""

    __slots__ = ()


class FlushExpired:
    """Remove the expired items at the head -> number removed."""

    __slots__ = ()


class Inspect:
    """The queue's stats lines (as :class:`GetStats` answers them) -> ``list[(stat, value)]``;
    after a ``Peek`` in the same batch it describes the same moment (thrift's ``peek``)."""

    __slots__ = ()


FLUSH: Final = Flush()
FLUSH_EXPIRED: Final = FlushExpired()
INSPECT = Inspect()

MANY_FETCHES: Final = frozenset((OpenMany, RemoveMany))
"""Fetches whose result is a list of items (empty on a miss)."""
FETCH_OPS: Final = frozenset((Remove, Open, Peek, OpenMany, RemoveMany))
"""Operations that may wait, until their ``deadline``."""

BATCH_FETCH_BYTES: Final = 1024 * 1024
"""A queue stops running a batch before its next fetch once the batch's fetches have taken
this many bytes, and answers with results for the operations it ran: the sender sends the
rest again when it is ready for more output. ``OpenMany`` stops at this many bytes too.
So one answer holds at most this much plus one item, whatever the client pipelined."""


class JournalFailure:
    """The result of an add that is not acknowledged because a journal could not write it
    (its own, or a fanout child's); falsy, like a refusal. ``message`` is for the client."""

    __slots__ = ("message",)

    def __init__(self, error: OSError) -> None:
        self.message = f"journal write failed: {error.strerror or error}"

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"JournalFailure({self.message!r})"


def first_failure(results: Any) -> JournalFailure | None:
    """The first :class:`JournalFailure` among add results, if a journal failed one."""
    for result in results:
        if type(result) is JournalFailure:
            return result
    return None


CONSUMING_OPS: Final = frozenset((Remove, RemoveMany, Confirm))
"""Operations that take items from the queue for good: answered as done only once their
records are as durable as ``sync_journal`` says, else with a :class:`JournalFailure`."""


def failed_result(ops: list[Any], results: list[Any], start: int, end: int) -> JournalFailure | None:
    """The :class:`JournalFailure` of an operation of ``ops[start:end]`` that takes items (a
    confirm, a removing fetch), if a journal could not make one durable (adds say their own)."""
    for index in range(start, min(end, len(results))):
        result = results[index]
        if type(result) is JournalFailure and type(ops[index]) in CONSUMING_OPS:
            return result
    return None


def closed_result(op: Any) -> Any:
    """What a closed (deleted) queue answers to ``op``."""
    kind = type(op)
    if kind is Add:
        return False
    if kind in MANY_FETCHES:
        return []
    if kind is Confirm or kind is FlushExpired:
        return 0
    return None


def missed_result(op: Any) -> Any:
    """The result of a fetch that found nothing."""
    return [] if type(op) in MANY_FETCHES else None


# -- the batch and its answer ---------------------------------------------------------------


class QueueBatch:
    """Run ``ops`` in order; answer ``reply_to.tell(BatchDone(results))``.

    A fetch that finds nothing and has a future deadline waits in the queue's wait-list; the
    batch is answered when it gets an item, times out, or its session is cancelled.
    ``copies`` is the queue's: the fanout copies its adds are waiting for. ``sent_at``: when a
    session sent it (epoch seconds, ``_clock.epoch_seconds``), the time of its requests
    (behaviour §5.1) and the start of its latency; 0.0: the queue reads the clock.
    """

    __slots__ = ("ops", "session", "reply_to", "copies", "parked", "failure", "sent_at", "answer")

    def __init__(self, ops: list[Any], session: Session | None, reply_to: Any, copies: Any = None,
                 sent_at: float = 0.0) -> None:
        self.ops = ops
        self.session = session
        self.reply_to = reply_to
        self.copies = copies
        self.sent_at = sent_at
        self.parked = False
        """Set by the queue when the batch waited in its wait-list (latency figures)."""
        self.failure: JournalFailure | None = None
        """Set by the queue when it refused an operation that takes items (a failing journal)."""
        self.answer: BatchDone | None = None
        """A :class:`BatchDone` the queue may refill as this batch's answer, not make one (it
        takes it: ``None`` again): the sender's answer to its batch before, which nothing else
        holds once the sender has read it (a session's, with its batch refilled too)."""


class BatchDone:
    """The results of a batch's operations, one each, in order.

    ``ops`` are the operations (the queue's answers carry them: a journal failure reads the
    results by them); ``failure`` is set when a result of an operation that takes items (a
    confirm, a removing fetch) is a :class:`JournalFailure`, so that a session looks for one
    only then. ``to`` is whom the queue tells it, once the journal write covering it is done
    (its batch's ``reply_to``, or the join of its fanout copies; let go of as it is told): the
    queue holds its answers as they are, with no pair around each. ``answered_at``: when the
    fdatasync that let it go ended (epoch seconds), one reading for all the answers it let go;
    0.0: the receiver reads the clock for its latency figures."""

    __slots__ = ("results", "ops", "failure", "to", "answered_at")

    def __init__(self, results: list[Any], ops: list[Any] | None = None,
                 failure: JournalFailure | None = None, to: Any = None) -> None:
        self.results = results
        self.ops = ops
        self.failure = failure
        self.to = to
        self.answered_at = 0.0

    def removed_items(self) -> list[Any]:
        """The items this answer hands out for good (plain fetches): what must go back to the
        queue if the answer cannot say so (:meth:`unacknowledged`)."""
        ops = self.ops
        items: list[Any] = []
        if ops is None:
            return items
        for index, result in enumerate(self.results):
            kind = type(ops[index])
            if kind is Remove and result is not None and type(result) is not JournalFailure:
                items.append(result)
            elif kind is RemoveMany and type(result) is list:
                items.extend(result)
        return items

    def unacknowledged(self, failure: JournalFailure) -> BatchDone:
        """This answer once the journal write it waited for has failed: each add it
        acknowledged (``True``), each confirm and each plain fetch that took an item becomes
        ``failure`` (the queue puts their items back: :meth:`removed_items`)."""
        ops = self.ops
        results = self.results
        converted = []
        for index, result in enumerate(results):
            kind = None if ops is None else type(ops[index])
            if result is True and (kind is None or kind is Add):
                result = failure
            elif kind in CONSUMING_OPS and result and type(result) is not JournalFailure:
                result = failure  # a count confirmed, an item or items removed
                self.failure = failure
            converted.append(result)
        self.results = converted
        return self


class CancelWaits:
    """The session has gone: drop its waiters (their batches are answered with a miss)."""

    __slots__ = ("session",)

    def __init__(self, session: Session) -> None:
        self.session = session


class _Ignore:
    """A ``reply_to`` for answers nobody waits for (a fire-and-forget request)."""

    __slots__ = ()

    @staticmethod
    def tell(_value: Any) -> None:
        pass


IGNORE = _Ignore()
