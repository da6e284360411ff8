"""Hostile entries in a data directory (issue 53, points 3 and 4), against real processes.

Nothing outside the data directory is ever written: a journal that is a symbolic link is not
followed, by ``serve`` or by ``journal pack``; a named pipe in a journal's place stops neither
``serve`` nor the offline tools (one line, exit 1, nothing changed). A record that claims more
data than the largest item allowed is damage, set aside without being read into memory.
"""

from __future__ import annotations

import os
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kestrel_actors.journal._format import OP_ADDX

from ..helpers import ServerProcess, write_config

pytestmark = pytest.mark.timeout(180)

NOW_MS = int(time.time() * 1000)
GIB = 1 << 30


def addx(data: bytes) -> bytes:
    return struct.pack("<biqq", OP_ADDX, len(data) + 16, NOW_MS, 0) + data


def cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
    """``kestrel-actors ARGS`` in its own process: a command that blocks fails the test by
    ``TimeoutExpired`` instead of hanging it."""
    return subprocess.run([sys.executable, "-m", "kestrel_actors.cli", *args],
                          capture_output=True, timeout=timeout, check=False)


def entries(directory: Path) -> dict[str, tuple[int, bytes | str | None]]:
    """Every entry of ``directory`` (the lock file aside): its type, and a regular file's bytes
    or a symbolic link's target."""
    found: dict[str, tuple[int, bytes | str | None]] = {}
    for name in os.listdir(directory):
        if name == ".lock":
            continue
        path = directory / name
        mode = os.lstat(path).st_mode
        content: bytes | str | None = None
        if stat.S_ISREG(mode):
            content = path.read_bytes()
        elif stat.S_ISLNK(mode):
            content = os.readlink(path)
        found[name] = (stat.S_IFMT(mode), content)
    return found


def events(server: ServerProcess, prefix: str) -> list[dict]:
    return [e for e in server.log_events() if str(e.get("event", "")).startswith(prefix)]


# -- point 3: nothing outside the data directory is ever written -------------------------------

def test_a_symlinked_journal_is_never_written_through_by_serve(tmp_path, started):
    outside = tmp_path / "outside"
    outside.mkdir()
    target, archive_target = outside / "q-journal", outside / "r-archive"
    target.write_bytes(addx(b"one") + addx(b"two"))
    archive_target.write_bytes(addx(b"archived"))
    before = entries(outside)
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(target, data / "q")               # the current journal of q
    os.symlink(archive_target, data / "r.1000")  # an archive of r
    (data / "r").write_bytes(addx(b"kept"))

    server = started(data)
    c = server.client()
    assert c.get("r") == b"kept" and c.get("r") is None  # the link named like an archive is not read
    assert c.set("r", b"new") == b"STORED" and c.get("r") == b"new"
    assert c.set("good", b"x") == b"STORED" and c.get("good") == b"x"
    c.send(b"set q 0 0 5\r\nhello\r\n")
    c.read_line()  # whatever the queue answers, nothing may reach the link's target
    c.close()
    assert server.stop() == 0

    assert entries(outside) == before  # byte for byte
    assert os.readlink(data / "q") == str(target) and os.readlink(data / "r.1000") == str(archive_target)
    skipped = {e["file"]: e["kind"] for e in events(server, "ignoring something in the journal directory")}
    assert skipped == {"q": "a symbolic link", "r.1000": "a symbolic link"}


def test_journal_pack_refuses_a_symlinked_journal_and_changes_nothing(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    # a damaged tail, which pack would cut: through the link, that cut would land outside
    (outside / "q-journal").write_bytes(addx(b"one") + addx(b"two")[:9])
    (outside / "q-archive").write_bytes(addx(b"old"))
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(outside / "q-journal", data / "q")
    (data / "p.1000").write_bytes(addx(b"archived"))
    os.symlink(outside / "q-archive", data / "p")
    before, before_data = entries(outside), entries(data)

    for queue in ("q", "p"):
        result = cli("journal", "pack", queue, "--data-dir", str(data))
        assert result.returncode == 1, result
        assert result.stdout == b""
        [line] = result.stderr.decode().splitlines()
        assert "symbolic link" in line and "nothing was changed" in line, line
        assert entries(outside) == before and entries(data) == before_data


def test_a_named_pipe_journal_stops_neither_serve_nor_the_offline_tools(tmp_path, started):
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "p")                       # p's current journal
    (data / "q.1000").write_bytes(addx(b"archived"))
    os.mkfifo(data / "q")                       # q's current journal, after a real archive
    (data / "r").write_bytes(addx(b"kept"))
    before = entries(data)

    for queue in ("p", "q"):
        result = cli("journal", "pack", queue, "--data-dir", str(data))
        assert result.returncode == 1, result
        [line] = result.stderr.decode().splitlines()
        assert "named pipe" in line and "nothing was changed" in line, line
        assert b"Traceback" not in result.stdout + result.stderr
        assert entries(data) == before  # nothing renamed, nothing created

    result = cli("journal", "dump", str(data / "p"), timeout=30)
    assert result.returncode == 1 and result.stdout == b""
    [line] = result.stderr.decode().splitlines()
    assert "named pipe" in line, line
    assert entries(data) == before

    server = started(data, timeout=30)
    c = server.client()
    assert c.get("r") == b"kept"
    assert c.set("r", b"new") == b"STORED" and c.get("r") == b"new"
    c.close()
    assert entries(data)["p"][0] == stat.S_IFIFO and entries(data)["q.1000"] == before["q.1000"]


def test_damage_is_never_saved_through_a_linked_corrupt_directory(tmp_path, started):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(elsewhere, data / ".corrupt")
    (data / "q").write_bytes(addx(b"before") + b"\xee" * 100 + addx(b"a") + addx(b"b") + addx(b"c") + addx(b"d"))

    server = started(data)
    c = server.client()
    assert [c.get("q") for _ in range(6)] == [b"before", b"a", b"b", b"c", b"d", None]
    c.close()
    assert os.listdir(elsewhere) == []
    [error] = events(server, "damaged journal record")
    assert error["saved_to"] is None and error["damaged_bytes"] == 100


def test_the_status_file_is_neither_followed_nor_waited_on(tmp_path, started):
    """The status file lives in the data directory too (``.kestrel/status``): a named pipe in
    its place is not waited on, and a link where its new copy is written is not written
    through."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    data = tmp_path / "data"
    (data / ".kestrel").mkdir(parents=True)
    os.mkfifo(data / ".kestrel" / "status")
    os.symlink(victim, data / ".kestrel" / "status~~tmp")

    server = started(data, timeout=30)
    [unread] = events(server, "cannot read the stored status")
    assert "not a regular file" in unread["error"], unread
    c = server.client()
    assert c.call(b"status ReadOnly") == b"END"
    c.close()
    assert victim.read_bytes() == b"precious\n"
    assert (data / ".kestrel" / "status").read_text() == "ReadOnly\n"
    assert not os.path.lexists(data / ".kestrel" / "status~~tmp")


# -- point 4: a record claiming 2 GiB in a sparse 4 GiB file -------------------------------------

def _sparse_journal(path: Path) -> tuple[bytes, int]:
    """An ADDX that claims 2 GiB of data at offset 0, a hole, and two whole records ending the
    4 GiB file: returns those two records and their offset."""
    claim = struct.pack("<biqq", OP_ADDX, 2 * GIB - 1, NOW_MS, 0)
    after = addx(b"after one") + addx(b"after two")
    offset = 4 * GIB - len(after)
    with open(path, "wb") as file:
        file.write(claim)
        file.seek(offset)
        file.write(after)
    return after, offset


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _dump_peak_rss_kib(path: Path) -> int:
    """The peak RSS of one ``journal dump PATH``, read by a fresh parent whose only child it is
    (this process's ``RUSAGE_CHILDREN`` also holds every server the run has waited for)."""
    measure = ("import resource, subprocess, sys; "
               "subprocess.run([sys.executable, '-m', 'kestrel_actors.cli', 'journal', 'dump', sys.argv[1]], "
               "capture_output=True, timeout=60); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    result = subprocess.run([sys.executable, "-c", measure, str(path)], capture_output=True, timeout=90, check=True)
    return int(result.stdout)


def test_a_record_claiming_2_gib_is_damage_set_aside_and_the_items_after_it_are_served(tmp_path, started):
    data = tmp_path / "data"
    data.mkdir()
    after, offset = _sparse_journal(data / "q")

    result = cli("journal", "dump", str(data / "q"), timeout=60)
    assert result.returncode == 1
    assert b"is corrupt at offset 0" in result.stderr and b"more than the largest item allowed" in result.stderr
    assert _dump_peak_rss_kib(data / "q") < 300 * 1024  # no 2 GiB read

    server = started(data, timeout=15)  # a generous deadline; it took 37 s
    c = server.client()
    assert c.get("q") == b"after one" and c.get("q") == b"after two" and c.get("q") is None
    assert c.set("q", b"later") == b"STORED" and c.get("q") == b"later"
    c.close()
    assert server.proc is not None
    assert _peak_rss_kib(server.proc.pid) < 300 * 1024  # it peaked at 2.1 GiB
    [error] = events(server, "damaged journal record")
    assert error["offset"] == 0 and error["resumed_at"] == offset and error["items_after"] == 2
    assert error["damaged_bytes"] == offset and "largest item allowed" in error["reason"]
    assert (data / "q").stat().st_size <= len(after) + 2 * (21 + len(b"later"))



def test_lowering_a_queues_max_item_size_never_turns_stored_items_into_damage(tmp_path, started):
    """Replay's bound is the server's ``max_item_bytes``, not the queue's reloadable
    ``max_item_size``: an operator who lowers it to refuse new large items keeps the large items
    already stored across a restart (they are served, nothing goes to ``.corrupt/``)."""
    data = tmp_path / "data"
    big = b"b" * 100_000
    server = started(data)
    c = server.client()
    assert c.set("q", big) == b"STORED" and c.set("q", b"small") == b"STORED"
    c.close()
    server.stop(signal.SIGKILL)

    config = write_config(tmp_path, '[queues."q"]\nmax_item_size = 1000\n')
    server = started(data, "--config", config)
    c = server.client()
    assert c.set("q", big) == b"NOT_STORED"  # the lowered limit holds for new items
    assert c.get("q") == big and c.get("q") == b"small" and c.get("q") is None
    c.close()
    assert not events(server, "damaged journal record")
    assert not (data / ".corrupt").exists() or not os.listdir(data / ".corrupt")
