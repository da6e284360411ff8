"""Which queue names the server accepts: shared by the server's collection and the client.

Pure and dependency-free, so the client (and the Spark bridge, which must never load gevent)
checks a name with exactly the server's rule before sending it.
"""

from __future__ import annotations

__all__ = ["MAX_NAME_BYTES", "validate_queue_name"]

MAX_NAME_BYTES = 200
"""Leaves room in a 255-byte file name for ``.<epoch-ms>.pack`` and ``~~<epoch-ms>``."""

_ILLEGAL = frozenset("/.~") | {chr(c) for c in range(32)} | {"\x7f"}


def validate_queue_name(name: str) -> bool:
    """True if ``name`` can name a queue: Kestrel's rule (no ``/ . ~``) plus safety limits.

    Control bytes and over-long names are refused too, and a fanout child needs a master, so
    a name can never reach outside the data directory or fail to become a file.
    """
    if not name or name.startswith("+") or len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return False
    return not any(char in _ILLEGAL for char in name)
