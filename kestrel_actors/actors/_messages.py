"""Messages between the connection, queue and collection actors.

A connection sends a queue a :class:`QueueBatch` of operations, consecutive requests for one
queue, and gets one :class:`BatchDone` back, so an actor hop is paid per batch, not per
request. ``reply_to`` is anything with ``tell()``: an ``ActorRef``, or a ``ReplyFuture``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "OP_ADD",
    "OP_CONFIRM",
    "OP_FLUSH",
    "OP_FLUSH_EXPIRED",
    "OP_OPEN",
    "OP_OPEN_MANY",
    "OP_PEEK",
    "OP_PUT_BACK",
    "OP_REMOVE",
    "OP_UNREMOVE",
    "BATCH_FETCH_BYTES",
    "IGNORE",
    "BatchDone",
    "JournalFailure",
    "CancelWaits",
    "QueueBatch",
    "QueueStats",
    "Session",
    "closed_result",
]

# Operations in a batch are tuples whose first element is one of these codes:
OP_ADD = 1  # (OP_ADD, data, expiry_ms) -> bool, or a JournalFailure
OP_REMOVE = 2  # (OP_REMOVE, deadline) -> Item | None
OP_OPEN = 3  # (OP_OPEN, deadline) -> Item (with xid) | None
OP_PEEK = 4  # (OP_PEEK, deadline) -> Item | None
OP_CONFIRM = 5  # (OP_CONFIRM, xids) -> number confirmed
OP_UNREMOVE = 6  # (OP_UNREMOVE, xids) -> None
OP_FLUSH = 7  # (OP_FLUSH,) -> None
OP_FLUSH_EXPIRED = 8  # (OP_FLUSH_EXPIRED,) -> number expired
OP_OPEN_MANY = 9  # (OP_OPEN_MANY, max_items, deadline) -> list[Item] (empty on timeout)
OP_PUT_BACK = 10  # (OP_PUT_BACK, items) -> None: items a plain GET took but could not deliver

BATCH_FETCH_BYTES = 1024 * 1024
"""A queue stops running a batch before its next fetch once the batch's fetches have taken
this many bytes, and answers with results for the operations it ran: the sender sends the
rest again when it is ready for more output. ``OP_OPEN_MANY`` stops at this many bytes too.
So one answer holds at most this much plus one item, whatever the client pipelined."""

FETCH_OPS = frozenset((OP_REMOVE, OP_OPEN, OP_PEEK, OP_OPEN_MANY))
"""Operations that may wait; ``deadline`` is ``time.monotonic()`` seconds or ``None``."""


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


def closed_result(op: tuple) -> Any:
    """What a closed (deleted) queue answers to ``op``."""
    code = op[0]
    if code == OP_ADD:
        return False
    if code == OP_OPEN_MANY:
        return []
    if code == OP_CONFIRM or code == OP_FLUSH_EXPIRED:
        return 0
    return None


class _Ignore:
    """A ``reply_to`` for answers nobody waits for (a fire-and-forget request)."""

    __slots__ = ()

    @staticmethod
    def tell(_value: Any) -> None:
        pass


IGNORE = _Ignore()


class Session:
    """What a queue may know of a client connection: whether it has gone, and who it is.

    A queue skips the waiters of a closed session, so a client that hung up never swallows an
    item. Actors share it read-only but for ``closed``, which only the connection sets.
    """

    __slots__ = ("closed", "id", "peer", "refuse_reads", "refuse_writes")

    def __init__(self, session_id: int, peer: str) -> None:
        self.id = session_id
        self.peer = peer
        self.closed = False
        self.refuse_reads = False
        self.refuse_writes = False
        """Set for the session's lifetime by ``connection_limit_refuse_*`` (reference §1)."""


class QueueBatch:
    """Run ``ops`` in order; answer ``reply_to.tell(BatchDone(tag, results))``.

    A fetch that finds nothing and has a future deadline waits in the queue's wait-list; the
    batch is answered when it gets an item, times out, or its session is cancelled.
    ``copies`` is the queue's: the fanout copies its adds are waiting for.
    """

    __slots__ = ("ops", "session", "reply_to", "tag", "copies", "parked")

    def __init__(self, ops: list[tuple], session: Session | None, reply_to: Any, tag: Any = None):
        self.ops = ops
        self.session = session
        self.reply_to = reply_to
        self.tag = tag
        self.copies: Any = None
        self.parked = False
        """Set by the queue when the batch waited in its wait-list (latency figures)."""


class BatchDone:
    __slots__ = ("tag", "results", "queue")

    def __init__(self, tag: Any, results: list[Any], queue: str) -> None:
        self.tag = tag
        self.results = results
        self.queue = queue


class CancelWaits:
    """The session has gone: drop its waiters (their batches are answered with a miss)."""

    __slots__ = ("session",)

    def __init__(self, session: Session) -> None:
        self.session = session


class QueueStats(NamedTuple):
    """A queue's (or an alias's) answer to :class:`GetStats`."""

    name: str
    lines: list[tuple[str, object]]
    """The memcache per-queue stats, in Kestrel's order (§7.3)."""
    extra: dict[str, int] | None
    """Figures only ostrich showed (``create_time``, ``max_items``, ``max_bytes``,
    ``journal_size``, ``put_bytes``); ``None`` for an alias."""


class GetStats:
    """Answer ``reply_to.tell(QueueStats(...))`` with the per-queue stats."""

    __slots__ = ("reply_to",)

    def __init__(self, reply_to: Any) -> None:
        self.reply_to = reply_to


class DeleteQueue:
    """Close the queue, wake its waiters with a miss, erase its journal, stop the actor."""

    __slots__ = ("reply_to",)

    def __init__(self, reply_to: Any) -> None:
        self.reply_to = reply_to


class CloseQueue:
    """Shut down: close the queue (journal flushed, not erased), answer, stop.

    With ``rewrite_empty`` an empty queue first rewrites its journal (§6.6, graceful shutdown).
    """

    __slots__ = ("reply_to", "rewrite_empty")

    def __init__(self, reply_to: Any, rewrite_empty: bool = False) -> None:
        self.reply_to = reply_to
        self.rewrite_empty = rewrite_empty


class Sweep:
    """Expiry sweep: answers ``reply_to.tell((name, expired_count, queue_expired))``.

    ``queue_expired`` is true when the queue is empty and older than ``max_queue_age``
    (reference §5.12); the collection then deletes it.
    """

    __slots__ = ("reply_to",)

    def __init__(self, reply_to: Any = None) -> None:
        self.reply_to = reply_to


class SetConfig:
    """``reload``: the queue's settings changed; they apply from the next operation."""

    __slots__ = ("config",)

    def __init__(self, config: Any) -> None:
        self.config = config


class SetChildren:
    """The fanout children of this queue changed: copies of every add go to ``children``."""

    __slots__ = ("children",)

    def __init__(self, children: dict[str, Any]) -> None:
        self.children = children


class AddCopy:
    """An item added to this queue's fanout master or an ``expire_to_queue`` source.

    A fanout copy is acknowledged with ``ack.tell(BatchDone(index, [result], name))`` once it
    is as durable as this queue's policy says (``index``: the master's result it belongs to);
    an expiry move calls ``release()`` once its ADD is durable, or at once if it is dropped.
    """

    __slots__ = ("data", "expiry", "count_total", "ack", "index", "release")

    def __init__(self, data: bytes, expiry: int, count_total: bool = True, ack: Any = None,
                 index: int = 0, release: Any = None) -> None:
        self.data = data
        self.expiry = expiry
        self.count_total = count_total
        self.ack = ack
        self.index = index
        self.release = release
