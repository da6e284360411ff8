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
calls it, for the times a large amount has just been freed (``session._budget``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

__all__ = ["MMAP_THRESHOLD", "give_back_free_memory", "tune_malloc"]

MMAP_THRESHOLD = 1024 * 1024
"""Blocks of at least this size are mapped on their own: large requests and replies (a queue
answers fetches in parts of about 1 MiB). Smaller blocks reuse heap memory, as before."""
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


def tune_malloc() -> bool:
    """Fix the mmap threshold (and the heap's trim threshold at twice it, glibc's own ratio);
    ``False`` where the C library has no ``mallopt``."""
    if _libc is None:
        return False
    return bool(_libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and _libc.mallopt(_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD))


def give_back_free_memory() -> None:
    """Return the heap's free pages to the system (``malloc_trim(0)``)."""
    if _libc is not None:
        _libc.malloc_trim(0)
