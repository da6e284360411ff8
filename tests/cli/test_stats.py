"""``kestrel-actors stats``: one reading, a refreshing --watch under a terminal, and errors; sorted,
filtered, with the oldest item's age, and cut to the terminal's height."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable

from ..helpers import create_queues, free_port


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


def watch_in_terminal(port: int, *args: str, lines: int = 40, columns: int = 120,
                      on_output: Callable[[bytes], None] | None = None) -> str:
    """Everything ``stats --watch`` draws on a pseudo-terminal of ``lines`` × ``columns``
    (``on_output`` sees what has arrived so far after each read)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    env = {key: value for key, value in os.environ.items() if key not in ("LINES", "COLUMNS")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kestrel_actors.cli", "stats", "--port", str(port), "--watch", *args],
        stdin=follower, stdout=follower, stderr=follower, env=dict(env, TERM="xterm"),
    )
    os.close(follower)
    output = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command has ended
            break
        if not chunk:
            break
        output += chunk
        if on_output is not None:
            on_output(output)
    os.close(leader)
    assert proc.wait(timeout=30) == 0
    return output.decode(errors="replace")


def test_watch_refreshes_in_place_under_a_terminal(admin_server):
    client = admin_server.client()
    client.set("watched", b"x")
    changed = []

    def change_once(output: bytes) -> None:
        # Once only: a first frame can arrive in several chunks, and each would add another item.
        if not changed and b"watched" in output:
            client.set("watched", b"y")  # the next refreshes show 2
            changed.append(True)

    text = watch_in_terminal(admin_server.admin_port, "--interval", "0.3", "--count", "4", on_output=change_once)
    assert text.count("watched") >= 3  # redrawn at each refresh
    assert "\x1b[" in text  # cursor movement: drawn in place, not appended
    last = [cell.strip() for cell in text[text.rindex("watched"):].split("\n")[0].split("│")]
    assert last[1] == "2"  # the SET made while watching


def test_an_unreachable_server_is_an_error(tmp_path):
    result = run_stats("--port", str(free_port()))
    assert result.returncode == 3  # failed, not "nothing there" (1) or a usage error (2)
    assert "cannot read" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback


# -- sort, filter, the oldest item and the terminal's height (issue 26, points 5 and 6) -------


def table_rows(text: str, prefix: str) -> list[list[str]]:
    """The cells of the table's rows whose queue name starts with ``prefix``, top to bottom
    (the titles too, with ``prefix`` empty: rich draws their line with ``┃``)."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in re.split("[│┃]", line)[1:-1]]
        if cells and cells[0].startswith(prefix):
            rows.append(cells)
    return rows


def test_one_reading_sorts_filters_and_shows_the_oldest_item(admin_server):
    client = admin_server.client()
    assert client.set("sorted_old", b"x") == b"STORED"
    time.sleep(1.1)
    for name, count in (("sorted_few", 1), ("sorted_many", 5), ("sorted_old", 2), ("elsewhere", 9)):
        for _ in range(count):
            assert client.set(name, b"x") == b"STORED"
    port = ("--port", str(admin_server.admin_port))

    by_items = run_stats(*port, "--sort", "items", "--filter", "SORTED_")
    assert by_items.returncode == 0, by_items.stderr
    rows = table_rows(by_items.stdout, "")
    assert [row[0] for row in rows[1:]] == ["sorted_many", "sorted_old", "sorted_few"]  # rows[0]: titles
    assert rows[0][:4] == ["Queue", "Items", "Bytes", "Oldest"]
    assert "elsewhere" not in by_items.stdout
    oldest = {row[0]: row[3] for row in rows[1:]}
    assert oldest["sorted_old"].endswith(" s") and float(oldest["sorted_old"].split()[0]) >= 1.0

    reversed_ = run_stats(*port, "--sort", "items", "-r", "--filter", "sorted_")
    assert [row[0] for row in table_rows(reversed_.stdout, "sorted_")] == ["sorted_few", "sorted_old", "sorted_many"]
    by_oldest = run_stats(*port, "--sort", "oldest")
    assert table_rows(by_oldest.stdout, "")[1][0] == "sorted_old"
    by_name = run_stats(*port, "--sort", "queue", "--reverse")
    assert [row[0] for row in table_rows(by_name.stdout, "")[1:]] == [
        "sorted_old", "sorted_many", "sorted_few", "elsewhere"]

    nothing = run_stats(*port, "--filter", "nosuch")
    assert nothing.returncode == 0 and "no queue matches the filter" in nothing.stdout
    bad = run_stats(*port, "--sort", "colour")
    assert bad.returncode == 2 and "colour" in bad.stderr


def watch_once(port: int, lines: int, columns: int, *args: str) -> str:
    """The last ``--watch`` frame drawn on a pseudo-terminal of ``lines`` × ``columns``, as text."""
    text = watch_in_terminal(port, "--count", "1", *args, lines=lines, columns=columns)
    last = text.rsplit("\x1b[1A", 1)[-1]  # rich's Live moves the cursor up over a frame to redraw it
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", last).replace("\r", "")


def test_watch_fits_the_terminal_and_counts_the_queues_left_out(admin_server):
    names = [f"fit{number:02d}" for number in range(60)]
    create_queues(admin_server, names)
    frame = watch_once(admin_server.admin_port, 24, 120)
    drawn = [line for line in frame.split("\n") if line.strip()]
    assert len(drawn) < 24  # nothing scrolled off the top
    rows = [row[0] for row in table_rows(frame, "fit")]
    assert 5 <= len(rows) < 24
    assert rows == names[: len(rows)]  # the first by name
    assert f"{60 - len(rows)} more (not shown)" in frame

    taller = watch_once(admin_server.admin_port, 60, 120)
    assert len(table_rows(taller, "fit")) > len(rows)

    filtered = watch_once(admin_server.admin_port, 24, 120, "--filter", "fit5", "--sort", "queue", "-r")
    assert [row[0] for row in table_rows(filtered, "fit")] == [f"fit5{digit}" for digit in range(9, -1, -1)]
    assert "more (not shown)" not in filtered
