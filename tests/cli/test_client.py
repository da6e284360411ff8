"""``kestrel-actors put|get|peek|tail`` against a real server, as a shell would run them."""

from __future__ import annotations

import os
import subprocess
import sys

from kestrel_actors.client import Client


def cli(server, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "kestrel_actors.cli", *args, "-s", server.address],
                          input=stdin, capture_output=True, timeout=60)


def test_put_lines_then_get_peek_tail(module_server):
    assert cli(module_server, "put", "lines", stdin=b"one\ntwo\r\n\nfour\n").returncode == 0
    got = cli(module_server, "get", "lines", "-n", "2")
    assert (got.returncode, got.stdout) == (0, b"one\ntwo\n")
    assert cli(module_server, "peek", "lines").stdout == b"\n"  # an empty line is an empty item
    tail = cli(module_server, "tail", "lines", "--idle", "0.3")
    assert (tail.returncode, tail.stdout) == (0, b"\nfour\n")
    empty = cli(module_server, "get", "lines")
    assert (empty.returncode, empty.stdout) == (1, b"")
    assert cli(module_server, "peek", "lines").returncode == 1


def test_raw_items_keep_their_bytes(module_server):
    data = bytes(range(256)) * 3
    assert cli(module_server, "put", "raw", "--raw", stdin=data).returncode == 0
    assert cli(module_server, "peek", "raw", "--raw").stdout == data
    assert cli(module_server, "get", "raw", "--raw").stdout == data
    assert cli(module_server, "put", "raw", "--raw", stdin=b"one\n").returncode == 0
    assert cli(module_server, "put", "raw", "--raw", stdin=b"two").returncode == 0
    tail = cli(module_server, "tail", "raw", "--raw", "-n", "2")
    assert (tail.returncode, tail.stdout) == (0, b"one\ntwo")  # back to back, as they were


def test_a_pool_of_servers(make_server):
    first, second = make_server(), make_server()
    with Client(second.address) as client:
        client.put_many("pooled", [b"on the second"])
    pool = ("-s", first.address, "-s", second.address)
    got = subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "get", "pooled", *pool],
                         capture_output=True, timeout=60)
    assert (got.returncode, got.stdout) == (0, b"on the second\n")
    env = {**os.environ, "KESTREL_SERVERS": f"{first.address},{second.address}"}
    put = subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "put", "pooled"],
                         input=b"a\nb\n", env=env, timeout=60)
    assert put.returncode == 0
    with Client([first.address, second.address]) as client:
        assert client.queue_stats("pooled")["items"] == 2


def test_tail_confirms_only_what_it_wrote(module_server):
    with Client(module_server.address) as client:
        client.put_many("tailq", [b"a", b"b", b"c"])
        tail = cli(module_server, "tail", "tailq", "-n", "2")
        assert (tail.returncode, tail.stdout) == (0, b"a\nb\n")
        stats = client.queue_stats("tailq")
        assert (stats["items"], stats["open_transactions"]) == (1, 0)
        # a reader whose stdout is gone: the item it could not write stays at the head
        proc = subprocess.Popen([sys.executable, "-m", "kestrel_actors.cli", "tail", "tailq",
                                 "-s", module_server.address], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdout.close()
        assert proc.wait(30) != 0
        assert client.get("tailq") == b"c"


def test_follow_waits_for_new_items(module_server):
    proc = subprocess.Popen([sys.executable, "-m", "kestrel_actors.cli", "tail", "follow", "-n", "2",
                             "-s", module_server.address], stdout=subprocess.PIPE)
    try:
        with Client(module_server.address) as client:
            client.put("follow", b"first")
            assert proc.stdout.readline() == b"first\n"
            client.put("follow", b"second")
            assert proc.stdout.readline() == b"second\n"
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_unreachable_server_exits_3(tmp_path):
    from ..helpers import free_port

    proc = subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "get", "q", "-s",
                           f"127.0.0.1:{free_port()}", "--timeout", "0.5"], capture_output=True, timeout=60)
    assert proc.returncode == 3 and b"cannot connect" in proc.stderr
