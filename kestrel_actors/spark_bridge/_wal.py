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
import zlib
from dataclasses import dataclass

from ..client import PackedValues
from ._walstore import Staged, WalLocation, WalStore, open_store

__all__ = ["BatchPart", "Prepared", "WalCorrupt", "WalFile", "WalSlice", "WriteAheadLog",
           "read_slice"]

_MAGIC = b"KWAL1\n"
_NAME = re.compile(r"^batch-(\d{12})\.wal$")
_CRC = struct.Struct("<I")


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
class WalFile:
    """A batch's file once written: where its item lengths, bytes and enqueue times start."""

    path: str  # as a user writes it: a local path or an s3:// URI
    seq: int
    lengths_at: int
    data_at: int
    location: WalLocation
    stamps_at: int

    def slice(self, first: int, pieces: list[PackedValues], data_before: int) -> WalSlice:
        """The slice of the batch's items ``first``, ``first + 1``, ... given as ``pieces``
        (consecutive in the file: the lengths of all parts come first, then their data, then
        their enqueue times), whose bytes start ``data_before`` bytes into the batch's data."""
        crc = 0
        for piece in pieces:
            crc = zlib.crc32(piece.lengths, crc)
        for piece in pieces:
            crc = zlib.crc32(piece.data, crc)
        for piece in pieces:
            crc = zlib.crc32(piece.stamps or b"", crc)
        return WalSlice(self.path, self.seq, sum(p.count for p in pieces),
                        self.lengths_at + 4 * first, self.data_at + data_before,
                        sum(len(p.data) for p in pieces), self.stamps_at + 8 * first, crc,
                        self.location)


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
            or zlib.crc32(stamps, zlib.crc32(data, zlib.crc32(lengths))) != where.crc:
        raise WalCorrupt(f"kestrel: {where.path} does not hold micro-batch {where.seq}'s items "
                         f"as planned (checksum of bytes {where.data_at}+{where.data_size})")
    return PackedValues(lengths, data, stamps)


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
        self.store.delete(_file_name(seq))

    def mark(self, name: str) -> None:
        """An empty file ``name`` beside the batches (tests wait for it)."""
        self.store.touch(name)

    def write(self, seq: int, parts: list[BatchPart]) -> WalFile:
        """Write batch ``seq`` durably (replacing any file of that number)."""
        return self.publish(self.prepare(seq, parts))

    def prepare(self, seq: int, parts: list[BatchPart]) -> Prepared:
        """Stage batch ``seq`` (in a directory: write its temporary file and ``fsync`` it).
        It is no batch yet: :meth:`has` and :meth:`read` do not see it until :meth:`publish`
        (a rename, or an object store's PUT)."""
        header = json.dumps({"seq": seq, "stamps": True, "parts": [
            {"queue": p.queue, "server": p.server, "count": p.count, "read_at": p.read_at}
            for p in parts]})
        chunks = [_MAGIC, header.encode(), b"\n", *(p.items.lengths for p in parts),
                  *(p.items.data for p in parts), *(p.stamped.stamps or b"" for p in parts)]
        crc = 0
        for chunk in chunks:
            crc = zlib.crc32(chunk, crc)
        chunks.append(_CRC.pack(crc))
        staged = self.store.stage(_file_name(seq), chunks)
        lengths_at = len(_MAGIC) + len(chunks[1]) + 1
        data_at = lengths_at + 4 * sum(p.count for p in parts)
        stamps_at = data_at + sum(len(p.items.data) for p in parts)
        return Prepared(staged, WalFile(self.path(seq), seq, lengths_at, data_at, self.location,
                                        stamps_at))

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
        if zlib.crc32(body) != crc:
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
