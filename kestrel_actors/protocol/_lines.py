"""What both wire protocols share: line framing with a length limit, and Java's integers.

Pure functions over a buffer, in pymemcache's manner: a decoder calls :func:`next_line` with
its buffer and position and gets the line and where the next one starts.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["STATUS_NAMES", "TOO_LONG", "bytes_between", "int32", "int32_text", "line_at", "next_line"]

STATUS_NAMES = frozenset(("up", "readonly", "writeavoid", "quiescent"))
"""The server statuses a client may name (behaviour §7.2)."""

TOO_LONG: Final = object()
""":func:`next_line`'s answer for a line longer than the limit (complete or not)."""

_INT = re.compile(rb"[+-]?[0-9]+\Z")
_INT_TEXT = re.compile(r"[+-]?[0-9]+\Z")
_INT32_MIN, _INT32_END = -(2**31), 2**31


def next_line(buffer: bytes | bytearray, pos: int, limit: int) -> tuple[bytes | object | None, int]:
    """The line that starts at ``pos`` and the position after it.

    A line ends at ``\\n``; a ``\\r`` just before it is dropped. ``(None, pos)`` while the line
    is incomplete, ``(TOO_LONG, pos)`` once it is longer than ``limit`` bytes.
    """
    eol = buffer.find(b"\n", pos)
    if eol < 0:
        return (TOO_LONG if len(buffer) - pos > limit else None), pos
    end = eol - 1 if eol > pos and buffer[eol - 1] == 13 else eol
    if end - pos > limit:
        return TOO_LONG, pos
    return bytes_between(buffer, pos, end), eol + 1


def bytes_between(buffer: bytes | bytearray, start: int, end: int) -> bytes:
    """``buffer[start:end]`` as ``bytes``: a line, an item's data, a frame.

    A read parsed in place is ``bytes``, whose slice already is (typed so, the compiled build
    slices it natively); the decoder's kept ``bytearray`` is copied out.
    """
    if type(buffer) is bytes:
        return buffer[start:end]
    return bytes(buffer[start:end])


def line_at(buffer: bytes | bytearray, pos: int, line: bytes) -> bool:
    """Whether ``line`` (a whole line, its end included) comes next in ``buffer`` at ``pos``.

    A client repeats its request line (``set q 0 0 1024``): one comparison recognises it where
    :func:`next_line` searches for its end and copies it out (``bytes.find`` is a generic method
    call even in the compiled build; ``startswith`` on ``bytes`` is not).
    """
    end = pos + len(line)
    if type(buffer) is bytes:  # a read parsed in place, typed so: sliced and compared natively
        if pos == 0:
            return buffer.startswith(line)  # no copy
        return buffer[pos:end] == line
    return buffer[pos:end] == line


def int32(token: bytes) -> int | None:
    """Java's ``Integer.parseInt``: an optional sign and digits, within 32 bits, else None."""
    if token.isdigit():  # the common case, without the regex (three numbers per SET)
        value = int(token)
        return value if value < _INT32_END else None
    if not _INT.match(token):
        return None
    value = int(token)
    return value if _INT32_MIN <= value < _INT32_END else None


def int32_text(token: str) -> int | None:
    """:func:`int32` of a decoded token."""
    if not _INT_TEXT.match(token):
        return None
    value = int(token)
    return value if _INT32_MIN <= value < _INT32_END else None
