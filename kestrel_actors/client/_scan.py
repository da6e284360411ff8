"""The per-item step of a ``monitor`` reply's scan, compiled (ADR 0015, ADR 0022 point 3).

A Spark source's planner takes 50,000 ``VALUE`` blocks a micro-batch. In Python each cost a
regular-expression match, two conversions and three appends (~1.5 µs); here the header's
digits are read byte by byte into machine integers, with no Python object but a length or
stamp boxed once for a run of items sharing it. Only Kestrel's own form is taken — ``VALUE
<queue> 0 <length>[ <stamp>]\\r\\n``, the value, ``\\r\\nEND\\r\\n`` — and anything else (the final
``END``, an error, a value not followed by ``END``) is left to
:class:`~kestrel_actors.client._wire.ValueScan`, which maps it as for one value. Interpreted (a
pure install) this loop is slower than the regular expression, so ``ValueScan`` uses it only
when it is compiled (:data:`COMPILED`); what it takes is kept here either way.

The scan reads the ``bytes`` a ``recv`` returned where they lie (mypyc reads a byte of ``bytes``
in C, of a ``bytearray`` only through a generic call), and each value is copied once, from a
view of them into a view of the values' buffer (:meth:`HeaderScan.put`): a ``bytearray``'s
slice assignment would first copy a value that is not itself a ``bytearray``.
"""

from __future__ import annotations

from typing import Final

from mypy_extensions import i64

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
    """One queue's ``monitor`` reply as it is taken: each value's length in :attr:`lengths`,
    its stamp in :attr:`stamps` (when ``stamped``: 0 for a line without one), its bytes
    back to back in ``data`` from its start, over what a reused buffer held before; the
    buffer grows only past its size. :meth:`scan` takes whole blocks of Kestrel's own form;
    the caller takes any other block with :meth:`put` and the two appends."""

    def __init__(self, prefix: bytes, stamped: bool, data: bytearray) -> None:
        self.prefix = prefix
        """``VALUE <queue> 0 ``."""
        self.stamped = stamped
        self.data = data
        self.lengths: list[int] = []
        self.stamps: list[int] = []
        self.used: i64 = 0
        """The bytes of ``data`` taken so far."""
        self.stopped = MORE
        """Why the last :meth:`scan` stopped: :data:`MORE` or :data:`OTHER`."""
        self.wanted: i64 = 0
        """Stopped inside a value: the bytes from where it stopped that make the block whole
        (0: not known), so that the caller keeps them until they have come."""
        self._out: memoryview | None = None

    def put(self, source: memoryview, start: i64, end: i64) -> None:
        """Write ``source[start:end]`` after the values taken so far (one copy)."""
        used = self.used
        stop = used + end - start
        out = self._out
        if out is None or stop > len(out):
            out = self._writable(stop)
        out[used:stop] = source[start:end]
        self.used = stop

    def _writable(self, size: i64) -> memoryview:
        """A view of ``data`` to write into, of at least ``size`` bytes. While it lives the
        buffer cannot be resized, so it is made anew past the buffer's end (the buffer grown
        by an eighth at least, as a ``bytearray`` grows its room: a fresh one grows some 70
        times in 10 MiB, a batch's buffers fill pages at most an eighth past their items)."""
        self.release()
        data = self.data
        have: i64 = len(data)
        if size > have:
            data += bytes(max(size, have + (have >> 3) + 4096) - have)
        out = memoryview(data)
        self._out = out
        return out

    def release(self) -> None:
        """End the writing view (after each received piece): a buffer a view holds cannot be
        resized, which is how the planner's pool tells a buffer still in use."""
        out = self._out
        if out is not None:
            self._out = None
            out.release()

    def scan(self, buf: bytes, pos: i64, source: memoryview) -> i64:
        """Take the blocks of this form from ``pos`` on (``source`` is a view of ``buf``,
        which the values are copied from); returns where it stopped (:attr:`stopped` says
        why)."""
        prefix = self.prefix
        width: i64 = len(prefix)
        size: i64 = len(buf)
        stamped = self.stamped
        # typed as objects here, so that mypyc appends the boxes below as they are (as ints it
        # would unbox and box each again)
        lengths: list[object] = self.lengths  # type: ignore[assignment]
        stamps: list[object] = self.stamps  # type: ignore[assignment]
        # A run of items tends to share its length (and, put in bulk, its enqueue
        # millisecond): the number appended is then the same object, boxed once.
        last_length: i64 = -1
        length_box: object = 0
        last_stamp: i64 = -1
        stamp_box: object = 0
        self.wanted = 0
        while True:
            if size - pos < width:
                self.stopped = OTHER
                break
            matched = True
            k: i64 = 0
            while k < width:
                if buf[pos + k] != prefix[k]:
                    matched = False
                    break
                k += 1
            if not matched:
                self.stopped = OTHER
                break
            at: i64 = pos + width
            length: i64 = 0
            digits: i64 = 0
            while at < size:
                c: i64 = buf[at]
                if c < _ZERO or c > _NINE or digits > _MAX_DIGITS:
                    break
                length = length * 10 + c - _ZERO
                at += 1
                digits += 1
            stamp: i64 = 0
            if stamped and at < size and buf[at] == _SPACE and digits:
                at += 1
                stamp_digits: i64 = 0
                while at < size:
                    c = buf[at]
                    if c < _ZERO or c > _NINE or stamp_digits > _MAX_DIGITS:
                        break
                    stamp = stamp * 10 + c - _ZERO
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
            self.put(source, start, end)
            pos = end + _TAIL
        return pos
