"""Queue names: what a name is in bytes, and which names are legal. One rule, in one place.

A queue name is a byte string, and it is the same bytes everywhere: on the wire (both
protocols), as its journal's file name, and as the UTF-8 of its spelling in the config file.
Inside the server it is held as ``str``, decoded UTF-8 with ``surrogateescape``: every byte
string round-trips (bytes that are not UTF-8 become lone surrogates and are encoded back
unchanged), and it is the encoding Python's ``os`` functions use for file names on Linux, so
``os.listdir`` gives the very ``str`` that a client sending the file's name produces.
Kestrel decodes names ISO-8859-1 and writes files in the JVM's encoding (UTF-8), so a name
with bytes >= 0x80 has different bytes on its disk than on its wire there; see docs/behaviour.md.
"""

from __future__ import annotations

__all__ = [
    "MAX_NAME_BYTES", "fanout_master", "is_fanout_child", "is_queue_name", "name_bytes", "name_from_wire",
    "name_problem", "name_text",
]

MAX_NAME_BYTES = 200
"""Leaves room in a 255-byte file name for ``.<epoch-ms>.pack`` and ``~~<epoch-ms>``."""

_ILLEGAL = frozenset("/.~")
_CONTROL = frozenset(chr(c) for c in range(32)) | {"\x7f"}


def name_from_wire(raw: bytes) -> str:
    """The name (or any token) a client sent, as the server holds it."""
    return raw.decode("utf-8", "surrogateescape")


def name_bytes(text: str) -> bytes:
    """The bytes of a name, or of reply text that holds names (stats, dump_stats, dump_config,
    ``VALUE`` lines): the inverse of :func:`name_from_wire`."""
    return text.encode("utf-8", "surrogateescape")


def name_text(text: str) -> str:
    """``text`` (a name, or text that holds names) for an output that must be valid UTF-8
    (the admin port's ``/stats.json``, ``/stats.txt`` and ``/metrics``): bytes of a name that
    are not UTF-8 are written as ``\\xNN``; every other name is unchanged."""
    return name_bytes(text).decode("utf-8", "backslashreplace")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a queue, or None if it can.

    Kestrel's rule (no ``/ . ~``, so a name never reaches outside the data directory and the
    part of a file name before the first ``.`` is its queue), plus safety limits: no control
    bytes, at most :data:`MAX_NAME_BYTES` bytes (a file name must fit), and a fanout child
    (``master+child``) needs a master.
    """
    if not name:
        return "a queue name cannot be empty"
    if any(char in _ILLEGAL for char in name):
        return f"queue name {name!r} contains illegal characters (one of: ~ . /)"
    if any(char in _CONTROL for char in name):
        return f"queue name {name!r} contains a control character"
    if name.startswith("+"):
        return f"queue name {name!r} starts with '+' (a fanout child needs a master queue name before it)"
    if len(name_bytes(name)) > MAX_NAME_BYTES:
        return f"queue name {name!r} is longer than {MAX_NAME_BYTES} bytes"
    return None


def is_queue_name(name: str) -> bool:
    """True if ``name`` can name a queue (see :func:`name_problem`)."""
    return name_problem(name) is None


def fanout_master(name: str) -> str | None:
    """The master of fanout child ``P+C`` (split at the first ``+``), or ``None`` for a master."""
    master, plus, _child = name.partition("+")
    return master if plus else None


def is_fanout_child(name: str) -> bool:
    return "+" in name
