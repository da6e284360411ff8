"""The per-item step of a ``monitor`` reply's scan, compiled (ADR 0015, ADR 0022 point 3).

A Spark source's planner takes 50,000 ``VALUE`` blocks a micro-batch. In Python each cost a
regular-expression match, two conversions and three appends (~1.5 µs); here the header's
digits are read byte by byte into machine integers and the value copied, with no Python
object but the two integers kept. Only Kestrel's own form is taken — ``VALUE <queue> 0
<length>[ <stamp>]\\r\\n``, the value, ``\\r\\nEND\\r\\n`` — and anything else (the final ``END``, an
error, a value not followed by ``END``) is left to :class:`~kestrel_actors.client._wire.ValueScan`,
which maps it as for one value. Interpreted (a pure install) this loop is slower than the
regular expression, so ``ValueScan`` uses it only when it is compiled (:data:`COMPILED`).
"""

from __future__ import annotations

from typing import Final

__all__ = ["COMPILED", "MORE", "OTHER", "HeaderScan"]

COMPILED: Final = not __file__.endswith(".py")
"""Whether this module runs compiled (its file is the extension, not the source)."""

MORE: Final = 0
"""The scan stopped inside a block of its form: the rest has not been received yet."""
OTHER: Final = 1
"""The scan stopped at a line not of its form (or a value not followed by ``END``)."""

_MAX_DIGITS: Final = 18
"""More digits than this may not fit 63 bits: such a line is left to the caller."""

_CR: Final = 13
_LF: Final = 10
_SPACE: Final = 32
_ZERO: Final = 48
_NINE: Final = 57
_TAIL: Final = 7
"""``\\r\\nEND\\r\\n`` after each value."""


class HeaderScan:
    """Takes whole blocks of one queue's ``monitor`` reply into :attr:`lengths`, :attr:`stamps`
    (when ``stamped``: 0 for a line without one) and the caller's ``data``."""

    def __init__(self, prefix: bytes, stamped: bool) -> None:
        self.prefix = prefix
        """``VALUE <queue> 0 ``."""
        self.stamped = stamped
        self.lengths: list[int] = []
        self.stamps: list[int] = []
        self.used = 0
        """The bytes of ``data`` taken so far: values are written from there on, over what a
        reused buffer held before (:meth:`scan`), and the buffer grows only past its size."""
        self.stopped = MORE
        """Why the last :meth:`scan` stopped: :data:`MORE` or :data:`OTHER`."""
        self.wanted = 0
        """Stopped inside a value: the bytes from where it stopped that make the block whole
        (0: not known), so that a large item's pieces are not copied again at each arrival."""

    def scan(self, buf: bytes, pos: int, data: bytearray) -> int:
        """Take the blocks of this form from ``pos`` on, their values written into ``data``
        from :attr:`used` on; returns where it stopped (:attr:`stopped` says why). ``buf`` is
        ``bytes``: mypyc reads a byte of ``bytes`` in C, but a byte of a ``bytearray`` through
        a generic call."""
        prefix = self.prefix
        width = len(prefix)
        size = len(buf)
        stamped = self.stamped
        # typed as objects here, so that mypyc appends the boxes below as they are (as ints it
        # would unbox and box each again)
        lengths: list[object] = self.lengths  # type: ignore[assignment]
        stamps: list[object] = self.stamps  # type: ignore[assignment]
        used = self.used
        room = len(data)
        # A run of items tends to share its length (and, put in bulk, its enqueue
        # millisecond): the number appended is then the same object, boxed once.
        last_length = -1
        length_box: object = 0
        last_stamp = -1
        stamp_box: object = 0
        self.wanted = 0
        while True:
            if size - pos < width:
                self.stopped = OTHER
                break
            matched = True
            for k in range(width):
                if buf[pos + k] != prefix[k]:
                    matched = False
                    break
            if not matched:
                self.stopped = OTHER
                break
            at = pos + width
            length = 0
            digits = 0
            while at < size and _ZERO <= buf[at] <= _NINE:
                length = length * 10 + buf[at] - _ZERO
                at += 1
                digits += 1
            stamp = 0
            if stamped and at < size and buf[at] == _SPACE and digits:
                at += 1
                stamp_digits = 0
                while at < size and _ZERO <= buf[at] <= _NINE:
                    stamp = stamp * 10 + buf[at] - _ZERO
                    at += 1
                    stamp_digits += 1
                if not stamp_digits or stamp_digits > _MAX_DIGITS:
                    self.stopped = OTHER if at < size else MORE
                    break
            if at + 1 >= size:
                self.stopped = MORE
                break
            if not digits or digits > _MAX_DIGITS or buf[at] != _CR or buf[at + 1] != _LF:
                self.stopped = OTHER
                break
            start = at + 2
            end = start + length
            if end + _TAIL > size:
                self.stopped = MORE
                self.wanted = end + _TAIL - pos
                break
            if (buf[end] != _CR or buf[end + 1] != _LF or buf[end + 2] != 69  # E
                    or buf[end + 3] != 78 or buf[end + 4] != 68  # N, D
                    or buf[end + 5] != _CR or buf[end + 6] != _LF):
                self.stopped = OTHER
                break
            if length != last_length:
                last_length = length
                length_box = length
            lengths.append(length_box)
            if stamped:
                if stamp != last_stamp:
                    last_stamp = stamp
                    stamp_box = stamp
                stamps.append(stamp_box)
            if used + length <= room:  # over a reused buffer's old bytes: no growth, no fault
                data[used:used + length] = buf[start:end]
            else:
                data[used:] = buf[start:end]
                room = len(data)
            used += length
            pos = end + _TAIL
        self.used = used
        return pos
