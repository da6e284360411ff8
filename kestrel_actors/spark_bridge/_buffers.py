"""The planner's buffers for its batches' item bytes, reused once a batch's file is written.

A micro-batch of 50,000 items of 1 KiB is 50 MiB of values, received into one buffer per
connection. Fresh buffers cost the planner a page fault per 4 KiB page, each time (~14% of
its CPU, ADR 0022): the C heap gives a freed buffer of that size back to the system, and the
next batch's buffers come back as new pages. Once a batch's write-ahead file is written nothing
reads its buffers again (its slices were cut while the file was written; another cut, or a
replay, reads the file), so :class:`BufferPool` takes them back at once and the read-ahead
receives the next batch into them: the planner holds one batch's worth.

A buffer is reused only when nothing can read it any more: :class:`~kestrel_actors.client.ValueScan`
hands out views of a pooled buffer, never the buffer, and a ``bytearray`` with a view alive
refuses to be resized, which :meth:`BufferPool.give_back` tries. A buffer some view still
holds is left to the C heap, never handed out again.
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
    """At most ``keep`` buffers of planned batches, for the next batches to be written into.
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
        """The buffers of a batch whose file is written. Kept only if nothing views them any
        more, and up to ``keep``; the rest go to the C heap."""
        with self._lock:
            for buffer in buffers:
                if len(self._free) < self.keep and _unshared(buffer):
                    self._free.append(buffer)
            self._free.sort(key=len)

    def __len__(self) -> int:
        return len(self._free)
