"""One server per data directory (issue 21.1): ``serve`` locks its data directory for its whole
life, a second ``serve`` and ``journal pack`` are refused at once, and the kernel frees the
lock on any exit, SIGKILL included."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import REPO, free_port

COMMAND_PATIENCE = 60.0
"""Seconds a refused command may take (about 0.5 s on an idle machine, start-up of the
interpreter included; a loaded one takes longer): a command that waited for the lock would never
end, and ``subprocess.run`` raises ``TimeoutExpired``."""


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kestrel_actors.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=COMMAND_PATIENCE)


def second_serve(data_dir: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    port = free_port()
    result = run_cli("serve", "--host", "127.0.0.1", "--port", str(port), "--text-port", "0",
                     "--thrift-port", "0", "--admin-port", "0", "--data-dir", str(data_dir),
                     "--log-format", "json")
    return result, port


def files_state(data_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``data_dir`` (the lock file too): its bytes and its mtime in ns."""
    state = {}
    for path in sorted(data_dir.rglob("*")):
        if path.is_file():
            state[str(path.relative_to(data_dir))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return state


def refusal_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def assert_refused(result: subprocess.CompletedProcess[str], data_dir: Path, pid: int) -> None:
    """Exit 1 (not a wait for the lock), one line on stderr naming the directory and the lock's
    holder."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    line = refusal_line(result)
    assert str(data_dir) in line and f"pid {pid}" in line, line


def test_a_second_serve_on_the_same_data_dir_exits_1_naming_the_dir_and_the_holder(make_server, tmp_path):
    data_dir = tmp_path / "data"
    first = make_server(data_dir=data_dir)
    client = first.client()
    assert client.set("jobs", b"one") == b"STORED"
    result, port = second_serve(data_dir)
    assert_refused(result, data_dir, first.proc.pid)
    assert result.stdout == ""  # nothing was started, nothing logged
    # it never listened, and the first server serves on, its item still there once
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    assert client.get("jobs") == b"one"
    assert client.get("jobs") is None


def test_after_a_sigkill_a_new_serve_starts_at_once(make_server, tmp_path):
    data_dir = tmp_path / "data"
    server = make_server(data_dir=data_dir)
    assert server.client().set("jobs", b"kept") == b"STORED"
    server.stop(signal.SIGKILL)
    assert (data_dir / ".lock").exists()  # the file stays; the kernel dropped the lock
    server.start()  # within its start-up patience: no wait for a stale lock to time out
    client = server.client()
    assert client.get("jobs") == b"kept"
    assert (data_dir / ".lock").read_text() == f"{server.proc.pid}\n"
    assert not [name for name in client.stats() if "lock" in name]  # the lock file is no queue


def test_journal_pack_refuses_a_live_directory_and_changes_nothing(make_server, tmp_path):
    data_dir = tmp_path / "data"
    server = make_server(data_dir=data_dir)
    client = server.client()
    for n in range(50):
        assert client.set("jobs", b"item-%d" % n) == b"STORED"
    for _ in range(20):
        assert client.get("jobs") is not None
    before = files_state(data_dir)
    assert "jobs" in before
    result = run_cli("journal", "pack", "jobs", "--data-dir", str(data_dir))
    assert_refused(result, data_dir, server.proc.pid)
    assert files_state(data_dir) == before
    assert client.get("jobs") == b"item-20"  # the server goes on as if nothing happened
    client.close()
    server.stop()
    # stopped, the directory is free: pack works, and the queue's items survive it
    result = run_cli("journal", "pack", "jobs", "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stderr
    client = server.start().client()
    assert [client.get("jobs") for _ in range(30)] == [b"item-%d" % n for n in range(21, 50)] + [None]


def test_a_serve_started_while_a_pack_holds_the_directory_is_refused(tmp_path):
    """The lock is one rule for both: whichever comes second is refused, naming the first."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    code = (
        "import sys, time\n"
        "from kestrel_actors.journal import lock_data_dir\n"
        "lock_data_dir(sys.argv[1])\n"
        "print('locked', flush=True)\n"
        "time.sleep(2 * 60)\n"  # longer than a refused serve may take
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(data_dir)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        result, _port = second_serve(data_dir)
        assert_refused(result, data_dir, holder.pid)
    finally:
        holder.kill()
        holder.wait()
    assert os.listdir(data_dir) == [".lock"]


def test_a_lock_file_that_is_not_a_file_stops_serve_with_one_line(tmp_path):
    data_dir = tmp_path / "data"
    (data_dir / ".lock").mkdir(parents=True)
    result, _port = second_serve(data_dir)
    assert result.returncode == 1
    line = refusal_line(result)
    assert line.startswith(f"kestrel-actors serve: cannot lock data directory {data_dir}: "), line
