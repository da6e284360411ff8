"""``kestrel-actors stats``: one reading, a refreshing --watch under a terminal, and errors."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time

from ..helpers import free_port


def run_stats(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "stats", *args],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, COLUMNS="120"))


def test_one_reading_shows_every_queue_with_its_items(admin_server):
    client = admin_server.client()
    for _ in range(7):
        client.set("cli_jobs", b"payload")
    client.set("cli_other", b"x")
    result = run_stats("--host", admin_server.host, "--port", str(admin_server.admin_port))
    assert result.returncode == 0, result.stderr
    rows = {}
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0].startswith("cli_"):
            rows[cells[0]] = cells
    assert rows["cli_jobs"][1] == "7"
    assert rows["cli_other"][1] == "1"
    assert "Up" in result.stdout and "connections 1" in result.stdout


def test_watch_refreshes_in_place_under_a_terminal(admin_server):
    client = admin_server.client()
    client.set("watched", b"x")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kestrel_actors.cli", "stats", "--port", str(admin_server.admin_port),
         "--watch", "--interval", "0.3", "--count", "4"],
        stdin=follower, stdout=follower, stderr=follower, env=dict(os.environ, TERM="xterm", COLUMNS="120"),
    )
    os.close(follower)
    output = b""
    changed = False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command has ended
            break
        if not chunk:
            break
        output += chunk
        # Once only: a first frame can arrive in several chunks, and each would add another item.
        if not changed and b"watched" in output:
            client.set("watched", b"y")  # the next refreshes show 2
            changed = True
    os.close(leader)
    assert proc.wait(timeout=30) == 0
    text = output.decode(errors="replace")
    assert text.count("watched") >= 3  # redrawn at each refresh
    assert "\x1b[" in text  # cursor movement: drawn in place, not appended
    last = [cell.strip() for cell in text[text.rindex("watched"):].split("\n")[0].split("│")]
    assert last[1] == "2"  # the SET made while watching


def test_an_unreachable_server_is_an_error(tmp_path):
    result = run_stats("--port", str(free_port()))
    assert result.returncode == 3  # failed, not "nothing there" (1) or a usage error (2)
    assert "cannot read" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback
