"""What a session may ask of its server, and nothing more.

A session reads the server-wide counters and bumps them (``stats``), checks the server's
status (behaviour §7.2) and reads config values, finds queues in the collection's directory or
through the collection, and asks the
server to shut down or reload by a message to ``control``. It never holds the ``Server``.
The counters and the status are shared, not told: see ADR 0003 for why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# imported, not only named for the type checker: the compiled dataclass needs these classes
# when the module loads
from ..messages import Session
from ..stats import ServerStats
from ..status import ServerStatus

__all__ = ["Reload", "SessionContext", "Shutdown"]


class Shutdown:
    """Begin an orderly shutdown (behaviour §7.4)."""

    __slots__ = ()


@dataclass(slots=True, eq=False)
class Reload:
    """Re-read the config file; answer ``reply_to`` once every queue has its new settings."""

    reply_to: Any


@dataclass(slots=True, eq=False, kw_only=True)
class SessionContext:
    """One per server, shared by its sessions (the server updates ``config`` on reload)."""

    stats: ServerStats
    """The global counters of STATS."""
    status: ServerStatus
    """Up, ReadOnly, Quiescent... (behaviour §7.2)."""
    collection: Any
    config: Any
    version: str
    control: Any
    """Takes :class:`Shutdown` and :class:`Reload` by ``tell``."""
    closed: Callable[[Any], None]
    """Called with the ``Session`` once a session has finished."""
    membership: Any = None
    """``cluster.ZooKeeperMembership`` when the server joins server sets (its figures are in
    ``stats``), else None."""
    queues: dict[str, Any] = field(default_factory=dict)
    """The collection's ``directory``: the live queues a ``Resolve`` would answer at once, by
    name. Read, never written, by sessions: a connection's first request for a queue that
    exists needs no message to the collection (ADR 0005)."""

    def writes_allowed(self, session: Session) -> bool:
        return not session.refuse_writes and not self.status.blocks_writes()

    def reads_allowed(self, session: Session) -> bool:
        return not session.refuse_reads and not self.status.blocks_reads()

    def status_command(self, name: str | None) -> str | None:
        """``status`` (``name`` None) answers the status's name; ``status <name>`` sets it
        (or silently not, if ``name`` is no status) and answers ``None``."""
        if name is None:
            reply: str = self.status.status.reply_name
            return reply
        self.status.set(name)
        return None
