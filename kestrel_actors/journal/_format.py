"""Kestrel's journal records (behaviour §6.2): opcodes, encoders, and a reader.

Every record is a 1-byte opcode followed by a fixed layout; all integers are little-endian and
signed. The encoders are pure functions returning ``bytes``, so a writer can batch many records
into one ``write()``. :class:`RecordReader` walks the records of a file descriptor or a bytes
object and never trusts a size field: a record that claims more bytes than remain is a torn
tail, not a reason to allocate gigabytes.

The reader reports how it stopped through :attr:`RecordReader.problem`:

* ``None`` — a clean end (the data ended exactly where an opcode would start);
* kind :data:`TORN` — the data ends inside a record: an append interrupted by a crash, the
  normal way a journal ends badly, or a damaged size that runs past the records after it
  (replay looks past the stop to tell the two apart: see :mod:`._repair`);
* kind :data:`CORRUPT` — bytes that cannot be a record: an unknown opcode, an add whose body is
  too short to hold its header, a negative size, or (given ``max_item_size``) an add whose
  data is longer than the largest item the queue allows (the caller logs an error). Such a
  size is never read into memory: a record claiming 2 GiB is damage, not an allocation.

Either way :attr:`RecordReader.position` is the offset just after the last whole record, which
is where Kestrel truncates the file (``lastValidPosition``).
"""

from __future__ import annotations

import os
import struct
import sys
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple, Protocol

from mypy_extensions import i64

from ..queue import Item
from ._files import open_regular

__all__ = [
    "ADD_OPS",
    "CORRUPT",
    "OP_ADD",
    "OP_ADDX",
    "OP_ADD_XID",
    "OP_CONFIRM_REMOVE",
    "OP_CONTINUE",
    "OP_NAMES",
    "OP_REMOVE",
    "OP_REMOVE_TENTATIVE",
    "OP_REMOVE_TENTATIVE_XID",
    "OP_SAVE_XID",
    "OP_UNREMOVE",
    "REMOVE_RECORD",
    "TORN",
    "AddRecords",
    "Problem",
    "Record",
    "RecordReader",
    "add_record_size",
    "chunks_length",
    "encode_add",
    "encode_add_xid",
    "encode_confirm_remove",
    "encode_continue",
    "encode_legacy_add",
    "encode_legacy_remove_tentative",
    "encode_remove",
    "encode_remove_tentative",
    "encode_save_xid",
    "encode_unremove",
    "encode_xid_records",
    "encode_xid_run",
    "le_i32",
    "le_i64",
    "le_u32",
    "read_file_records",
    "write_all",
    "xid_run",
]

OP_ADD: Final = 0
OP_REMOVE: Final = 1
OP_ADDX: Final = 2
OP_REMOVE_TENTATIVE: Final = 3
OP_SAVE_XID: Final = 4
OP_UNREMOVE: Final = 5
OP_CONFIRM_REMOVE: Final = 6
OP_ADD_XID: Final = 7
OP_CONTINUE: Final = 8
OP_REMOVE_TENTATIVE_XID: Final = 9

OP_NAMES = {
    OP_ADD: "ADD", OP_REMOVE: "REMOVE", OP_ADDX: "ADDX", OP_REMOVE_TENTATIVE: "REMOVE_TENTATIVE",
    OP_SAVE_XID: "SAVE_XID", OP_UNREMOVE: "UNREMOVE", OP_CONFIRM_REMOVE: "CONFIRM_REMOVE",
    OP_ADD_XID: "ADD_XID", OP_CONTINUE: "CONTINUE", OP_REMOVE_TENTATIVE_XID: "REMOVE_TENTATIVE_XID",
}

ADD_OPS = frozenset((OP_ADD, OP_ADDX, OP_ADD_XID))
"""Records replayed as a plain append at the tail (CONTINUE also appends, after closing an xid)."""

TORN = "torn"
CORRUPT = "corrupt"

_ADDX: Final = struct.Struct("<biqq")      # opcode, size (= len + 16), add time ms, expiry ms
_pack_addx: Final = _ADDX.pack  # bound once: ``_ADDX.pack(...)`` looks "pack" up on every ADD
_XID_ADDX = struct.Struct("<biiqq")  # opcode, xid, size, add time ms, expiry ms
_LEGACY_ADD: Final = struct.Struct("<bii")  # opcode, size (= len + 4), expiry s
_I32 = struct.Struct("<i")
_ITEM_HEAD = struct.Struct("<qq")
# bound once, as ``_pack_addx``: the records a read writes and reads per item
_unpack_i32: Final = _I32.unpack_from


def le_u32(buf: bytes, at: i64) -> i64:
    """The little-endian unsigned 32-bit integer at ``buf[at:at + 4]``, read byte by byte: native
    in the compiled build, where ``struct``'s ``unpack_from`` makes a tuple and an int object per
    field (read-behind's ADDX header, per item read back; ADR 0022)."""
    b0: i64 = buf[at]
    b1: i64 = buf[at + 1]
    b2: i64 = buf[at + 2]
    b3: i64 = buf[at + 3]
    return b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)


def le_i32(buf: bytes, at: i64) -> i64:
    """``struct``'s ``<i`` at ``buf[at]``, as :func:`le_u32`."""
    value = le_u32(buf, at)
    return value - 4294967296 if value >= 2147483648 else value


def le_i64(buf: bytes, at: i64) -> i64:
    """``struct``'s ``<q`` at ``buf[at]``, as :func:`le_u32` (the high half signed: no overflow)."""
    return le_i32(buf, at + 4) * 4294967296 + le_u32(buf, at)

REMOVE_RECORD: Final = b"\x01"


# -- encoders ------------------------------------------------------------------------------

def add_record_size(data_len: int) -> int:
    """Bytes of the ADDX record of an item of ``data_len`` bytes (21 + len)."""
    return 21 + data_len


def encode_add(item: Item) -> bytes:
    """ADDX (2): ``i32 len+16, i64 add_time ms, i64 expiry ms (0 = none), data``."""
    data = item.data
    return _add_header(len(data), item.add_time, item.expiry) + data


def _add_header(data_len: int, add_time: int, expiry: int) -> bytes:
    return _pack_addx(OP_ADDX, data_len + 16, add_time, expiry)


class AddRecords:
    """The ADDX headers of one journal's stream of ADDs, keeping the last one it packed.

    An ADDX header is the item's size, add time (ms) and expiry: a run of SETs of one size within
    a millisecond shares it, and comparing three numbers costs far less than packing them again.
    The header and the item's data are written as two buffers of one ``writev``
    (:meth:`JournalWriter.append_record`): gluing them first copied every item's data once more.
    """

    __slots__ = ("_size", "_add_time", "_expiry", "_header")

    def __init__(self) -> None:
        self._size = -1
        self._add_time = 0
        self._expiry = 0
        self._header = b""

    def header(self, item: Item) -> bytes:
        """The ADDX header of ``item``: :func:`encode_add` is this and then ``item.data``."""
        size = len(item.data)
        add_time = item.add_time
        expiry = item.expiry
        if size != self._size or add_time != self._add_time or expiry != self._expiry:
            self._header = _add_header(size, add_time, expiry)
            self._size = size
            self._add_time = add_time
            self._expiry = expiry
        return self._header


def encode_add_xid(xid: int, item: Item) -> bytes:
    """ADD_XID (7), read-only in Kestrel 2.4: ``i32 xid`` then the ADDX body."""
    data = item.data
    return _XID_ADDX.pack(OP_ADD_XID, xid, len(data) + 16, item.add_time, item.expiry) + data


def encode_continue(xid: int, item: Item) -> bytes:
    """CONTINUE (8): confirm ``xid`` and append ``item``, in one record."""
    data = item.data
    return _XID_ADDX.pack(OP_CONTINUE, xid, len(data) + 16, item.add_time, item.expiry) + data


def encode_legacy_add(data: bytes, expiry_s: int = 0) -> bytes:
    """Legacy ADD (0): ``i32 len+4, i32 expiry in epoch seconds (0 = none), data``."""
    return _LEGACY_ADD.pack(OP_ADD, len(data) + 4, expiry_s) + data


def encode_remove() -> bytes:
    return REMOVE_RECORD


def encode_legacy_remove_tentative() -> bytes:
    """Legacy REMOVE_TENTATIVE (3): no xid; replay gives it the next free xid."""
    return b"\x03"


def _xid_record(op: int, xid: int) -> bytes:
    """``<bi``: the opcode, then the xid (signed 32-bit little-endian), as one 40-bit integer's
    bytes: compiled, ``int.to_bytes`` is a native call that boxes one integer, where
    ``_XID.pack`` was a generic call boxing each argument (two records per item a ``monitor``
    opens and a ``confirm`` takes)."""
    return (xid << 8 | op).to_bytes(5, "little", signed=True)


_SWAP_XIDS: Final = sys.byteorder != "little"
"""An ``array('I')`` holds its ints in the machine's order; the journal's are little-endian."""


def encode_xid_records(op: int, xids: list[int]) -> bytes:
    """The records of one xid opcode (REMOVE_TENTATIVE_XID, CONFIRM_REMOVE, ...) for each of
    ``xids``, in order: byte for byte ``b"".join(_xid_record(op, xid) for xid in xids)``.

    Made in one pass of C loops, whatever the count: the xids packed as 32-bit ints by an
    ``array``, then each of their four byte lanes and the opcode laid every fifth byte by
    slice assignment. A ``monitor`` opens thousands of items at once and a ``confirm`` confirms
    them: a record each cost ~430 instructions through ``int.to_bytes`` (ADR 0022). The array
    is unsigned (``'I'``): it converts each int directly, where ``'i'`` parses each through
    ``PyArg_Parse`` (~190 instructions); the server's xids are positive (behaviour §6.3), and
    a negative one (an old file's) takes the record-by-record way."""
    count = len(xids)
    if count == 1:
        return _xid_record(op, xids[0])
    # ``fromlist`` reads the list's slots in place; the constructor took each item through
    # ``PySequence_GetItem`` (a reference taken and dropped: ~90 instructions per xid)
    lanes = array("I")
    try:
        lanes.fromlist(xids)
    except OverflowError:
        return b"".join([_xid_record(op, xid) for xid in xids])
    if _SWAP_XIDS:
        lanes.byteswap()
    packed = lanes.tobytes()
    out = bytearray(5 * count)
    out[0::5] = bytes((op,)) * count
    out[1::5] = packed[0::4]
    out[2::5] = packed[1::4]
    out[3::5] = packed[2::4]
    out[4::5] = packed[3::4]
    return bytes(out)


_HALVES: Final = array("H", range(65536))
if _SWAP_XIDS:
    _HALVES.byteswap()
_LOW_HALVES: Final = _HALVES.tobytes()
"""Every 16-bit value in order, little-endian: the low halves of a run of xids are a slice of it."""


def encode_xid_run(op: int, first: int, count: int) -> bytes:
    """:func:`encode_xid_records` of the ``count`` xids from ``first`` on, byte for byte.

    A run of consecutive xids (a ``monitor`` step's opens, their ``confirm``) needs no xid
    converted: their low halves are a slice of :data:`_LOW_HALVES`, their high half is the
    same for up to 65,536 of them, and each byte lane is laid by one slice assignment."""
    if count <= 0:
        return b""
    if first <= 0 or first + count - 1 > 0x7FFFFFFF:
        return encode_xid_records(op, list(range(first, first + count)))
    out = bytearray(5 * count)
    out[0::5] = bytes((op,)) * count
    done = 0
    while done < count:
        value = first + done
        low = value & 0xFFFF
        piece = min(count - done, 0x10000 - low)
        halves = _LOW_HALVES[2 * low:2 * (low + piece)]
        high = value >> 16
        at = 5 * done
        end = at + 5 * piece
        out[at + 1:end:5] = halves[0::2]
        out[at + 2:end:5] = halves[1::2]
        out[at + 3:end:5] = bytes((high & 0xFF,)) * piece
        out[at + 4:end:5] = bytes((high >> 8,)) * piece
        done += piece
    return bytes(out)


def encode_save_xid(xid: int) -> bytes:
    return _xid_record(OP_SAVE_XID, xid)


def encode_unremove(xid: int) -> bytes:
    return _xid_record(OP_UNREMOVE, xid)


def encode_confirm_remove(xid: int) -> bytes:
    return _xid_record(OP_CONFIRM_REMOVE, xid)


def encode_remove_tentative(xid: int) -> bytes:
    """REMOVE_TENTATIVE_XID (9), what 2.4 writes for every transactional remove."""
    return _xid_record(OP_REMOVE_TENTATIVE_XID, xid)


# -- reading -------------------------------------------------------------------------------

_XID_OPS: Final = bytes((OP_REMOVE_TENTATIVE_XID, OP_CONFIRM_REMOVE))
_LOOK_AHEAD: Final = 4
"""Records after the first that :func:`xid_run` checks one by one before it takes slices: a
lone record among adds (a GET's open) costs no slice."""


def xid_run(buf: bytes, i: int, avail: int) -> int:
    """How many records from ``buf[i]`` on (a REMOVE_TENTATIVE_XID or CONFIRM_REMOVE) are
    REMOVE_TENTATIVE_XID or CONFIRM_REMOVE records, all whole within ``avail`` bytes.

    Past a few, their opcodes (every fifth byte) are taken as slices of a growing length and
    stripped of the two opcodes, in C: a ``monitor``'s or a ``confirm``'s run of thousands is a
    few calls, not a step of the reader each."""
    whole = avail // 5
    done = 1
    ahead = min(whole, 1 + _LOOK_AHEAD)
    while done < ahead:
        op = buf[i + 5 * done]
        if op != OP_REMOVE_TENTATIVE_XID and op != OP_CONFIRM_REMOVE:
            return done
        done += 1
    window = 16
    while done < whole:
        count = min(window, whole - done)
        at = i + 5 * done
        ops = buf[at:at + 5 * count:5]
        run = count - len(ops.lstrip(_XID_OPS))
        done += run
        if run < count:
            break
        window = min(4 * window, 4096)
    return done


class Problem(NamedTuple):
    """Why a reader stopped before the end: ``kind`` is TORN or CORRUPT; ``offset`` is where
    the broken record starts (= the last valid position)."""

    kind: str
    offset: int
    message: str


class Record:
    """One decoded record: ``op``, its ``offset`` and ``size`` in bytes, ``xid`` (0 if none)
    and ``item`` (for the add records and CONTINUE, else ``None``)."""

    __slots__ = ("op", "offset", "size", "xid", "item")

    def __init__(self, op: int, offset: int, size: int, xid: int = 0, item: Item | None = None) -> None:
        self.op = op
        self.offset = offset
        self.size = size
        self.xid = xid
        self.item = item

    def __repr__(self) -> str:
        name = OP_NAMES.get(self.op, str(self.op))
        return f"Record({name}, offset={self.offset}, size={self.size}, xid={self.xid}, item={self.item!r})"


Source = int | bytes | bytearray | memoryview
ReadFn = Callable[[int, int, int], bytes]
"""``read(fd, length, offset) -> bytes``, ``os.pread`` by default (a journal may pass one
that runs on gevent's threadpool)."""


class AheadRead(Protocol):
    """A read started before it is needed (:data:`ReadAheadFn`)."""

    def result(self) -> bytes | None:
        """The bytes read, waiting for them if need be; ``None`` if the read failed or cannot
        be waited for here (the reader then reads for itself). Asked again, the same bytes."""


ReadAheadFn = Callable[[int, int, int], "AheadRead | None"]
"""``read_ahead(fd, length, offset)``: start reading ``length`` bytes at ``offset`` in the
background (read-behind: on gevent's threadpool), or ``None`` if it cannot."""

CHUNK_SIZE = 512 * 1024
"""Bytes a reader reads at a time: under the server's fixed ``MMAP_THRESHOLD`` (``_malloc``), so
each chunk reuses heap memory. At 1 MiB every chunk was a fresh mapping, faulted in page by page
and unmapped again: about a quarter of a page fault per 1 KiB item read behind."""
BRIDGE_SIZE = 4096
"""Bytes of a chunk read ahead that go with the end of the chunk before it into one small buffer,
when a record lies across the two: the rest of the chunk is then read where it lies."""
NO_LIMIT = (1 << 62) - 1
"""No item is this long: a reader given no ``max_item_size`` stops only at the end. The largest
int the compiled build holds unboxed: ``1 << 62`` made every comparison with it a boxed one."""


class RecordReader:
    """Iterate the records of ``source`` from ``start`` up to ``end``.

    ``source`` is an open file descriptor (read with ``pread``, so the descriptor's own offset
    is untouched) or a bytes-like object. ``end`` defaults to the file size at construction
    (or the length of the bytes); a caller following a growing file may move it forward with
    :meth:`set_end` between records. ``now_ms`` is the add time given to legacy ADD records.
    ``max_item_size``: an add record whose data is longer is CORRUPT (``None``: no limit but
    the end).
    """

    def __init__(self, source: Source, start: int = 0, end: int | None = None, *,
                 now_ms: int | None = None, read: ReadFn | None = None,
                 chunk_size: int = CHUNK_SIZE, max_item_size: int | None = None,
                 read_ahead: ReadAheadFn | None = None) -> None:
        if isinstance(source, int):
            self._fd: int | None = source
            self._buf: bytes = b""
            self._buf_start = start
            if end is None:
                end = os.fstat(source).st_size
        else:
            self._fd = None
            self._buf = source if isinstance(source, bytes) else bytes(source)
            self._buf_start = 0
            if end is None:
                end = len(self._buf)
        self._i = start - self._buf_start
        self._end = end
        self._read = read or os.pread
        self._chunk = chunk_size
        self._now_ms = now_ms
        self._max_item: int = NO_LIMIT if max_item_size is None else min(max_item_size, NO_LIMIT)
        self.position = start
        """Offset just after the last whole record read."""
        self.problem: Problem | None = None
        self.records = 0
        self._read_ahead = read_ahead
        self._ahead: AheadRead | None = None
        """The chunk after the buffer, being read since the buffer was (``read_ahead``)."""
        self._ahead_at = 0
        """Where :attr:`_ahead` starts in the file: where the buffer read with it ended."""

    @property
    def end(self) -> int:
        return self._end

    def set_end(self, end: int) -> None:
        """Move the end forward (a growing file); clears a TORN problem found at the old end."""
        self._end = end
        if self.problem is not None and self.problem.kind == TORN:
            self.problem = None

    def __iter__(self) -> Iterator[Record]:
        while True:
            record = self.next()
            if record is None:
                return
            yield record

    def _have(self, n: int) -> bool:
        """Make ``n`` bytes available at the cursor; False if fewer than ``n`` remain before end."""
        i = self._i
        if min(len(self._buf), self._end - self._buf_start) - i >= n:
            return True
        offset = self._buf_start + i
        if self._end - offset < n or self._fd is None:
            return False
        if self._ahead is not None and self._take_ahead(offset, n):
            return True
        self._ahead = None
        want = max(n, min(self._chunk, self._end - offset))
        # the unread rest of the buffer is read again with the next chunk (the file does not
        # change before ``end``): joining the two copied the whole chunk once more
        self._buf = self._read(self._fd, want, offset)
        self._buf_start = offset
        self._i = 0
        if len(self._buf) == want:
            self._start_ahead()
        return len(self._buf) >= n

    def _start_ahead(self) -> None:
        """With ``read_ahead``, start reading the chunk after the buffer (up to what ``end``
        says now), so that it is there when the buffer's records have been read."""
        read_ahead = self._read_ahead
        if read_ahead is None or self._fd is None:
            return
        at = self._buf_start + len(self._buf)
        length = min(self._chunk, self._end - at)
        if length > 0:
            self._ahead = read_ahead(self._fd, length, at)
            self._ahead_at = at

    def _take_ahead(self, offset: int, n: int) -> bool:
        """Make ``n`` bytes at ``offset`` available from the chunk read ahead, if it holds them:
        it becomes the buffer (the next is started), or, for a record that begins in the
        buffer and ends in it, a small buffer joins the two (:data:`BRIDGE_SIZE`) and the
        chunk waits for the records after it."""
        ahead = self._ahead
        assert ahead is not None
        data = ahead.result()
        at = self._ahead_at
        if data is None or offset + n > at + len(data):
            return False
        if offset >= at:
            self._ahead = None
            self._buf = data
            self._buf_start = at
            self._i = offset - at
            self._start_ahead()
            return True
        buf_start = self._buf_start
        if buf_start + len(self._buf) < at:
            return False  # the buffer does not reach the chunk (not the one it was read after)
        self._buf = self._buf[offset - buf_start:at - buf_start] + data[:max(offset + n - at, BRIDGE_SIZE)]
        self._buf_start = offset
        self._i = 0
        return True

    def _fail(self, kind: str, message: str) -> None:
        self.problem = Problem(kind, self.position, message)

    def next(self) -> Record | None:
        """The next record, or ``None`` at the end (see :attr:`problem` for why it stopped)."""
        if self.problem is not None:
            return None
        start = self.position
        end = self._end
        if start >= end:
            return None
        # Fast paths for the records 2.4 writes, when the whole record is in the buffer.
        buf = self._buf
        i = self._i
        avail = min(len(buf), end - self._buf_start) - i
        if avail < 21 and avail < end - start:
            self._have(min(21, end - start))
            buf, i = self._buf, self._i
            avail = min(len(buf), end - self._buf_start) - i
            if avail <= 0:
                return None  # the file is shorter than ``end`` said
        op = buf[i]
        if op == OP_ADDX and avail >= 21:
            item = self._take_addx(buf, i, avail, start)
            if item is not None:
                return Record(OP_ADDX, start, self.position - start, 0, item)
        elif op == OP_REMOVE:
            self._i = i + 1
            self.position = start + 1
            self.records += 1
            return Record(OP_REMOVE, start, 1)
        elif op == OP_REMOVE_TENTATIVE_XID and avail >= 5:
            self._i = i + 5
            self.position = start + 5
            self.records += 1
            return Record(op, start, 5, _unpack_i32(buf, i + 1)[0])
        return self._next_slow(op, start)

    def next_item(self) -> Item | None:
        """The item of the next add record (an add, or CONTINUE), the records before it
        skipped; ``None`` at the end, as :meth:`next`. Read-behind's read: an ADDX whose bytes
        are in the buffer, and a REMOVE, REMOVE_TENTATIVE_XID or CONFIRM_REMOVE before it, make
        no :class:`Record`."""
        while True:
            start = self.position
            end = self._end
            if self.problem is not None or start >= end:
                return None
            buf = self._buf
            i = self._i
            avail = min(len(buf), end - self._buf_start) - i
            if avail >= 21:
                op = buf[i]
                if op == OP_ADDX:
                    item = self._take_addx(buf, i, avail, start)
                    if item is not None:
                        return item
                elif op == OP_REMOVE:
                    self._i = i + 1
                    self.position = start + 1
                    self.records += 1
                    continue
                elif op in (OP_REMOVE_TENTATIVE_XID, OP_CONFIRM_REMOVE):
                    # a monitor's and a confirm's records lie after the backlog's adds in
                    # the file being written, thousands in a row: read past as a run, with
                    # no Record (5 bytes each, no check due)
                    run = xid_run(buf, i, avail)
                    self._i = i + 5 * run
                    self.position = start + 5 * run
                    self.records += run
                    continue
            record = self.next()
            if record is None:
                return None
            if record.item is not None:
                return record.item

    def _take_addx(self, buf: bytes, i: int, avail: int, start: int) -> Item | None:
        """The item of the ADDX record at ``buf[i]`` (``start`` in the file), the reader moved
        past it; ``None`` (and nothing moved) unless its header is sane and its whole record is
        among the ``avail`` bytes (:meth:`_next_slow` then reads or judges it)."""
        # typed: the compiled build reads the three natively (``<iqq``) and works on native
        # ints (the slice below, the checks); untyped, each sum and comparison was a boxed call
        # (3,700 instructions per item read behind)
        size: int = le_i32(buf, i + 1)
        add_time: int = le_i64(buf, i + 5)
        expiry: int = le_i64(buf, i + 13)
        total = 5 + size
        if size < 16 or total > avail or size - 16 > self._max_item:
            return None
        self._i = i + total
        self.position = start + total
        self.records += 1
        return Item(buf[i + 21:i + total], add_time, expiry)

    def _next_slow(self, op: int, start: int) -> Record | None:
        buf = self._buf
        i = self._i
        if op in (OP_REMOVE, OP_REMOVE_TENTATIVE):
            self._i = i + 1
            self.position = start + 1
            self.records += 1
            return Record(op, start, 1)
        if op in (OP_SAVE_XID, OP_UNREMOVE, OP_CONFIRM_REMOVE, OP_REMOVE_TENTATIVE_XID):
            if not self._have(5):
                self._fail(TORN, f"end of data inside a {OP_NAMES[op]} record")
                return None
            buf, i = self._buf, self._i
            (xid,) = _unpack_i32(buf, i + 1)
            self._i = i + 5
            self.position = start + 5
            self.records += 1
            return Record(op, start, 5, xid)
        if op in (OP_ADDX, OP_ADD, OP_ADD_XID, OP_CONTINUE):
            head = 9 if op in (OP_ADD_XID, OP_CONTINUE) else 5
            if not self._have(head):
                self._fail(TORN, f"end of data inside the header of a {OP_NAMES[op]} record")
                return None
            buf, i = self._buf, self._i
            xid = _unpack_i32(buf, i + 1)[0] if head == 9 else 0
            (size,) = _unpack_i32(buf, i + head - 4)
            minimum = 4 if op == OP_ADD else 16
            if size < 0:
                self._fail(CORRUPT, f"negative size {size} in a {OP_NAMES[op]} record")
                return None
            if size < minimum:
                self._fail(CORRUPT, f"{OP_NAMES[op]} body of {size} bytes is shorter than {minimum}")
                return None
            if size - minimum > self._max_item:
                self._fail(CORRUPT, f"a {OP_NAMES[op]} record claims {size - minimum} bytes of data, more "
                                    f"than the largest item allowed ({self._max_item})")
                return None
            total = head + size
            if not self._have(total):
                self._fail(TORN, f"end of data inside a {OP_NAMES[op]} record of {total} bytes")
                return None
            buf, i = self._buf, self._i
            body = i + head
            if op == OP_ADD:
                (expiry_s,) = _unpack_i32(buf, body)
                add_time = self._now_ms if self._now_ms is not None else int(time.time() * 1000)
                item = Item(bytes(buf[body + 4:i + total]), add_time, expiry_s * 1000)
            else:
                add_time, expiry = _ITEM_HEAD.unpack_from(buf, body)
                item = Item(bytes(buf[body + 16:i + total]), add_time, expiry)
            self._i = i + total
            self.position = start + total
            self.records += 1
            return Record(op, start, total, xid, item)
        self._fail(CORRUPT, f"invalid opcode {op} at offset {start}")
        return None


def read_file_records(path: str, now_ms: int | None = None,
                      max_item_size: int | None = None) -> tuple[list[Record], RecordReader]:
    """All records of the file at ``path`` and the reader (for ``position`` and ``problem``)."""
    fd = open_regular(path)
    try:
        reader = RecordReader(fd, now_ms=now_ms, max_item_size=max_item_size)
        return list(reader), reader
    finally:
        os.close(fd)


IOV_MAX: Final = 1024
"""Buffers one ``writev`` may take (Linux's ``IOV_MAX``)."""
_writev: Final = os.writev
_write: Final = os.write


def chunks_length(chunks: list[bytes]) -> int:
    # a compiled loop: ``sum(map(len, ...))`` looks up two builtins by name on every write
    total = 0
    for chunk in chunks:
        total += len(chunk)
    return total


def write_all(fd: int, chunks: list[bytes], size: int) -> None:
    """Write every chunk, in order, with as few system calls as possible. ``size``: their bytes in
    all (the caller counted them)."""
    count = len(chunks)
    for start in range(0, count, IOV_MAX):
        if count <= IOV_MAX:
            group = chunks
            total = size
        else:
            group = chunks[start:start + IOV_MAX]
            total = chunks_length(group)
        # one chunk (a lone GET's REMOVE; an ADD is two): ``write`` allocates no iovec and
        # buffer arrays, as ``writev`` does for each call (issue 24)
        done = _write(fd, group[0]) if count == 1 else _writev(fd, group)
        if done < total:  # a short write: finish the rest one buffer at a time
            rest = memoryview(b"".join(group))[done:]
            while rest:
                rest = rest[os.write(fd, rest):]
