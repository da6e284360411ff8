"""Finding and replaying journal files (behaviour §6.1, §6.4, §6.5), with files built by hand."""

from __future__ import annotations

import os
import struct

import pytest

from kestrel_actors.journal import Item, archived_files, journal_files, queue_names, replay_queue
from kestrel_actors.journal._format import (
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
)


def addx(data: bytes, add_time: int = 1000, expiry: int = 0) -> bytes:
    return b"\x02" + struct.pack("<iqq", len(data) + 16, add_time, expiry) + data


def xid_record(op: int, xid: int) -> bytes:
    return bytes([op]) + struct.pack("<i", xid)


def write(path, *records: bytes) -> bytes:
    blob = b"".join(records)
    path.write_bytes(blob)
    return blob


def datas(items) -> list[bytes]:
    return [item.data for item in items]


# -- a journal written the way Kestrel 2.4 writes it ---------------------------------------

def test_kestrel_24_records_replay(tmp_path):
    write(
        tmp_path / "q",
        addx(b"one", 1), addx(b"two", 2), addx(b"three", 3), addx(b"four", 4), addx(b"five", 5, 99_000),
        xid_record(9, 1),  # open one
        xid_record(9, 2),  # open two
        xid_record(6, 1),  # confirm one
        xid_record(5, 2),  # abort two: back at the head
        b"\x01",           # plain get: two
        xid_record(9, 3),  # open three
    )
    result = replay_queue(str(tmp_path), "q")
    assert datas(result.items) == [b"four", b"five"]
    assert list(result.items)[1] == Item(b"five", 5, 99_000)
    assert list(result.open_items) == [3] and result.open_items[3].data == b"three"
    assert result.xid == 3
    assert result.total_items == 5
    assert result.length == 2 and result.bytes == 8
    assert result.current_size == os.path.getsize(tmp_path / "q")


def test_every_opcode_including_legacy_ones(tmp_path):
    write(
        tmp_path / "q",
        encode_legacy_add(b"legacy", 0),         # 0: added at replay time
        addx(b"a"), addx(b"b"), addx(b"c"),      # 2
        encode_remove(),                         # 1: legacy leaves
        encode_save_xid(41),                     # 4: counter := 41
        encode_legacy_remove_tentative(),        # 3: next xid, 42, takes a
        encode_remove_tentative(7),              # 9: b under 7, counter := 7
        encode_legacy_remove_tentative(),        # 3: 8 takes c
        encode_add_xid(99, Item(b"d", 1)),       # 7: a plain add
        encode_continue(42, Item(b"e", 2)),      # 8: closes 42 (a), appends e
        encode_unremove(8),                      # 5: c back at the head
        encode_confirm_remove(7),                # 6: b gone
    )
    result = replay_queue(str(tmp_path), "q", now_ms=555)
    assert datas(result.items) == [b"c", b"d", b"e"]
    assert result.open_items == {}
    assert result.xid == 8
    assert result.total_items == 6  # legacy, a, b, c, d, e
    assert all(item.xid == 0 for item in result.items)


def test_legacy_remove_tentative_skips_open_xids(tmp_path):
    write(tmp_path / "q", addx(b"a"), addx(b"b"), addx(b"c"), encode_remove_tentative(2),
          encode_save_xid(1), encode_legacy_remove_tentative(), encode_legacy_remove_tentative())
    result = replay_queue(str(tmp_path), "q")
    assert {xid: item.data for xid, item in result.open_items.items()} == {2: b"a", 3: b"b", 4: b"c"}


def test_remove_on_an_empty_queue_is_a_no_op(tmp_path):
    write(tmp_path / "q", encode_remove(), encode_remove_tentative(5), encode_unremove(9),
          encode_confirm_remove(3), addx(b"x"))
    result = replay_queue(str(tmp_path), "q")
    assert datas(result.items) == [b"x"] and result.xid == 5 and result.open_items == {}


def test_missing_files_mean_an_empty_queue(tmp_path):
    result = replay_queue(str(tmp_path), "nothing")
    assert result.length == 0 and result.current_size == 0 and result.files == ["nothing"]


# -- files, order, packs ---------------------------------------------------------------------

def test_archives_replay_oldest_first_numerically(tmp_path):
    write(tmp_path / "q.10", addx(b"second"))
    write(tmp_path / "q.9", addx(b"first"))
    write(tmp_path / "q", addx(b"third"), encode_remove())
    assert journal_files(str(tmp_path), "q") == ["q.9", "q.10", "q"]
    result = replay_queue(str(tmp_path), "q")
    assert datas(result.items) == [b"second", b"third"]
    assert result.archived_size == 2 * (21 + 6) - 1 and result.max_timestamp == 10


def test_a_pack_replaces_the_archives_it_covers(tmp_path):
    write(tmp_path / "q.1", addx(b"a"), addx(b"b"))
    write(tmp_path / "q.2", encode_remove())
    write(tmp_path / "q.2.pack", addx(b"b"))
    write(tmp_path / "q.3", addx(b"c"))
    write(tmp_path / "q", addx(b"d"))
    assert archived_files(str(tmp_path), "q") == ["q.2", "q.3"]
    assert not (tmp_path / "q.1").exists() and (tmp_path / "q.2").read_bytes() == addx(b"b")
    assert datas(replay_queue(str(tmp_path), "q").items) == [b"b", b"c", b"d"]


def test_temp_files_are_deleted_on_replay_of_their_queue_only(tmp_path):
    write(tmp_path / "q~~123", addx(b"half a rewrite"))
    write(tmp_path / "r~~123", addx(b"other"))
    write(tmp_path / "q", addx(b"real"))
    assert datas(replay_queue(str(tmp_path), "q").items) == [b"real"]
    assert not (tmp_path / "q~~123").exists() and (tmp_path / "r~~123").exists()


def test_queue_discovery(tmp_path):
    for name in ("a", "b.123", "b", "c.5.pack", "d~~77", "e.bogus", "f+child", "f+child.9"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "dir").mkdir()
    (tmp_path / ".corrupt").mkdir()
    assert queue_names(str(tmp_path)) == ["a", "b", "c", "f+child"]
    assert queue_names(str(tmp_path / "missing")) == []


def test_a_stray_suffix_is_ignored_not_fatal(tmp_path):
    write(tmp_path / "q.notanumber", addx(b"junk"))
    write(tmp_path / "q.12", addx(b"a"))
    write(tmp_path / "q", addx(b"b"))
    assert journal_files(str(tmp_path), "q") == ["q.12", "q"]
    assert datas(replay_queue(str(tmp_path), "q").items) == [b"a", b"b"]
    assert (tmp_path / "q.notanumber").exists()


# -- broken files ------------------------------------------------------------------------------

def test_torn_tail_at_every_offset_is_cut_and_the_rest_kept(tmp_path):
    good = addx(b"one") + xid_record(9, 1) + addx(b"two")
    last = encode_continue(1, Item(b"three", 3, 0))
    for cut in range(1, len(last)):
        path = tmp_path / "q"
        path.write_bytes(good + last[:cut])
        result = replay_queue(str(tmp_path), "q")
        assert datas(result.items) == [b"two"] and list(result.open_items) == [1], cut
        assert path.read_bytes() == good, cut
        assert result.current_size == len(good)
        assert [p.kind for _f, p in result.problems] == ["torn"]


def test_torn_tail_in_an_archive_cuts_that_file_and_replay_goes_on(tmp_path):
    archive = addx(b"a") + addx(b"b")
    write(tmp_path / "q.5", archive + addx(b"broken")[:10])
    current = write(tmp_path / "q", encode_remove(), addx(b"c"))
    result = replay_queue(str(tmp_path), "q")
    assert datas(result.items) == [b"b", b"c"]
    assert (tmp_path / "q.5").read_bytes() == archive
    assert (tmp_path / "q").read_bytes() == current


def test_corrupt_record_stops_the_file_and_keeps_a_copy(tmp_path):
    good = addx(b"a") + encode_remove_tentative(1)
    garbage = b"\x0b" + addx(b"lost")
    write(tmp_path / "q.7", good + garbage)
    write(tmp_path / "q", addx(b"b"))
    result = replay_queue(str(tmp_path), "q")
    assert datas(result.items) == [b"b"] and list(result.open_items) == [1]
    assert (tmp_path / "q.7").read_bytes() == good
    [(filename, problem)] = result.problems
    assert filename == "q.7" and problem.kind == "corrupt" and problem.offset == len(good)
    [saved] = os.listdir(tmp_path / ".corrupt")
    assert saved.startswith(f"q.7@{len(good)}.") and (tmp_path / ".corrupt" / saved).read_bytes() == garbage
    assert queue_names(str(tmp_path)) == ["q"]


@pytest.mark.parametrize("bad", [b"\x02" + struct.pack("<i", -40), b"\x02" + struct.pack("<i", 3) + b"abc",
                                 b"\x02" + struct.pack("<i", 2**31 - 1) + b"x" * 30])
def test_bad_sizes_do_not_stop_the_server(tmp_path, bad):
    write(tmp_path / "q", addx(b"kept"), bad)
    result = replay_queue(str(tmp_path), "q")
    assert datas(result.items) == [b"kept"] and (tmp_path / "q").read_bytes() == addx(b"kept")


# -- read-behind during replay (behaviour §5.8) --------------------------------------------------------

def test_replay_keeps_memory_bounded_and_says_where_to_read_behind(tmp_path):
    items = [encode_add(Item(bytes([65 + i]) * 128, i)) for i in range(20)]
    write(tmp_path / "q", *items)
    result = replay_queue(str(tmp_path), "q", max_memory_size=1024)
    assert len(result.items) == 8 and result.mem_bytes == 1024  # items 0-7 stay in memory
    assert result.length == 20 and result.bytes == 20 * 128
    assert result.read_behind == ("q", 8 * len(items[0]))


def test_replay_refills_memory_as_the_head_is_removed(tmp_path):
    records = [encode_add(Item(bytes([65 + i]) * 100, i)) for i in range(10)]
    write(tmp_path / "q.1", *records[:6])
    write(tmp_path / "q", *records[6:], encode_remove(), encode_remove(), encode_remove_tentative(1),
          encode_remove())
    full = replay_queue(str(tmp_path), "q")
    behind = replay_queue(str(tmp_path), "q", max_memory_size=300)
    assert behind.length == full.length == 6 and behind.bytes == full.bytes
    assert datas(behind.items) == datas(full.items)[:len(behind.items)]
    assert 300 <= behind.mem_bytes <= 400
    assert behind.open_items[1].data == full.open_items[1].data == b"C" * 100
    assert behind.read_behind is not None and behind.read_behind.filename == "q"


def test_replay_leaves_read_behind_when_it_catches_up(tmp_path):
    records = [encode_add(Item(bytes([65 + i]) * 100, i)) for i in range(6)]
    write(tmp_path / "q", *records, *[encode_remove()] * 5)
    result = replay_queue(str(tmp_path), "q", max_memory_size=200)
    assert result.read_behind is None and datas(result.items) == [b"F" * 100]


def test_read_behind_reads_a_file_to_where_the_replay_cut_its_torn_tail(tmp_path):
    """The read-behind cursor opens q.5 while the replay is still in it; the replay then reads
    one more add (H, counted only), finds the torn tail and cuts it. The cursor must read q.5 up
    to the cut, H included, then go on into ``q``."""
    adds = [addx(bytes([65 + i]) * 100) for i in range(8)]
    q5 = [*adds[:6], encode_remove(), encode_remove(), adds[7], adds[6][:50]]
    write(tmp_path / "q.5", *q5)
    write(tmp_path / "q", addx(b"G" * 100), *[encode_remove()] * 3)
    full = replay_queue(str(tmp_path), "q")
    write(tmp_path / "q.5", *q5)
    behind = replay_queue(str(tmp_path), "q", max_memory_size=300)
    assert datas(full.items) == [b"F" * 100, b"H" * 100, b"G" * 100]
    assert datas(behind.items) == datas(full.items) and behind.length == 3
    assert behind.mem_bytes == 300 and behind.read_behind == ("q", len(adds[0]))  # G read; memory full
    assert (tmp_path / "q.5").read_bytes() == b"".join(q5[:-1])


# -- damage in the middle: told from a torn tail, cut out, the records after it kept -----------

NOW = 1_700_000_000_000


def real(data: bytes, n: int = 0) -> bytes:
    """An ADDX record with a real add time (resync only trusts a plausible one)."""
    return addx(data, NOW + n)


def test_an_impossible_opcode_in_the_middle_is_cut_out_and_the_rest_replayed(tmp_path):
    before = real(b"a") + real(b"b") + encode_remove_tentative(1)
    damage = b"\x0b\x00garbage"
    after = real(b"c", 1) + encode_confirm_remove(1) + real(b"d", 2)
    write(tmp_path / "q", before, damage, after)
    result = replay_queue(str(tmp_path), "q", now_ms=NOW)
    assert datas(result.items) == [b"b", b"c", b"d"] and result.open_items == {}
    assert (tmp_path / "q").read_bytes() == before + after
    assert result.current_size == len(before + after)
    [(filename, problem)] = result.problems
    assert filename == "q" and problem.kind == "corrupt" and problem.offset == len(before)
    [saved] = os.listdir(tmp_path / ".corrupt")
    assert saved.startswith(f"q@{len(before)}.") and (tmp_path / ".corrupt" / saved).read_bytes() == damage
    assert not [f for f in os.listdir(tmp_path) if "~~" in f]


def test_a_size_running_past_later_records_is_damage_not_a_torn_tail(tmp_path):
    records = [real(b"item %d" % i, i) for i in range(8)]
    broken = bytearray(records[3])
    struct.pack_into("<i", broken, 1, 10_000)  # past every later record, within no record
    write(tmp_path / "q.5", *records[:3], bytes(broken), *records[4:])
    write(tmp_path / "q", real(b"current", 9))
    result = replay_queue(str(tmp_path), "q", now_ms=NOW)
    assert datas(result.items) == [b"item %d" % i for i in (0, 1, 2, 4, 5, 6, 7)] + [b"current"]
    assert (tmp_path / "q.5").read_bytes() == b"".join(records[:3] + records[4:])
    [saved] = os.listdir(tmp_path / ".corrupt")
    assert (tmp_path / ".corrupt" / saved).read_bytes() == bytes(broken)


def test_two_damaged_stretches_are_both_cut_out(tmp_path):
    parts = [real(b"a"), b"\xff" * 7, real(b"b", 1) + real(b"c", 2) + real(b"d", 3) + real(b"e", 4),
             b"\x0c\x0d", real(b"f", 5)]
    write(tmp_path / "q", *parts)
    result = replay_queue(str(tmp_path), "q", now_ms=NOW)
    assert datas(result.items) == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert (tmp_path / "q").read_bytes() == parts[0] + parts[2] + parts[4]
    assert len(result.problems) == 2 and len(os.listdir(tmp_path / ".corrupt")) == 2


def test_a_torn_tail_with_real_timestamps_is_still_only_cut(tmp_path):
    good = real(b"one") + real(b"two", 1)
    write(tmp_path / "q", good, real(b"three" * 100, 2)[:300])
    result = replay_queue(str(tmp_path), "q", now_ms=NOW)
    assert datas(result.items) == [b"one", b"two"] and (tmp_path / "q").read_bytes() == good
    assert [p.kind for _f, p in result.problems] == ["torn"]
    assert not (tmp_path / ".corrupt").exists()


def test_resync_under_read_behind_gives_the_same_queue(tmp_path):
    records = [real(bytes([65 + i]) * 100, i) for i in range(12)]
    damaged = b"".join(records[:5]) + b"\x0f" * 9 + b"".join(records[5:]) + encode_remove() * 3
    write(tmp_path / "q", damaged)
    full = replay_queue(str(tmp_path), "q", now_ms=NOW)
    write(tmp_path / "q", damaged)
    behind = replay_queue(str(tmp_path), "q", now_ms=NOW, max_memory_size=300)
    assert full.length == behind.length == 9 and behind.read_behind is not None
    assert datas(behind.items) == datas(full.items)[:len(behind.items)]
    assert datas(full.items) == [bytes([65 + i]) * 100 for i in range(3, 12)]


def test_a_pipe_named_like_an_archive_is_never_opened(tmp_path):
    write(tmp_path / "q", real(b"kept"))
    os.mkfifo(tmp_path / "q.3000")
    os.mkfifo(tmp_path / "p")
    assert journal_files(str(tmp_path), "q") == ["q"] and queue_names(str(tmp_path)) == ["q"]
    assert datas(replay_queue(str(tmp_path), "q").items) == [b"kept"]
    assert datas(replay_queue(str(tmp_path), "p").items) == []  # the queue's own path: skipped
