"""Kestrel's journal records, byte for byte (behaviour §6.2, §6.5)."""

from __future__ import annotations

import os
import struct
import sys
import tracemalloc

import pytest

from kestrel_actors.journal import CORRUPT, TORN, Item, RecordReader
from kestrel_actors.journal._format import (
    OP_ADD,
    OP_ADD_XID,
    OP_ADDX,
    OP_CONFIRM_REMOVE,
    OP_CONTINUE,
    OP_REMOVE,
    OP_REMOVE_TENTATIVE,
    OP_REMOVE_TENTATIVE_XID,
    OP_SAVE_XID,
    OP_UNREMOVE,
    AddRecords,
    encode_add,
    encode_add_xid,
    encode_confirm_remove,
    encode_continue,
    encode_legacy_add,
    encode_legacy_remove_tentative,
    encode_remove,
    encode_remove_tentative,
    encode_save_xid,
    encode_unremove,
    encode_xid_records,
    encode_xid_run,
    le_i32,
    le_i64,
    le_u32,
    xid_run,
)


def addx(data: bytes, add_time: int = 1000, expiry: int = 0) -> bytes:
    """An ADDX record built by hand, the way Kestrel's QItem.pack lays it out."""
    return bytes([2]) + struct.pack("<iqq", len(data) + 16, add_time, expiry) + data


def with_xid(op: int, xid: int) -> bytes:
    return bytes([op]) + struct.pack("<i", xid)


def records(data: bytes, **kwargs):
    reader = RecordReader(data, **kwargs)
    return list(reader), reader


def test_encoders_match_the_hand_built_layout():
    item = Item(b"hello world", 1_234_567_890_123, 1_234_567_899_000)
    assert encode_add(item) == addx(b"hello world", 1_234_567_890_123, 1_234_567_899_000)
    assert encode_add(item)[:5] == b"\x02\x1b\x00\x00\x00"  # size = 11 + 16 = 27, little-endian
    assert encode_remove() == b"\x01"
    assert encode_remove_tentative(1) == b"\x09\x01\x00\x00\x00"
    assert encode_unremove(258) == b"\x05\x02\x01\x00\x00"
    assert encode_confirm_remove(7) == b"\x06\x07\x00\x00\x00"
    assert encode_save_xid(-2) == b"\x04\xfe\xff\xff\xff"
    as_addx = addx(b"hello world", 1_234_567_890_123, 1_234_567_899_000)
    assert encode_add_xid(3, item) == b"\x07\x03\x00\x00\x00" + as_addx[1:]
    assert encode_continue(3, item)[0] == OP_CONTINUE
    assert encode_legacy_add(b"abc", 17) == b"\x00\x07\x00\x00\x00\x11\x00\x00\x00abc"
    assert encode_legacy_remove_tentative() == b"\x03"


def test_a_journals_add_records_are_encode_add_whatever_came_before():
    adds = AddRecords()
    items = [Item(b"abc", 1000), Item(b"def", 1000), Item(b"defg", 1000), Item(b"hij", 1000),
             Item(b"hij", 1001), Item(b"hij", 1001, 5000), Item(b"hij", 1001), Item(b"", 1001),
             Item(b"x" * 1024, 1_764_300_000_000), Item(b"y" * 1024, 1_764_300_000_000, 2**62)]
    for item in items:
        assert adds.header(item) + item.data == encode_add(item) == addx(item.data, item.add_time, item.expiry)


def test_record_sizes_are_kestrels_logsize_arithmetic():
    assert len(encode_add(Item(b"x" * 11, 0))) == 32  # SET of 11 bytes -> logsize 32
    assert len(encode_add(Item(b"first", 0))) + len(encode_add(Item(b"second", 0))) + 1 == 54
    for record in (encode_remove_tentative(1), encode_confirm_remove(1), encode_unremove(1)):
        assert len(record) == 5  # /open, /close, abort: +5 each
    assert len(encode_add_xid(1, Item(b"abc", 0))) == 25 + 3


def test_every_opcode_decodes():
    blob = (
        encode_legacy_add(b"old", 0)               # 0
        + encode_remove()                          # 1
        + addx(b"new", 5, 99)                      # 2
        + encode_legacy_remove_tentative()         # 3
        + with_xid(4, 10)                          # 4
        + with_xid(5, 11)                          # 5
        + with_xid(6, 12)                          # 6
        + encode_add_xid(13, Item(b"ax", 6, 0))    # 7
        + encode_continue(14, Item(b"cont", 7, 8))  # 8
        + with_xid(9, 15)                          # 9
    )
    found, reader = records(blob, now_ms=4242)
    assert reader.problem is None and reader.position == len(blob)
    assert [r.op for r in found] == list(range(10))
    assert found[0].item == Item(b"old", 4242, 0)
    assert found[2].item == Item(b"new", 5, 99)
    assert [r.xid for r in found[3:7]] == [0, 10, 11, 12]
    assert found[7].xid == 13 and found[7].item == Item(b"ax", 6, 0)
    assert found[8].xid == 14 and found[8].item == Item(b"cont", 7, 8)
    assert found[9].xid == 15
    offsets = [r.offset for r in found]
    ends = [*offsets[1:], len(blob)]
    assert offsets[0] == 0 and all(r.offset + r.size == n for r, n in zip(found, ends, strict=True))


def test_legacy_add_expiry_is_seconds():
    (record,), _ = records(encode_legacy_add(b"abc", 1_700_000_000), now_ms=1)
    assert record.item.expiry == 1_700_000_000_000


def test_only_a_zero_expiry_means_none():
    (past, never), _ = records(addx(b"a", 1, -5) + addx(b"b", 1, 0))
    assert past.item.expiry == -5  # as in Kestrel: a time long past, so already expired
    assert never.item.expiry == 0


def test_read_behinds_way_keeps_any_int64_time_and_any_limit():
    # next_item's fast path reads the header into native ints in the compiled build: the
    # extremes of its int64 fields, and a limit past what a native int holds, are kept as they are
    blob = encode_remove() + addx(b"a", -2**63, 2**63 - 1) + addx(b"bc", 2**62, -1)
    reader = RecordReader(blob, max_item_size=2**63 - 1)
    assert [reader.next_item(), reader.next_item()] == [Item(b"a", -2**63, 2**63 - 1), Item(b"bc", 2**62, -1)]
    assert reader.next_item() is None and reader.problem is None and reader.position == len(blob)


def test_xid_run_counts_the_whole_xid_records_in_a_row():
    monitor = encode_xid_records(OP_REMOVE_TENTATIVE_XID, list(range(1, 5001)))
    confirm = encode_xid_records(OP_CONFIRM_REMOVE, list(range(1, 3001)))
    blob = monitor + confirm + encode_remove() + monitor[:5]
    assert xid_run(blob, 0, len(blob)) == 8000  # both opcodes, up to the REMOVE
    assert xid_run(blob, 5 * 7999, len(blob) - 5 * 7999) == 1
    assert xid_run(blob, 0, 5 * 1234 + 4) == 1234  # only whole records within what is available
    lone = with_xid(OP_CONFIRM_REMOVE, 3) + with_xid(OP_UNREMOVE, 2) + with_xid(OP_CONFIRM_REMOVE, 4)
    assert xid_run(lone, 0, len(lone)) == 1  # an UNREMOVE is not one of them


def test_read_behind_steps_over_runs_of_xid_records_to_the_items(tmp_path):
    # a monitor's and a confirm's records between adds, in runs of every length, some across
    # the reader's chunks (2 KiB): read past in runs, the items and the count of records as one by one
    blob = b""
    expected = []
    count = 0
    for n, length in enumerate([1, 2, 3, 5, 6, 17, 100, 1000, 4, 5000, 21]):
        data = bytes([n]) * (n * 37 % 200 + 1)
        blob += addx(data, n) + encode_xid_records(OP_REMOVE_TENTATIVE_XID, list(range(1, length + 1)))
        blob += encode_xid_records(OP_CONFIRM_REMOVE, list(range(1, length // 2 + 2))) + encode_remove()
        expected.append(Item(data, n))
        count += 2 + length + length // 2 + 1
    blob += addx(b"last", 99) + with_xid(OP_CONFIRM_REMOVE, 1) * 9 + with_xid(OP_UNREMOVE, 1)
    expected.append(Item(b"last", 99))
    count += 11
    path = tmp_path / "q"
    path.write_bytes(blob)
    fd = os.open(path, os.O_RDONLY)
    try:
        for source, chunk in ((blob, 1 << 20), (fd, 2048)):
            reader = RecordReader(source, chunk_size=chunk)
            items = []
            while (item := reader.next_item()) is not None:
                items.append(item)
            assert items == expected
            assert reader.problem is None and reader.position == len(blob) and reader.records == count
    finally:
        os.close(fd)
    torn = blob[:-5] + with_xid(OP_CONFIRM_REMOVE, 1)[:3]  # a run that ends in a torn record
    reader = RecordReader(torn)
    while reader.next_item() is not None:
        pass
    assert reader.problem is not None and reader.problem.kind == TORN and reader.position == len(blob) - 5


@pytest.mark.parametrize("value", [0, 1, -1, 255, 256, -256, 2**31 - 1, -2**31, 2**32 - 1, 2**32, -2**32,
                                   2**62, 1_764_000_000_123, 2**63 - 1, -2**63, -2**63 + 1, 0x0102030405060708])
def test_read_behinds_header_reads_are_structs_little_endian_layouts(value):
    # the ADDX header is read byte by byte (no struct): each sign boundary of both widths,
    # at an offset, reads as struct reads it
    blob = b"\xaa" * 3 + struct.pack("<q", value) + b"\xbb"
    assert le_i64(blob, 3) == struct.unpack_from("<q", blob, 3)[0]
    assert le_i32(blob, 3) == struct.unpack_from("<i", blob, 3)[0]
    assert le_u32(blob, 7) == struct.unpack_from("<I", blob, 7)[0]


def test_a_file_descriptor_reads_like_bytes_even_across_chunks(tmp_path):
    blob = b"".join(encode_add(Item(bytes([i]) * i, i)) + encode_remove_tentative(i) for i in range(1, 60))
    path = tmp_path / "q"
    path.write_bytes(blob)
    expected, _ = records(blob)
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = RecordReader(fd, chunk_size=7)
        found = list(reader)
    finally:
        os.close(fd)
    assert [(r.op, r.offset, r.xid, r.item) for r in found] == [(r.op, r.offset, r.xid, r.item) for r in expected]
    assert reader.position == len(blob) and reader.problem is None


def test_start_offset_and_end():
    blob = encode_add(Item(b"a", 1)) + encode_remove() + encode_add(Item(b"b", 2))
    found, reader = records(blob, start=22)
    assert [r.op for r in found] == [OP_REMOVE, OP_ADDX]
    found, reader = records(blob, start=22, end=23)
    assert [r.op for r in found] == [OP_REMOVE] and reader.problem is None


def test_torn_at_every_offset_inside_the_last_record():
    records_ = [encode_add(Item(b"one", 1)), encode_remove_tentative(1), encode_continue(1, Item(b"two!", 2, 3))]
    whole = b"".join(records_)
    last_start = len(whole) - len(records_[-1])
    for cut in range(last_start + 1, len(whole)):
        found, reader = records(whole[:cut])
        assert [r.op for r in found] == [OP_ADDX, OP_REMOVE_TENTATIVE_XID], cut
        assert reader.position == last_start
        assert reader.problem.kind == TORN and reader.problem.offset == last_start


@pytest.mark.parametrize("record", [encode_remove_tentative(3), encode_unremove(3), encode_save_xid(3),
                                    encode_legacy_add(b"xy", 0), encode_add_xid(2, Item(b"q", 1))])
def test_torn_fixed_records(record):
    for cut in range(1, len(record)):
        found, reader = records(encode_remove() + record[:cut])
        assert len(found) == 1 and reader.problem == (TORN, 1, reader.problem.message)


def test_unknown_opcode_is_corrupt():
    found, reader = records(encode_remove() + b"\x0a\x00\x00")
    assert len(found) == 1
    assert reader.problem.kind == CORRUPT and reader.problem.offset == 1 and reader.position == 1
    assert "opcode 10" in reader.problem.message


def test_short_add_bodies_are_corrupt():
    short_addx = b"\x02" + struct.pack("<i", 15) + b"\x00" * 15
    _, reader = records(encode_remove() + short_addx)
    assert reader.problem.kind == CORRUPT and reader.problem.offset == 1
    short_legacy = b"\x00" + struct.pack("<i", 3) + b"abc"
    _, reader = records(short_legacy)
    assert reader.problem.kind == CORRUPT and reader.problem.offset == 0
    short_continue = b"\x08" + struct.pack("<i", 1) + struct.pack("<i", 2) + b"ab"
    _, reader = records(short_continue)
    assert reader.problem.kind == CORRUPT


def test_negative_size_is_corrupt_not_a_crash():
    _, reader = records(b"\x02" + struct.pack("<i", -1) + b"\x00" * 40)
    assert reader.problem.kind == CORRUPT and "negative" in reader.problem.message


def test_a_huge_size_does_not_allocate(tmp_path):
    path = tmp_path / "q"
    path.write_bytes(encode_remove() + b"\x02" + struct.pack("<i", 2**31 - 1) + b"\x00" * 100)
    fd = os.open(path, os.O_RDONLY)
    tracemalloc.start()
    try:
        reader = RecordReader(fd)
        found = list(reader)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        os.close(fd)
    assert len(found) == 1 and reader.problem.kind == TORN and reader.position == 1
    assert peak < 2 * 1024 * 1024


def test_growing_end_clears_a_torn_stop():
    whole = encode_add(Item(b"abc", 1)) + encode_remove()
    reader = RecordReader(whole, end=10)
    assert reader.next() is None and reader.problem.kind == TORN
    reader.set_end(len(whole))
    assert reader.problem is None
    assert [r.op for r in reader] == [OP_ADDX, OP_REMOVE]


def test_opcode_constants():
    assert tuple(range(10)) == (OP_ADD, OP_REMOVE, OP_ADDX, OP_REMOVE_TENTATIVE, OP_SAVE_XID, OP_UNREMOVE,
                                OP_CONFIRM_REMOVE, OP_ADD_XID, OP_CONTINUE, OP_REMOVE_TENTATIVE_XID)


def test_a_file_is_read_in_chunks_that_malloc_keeps_in_its_heap(tmp_path):
    """Read-behind and replay read a journal in chunks under the server's fixed mmap threshold:
    a chunk at or over it was a fresh mapping each time, faulted in page by page (issue 56)."""
    from kestrel_actors._malloc import MMAP_THRESHOLD

    blob = b"".join(encode_add(Item(bytes([i % 251]) * 1024, i)) + encode_remove() for i in range(3000))
    path = tmp_path / "q"
    path.write_bytes(blob)
    chunks = []

    def read(fd: int, length: int, offset: int) -> bytes:
        data = os.pread(fd, length, offset)
        chunks.append(data)
        return data

    fd = os.open(path, os.O_RDONLY)
    try:
        reader = RecordReader(fd, read=read)
        found = list(reader)
    finally:
        os.close(fd)
    assert len(found) == 6000 and reader.problem is None
    assert [r.item.data for r in found[::2]] == [bytes([i % 251]) * 1024 for i in range(3000)]
    assert len(chunks) > 1
    assert all(sys.getsizeof(chunk) < MMAP_THRESHOLD for chunk in chunks)


class _Ahead:
    """A read ahead that is done at once (the journal's runs on gevent's threadpool)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def result(self) -> bytes:
        return self.data


def test_a_reader_given_read_ahead_reads_each_chunk_before_it_needs_it(tmp_path):
    """Read-behind reads the next chunk while the queue serves the one it has (issue 56): every
    chunk after the first comes from a read started ahead, records that lie across two chunks
    and records larger than a chunk included (the reader reads those itself), each in order."""
    sizes = [37, 5, 900, 64, 3000, 1, 511] * 12  # 3000 > the chunk: read by the reader itself
    blob = b"".join(encode_add(Item(bytes([i % 251]) * size, i)) + encode_remove()
                    for i, size in enumerate(sizes))
    path = tmp_path / "q"
    path.write_bytes(blob)
    own_reads: list[tuple[int, int]] = []
    aheads: list[tuple[int, int]] = []

    def read(fd: int, length: int, offset: int) -> bytes:
        own_reads.append((offset, length))
        return os.pread(fd, length, offset)

    def read_ahead(fd: int, length: int, offset: int) -> _Ahead:
        aheads.append((offset, length))
        return _Ahead(os.pread(fd, length, offset))

    fd = os.open(path, os.O_RDONLY)
    try:
        reader = RecordReader(fd, read=read, read_ahead=read_ahead, chunk_size=2048)
        items = []
        while (item := reader.next_item()) is not None:
            items.append(item)
    finally:
        os.close(fd)
    assert [(item.data, item.add_time) for item in items] == [(bytes([i % 251]) * size, i)
                                                               for i, size in enumerate(sizes)]
    assert reader.problem is None and reader.position == len(blob)
    # the first chunk, and each record over a chunk (12), are the reader's own reads
    assert own_reads[0] == (0, 2048) and len(own_reads) == 1 + 12
    assert len(aheads) > 20
    # what is read ahead starts where the chunk before it ends and goes no further than the file
    assert all(offset + length <= len(blob) for offset, length in aheads)
    starts = [offset for offset, _ in aheads]
    assert starts == sorted(set(starts))


def test_a_read_ahead_that_fails_leaves_the_read_to_the_reader(tmp_path):
    blob = b"".join(encode_add(Item(bytes([i]) * 100, i)) for i in range(200))
    path = tmp_path / "q"
    path.write_bytes(blob)
    fd = os.open(path, os.O_RDONLY)

    class Failed:
        def result(self) -> None:
            return None

    try:
        reader = RecordReader(fd, chunk_size=1000, read_ahead=lambda fd, length, offset: Failed())
        items = [record.item.data for record in reader]
    finally:
        os.close(fd)
    assert items == [bytes([i]) * 100 for i in range(200)] and reader.problem is None


@pytest.mark.parametrize("xids", [[], [7], [1, 2, 3], list(range(1, 3000)), [2**31 - 1, 1, 65536, 255],
                                  [5, -1, -2**31]])  # a negative xid (an old file's) too
def test_a_run_of_xid_records_is_byte_for_byte_the_records_one_by_one(xids):
    for op, one in ((OP_REMOVE_TENTATIVE_XID, encode_remove_tentative), (OP_CONFIRM_REMOVE, encode_confirm_remove)):
        joined = encode_xid_records(op, xids)
        assert joined == b"".join(one(xid) for xid in xids)
        assert [(r.op, r.xid) for r in RecordReader(joined)] == [(op, xid) for xid in xids]


@pytest.mark.parametrize(("first", "count"), [(1, 1), (1, 3), (7, 10_000), (65_530, 20), (0xFFFF, 2),
                                              (3 * 65_536 - 5, 70_000), (2**31 - 3, 3),
                                              (-2, 5), (0, 3)])
def test_a_run_of_consecutive_xids_encodes_as_its_records_one_by_one(first, count):
    for op in (OP_REMOVE_TENTATIVE_XID, OP_CONFIRM_REMOVE):
        expected = b"".join(with_xid(op, xid) for xid in range(first, first + count))
        assert encode_xid_run(op, first, count) == expected
    assert encode_xid_run(OP_CONFIRM_REMOVE, 5, 0) == b""
