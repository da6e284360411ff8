"""Messages between the queue collection and a queue actor (and between queues: fanout and
``expire_to_queue`` copies)."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "AddCopy", "CloseQueue", "CopyDone", "DeleteQueue", "GetStats", "QueueStats", "SetChildren", "SetConfig", "Sweep",
    "Swept",
]


class QueueStats(NamedTuple):
    """A queue's answer to :class:`GetStats`: its ``(stat, value)`` lines in Kestrel's order."""

    name: str
    lines: list[tuple[str, object]]


class Swept(NamedTuple):
    """A queue's answer to :class:`Sweep`."""

    name: str
    expired: int
    queue_expired: bool
    """Empty and older than ``max_queue_age`` (reference §5.12): the collection deletes it."""


class GetStats:
    """Answer ``reply_to.tell(QueueStats)`` with the per-queue stats."""

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
    """Expiry sweep: answers ``reply_to.tell(Swept)`` if there is a ``reply_to``."""

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

    A fanout copy is acknowledged with ``ack.tell(CopyDone(index, result))`` once it is as
    durable as this queue's policy says (``index``: the master's result it belongs to); an
    expiry move calls ``release()`` once its ADD is durable, or at once if it is dropped.
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


class CopyDone(NamedTuple):
    """A child's answer to a fanout :class:`AddCopy`: the result of its add."""

    index: int
    """Which of the master batch's results the copy belongs to."""
    result: Any
