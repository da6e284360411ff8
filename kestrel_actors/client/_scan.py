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
in C, of a ``bytearray`` only through a generic call). Each value is sliced out of them as a
``bytes`` and packed into the values' buffer at its offset by a ``Struct`` (:meth:`HeaderScan.put`):
a ``bytearray``'s own slice assignment would copy the value once more first, and a view's costs
more objects than the slice (ADR 0022).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable
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
_LENGTH: Final = struct.Struct("<I")
_STAMP: Final = struct.Struct("<Q")
"""A value's length and enqueue time as the packed record keeps them (``PackedValues``): a
stamp is never negative, so unsigned is the same bytes."""


class HeaderScan:
    """One queue's ``monitor`` reply as it is taken: each value's length and its stamp (when
    ``stamped``: 0 for a line without one) through :meth:`add`, packed by
    :meth:`packed_lengths` and :meth:`packed_stamps`, its bytes back to back in ``data`` from
    its start, over what a reused buffer held before; the buffer grows only past its size.
    :meth:`scan` takes whole blocks of Kestrel's own form; the caller takes any other block
    with :meth:`add` and :meth:`put`.

    Lengths and stamps are kept as runs (a value, how many times in a row), not one number
    per item: a run of items tends to share its length and, put in bulk, its enqueue
    millisecond, and a run costs no Python object per item, nor a conversion per item when
    packed (ADR 0022)."""

    def __init__(self, prefix: bytes, stamped: bool, data: bytearray) -> None:
        self.prefix = prefix
        """``VALUE <queue> 0 ``."""
        self.stamped = stamped
        self.data = data
        self.count: i64 = 0
        """The values taken so far."""
        # each run's number and how many times in a row, those before the current one
        self._lengths: list[int] = []
        self._length_counts: list[int] = []
        self._stamps: list[int] = []
        self._stamp_counts: list[int] = []
        self._length: i64 = -1
        self._length_count: i64 = 0
        self._stamp: i64 = -1
        self._stamp_count: i64 = 0
        self.used: i64 = 0
        """The bytes of ``data`` taken so far."""
        self.stopped = MORE
        """Why the last :meth:`scan` stopped: :data:`MORE` or :data:`OTHER`."""
        self.wanted: i64 = 0
        """Stopped inside a value: the bytes from where it stopped that make the block whole
        (0: not known), so that the caller keeps them until they have come."""
        self._room: i64 = len(data)
        """The length of ``data``: a value and its copy's padding are written inside it."""
        # the copy of values in the current size class (lengths in ``(size / 2, size]``)
        self._copy_size: i64 = 0
        self._copy: Callable[[bytearray, int, bytes], None] = _copier(0)

    def add(self, length: i64, stamp: i64) -> None:
        """One more value's length and stamp (``stamp`` ignored unless ``stamped``)."""
        self.count += 1
        if length == self._length:
            self._length_count += 1
        else:
            if self._length_count:
                self._lengths.append(self._length)
                self._length_counts.append(self._length_count)
            self._length = length
            self._length_count = 1
        if self.stamped:
            if stamp == self._stamp:
                self._stamp_count += 1
            else:
                if self._stamp_count:
                    self._stamps.append(self._stamp)
                    self._stamp_counts.append(self._stamp_count)
                self._stamp = stamp
                self._stamp_count = 1

    def packed_lengths(self) -> bytes:
        """The lengths taken, uint32 little-endian each."""
        return _packed("I", _LENGTH, self._lengths, self._length_counts, self._length,
                       self._length_count, self.count)

    def packed_stamps(self) -> bytes:
        """The stamps taken, uint64 little-endian each."""
        return _packed("Q", _STAMP, self._stamps, self._stamp_counts, self._stamp,
                       self._stamp_count, self.count)

    def put(self, buf: bytes, start: i64, end: i64) -> None:
        """Write ``buf[start:end]`` after the values taken so far: a ``bytes`` slice (made in
        C from ``i64`` bounds: no number boxed but the offset) packed into ``data`` by a
        ``Struct`` of the value's size class, which pads it with zeros up to the class's size
        (the next value writes over them). A view of ``buf``'s slice assigned to a view of
        ``data`` cost a view object, two slice objects and two bounds boxed more (ADR 0022)."""
        length = end - start
        size = self._copy_size
        if length > size or length << 1 < size:
            size = 16
            while size < length:
                size <<= 1
            self._copy = _copier(size)
            self._copy_size = size
        if self.used + size > self._room:
            self._grow(self.used + size)
        self._copy(self.data, self.used, buf[start:end])
        self.used += length

    def _grow(self, size: i64) -> None:
        """``data`` made at least ``size`` bytes long, grown by an eighth at least, as a
        ``bytearray`` grows its room (a fresh one grows some 70 times in 10 MiB, a batch's
        buffers fill pages at most an eighth past their items)."""
        data = self.data
        have: i64 = len(data)
        data += bytes(max(size, have + (have >> 3) + 4096) - have)
        self._room = len(data)

    def scan(self, buf: bytes, pos: i64) -> i64:
        """Take the blocks of this form from ``pos`` on; returns where it stopped
        (:attr:`stopped` says why)."""
        prefix = self.prefix
        width: i64 = len(prefix)
        size: i64 = len(buf)
        stamped = self.stamped
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
            self.add(length, stamp)
            self.put(buf, start, end)
            pos = end + _TAIL
        return pos


_COPIERS: Final[dict[int, Callable[[bytearray, int, bytes], None]]] = {}


def _copier(size: i64) -> Callable[[bytearray, int, bytes], None]:
    """``Struct("<size>s").pack_into``: writes a ``bytes`` at an offset of a buffer, padded
    with zeros to ``size`` bytes (one per size class, a power of two: a few dozen at most)."""
    copy = _COPIERS.get(size)
    if copy is None:
        copy = _COPIERS[size] = struct.Struct(f"{size}s").pack_into
    return copy


def _packed(code: str, form: struct.Struct, numbers: list[int], counts: list[int], last: i64,
            last_count: i64, total: i64) -> bytes:
    """The runs (``numbers[k]`` ``counts[k]`` times in a row, then ``last`` ``last_count``
    times) packed, ``total`` numbers in all. Where no number repeats (items of every size, or
    enqueued slowly) they are converted in one pass, as one list of them would be."""
    if len(numbers) + 1 >= total:
        every = array(code, numbers)
        if last_count:
            every.extend(array(code, [last]) * last_count)
        if sys.byteorder != "little":
            every.byteswap()
        return every.tobytes()
    packed = [form.pack(number) * count for number, count in zip(numbers, counts, strict=True)]
    if last_count:
        packed.append(form.pack(last) * last_count)
    return b"".join(packed)
