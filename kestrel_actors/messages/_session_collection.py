"""Messages to the queue collection (from a session, or from the server) and its answers."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from pykka import ActorDeadError

__all__ = [
    "AliasAdd", "Delete", "ForAll", "ForAllKind", "Gather", "Load", "Reconfigure", "ReloadFailed", "Resolve",
    "Resolved",
]


@dataclass(slots=True, eq=False)
class Resolve:
    """Look a name up (creating the queue if ``create`` and it is legal); answer :class:`Resolved`."""

    name: str
    create: bool
    reply_to: Any


@dataclass(slots=True, eq=False)
class Resolved:
    """The answer to a name lookup: a queue ref, an alias's destinations, or neither.

    ``error`` says why a queue that had to be created could not be opened (its journal file
    could not be created on a full disk, say); the client gets a server error.
    """

    name: str
    ref: Any = None
    alias: tuple[str, ...] | None = None
    valid: bool = True
    error: str | None = None


@dataclass(slots=True, eq=False)
class Delete:
    """Delete queue ``name`` (and its journal); answer ``True``."""

    name: str
    reply_to: Any


@dataclass(slots=True, eq=False)
class AliasAdd:
    """A SET to an alias: add to every destination; answer the list of their results."""

    name: str
    data: bytes
    expiry: int
    reply_to: Any


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


@dataclass(slots=True, eq=False)
class ForAll:
    """Run ``kind`` on every queue and answer ``reply_to`` once all have answered."""

    kind: ForAllKind
    reply_to: Any
    names: tuple[str, ...] | None = None
    graceful: bool = False
    """For CLOSE: empty queues rewrite their journals first (ReadOnly/Quiescent shutdown)."""


@dataclass(slots=True, eq=False)
class Load:
    """Start loading the queues found on disk (asked before the listeners start; it answers
    at once, and each queue is replayed in the background: behaviour §7.1)."""

    names: list[str]
    loaded: Any = None
    """Called (no arguments, on the collection's greenlet) once every queue is loaded."""


@dataclass(slots=True, eq=False)
class Reconfigure:
    """``reload``: answer ``reply_to`` once every queue has been told its new settings."""

    config: Any
    reply_to: Any


class ReloadFailed(NamedTuple):
    """The answer to a ``reload`` whose config file cannot be used (unreadable, not TOML, a
    bad key or value): the running configuration stays, no :class:`Reconfigure` is sent.
    ``reason`` is one line, for the client."""

    reason: str


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
