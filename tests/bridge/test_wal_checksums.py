"""The write-ahead file's checksum and its slices' checksums come from one pass over the
items (issue 57 point 4): the planner reads each byte of a batch once to checksum it, and
the file and every slice still verify as before (ADR 0013: an executor reads exactly what
was planned)."""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

import pytest

from kestrel_actors.client import PackedValues
from kestrel_actors.spark_bridge import _wal
from kestrel_actors.spark_bridge._wal import (
    BatchPart,
    WalCorrupt,
    WriteAheadLog,
    crc32_combine,
    read_slice,
)


def test_crc32_combine_is_the_checksum_of_the_joined_bytes():
    rng = random.Random(57)
    for length1, length2 in [(0, 0), (0, 5), (5, 0), (1, 1), (1000, 4096), (3, 1 << 20)]:
        first, second = rng.randbytes(length1), rng.randbytes(length2)
        assert crc32_combine(zlib.crc32(first), zlib.crc32(second), len(second)) \
            == zlib.crc32(first + second)


def test_the_log_s_checksum_is_zlib_s_crc32_whichever_library_computes_it(tmp_path):
    """The log checksums with ISA-L's CRC-32 where the spark extra installed it (``isal``,
    ~10x zlib's speed) and with zlib's elsewhere: the same checksum, so a file written on a
    driver with one verifies on an executor with the other."""
    rng = random.Random(32)
    blob = rng.randbytes(100_003)
    for data, seed in [(b"", 0), (b"", 7), (blob, 0), (memoryview(blob)[3:], 12345),
                       (bytearray(blob[:5000]), 0xFFFFFFFF)]:
        assert _wal.crc32(data, seed) == zlib.crc32(data, seed)
    wal = WriteAheadLog(str(tmp_path))
    parts = _parts()
    sliced = wal.write(1, parts, 4).slices(parts, 4)
    data = Path(wal.path(1)).read_bytes()
    assert int.from_bytes(data[-4:], "little") == zlib.crc32(data[:-4])
    for each in (s.where for s in sliced):
        assert each.crc == zlib.crc32(data[each.stamps_at:each.stamps_at + 8 * each.count], zlib.crc32(
            data[each.data_at:each.data_at + each.data_size],
            zlib.crc32(data[each.lengths_at:each.lengths_at + 4 * each.count])))


def _parts() -> list[BatchPart]:
    """Two servers, the first with two parts (two connections); one part without enqueue
    times (its read time stands in)."""
    rng = random.Random(4)

    def items(count: int, stamp: int | None) -> PackedValues:
        packed = PackedValues.of([rng.randbytes(rng.randrange(0, 300)) for _ in range(count)])
        return packed if stamp is None else packed.stamps_or(stamp)

    return [BatchPart("s1", 10.0, items(7, 1_000), "q"), BatchPart("s1", 11.0, items(5, None), "q"),
            BatchPart("s2", 12.0, items(9, 3_000), "q")]


@pytest.mark.parametrize("step", [1, 3, 4, 12, 100])
def test_each_byte_is_checksummed_once_and_every_slice_verifies(tmp_path, monkeypatch, step):
    hashed, crc32 = [], _wal.crc32

    def counting_crc32(data, value=0):
        hashed.append(len(data))
        return crc32(data, value)

    monkeypatch.setattr(_wal, "crc32", counting_crc32)
    wal = WriteAheadLog(str(tmp_path))
    parts = _parts()
    written = wal.write(1, parts, step)
    sliced = written.slices(parts, step)
    size = os.path.getsize(wal.path(1))
    assert sum(hashed) == size - 4  # everything but the checksum itself, once
    monkeypatch.undo()

    # the same slices as cut afresh (a replayed batch's file), and each reads back verified
    read_parts, replayed = WriteAheadLog(str(tmp_path)).read(1, "q")
    assert replayed.slices(read_parts, step) == sliced
    assert [(s.queue, s.server) for s in sliced].count(("q", "s2")) == -(-9 // step)
    values = [v for s in sliced for v in read_slice(s.where).values()]
    assert values == [v for p in parts for v in p.items.values()]
    stamps = b"".join(bytes(read_slice(s.where).stamps or b"") for s in sliced)
    assert stamps == b"".join(bytes(p.stamped.stamps or b"") for p in parts)


def test_a_byte_changed_in_the_file_fails_its_slice_and_the_whole_file(tmp_path):
    wal = WriteAheadLog(str(tmp_path))
    parts = _parts()
    sliced = wal.write(1, parts, 4).slices(parts, 4)
    path = Path(wal.path(1))
    data = bytearray(path.read_bytes())
    where = sliced[1].where
    data[where.data_at] ^= 1
    path.write_bytes(data)
    with pytest.raises(WalCorrupt, match="as planned"):
        read_slice(where)
    read_slice(sliced[0].where)  # the others are intact
    with pytest.raises(WalCorrupt, match="checksum"):
        wal.read(1, "q")
