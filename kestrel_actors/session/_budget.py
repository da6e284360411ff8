"""The server-wide bound on buffered input and output (``--max-buffered-bytes``, ADR 0011).

Each connection bounds what it buffers on its own (its replies, its pipelined requests: see
``_transport``), but a thousand connections within their own bounds can still hold gigabytes,
and a client that stalls half-way through a large request holds its part for as long as it
likes. :class:`BufferBudget` adds up what every transport holds (the unfinished request its
decoder keeps, the requests read but not yet handled, the replies not yet sent) and, once the
sum is over the bound, closes the connections holding the most until it is back under.

Closing, not pausing: a paused connection keeps what it holds, and what a stalled or
non-reading client holds can only be given back by ending its connection. The heaviest goes
first, so a client sending ordinary requests (which hold nothing between reads) is never the
one closed while a heavier one exists.

Shedding runs once per hub loop iteration at most (a callback), never inside a transport's own
read or send: the sum may go over the bound by what one iteration's reads and replies add.

Freed is not always given back: glibc keeps freed heap memory for reuse (see ``_malloc``). So
every change of the sum is told to ``_malloc.HELD`` too, which gives the heap's free pages back
once what the server holds (these buffers and the queues' items) has fallen far enough.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Final, Protocol

import gevent
import structlog
from mypy_extensions import i64

from .._malloc import HELD, HeldMemory

__all__ = ["BufferBudget", "BufferHolder"]

log = structlog.get_logger("kestrel_actors.transport")

_held = attrgetter("held")

_I64_MAX: Final = (1 << 63) - 1


class BufferHolder(Protocol):
    """What the budget needs of a transport."""

    held: i64
    """Bytes this connection holds now, as last told to :meth:`BufferBudget.moved`."""

    @property
    def peer(self) -> str:
        """The client's ``host:port`` (for the log line of a shed)."""

    def shed(self) -> None:
        """Drop what is held (telling the budget so) and end the connection."""


class BufferBudget:
    """The sum of what every connection buffers, and the bound on it; see the module docstring."""

    __slots__ = ("limit", "total", "members", "shed_connections", "_due", "held")

    def __init__(self, limit: int) -> None:
        # native 64-bit integers: two changes a request (its read, its answer), and the sum's
        # boxed arithmetic cost more than the rest of a change
        self.limit: i64 = min(limit, _I64_MAX)
        self.total: i64 = 0
        self.members: set[BufferHolder] = set()
        """Every open connection: the candidates for shedding. Only a shed looks through them,
        so that what a request changes costs a sum and a comparison, not a set's upkeep."""
        self.shed_connections = 0
        """Connections closed by the bound since start-up."""
        self._due = False
        self.held: HeldMemory = HELD
        """Told of every change of the sum (see the module docstring)."""

    def join(self, holder: BufferHolder) -> None:
        """``holder`` is a connection from now on (holding nothing yet)."""
        self.members.add(holder)

    def leave(self, holder: BufferHolder) -> None:
        """``holder`` has closed, and told :meth:`moved` that it holds nothing now."""
        self.members.discard(holder)

    def moved(self, change: i64) -> None:
        """A connection holds ``change`` bytes more (or fewer, if negative) than it last said."""
        total = self.total = self.total + change
        self.held.moved(change)
        if change > 0 and total > self.limit and not self._due:
            self._due = True
            gevent.get_hub().loop.run_callback(self._shed)

    def _shed(self) -> None:
        self._due = False
        if self.total <= self.limit:
            return
        # one connection closed is usually enough: a pass over the members for each, not a sort
        # of them all (with a thousand non-readers a shed came with nearly every loop pass)
        while self.total > self.limit and self.members:
            heaviest = max(self.members, key=_held)
            if not heaviest.held:
                break
            log.warning("closing the connection holding the most buffered bytes: the server holds more "
                        "than --max-buffered-bytes", held_bytes=heaviest.held, buffered_bytes=self.total,
                        max_buffered_bytes=self.limit, peer=heaviest.peer)
            self.shed_connections += 1
            heaviest.shed()
            if heaviest.held:  # could not let go (never so far): do not pick it again forever
                break
