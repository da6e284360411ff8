"""How the server's C heap gives memory back (glibc's malloc; elsewhere these do nothing).

glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap``, returned to
the system when it is freed, and grows it with ``mremap``, without copying. But by default the
threshold is dynamic: each time such a block is freed, it rises to that block's size (up to
32 MiB). After one client's half-sent 48 MiB request was freed, the next large requests came
from the heap instead: a 24 MiB buffer was copied each time it grew by an eighth (slow enough to
hold other clients up for tens of milliseconds), and freed heap memory stays with the process
(measured: 48 MiB left behind every other round of eight such clients). :func:`tune_malloc`
fixes the threshold at ``MMAP_THRESHOLD``.

What is freed in the heap (blocks under the threshold: replies, items) is kept for reuse, and
a page in the middle of the heap is only returned by ``malloc_trim``: :func:`give_back_free_memory`
calls it, for the times a large amount has just been freed and stays freed. :data:`HELD` knows
when that is: it adds up the bytes the server holds of its clients' data, its connections'
buffers (``session._budget``) and the items its queues keep in memory (``queue._core``). Once
that sum has fallen ``TRIM_STEP`` below its highest since the last trim, it is looked at every
``TRIM_DELAY``: the trim runs at the first look that finds the fall has lasted, the sum neither
back within a step of the mark nor still falling (by ``SETTLE`` or more since the last look). A
reader beside the server (Spark's source, ADR 0022) reads a backlog out batch after batch. A
trim at every step of its fall (``strace``: 6 trims a ``spark_source_bench`` run, 3 during the
measured query, ~1 GiB ``madvise``d, as ``malloc_trim`` gives back every free page of the heap,
far more than the fall) would give back pages the next batch faults in again; so the trim waits
for the reading to stop (2 trims a run, none during the query), and a cycle of reads and writes
never trims: its heap is in use. ``malloc_trim(pad)`` and ``M_TOP_PAD`` keep memory at the
heap's top only: glibc still ``madvise``s every free chunk inside it. Asking glibc how much it
holds free instead (``mallinfo2``) walks every free chunk: 30 ms for a heap fragmented by 60,000
small items, too slow to poll.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any, Final

from mypy_extensions import i64

__all__ = ["HELD", "MMAP_THRESHOLD", "SETTLE", "TRIM_DELAY", "TRIM_STEP", "HeldMemory", "give_back_free_memory",
           "tune_malloc"]

MMAP_THRESHOLD = 1024 * 1024
"""Blocks of at least this size are mapped on their own: large requests and replies (a queue
answers fetches in parts of about 1 MiB). Smaller blocks reuse heap memory, as before."""
TRIM_STEP: Final = 32 * 1024 * 1024
"""Bytes :data:`HELD` must fall below its high-water mark before freed memory is given back."""
TRIM_DELAY: Final = 2.0
"""Seconds between looks at a fall: longer than a steady reader's pause between batches (a
micro-batch's), and long enough that a server slowed by other load still sees a fall followed
by a rise as such."""
SETTLE: Final = TRIM_STEP // 8
"""A fall further than this since the last look means the memory is still being read out."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _glibc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None  # musl, macOS: no such knobs
    return libc


_libc = _glibc()


class HeldMemory:
    """The bytes the server holds of its clients' data, and when freed memory goes back.

    Told of every change (:meth:`moved`) by the connections' buffer budget and by every queue
    as its items enter and leave memory: a sum and a few comparisons, on the request path. What
    happens once the sum has fallen ``TRIM_STEP`` below its high-water mark is ``on_fall``,
    which :func:`tune_malloc` sets (a server process); until then nothing is trimmed.
    """

    __slots__ = ("total", "high", "due", "low", "rose", "falling", "trims", "on_fall")

    def __init__(self) -> None:
        # native 64-bit integers: told three times a durable SET (its read, its answer, its
        # item), where boxed arithmetic cost ~40 instructions each
        self.total: i64 = 0
        self.high: i64 = 0
        """The highest ``total`` since the last trim."""
        self.due = False
        """``on_fall`` was called and :meth:`look` has not yet trimmed or given up."""
        self.low: i64 = 0
        """While ``due``: the lowest ``total`` since the last look, in ``SETTLE`` steps."""
        self.rose = False
        """``total`` came back within ``TRIM_STEP`` of ``high`` since the last look."""
        self.falling = False
        """``total`` fell ``SETTLE`` below ``low`` since the last look."""
        self.trims = 0
        """Trims run (``heap_trims`` in the admin port's counters)."""
        self.on_fall: Callable[[], None] | None = None

    def moved(self, change: i64) -> None:
        """The server holds ``change`` bytes more (or fewer, if negative) than before."""
        total = self.total = self.total + change
        if change > 0:
            if total > self.high:
                self.high = total
            if self.high - total < TRIM_STEP:
                self.rose = True
        elif self.high - total >= TRIM_STEP:
            if self.due:
                if self.low - total >= SETTLE:
                    self.low = total
                    self.falling = True
            elif self.on_fall is not None:
                self.due = True
                self.low = total
                self.rose = self.falling = False
                self.on_fall()

    def look(self) -> bool:
        """``TRIM_DELAY`` after the fall and after each look that waits: ``True`` if the fall
        has lasted since the last look (the trim is to run now). Otherwise the wait starts
        again from here while the sum is still a step below the mark (``due`` stays set: look
        again later), or ends if it is back within a step (the next fall starts one)."""
        if not (self.rose or self.falling):
            return True
        total = self.low = self.total
        self.rose = self.falling = False
        self.due = self.high - total >= TRIM_STEP
        return False

    def trimmed(self) -> None:
        """Freed memory was given back: the high-water mark starts again from here."""
        self.due = False
        self.high = self.total
        self.trims += 1


HELD: Final = HeldMemory()
"""The process's one :class:`HeldMemory` (the C heap is the process's)."""


def _trim_soon() -> None:
    import gevent  # only a server process trims, on its hub

    gevent.get_hub().loop.timer(TRIM_DELAY).start(_look)


def _look() -> None:
    if HELD.look():
        give_back_free_memory()
        HELD.trimmed()
    elif HELD.due:
        _trim_soon()


def tune_malloc() -> bool:
    """Fix the mmap threshold (and the heap's trim threshold at twice it, glibc's own ratio),
    and give freed memory back when :data:`HELD` falls; ``False`` where the C library has no
    ``mallopt``."""
    if _libc is None:
        return False
    HELD.on_fall = _trim_soon
    return bool(_libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and _libc.mallopt(_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD))


def give_back_free_memory() -> None:
    """Return the heap's free pages to the system (``malloc_trim(0)``)."""
    if _libc is not None:
        _libc.malloc_trim(0)
