"""The planner's buffers for its batches' item bytes, reused once Spark has committed a batch.

A micro-batch of 50,000 items of 1 KiB is 50 MiB of values, received into one buffer per
connection. Fresh buffers cost the planner a page fault per 4 KiB page, each time (~14% of
its CPU, ADR 0022): the C heap gives a freed buffer of that size back to the system, and the
next batch's buffers come back as new pages. A batch's buffers live until its commit (its parts
are cut into slices and, if a server took some back, written again), while the read-ahead fills
the next batch's, so the planner holds at most about two batches' worth; :class:`BufferPool`
keeps the buffers of committed batches for the batches opened after them.

A buffer is reused only when nothing can read it any more: :class:`~kestrel_actors.client.ValueScan`
hands out views of a pooled buffer, never the buffer, and a ``bytearray`` with a view alive
refuses to be resized, which :meth:`BufferPool.give_back` tries. A batch the planner keeps (not
committed, or replayed) holds views, so its buffers are never handed out again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["BufferPool"]


def _unshared(buffer: bytearray) -> bool:
    """Whether no view of ``buffer`` is alive (resizing is refused while one is)."""
    try:
        buffer.append(0)
    except BufferError:
        return False
    buffer.pop()
    return True


class BufferPool:
    """At most ``keep`` buffers of committed batches, for the next batches to be written into.
    Thread-safe: the read-ahead takes buffers while Spark's calls give them back."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self) -> bytearray:
        """A buffer to write a connection's items into: the largest kept (its pages are the
        process's already), or a new one."""
        with self._lock:
            return self._free.pop() if self._free else bytearray()

    def give_back(self, buffers: Iterable[bytearray]) -> None:
        """The buffers of a batch Spark has committed (or that was given up). Kept only if
        nothing views them any more, and up to ``keep``; the rest go to the C heap."""
        with self._lock:
            for buffer in buffers:
                if len(self._free) < self.keep and _unshared(buffer):
                    self._free.append(buffer)
            self._free.sort(key=len)

    def __len__(self) -> int:
        return len(self._free)
