"""Checkpoints (behaviour §6.8), in the journal room: a queue replayed from its checkpoint and the
journal after it holds exactly what a full replay of the same files gives, in the same order,
across removes, reads opened, given back and confirmed, items put back, expiry, rotations and
rewrites after the checkpoint; a rewrite deletes a checkpoint that names the files it replaces."""

from __future__ import annotations

import base64
import json
import os
import shutil
import zlib

import gevent
import pytest

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import open_file_journal, replay_queue
from kestrel_actors.journal._checkpoint import Checkpoint, CheckpointFile, decode, encode
from kestrel_actors.queue import Item, QueueCore

CONFIG = QueueConfig(max_memory_size=16 * 1024, default_journal_size=8 * 1024, max_journal_size=1 << 30)
NOW = 1_700_000_000_000


def _open(data_dir: str) -> QueueCore:
    journal, state = open_file_journal(data_dir, "q", CONFIG, read_behind=True, now_ms=NOW)
    core = QueueCore("q", CONFIG, journal)
    core.restore(state)
    return core


def _drain(data_dir: str) -> list[tuple[bytes, int]]:
    def run() -> list[tuple[bytes, int]]:
        core = _open(data_dir)
        out = []
        while (item := core.remove(NOW + 10_000)) is not None:
            out.append((item.data, item.expiry))
        core.journal.close()
        return out
    return gevent.spawn(run).get()


def _work(core: QueueCore, start: int, count: int) -> None:
    """Adds (a few expiring), plain removes, reads opened, given back, confirmed, a put back."""
    opened = []
    for i in range(start, start + count):
        core.add(b"%08d" % i + b"." * 92, NOW + 5_000 if i % 41 == 3 else 0, NOW)
        if i % 5 == 0:
            core.remove(NOW)
        if i % 7 == 0:
            item = core.remove(NOW, transactional=True)
            if item is not None:
                opened.append(item.xid)
        if i % 11 == 0 and opened:
            core.unremove(opened.pop(0))
        if i % 13 == 0 and opened:
            core.confirm(opened.pop())
        if i % 97 == 0:
            item = core.remove(NOW)
            if item is not None:
                core.put_back(item)


def _crash(core: QueueCore) -> None:
    """What a SIGKILL leaves: every record written (not closed, no checkpoint at close)."""
    core.journal.flush()


def _compare(tmp_path, data_dir: str) -> dict:
    full = str(tmp_path / "full")
    shutil.copytree(data_dir, full)
    shutil.rmtree(os.path.join(full, ".checkpoint"))
    from_checkpoint = replay_queue(data_dir, "q", max_memory_size=CONFIG.max_memory_size, now_ms=NOW)
    whole = replay_queue(full, "q", max_memory_size=CONFIG.max_memory_size, now_ms=NOW)
    assert from_checkpoint.from_checkpoint and not whole.from_checkpoint
    assert from_checkpoint.replayed_bytes < whole.replayed_bytes
    for field in ("length", "bytes", "xid", "total_items"):
        assert getattr(from_checkpoint, field) == getattr(whole, field), field
    assert sorted(from_checkpoint.open_items) == sorted(whole.open_items)
    drained = _drain(data_dir)
    assert drained == _drain(full) and len(drained) > 100
    return {"checkpoint": from_checkpoint, "full": whole}


def test_checkpoint_and_tail_replay_as_a_full_replay(tmp_path):
    data_dir = str(tmp_path / "data")
    os.mkdir(data_dir)

    def run() -> None:
        core = _open(data_dir)
        _work(core, 0, 3000)  # rotations, read-behind, a checkpoint at each rotation
        assert core.journal.checkpoints > 0
        _work(core, 3000, 100)
        _crash(core)
    gevent.spawn(run).get()
    _compare(tmp_path, data_dir)


def test_an_explicit_checkpoint_then_rotations_after_it(tmp_path):
    data_dir = str(tmp_path / "data")
    os.mkdir(data_dir)
    saved = str(tmp_path / "saved")

    def run() -> None:
        core = _open(data_dir)
        _work(core, 0, 1000)
        assert core.journal.checkpoint(core)
        shutil.copy(os.path.join(data_dir, ".checkpoint", "q"), saved)
        _work(core, 1000, 2000)
        assert core.journal.rotations > 0
        _crash(core)
    gevent.spawn(run).get()
    shutil.copy(saved, os.path.join(data_dir, ".checkpoint", "q"))
    _compare(tmp_path, data_dir)


def test_a_rewrite_deletes_the_checkpoint_and_the_next_one_starts_from_it(tmp_path):
    data_dir = str(tmp_path / "data")
    os.mkdir(data_dir)

    def run() -> None:
        core = _open(data_dir)
        _work(core, 0, 300)
        assert core.journal.checkpoint(core)
        core.flush(NOW)
        for xid in list(core.open_reads):
            core.confirm(xid)
        for word in (b"open", b"also", b"kept"):
            core.add(word * 25, 0, NOW)
        core.remove(NOW, transactional=True)
        core.remove(NOW, transactional=True)
        assert core.journal.rewrite(core)  # every file replaced by one: two reads open, an item
        assert not os.path.exists(os.path.join(data_dir, ".checkpoint", "q"))
        _work(core, 300, 400)
        assert core.journal.rotations > 0
        assert core.journal.checkpoint(core)
        _work(core, 700, 50)
        _crash(core)
    gevent.spawn(run).get()
    _compare(tmp_path, data_dir)


def test_a_checkpoint_waits_while_its_open_reads_outweigh_the_journal_since_the_last(tmp_path):
    """A checkpoint holds the open reads whole (behaviour §6.8): one due every 4 MiB waits while
    they take more than the journal written since the last one (ADR 0026), then is written once;
    the files replay from it to the queue a full replay gives."""
    data_dir = str(tmp_path / "data")
    os.mkdir(data_dir)
    config = QueueConfig(max_journal_size=1 << 30, default_journal_size=1 << 30)  # only periodic checkpoints

    def run() -> None:
        journal, state = open_file_journal(data_dir, "q", config, read_behind=True, now_ms=NOW)
        core = QueueCore("q", config, journal)
        core.restore(state)
        for i in range(10_000):
            assert core.add(b"%08d" % i + b"." * 992, 0, NOW)
        assert journal.checkpoint(core)  # the reads' ADDX records are before it
        written = journal.checkpoints
        held = core.open_many(NOW, 10_000, 1 << 30)  # 10.26 MB held
        assert len(held) == 10_000
        for i in range(4_200):  # 4.29 MB of ADD and REMOVE: a checkpoint is due
            assert core.add(b"p%07d" % i + b"." * 992, 0, NOW) and core.remove(NOW) is not None
        journal._wait_for_checkpoint()
        assert journal.checkpoints == written  # it would hold 10.26 MB for 4.34 written
        for i in range(6_000):  # 6.1 MB more: past the 10.26 MB it holds
            assert core.add(b"%04d" % i + b"." * 996, 0, NOW) and core.remove(NOW) is not None
        journal._wait_for_checkpoint()
        assert journal.checkpoints == written + 1
        core.add(b"last", 0, NOW)
        _crash(core)
    gevent.spawn(run).get()
    full = str(tmp_path / "full")
    shutil.copytree(data_dir, full)
    shutil.rmtree(os.path.join(full, ".checkpoint"))
    from_checkpoint = replay_queue(data_dir, "q", now_ms=NOW)
    whole = replay_queue(full, "q", now_ms=NOW)
    assert from_checkpoint.from_checkpoint and from_checkpoint.replayed_bytes < whole.replayed_bytes
    assert [item.data for item in from_checkpoint.items] == [item.data for item in whole.items] == [b"last"]
    assert ({xid: item.data for xid, item in from_checkpoint.open_items.items()}
            == {xid: item.data for xid, item in whole.open_items.items()})
    assert sorted(item.data for item in whole.open_items.values()) == [b"%08d" % i + b"." * 992 for i in range(10_000)]


def _state_with_items() -> tuple[list[bytes], Checkpoint]:
    """A checkpoint's state holding given-back items and open reads of every byte value."""
    datas = [bytes(range(256)) * 4, b"\n", b"", b"\r\nEND\r\n" * 3, os.urandom(1024)]
    front = [Item(datas[0], NOW, 0), Item(datas[1], NOW + 1, NOW + 60_000)]
    open_items = {7: Item(datas[2], NOW + 2, 0, 7), 9: Item(datas[3], NOW + 3, 0, 9), 12: Item(datas[4], NOW, 5, 12)}
    state = Checkpoint(queue="q", files=[CheckpointFile("q", 11, 4096)], tail_crc=5, head_offset=64, head_skip=2,
                       length=9, bytes=4000, xid=12, added=20, consumed=11, front=front, open_items=open_items,
                       marks=[[4096, 0, 128]])
    return datas, state


def test_a_checkpoint_keeps_its_items_bytes_as_they_are():
    """The items a checkpoint holds (given back, open: a monitor's 10,000 reads) are written as
    their bytes, not in base64 inside the JSON line, and read back the same; a changed byte of
    one of them, or a file cut short, is a damaged checkpoint."""
    datas, state = _state_with_items()
    raw = encode(state)
    assert len(raw) < sum(len(data) for data in datas) + 600  # base64 alone adds a third: 1,100 bytes
    assert decode(raw) == state
    for damaged in (raw[:600] + bytes([raw[600] ^ 1]) + raw[601:], raw[:-20] + raw[-9:]):
        with pytest.raises(ValueError):
            decode(damaged)


def test_a_version_1_checkpoint_is_still_read():
    """Version 1 (item bytes in base64 inside the JSON) is read as it was written."""
    _, state = _state_with_items()

    def item(i: Item) -> list[object]:
        return [base64.b64encode(i.data).decode("ascii"), i.add_time, i.expiry]

    body = json.dumps({
        "queue": "q", "files": [["q", 11, 4096]], "tail_crc": 5, "head_offset": 64, "head_skip": 2, "length": 9,
        "bytes": 4000, "xid": 12, "added": 20, "consumed": 11, "front": [item(i) for i in state.front],
        "open": [[xid, *item(i)] for xid, i in state.open_items.items()], "marks": [[4096, 0, 128]],
    }).encode("ascii") + b"\n"
    head = b"kestrel-checkpoint 1\n" + body
    assert decode(head + b"%08x\n" % zlib.crc32(head)) == state
