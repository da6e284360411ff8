"""The ``kestrel`` source's write-ahead log: one file per planned micro-batch.

Kestrel items carry no id that survives a re-delivery, so a batch cannot be read again from
the queue after a restart. Instead the planner writes each batch it plans to
``<walLocation>/batch-<seq>.wal`` (durably and whole: in a directory a temporary file,
``fsync``, ``rename``, ``fsync`` of the directory; in an object store one PUT of the whole
object, :mod:`._walstore`) *before* confirming its items on the servers; a restarted query
re-reads a planned batch from that file, with the same rows (timestamps included). See
docs/adr/0013-spark-exactly-once.md.

A file holds::

    b"KWAL1\\n" + header JSON + b"\\n" + item lengths (uint32 little-endian) + item bytes
    + item enqueue times (epoch ms, int64 little-endian: the ``timestamp`` column)
    + crc32 of everything before it (uint32 little-endian)

The header names the batch's parts: per part the queue, the server, its item count and when
the items were read (``read_at``, seconds since the epoch: the enqueue time of an item whose
server gave none), and ``"stamps": true``. A file written before the enqueue times were kept
(no ``stamps`` in its header) is rewritten with its read times as the items' times when it is
read. A file whose checksum does not match is refused (a torn file is never published, so that
means the storage lost data).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby

from .._crc import crc32
from ..client import PackedValues
from ._walstore import Staged, WalLocation, WalStore, open_store

__all__ = ["BatchPart", "Prepared", "SlicedItems", "WalCorrupt", "WalFile", "WalSlice",
           "WriteAheadLog", "crc32_combine", "read_slice"]


_MAGIC = b"KWAL1\n"
_NAME = re.compile(r"^batch-(\d{12})\.wal$")
_CRC = struct.Struct("<I")


_CRC_POLYNOMIAL = 0xEDB88320  # CRC-32's, bit-reflected, as zlib.crc32 computes it


def _multiply_mod_p(a: int, b: int) -> int:
    """a(x) * b(x) modulo CRC-32's polynomial (bit-reflected: x^0 is the top bit)."""
    top, product = 1 << 31, 0
    while True:
        if a & top:
            product ^= b
            if not a & (top - 1):
                return product
        top >>= 1
        b = (b >> 1) ^ _CRC_POLYNOMIAL if b & 1 else b >> 1


# x^(2^k) modulo the polynomial, for k = 0..31
_X_POWERS = [1 << 30]
for _ in range(31):
    _X_POWERS.append(_multiply_mod_p(_X_POWERS[-1], _X_POWERS[-1]))


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """``zlib.crc32(a + b)`` from ``crc1 = zlib.crc32(a)``, ``crc2 = zlib.crc32(b)`` and
    ``length2 = len(b)`` without reading the bytes again (zlib's ``crc32_combine``, which
    Python's zlib does not offer): a few hundred integer operations, so a batch's file and
    its slices are checksummed in one pass over the items."""
    shift, k, bits = 1 << 31, 3, length2  # x^(8 * length2): 2^3 bits per byte
    while bits:
        if bits & 1:
            shift = _multiply_mod_p(_X_POWERS[k & 31], shift)
        bits >>= 1
        k += 1
    return _multiply_mod_p(shift, crc1) ^ crc2


class WalCorrupt(RuntimeError):
    """A write-ahead file that cannot be read back as written."""


@dataclass(frozen=True)
class BatchPart:
    """Items of one batch read from one queue of one server at one moment."""

    server: str
    read_at: float  # seconds since the epoch when the items were read
    items: PackedValues
    queue: str

    @property
    def stamped(self) -> PackedValues:
        """The items, each with an enqueue time: their read time where the server gave none."""
        return self.items.stamps_or(int(self.read_at * 1000))

    @property
    def count(self) -> int:
        return self.items.count


@dataclass(frozen=True)
class WalSlice:
    """Where some consecutive items of one batch lie in its write-ahead file: an executor
    reads them from there (``walLocation`` is storage every executor reaches) instead of
    receiving them inside its pickled partition. ``crc`` covers the lengths, the data, then
    the enqueue times."""

    path: str
    seq: int
    count: int
    lengths_at: int
    data_at: int
    data_size: int
    stamps_at: int
    crc: int
    location: WalLocation  # the log's storage, which the executor opens


@dataclass(frozen=True)
class SlicedItems:
    """One slice of a batch's items (:meth:`WalFile.slices`): one queue's items from one
    server."""

    queue: str
    server: str
    where: WalSlice


@dataclass(frozen=True)
class _SliceSums:
    """A slice and the checksums of its three runs of bytes in the file, each on its own."""

    sliced: SlicedItems
    lengths_crc: int
    data_crc: int
    stamps_crc: int


@dataclass(frozen=True)
class WalFile:
    """A batch's file once written: where its item lengths, bytes and enqueue times start,
    and the batch's slices of ``step`` items as checksummed while the file was written."""

    path: str  # as a user writes it: a local path or an s3:// URI
    seq: int
    lengths_at: int
    data_at: int
    location: WalLocation
    stamps_at: int
    step: int = 0
    sliced: tuple[SlicedItems, ...] = field(default=(), repr=False)

    def slices(self, parts: list[BatchPart], step: int) -> list[SlicedItems]:
        """The batch (``parts``, as in the file) cut into slices of at most ``step`` items,
        each of one queue's items on one server (a slice may span the parts of one queue on
        one server, one per connection, so a batch has no more tasks than its size needs).
        Those of the ``step`` the file was written with are not read again."""
        if step == self.step:
            return list(self.sliced)
        return [sums.sliced for sums in _slice_sums(self, parts, step)]


def _cut(parts: list[BatchPart], step: int) -> Iterator[tuple[str, str, list[PackedValues]]]:
    """The parts' items, in order, in slices of at most ``step`` of one queue on one server:
    (queue, server, the pieces of the parts the slice covers)."""
    for (queue, server), group in groupby(parts, key=lambda part: (part.queue, part.server)):
        pieces: list[PackedValues] = []
        room = step
        for part in group:
            items, at = part.stamped, 0
            while at < part.count:
                take = min(room, part.count - at)
                pieces.append(items.take(at, take))
                at += take
                room -= take
                if not room:
                    yield queue, server, pieces
                    pieces, room = [], step
        if pieces:
            yield queue, server, pieces


def _slice_sums(file: WalFile, parts: list[BatchPart], step: int) -> Iterator[_SliceSums]:
    """Each slice, where it lies in ``file`` and its checksum (its lengths, then its data,
    then its enqueue times), from one pass over its bytes."""
    first = data_before = 0
    for queue, server, pieces in _cut(parts, step):
        lengths_crc = data_crc = stamps_crc = 0
        for piece in pieces:
            lengths_crc = crc32(piece.lengths, lengths_crc)
            data_crc = crc32(piece.data, data_crc)
            stamps_crc = crc32(piece.stamps or b"", stamps_crc)
        count, data_size = sum(p.count for p in pieces), sum(len(p.data) for p in pieces)
        crc = crc32_combine(crc32_combine(lengths_crc, data_crc, data_size), stamps_crc,
                            8 * count)
        where = WalSlice(file.path, file.seq, count, file.lengths_at + 4 * first,
                         file.data_at + data_before, data_size, file.stamps_at + 8 * first, crc,
                         file.location)
        yield _SliceSums(SlicedItems(queue, server, where), lengths_crc, data_crc, stamps_crc)
        first += count
        data_before += data_size


@dataclass(frozen=True)
class Prepared:
    """A batch staged (in a directory: written and synced under a temporary name), not yet
    in the log."""

    staged: Staged
    file: WalFile

    def discard(self) -> None:
        self.staged.discard()


def read_slice(where: WalSlice) -> PackedValues:
    """Read one slice of a write-ahead file (on an executor), checked against its CRC."""
    try:
        lengths, data, stamps = open_store(where.location).read_ranges(
            _file_name(where.seq), [(where.lengths_at, 4 * where.count),
                                    (where.data_at, where.data_size),
                                    (where.stamps_at, 8 * where.count)])
    except FileNotFoundError:
        raise WalCorrupt(
            f"kestrel: micro-batch {where.seq}'s write-ahead file {where.path} is not on this "
            f"executor: walLocation must be storage every executor reaches at the same path "
            f"(a shared file system or an s3a:// prefix), or the batch was already "
            f"committed") from None
    if len(lengths) != 4 * where.count or len(data) != where.data_size \
            or len(stamps) != 8 * where.count \
            or crc32(stamps, crc32(data, crc32(lengths))) != where.crc:
        raise WalCorrupt(f"kestrel: {where.path} does not hold micro-batch {where.seq}'s items "
                         f"as planned (checksum of bytes {where.data_at}+{where.data_size})")
    # The lengths and the times become Arrow's uint32 and int64 columns, read as such: a view
    # a store returns at a file's offset may not be aligned, so those two are made ``bytes``
    # (a local read's already are: no copy); the data, Arrow's bytes, is handed over as read.
    return PackedValues(bytes(lengths), data, bytes(stamps))


class WriteAheadLog:
    """The directory (or object-store prefix) of one query's planned batches
    (``walLocation``)."""

    def __init__(self, location: str | WalLocation) -> None:
        self.location = location if isinstance(location, WalLocation) \
            else WalLocation.parse(location)
        self.store: WalStore = open_store(self.location)
        self.store.ensure()

    def path(self, seq: int) -> str:
        return self.location.uri(_file_name(seq))

    def sequences(self) -> list[int]:
        return sorted(int(m.group(1)) for name in self.store.names()
                      if (m := _NAME.match(name)))

    def has(self, seq: int) -> bool:
        return self.store.exists(_file_name(seq))

    def remove(self, seq: int) -> None:
        self.store.retire(_file_name(seq))

    def close(self) -> None:
        """The planner stops: its spare files go (:meth:`WalStore.close`)."""
        self.store.close()

    def mark(self, name: str) -> None:
        """An empty file ``name`` beside the batches (tests wait for it)."""
        self.store.touch(name)

    def write(self, seq: int, parts: list[BatchPart], step: int | None = None) -> WalFile:
        """Write batch ``seq`` durably (replacing any file of that number); see
        :meth:`prepare` for ``step``."""
        return self.publish(self.prepare(seq, parts, step))

    def prepare(self, seq: int, parts: list[BatchPart], step: int | None = None) -> Prepared:
        """Stage batch ``seq`` (in a directory: write its temporary file and ``fsync`` it).
        It is no batch yet: :meth:`has` and :meth:`read` do not see it until :meth:`publish`
        (a rename, or an object store's PUT). The file's checksum is made from its slices of
        ``step`` items (default: the whole batch), so :meth:`WalFile.slices` of that step
        reads no byte again."""
        stamped = [BatchPart(p.server, p.read_at, p.stamped, p.queue) for p in parts]
        header = json.dumps({"seq": seq, "stamps": True, "parts": [
            {"queue": p.queue, "server": p.server, "count": p.count, "read_at": p.read_at}
            for p in stamped]}).encode()
        head = b"".join((_MAGIC, header, b"\n"))
        count = sum(p.count for p in stamped)
        lengths_at = len(head)
        data_at = lengths_at + 4 * count
        stamps_at = data_at + sum(len(p.items.data) for p in stamped)
        step = step or max(1, count)
        unsliced = WalFile(self.path(seq), seq, lengths_at, data_at, self.location, stamps_at)
        sums = list(_slice_sums(unsliced, stamped, step))
        crc = crc32(head)
        for each in sums:
            crc = crc32_combine(crc, each.lengths_crc, 4 * each.sliced.where.count)
        for each in sums:
            crc = crc32_combine(crc, each.data_crc, each.sliced.where.data_size)
        for each in sums:
            crc = crc32_combine(crc, each.stamps_crc, 8 * each.sliced.where.count)
        chunks = [head, *(p.items.lengths for p in stamped), *(p.items.data for p in stamped),
                  *(p.items.stamps or b"" for p in stamped), _CRC.pack(crc)]
        staged = self.store.stage(_file_name(seq), chunks)
        return Prepared(staged, WalFile(self.path(seq), seq, lengths_at, data_at, self.location,
                                        stamps_at, step, tuple(each.sliced for each in sums)))

    def publish(self, prepared: Prepared) -> WalFile:
        """Make a prepared batch durable and whole under its name (a directory: rename,
        ``fsync`` of the directory; an object store: one PUT of the whole object)."""
        prepared.staged.publish()
        return prepared.file

    def read(self, seq: int, queue: str) -> tuple[list[BatchPart], WalFile]:
        """Batch ``seq`` as written (``queue``: its parts' queue in a file that names none)."""
        path = self.path(seq)
        data = memoryview(self.store.read(_file_name(seq)))
        if len(data) < len(_MAGIC) + _CRC.size or bytes(data[:len(_MAGIC)]) != _MAGIC:
            raise WalCorrupt(f"kestrel: {path} is not a write-ahead file of this source")
        body, (crc,) = data[:-_CRC.size], _CRC.unpack(data[-_CRC.size:])
        if crc32(body) != crc:
            raise WalCorrupt(f"kestrel: {path} fails its checksum (storage lost data)")
        newline = bytes(body).index(b"\n", len(_MAGIC))
        header = json.loads(bytes(body[len(_MAGIC):newline]))
        lengths_at = newline + 1
        data_at = lengths_at + 4 * sum(p["count"] for p in header["parts"])
        lengths: list[memoryview] = []
        for described in header["parts"]:
            lengths.append(body[lengths_at:lengths_at + 4 * described["count"]])
            lengths_at += len(lengths[-1])
        sizes = [sum(PackedValues(of_part, b"").sizes()) for of_part in lengths]
        stamps_at = data_at + sum(sizes)
        written = WalFile(path, seq, newline + 1, data_at, self.location, stamps_at)
        stamped = bool(header.get("stamps"))
        parts = []
        for described, of_part, size in zip(header["parts"], lengths, sizes, strict=True):
            stamps_size = 8 * described["count"]  # an int64 per item
            stamps = body[stamps_at:stamps_at + stamps_size] if stamped else None
            parts.append(BatchPart(described["server"], float(described["read_at"]),
                                   PackedValues(of_part, body[data_at:data_at + size], stamps),
                                   described.get("queue", queue)))
            data_at += size
            stamps_at += stamps_size
        if not stamped:  # an older file: its items' times become their read times
            parts = [BatchPart(p.server, p.read_at, p.stamped, p.queue) for p in parts]
            return parts, self.write(seq, parts)
        return parts, written

    def remove_through(self, seq: int) -> None:
        """Forget batches ``<= seq`` (Spark has committed them)."""
        for number in self.sequences():
            if number <= seq:
                self.remove(number)


def _file_name(seq: int) -> str:
    return f"batch-{seq:012d}.wal"
