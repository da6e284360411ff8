"""Messages between the queue collection and a queue actor (and between queues: fanout and
``expire_to_queue`` copies)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "AddCopy", "CloseQueue", "CopyDone", "DeleteQueue", "GetStats", "QueueStats", "SetChildren", "SetConfig",
    "Sweep", "Swept",
]


class QueueStats(NamedTuple):
    """A queue's (or an alias's) answer to :class:`GetStats`."""

    name: str
    lines: list[tuple[str, object]]
    """The memcache per-queue stats, in Kestrel's order (behaviour §7.3)."""
    extra: dict[str, int] | None
    """Figures only ostrich showed (``create_time``, ``max_items``, ``max_bytes``,
    ``journal_size``, ``put_bytes``); ``None`` for an alias."""
    alias_created: int | None = None
    """An alias's ``create_time`` (Unix seconds): the one gauge ostrich showed for an alias."""
    loading: bool = False
    """A queue found on disk whose journal is still being replayed (its only line is
    ``loading``, 1): the collection answers for it until its actor exists."""


class Swept(NamedTuple):
    """A queue's answer to :class:`Sweep`."""

    name: str
    expired: int
    queue_expired: bool
    """Empty and older than ``max_queue_age`` (behaviour §5.12): the collection deletes it."""


@dataclass(slots=True, eq=False)
class GetStats:
    """Answer ``reply_to.tell(QueueStats)`` with the per-queue stats."""

    reply_to: Any


@dataclass(slots=True, eq=False)
class DeleteQueue:
    """Close the queue, wake its waiters with a miss, erase its journal, stop the actor."""

    reply_to: Any


@dataclass(slots=True, eq=False)
class CloseQueue:
    """Shut down: close the queue (journal flushed, not erased), answer, stop.

    With ``rewrite_empty`` an empty queue first rewrites its journal (behaviour §6.6, graceful shutdown).
    """

    reply_to: Any
    rewrite_empty: bool = False


@dataclass(slots=True, eq=False)
class Sweep:
    """Expiry sweep: answers ``reply_to.tell(Swept)`` if there is a ``reply_to``."""

    reply_to: Any = None


@dataclass(slots=True, eq=False)
class SetConfig:
    """``reload``: the queue's settings changed; they apply from the next operation."""

    config: Any


@dataclass(slots=True, eq=False)
class SetChildren:
    """The fanout children of this queue changed: copies of every add go to ``children``."""

    children: dict[str, Any]


@dataclass(slots=True, eq=False)
class AddCopy:
    """An item added to this queue's fanout master or an ``expire_to_queue`` source.

    A fanout copy is acknowledged with ``ack.tell(CopyDone(index, result))`` once it is as
    durable as this queue's policy says (``index``: the master's result it belongs to); an
    expiry move calls ``release()`` once its ADD is durable, or at once if it is dropped.
    """

    data: bytes
    expiry: int
    count_total: bool = True
    ack: Any = None
    index: int = 0
    release: Any = None


class CopyDone:
    """A child's answer to a fanout :class:`AddCopy`: the result of its add. ``to`` is the
    copy's ``ack``, whom the child tells it once its journal write is done (as
    ``BatchDone.to``)."""

    __slots__ = ("index", "result", "to")

    def __init__(self, index: int, result: Any, to: Any = None) -> None:
        self.index = index
        """Which of the master batch's results the copy belongs to."""
        self.result = result
        self.to = to

    def __repr__(self) -> str:
        return f"CopyDone(index={self.index}, result={self.result!r})"

    def unacknowledged(self, failure: Any) -> CopyDone:
        """This ack once the child's journal write it waited for has failed, as
        ``BatchDone.unacknowledged`` reads a batch's answer: a stored copy becomes ``failure``
        (a ``JournalFailure``), which the master's join makes its add's result."""
        return CopyDone(self.index, failure, self.to) if self.result is True else self
