"""The one CRC-32 of checkpoints and write-ahead files (kestrel_actors/_crc.py): ISA-L's where
installed, and the same checksum as zlib's, so that what one install writes another reads."""

from __future__ import annotations

import zlib

from kestrel_actors._crc import crc32
from kestrel_actors.journal._checkpoint import Checkpoint, decode, encode
from kestrel_actors.queue import Item


def test_it_is_zlibs_checksum_whole_chained_and_over_any_buffer():
    data = bytes(range(256)) * 4099 + b"tail"
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data[70_000:], crc32(data[:70_000])) == zlib.crc32(data)
    assert crc32(memoryview(data)[3:5000]) == zlib.crc32(data[3:5000])
    assert crc32(bytearray(b"abc")) == zlib.crc32(b"abc") and crc32(b"") == 0


def test_a_checkpoint_of_open_reads_ends_with_zlibs_checksum_of_its_bytes_and_reads_back():
    opened = {1001: Item(b"x" * 1024, 5, 0, 1001), 1002: Item(b"y" * 10, 6, 0, 1002)}
    state = Checkpoint(queue="q", files=[], tail_crc=7, head_offset=0, head_skip=0, length=0, bytes=0,
                       xid=1002, added=2, consumed=2, front=[], open_items=opened, marks=[])
    raw = encode(state)
    whole, crc = raw[:-9], raw[-9:]
    assert crc == b"%08x\n" % zlib.crc32(whole)
    back = decode(raw)
    assert {xid: item.data for xid, item in back.open_items.items()} == {1001: b"x" * 1024, 1002: b"y" * 10}
