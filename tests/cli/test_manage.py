"""``kestrel-actors move|status|flush|delete`` and the command line's errors and exit codes,
through the entry point, against a real server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kestrel_actors.client import Client

from ..helpers import ServerProcess, free_port


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "kestrel_actors.cli", *args],
                          input=stdin, capture_output=True, timeout=60)


def on(server, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return run(*args, "-s", server.address, stdin=stdin)


@pytest.fixture
def limited(tmp_path):
    """A server whose queue ``small`` holds at most two items."""
    config = tmp_path / "kestrel.toml"
    config.write_text('[queues."small"]\nmax_items = 2\n')
    server = ServerProcess(tmp_path / "data", ("--config", str(config))).start()
    yield server
    server.stop()


def test_move_carries_binary_and_multi_line_items_in_order(module_server):
    items = [b"one\ntwo", b"\x00\xff\r\n", b"", b"last"]
    with Client(module_server.address) as client:
        for item in items:
            assert client.put("mv-src", item)
        moved = on(module_server, "move", "mv-src", "mv-dst")
        assert (moved.returncode, moved.stdout) == (0, b"moved 4\n")
        assert [client.get("mv-dst") for _ in items] == items
        assert client.get("mv-src") is None
    nothing = on(module_server, "move", "mv-src", "mv-dst")
    assert (nothing.returncode, nothing.stdout) == (1, b"moved 0\n")  # nothing there: 1


def test_move_count_moves_that_many_from_the_head(module_server):
    with Client(module_server.address) as client:
        assert client.put_many("mv-count", [b"a", b"b", b"c"]) == 3
        assert on(module_server, "move", "mv-count", "mv-count-dst", "--count", "2").returncode == 0
        assert [client.get("mv-count-dst"), client.get("mv-count-dst")] == [b"a", b"b"]
        assert client.get("mv-count") == b"c"


def test_move_confirms_at_the_source_only_what_the_destination_stored(limited):
    with Client(limited.address) as client:
        assert client.put_many("big", [b"1", b"2", b"3", b"4"]) == 4
        moved = on(limited, "move", "big", "small")
        assert moved.returncode == 4, moved.stderr  # refused: the queue did not take an item
        assert b"refused" in moved.stderr and moved.stdout == b""
        assert [client.get("small"), client.get("small"), client.get("small")] == [b"1", b"2", None]
        # the refused item went back to the head of the source, and nothing was lost
        assert [client.get("big"), client.get("big"), client.get("big")] == [b"3", b"4", None]


def test_status_reads_and_sets_every_server(module_server):
    assert on(module_server, "status").stdout == f"{module_server.address} UP\n".encode()
    readonly = on(module_server, "status", "readonly")
    assert (readonly.returncode, readonly.stdout) == (0, f"{module_server.address} READONLY\n".encode())
    refused = on(module_server, "put", "st-q", stdin=b"x\n")
    assert refused.returncode == 3 and b"SERVER_ERROR" in refused.stderr  # failed, one line
    assert on(module_server, "status", "UP").stdout == f"{module_server.address} UP\n".encode()
    assert on(module_server, "put", "st-q", stdin=b"x\n").returncode == 0
    bogus = on(module_server, "status", "down")
    assert bogus.returncode == 2 and len(bogus.stderr.splitlines()) == 1


def test_flush_and_delete_ask_first(module_server):
    with Client(module_server.address) as client:
        assert client.put_many("ask", [b"a", b"b"]) == 2
        declined = on(module_server, "flush", "ask", stdin=b"n\n")
        assert declined.returncode == 5 and b"flush ask on" in declined.stderr  # not confirmed
        assert client.peek("ask") == b"a"  # nothing flushed
        assert on(module_server, "flush", "ask", stdin=b"y\n").returncode == 0
        assert client.peek("ask") is None
        assert client.put("ask", b"c")
        assert on(module_server, "delete", "ask", "--yes").returncode == 0
        assert "queue_ask_items" not in client.stats()[module_server.address]


@pytest.mark.parametrize("args", [
    ("serve", "--port", "70000"),
    ("serve", "--admin-port", "-1"),
    ("peek", "a.b", "-s", "127.0.0.1:1"),
    ("get", "bad/name", "-s", "127.0.0.1:1"),
    ("move", "same", "same", "-s", "127.0.0.1:1"),
    ("no-such-command",),
])
def test_usage_errors_are_one_line_and_exit_2(args):
    result = run(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines


def test_stats_pointed_at_the_memcache_port_fails_in_one_line(module_server):
    result = run("stats", "--port", str(module_server.port))
    assert result.returncode == 3
    assert len(result.stderr.decode().strip().splitlines()) == 1


def test_nothing_there_and_failed_differ():
    nothing_port = free_port()
    failed = run("get", "q", "-s", f"127.0.0.1:{nothing_port}", "--timeout", "0.5")
    assert failed.returncode == 3
    helps = run("get", "--help").stdout.decode()
    assert "1 there was none" in helps and "3 failed" in helps
