"""``kestrel-actors journal dump`` and ``journal pack``."""

from __future__ import annotations

import os

from click.testing import CliRunner

from kestrel_actors.cli import main
from kestrel_actors.journal import Item, replay_queue
from kestrel_actors.journal._format import (
    encode_add,
    encode_confirm_remove,
    encode_continue,
    encode_legacy_remove_tentative,
    encode_remove,
    encode_remove_tentative,
    encode_save_xid,
    encode_unremove,
)


def run(*args: str):
    return CliRunner().invoke(main, ["journal", *args], catch_exceptions=False)


def test_dump_describes_each_operation(tmp_path):
    path = tmp_path / "q"
    path.write_bytes(
        encode_add(Item(b"hello world", 1))
        + encode_add(Item(b"two", 1, 1))
        + encode_add(Item(b"three", 1, 10**14))
        + encode_remove()
        + encode_remove_tentative(1)
        + encode_confirm_remove(1)
        + encode_remove_tentative(2)
        + encode_unremove(2)
        + encode_save_xid(7)
        + encode_legacy_remove_tentative()
        + encode_continue(8, Item(b"c", 1))
    )
    result = run("dump", str(path))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"Queue: {path}"
    assert lines[1] == "00000000  ADD 11    "
    assert lines[2] == "00000020  ADD 3      expired"
    assert lines[3].startswith("00000038  ADD 5      exp=")
    assert lines[4:12] == ["00000052  REM", "00000053  RSV 1", "00000058  ACK 1", "0000005d  RSV 2",
                           "00000062  CAN 2", "00000067  XID 7", "0000006c  RSV 8", "0000006d  CON 1      xid=8"]
    assert lines[-3:] == ["Journal size: 135 bytes, with 11 operations.", "1 items totalling 1 bytes.",
                          "0 of them open (reserved), 1 queued."]


def test_dump_quiet_data_and_raw(tmp_path):
    path = tmp_path / "q"
    path.write_bytes(encode_add(Item(b"abc", 1)) + encode_add(Item(b"de", 1)) + encode_remove_tentative(1))
    quiet = run("dump", "-q", str(path))
    assert "ADD" not in quiet.output and "2 items totalling 5 bytes." in quiet.output
    assert "1 of them open (reserved), 1 queued." in quiet.output
    shown = run("dump", "-d", str(path))
    assert "    abc" in shown.output.splitlines()
    raw = CliRunner().invoke(main, ["journal", "dump", "-A", str(path)])
    assert raw.stdout_bytes == b"abcde"


def test_dump_reports_a_broken_tail_without_touching_the_file(tmp_path):
    path = tmp_path / "q"
    blob = encode_add(Item(b"abc", 1)) + encode_add(Item(b"lost", 1))[:7]
    path.write_bytes(blob)
    result = run("dump", str(path), str(tmp_path / "missing"))
    assert result.exit_code == 1
    assert "00000000  ADD 3" in result.output and "ends inside a record at offset 24" in result.output
    assert "Can't open journal file" in result.output
    assert path.read_bytes() == blob


def test_pack_compacts_a_stopped_queue_into_one_file(tmp_path):
    (tmp_path / "q.100").write_bytes(b"".join(encode_add(Item(b"old %d" % i, i)) for i in range(50))
                                     + encode_remove() * 45)
    (tmp_path / "q.200").write_bytes(encode_remove_tentative(1) + encode_add(Item(b"new", 9)))
    (tmp_path / "q").write_bytes(encode_remove() + encode_add(Item(b"newer", 10)) + encode_add(Item(b"x", 1))[:9])
    (tmp_path / "q~~5").write_bytes(b"temp")
    (tmp_path / "other").write_bytes(encode_add(Item(b"untouched", 1)))
    expected = replay_queue(str(tmp_path), "q")  # (this also cuts the torn tail, as pack does)
    result = run("pack", "q", "--data-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "Packed 'q'" in result.output
    assert sorted(os.listdir(tmp_path)) == [".lock", "other", "q"]  # the lock file stays (issue 21.1)
    after = replay_queue(str(tmp_path), "q")
    assert [i.data for i in after.items] == [i.data for i in expected.items] == [
        b"old 47", b"old 48", b"old 49", b"new", b"newer"]
    assert {x: i.data for x, i in after.open_items.items()} == {1: b"old 45"}
    kept = (b"old 45", b"old 47", b"old 48", b"old 49", b"new", b"newer")
    assert os.path.getsize(tmp_path / "q") == sum(21 + len(d) for d in kept) + 5


def test_pack_refuses_unknown_queues(tmp_path):
    assert run("pack", "nope", "--data-dir", str(tmp_path)).exit_code == 1
    assert CliRunner().invoke(main, ["journal", "pack", "a.b", "--data-dir", str(tmp_path)]).exit_code == 2
