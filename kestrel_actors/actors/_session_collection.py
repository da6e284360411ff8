"""Messages to the queue collection (from a session, or from the server) and its answers."""

from __future__ import annotations

import enum
from typing import Any, Callable

from pykka import ActorDeadError

__all__ = ["AliasAdd", "Delete", "ForAll", "ForAllKind", "Gather", "Load", "Reconfigure", "Resolve", "Resolved"]


class Resolve:
    """Look a name up (creating the queue if ``create`` and it is legal); answer :class:`Resolved`."""

    __slots__ = ("name", "create", "reply_to")

    def __init__(self, name: str, create: bool, reply_to: Any) -> None:
        self.name = name
        self.create = create
        self.reply_to = reply_to


class Resolved:
    """The answer to a name lookup: a queue ref, an alias's destinations, or neither.

    ``error`` says why a queue that had to be created could not be opened (its journal file
    could not be created on a full disk, say); the client gets a server error.
    """

    __slots__ = ("name", "ref", "alias", "valid", "error")

    def __init__(self, name: str, ref: Any = None, alias: tuple[str, ...] | None = None, valid: bool = True,
                 error: str | None = None):
        self.name = name
        self.ref = ref
        self.alias = alias
        self.valid = valid
        self.error = error


class Delete:
    """Delete queue ``name`` (and its journal); answer ``True``."""

    __slots__ = ("name", "reply_to")

    def __init__(self, name: str, reply_to: Any) -> None:
        self.name = name
        self.reply_to = reply_to


class AliasAdd:
    """A SET to an alias: add to every destination; answer the list of their results."""

    __slots__ = ("name", "data", "expiry", "reply_to")

    def __init__(self, name: str, data: bytes, expiry: int, reply_to: Any) -> None:
        self.name = name
        self.data = data
        self.expiry = expiry
        self.reply_to = reply_to


class ForAllKind(enum.Enum):
    FLUSH = "flush"
    """flush_all: answers one ``None`` per queue."""
    SWEEP = "sweep"
    """An expiry sweep (flush_all_expired, the timer): answers the expired counts."""
    STATS = "stats"
    """stats, dump_stats: answers ``QueueStats`` per queue (of ``names`` if given) and alias."""
    CONFIG = "config"
    """dump_config: answers ``(name, QueueConfig)`` per queue and ``(name, destinations)`` per alias."""
    CLOSE = "close"
    """Shutdown: closes every queue; answers once all have closed."""


class ForAll:
    """Run ``kind`` on every queue and answer ``reply_to`` once all have answered."""

    __slots__ = ("kind", "reply_to", "names", "graceful")

    def __init__(self, kind: ForAllKind, reply_to: Any, names: tuple[str, ...] | None = None,
                 graceful: bool = False) -> None:
        self.kind = kind
        self.reply_to = reply_to
        self.names = names
        self.graceful = graceful
        """For CLOSE: empty queues rewrite their journals first (ReadOnly/Quiescent shutdown)."""


class Load:
    """Create the queues found on disk (asked, before the listeners start)."""

    __slots__ = ("names",)

    def __init__(self, names: list[str]) -> None:
        self.names = names


class Reconfigure:
    """``reload``: answer ``reply_to`` once every queue has been told its new settings."""

    __slots__ = ("config", "reply_to")

    def __init__(self, config: Any, reply_to: Any) -> None:
        self.config = config
        self.reply_to = reply_to


class Gather:
    """A ``reply_to`` that collects ``expected`` answers, then calls ``done(answers)``."""

    def __init__(self, expected: int, done: Callable[[list[Any]], None]) -> None:
        self.answers: list[Any] = []
        self.expected = expected
        self.done = done
        if expected == 0:
            done([])

    def tell(self, answer: Any) -> None:
        self.answers.append(answer)
        if len(self.answers) == self.expected:
            self.done(self.answers)

    def send(self, refs: list[Any], make_message: Callable[[Any], Any]) -> None:
        """Send ``make_message(self)`` to every ref; a dead one answers ``None``."""
        for ref in refs:
            try:
                ref.tell(make_message(self))
            except ActorDeadError:
                self.tell(None)
