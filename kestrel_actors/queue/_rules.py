"""The rules every part of the server applies to queues, each in one place.

Names (reference §5.2, plus safety limits), the fanout ``+`` split (§5.9), transaction ids
(§6.3: positive 32-bit, wrapping past an id still open) and the clock items are stamped with.
The config file, the collection, the journal replay and the offline tools all use these.
"""

from __future__ import annotations

import time
from typing import Container

__all__ = [
    "MAX_NAME_BYTES", "XID_MAX", "epoch_ms", "fanout_master", "is_fanout_child", "name_problem",
    "next_xid", "validate_queue_name",
]

MAX_NAME_BYTES = 200
"""Leaves room in a 255-byte file name for ``.<epoch-ms>.pack`` and ``~~<epoch-ms>``."""

_ILLEGAL = frozenset("/.~")
_CONTROL = frozenset(chr(c) for c in range(32)) | {"\x7f"}

XID_MAX = 2**31 - 1


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a queue, or ``None`` if it can.

    Kestrel's rule (no ``/ . ~``) plus safety limits: control bytes and over-long names are
    refused too, and a fanout child needs a master, so a name can never reach outside the
    data directory or fail to become a file.
    """
    if not name:
        return "a queue name cannot be empty"
    if name.startswith("+"):
        return f"queue name {name!r} is a fanout child without a master (it starts with +)"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"queue name {name[:40]!r}... is longer than {MAX_NAME_BYTES} bytes"
    if any(char in _ILLEGAL for char in name):
        return f"queue name {name!r} contains illegal characters (one of: ~ . /)"
    if any(char in _CONTROL for char in name):
        return f"queue name {name!r} contains a control character"
    return None


def validate_queue_name(name: str) -> bool:
    """True if ``name`` can name a queue (see :func:`name_problem`)."""
    return name_problem(name) is None


def fanout_master(name: str) -> str | None:
    """The master of fanout child ``P+C`` (split at the first ``+``), or ``None`` for a master."""
    master, plus, _child = name.partition("+")
    return master if plus else None


def is_fanout_child(name: str) -> bool:
    return "+" in name


def next_xid(last: int, taken: Container[int]) -> int:
    """The transaction id after ``last`` that is not in ``taken`` (wrapping at ``XID_MAX``)."""
    xid = last
    while True:
        xid = xid + 1 if xid < XID_MAX else 1
        if xid not in taken:
            return xid


def epoch_ms() -> int:
    """The wall clock in epoch milliseconds, the unit of item times and expiries."""
    return int(time.time() * 1000)
