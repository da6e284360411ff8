"""Thrift's open reads: process-global ids, who opened them, and their auto-abort timers.

Kestrel's ``ThriftPendingReads`` (behaviour §4): an item a thrift ``get`` opens with
``auto_abort_msec > 0`` gets an id that is unique in the process, and any connection may
confirm or abort it by that id; an abort timer returns it if nobody does. The queue keeps its
own per-queue xid (the journal needs it); this map translates. It is memory only: after a
restart the opened items are back at the head of their queues (replay), and their old ids are
unknown (confirm counts 0).

One :class:`ThriftReads` per hub (per server process), touched only from greenlets of that hub
and from its one timer callback on the hub, so it needs no lock; nothing here blocks. The
timers are one heap of deadlines and one hub timer armed for the earliest, as a queue's
``WaitList`` does; a confirmed id's heap entry is dropped when it comes up. When the timer
fires, the due ids leave the map and their aborts go to their queues as messages handed to
the :class:`~..runtime.Dispatcher` (a hub callback never runs an actor's handler, ADR 0002).
"""

from __future__ import annotations

import heapq
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..messages import IGNORE, QueueBatch, Unremove
from ..runtime import Dispatcher, of_this_hub

__all__ = ["OpenRead", "ThriftReads", "first_id"]

_NEVER = float("inf")


def first_id(now_ms: int | None = None) -> int:
    """The first id of this process: boot time in ms × 1024, so that an id a client kept
    across a restart can never name a read of the new process (Kestrel starts at 1 each time
    and can). Room for 1024 ids per millisecond of uptime; an i64 holds it until year 285 000."""
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    return max(1, now_ms * 1024)


@dataclass(slots=True, eq=False)
class OpenRead:
    """An item opened by a thrift ``get``, known by its global id."""

    queue: str
    xid: int
    ref: Any
    """The queue actor that holds it open (dead or None: the queue was deleted, the item too)."""
    owner: dict[str, int]
    """The opener's open counts by queue (its per-connection limit): decremented on close."""
    deadline: float


class ThriftReads:
    """The id → :class:`OpenRead` map of one process, with the auto-abort timers."""

    _by_hub: ClassVar[weakref.WeakKeyDictionary[Any, ThriftReads]] = weakref.WeakKeyDictionary()

    def __init__(self, hub: Any, next_id: int | None = None) -> None:
        self.reads: dict[int, OpenRead] = {}
        self.next_id = first_id() if next_id is None else next_id
        self._loop = hub.loop
        self._dispatcher = Dispatcher.current()
        self._deadlines: list[tuple[float, int]] = []
        self._timer: Any = None
        self._timer_at = _NEVER

    @classmethod
    def current(cls) -> ThriftReads:
        """The map of this thread's hub (the server's), made on first use."""
        return of_this_hub(cls._by_hub, cls)

    def open(self, queue: str, xid: int, ref: Any, owner: dict[str, int], auto_abort_ms: int) -> int:
        """Record an opened item; its abort timer starts now. Returns its id. The opener's
        count was raised when the queue opened the item (the get's loop checks it)."""
        read_id = self.next_id
        self.next_id += 1
        deadline = time.monotonic() + auto_abort_ms / 1000.0
        self.reads[read_id] = OpenRead(queue, xid, ref, owner, deadline)
        deadlines = self._deadlines
        if len(deadlines) > 2 * len(self.reads) + 64:  # mostly closed ids: drop them
            deadlines[:] = [entry for entry in deadlines if entry[1] in self.reads]
            heapq.heapify(deadlines)
        heapq.heappush(deadlines, (deadline, read_id))
        if deadline < self._timer_at:
            self._arm(deadline)
        return read_id

    def close(self, ids: Iterable[int]) -> list[OpenRead]:
        """Take the known ids out of the map (a confirm or an abort, from any connection):
        their timers no longer matter and their openers' counts go down."""
        reads = self.reads
        closed = []
        for read_id in ids:
            read = reads.pop(read_id, None)
            if read is not None:
                _release(read)
                closed.append(read)
        return closed

    # -- the timer ----------------------------------------------------------------------------

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer.close()
        self._timer_at = deadline
        self._timer = self._loop.timer(max(0.0, deadline - time.monotonic()))
        self._timer.start(self._fire)

    def _fire(self) -> None:
        """On the hub: the due ids leave the map; their queues are told to abort them."""
        self._timer.close()
        self._timer = None
        self._timer_at = _NEVER
        now = time.monotonic()
        deadlines = self._deadlines
        reads = self.reads
        due: dict[int, tuple[Any, list[int]]] = {}
        while deadlines and deadlines[0][0] <= now:
            _deadline, read_id = heapq.heappop(deadlines)
            read = reads.pop(read_id, None)
            if read is None:
                continue  # confirmed or aborted already
            _release(read)
            if read.ref is not None:  # None: its queue went during the get, the item with it
                due.setdefault(id(read.ref), (read.ref, []))[1].append(read.xid)
        for ref, xids in due.values():
            self._dispatcher.deliver(ref, QueueBatch([Unremove(tuple(xids))], None, IGNORE))
        if deadlines:
            self._arm(deadlines[0][0])


def _release(read: OpenRead) -> None:
    owner = read.owner
    left = owner.get(read.queue, 0) - 1
    if left > 0:
        owner[read.queue] = left
    else:
        owner.pop(read.queue, None)
