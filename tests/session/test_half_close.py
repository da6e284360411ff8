"""Requests sent before a half-close are answered (issue 53, point 6; behaviour §1).

A client that writes its requests and then shuts its side down (``shutdown(SHUT_WR)``, as
``nc -N`` and ``nc -q1`` do) gets every reply, then the server closes. Against real server
processes, twenty tries of each shape, over memcache and over the text protocol; an open read
goes back to its queue after its reply, as on any disconnect.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest

from ..helpers import ServerProcess, drain_queue, start_text_server, stats_of, unique, value, wait_for

TRIES = 20
DEADLINE = 10.0
"""Seconds a half-closed client may wait for its replies and the close (a generous bound)."""


def half_close(host: str, port: int, request: bytes) -> bytes:
    """Send ``request``, shut the sending side down, and return everything the server sends
    until it closes."""
    with socket.create_connection((host, port), timeout=DEADLINE) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                return received
            received += chunk
        raise AssertionError(f"not closed within {DEADLINE} s; received {received!r}")


def memcache_set(queue: str, data: bytes) -> bytes:
    return b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(data), data)


def text_put(queue: str, data: bytes) -> bytes:
    return b"put %s:\n%s\n\n" % (queue.encode(), data)


# -- memcache ---------------------------------------------------------------------------------


MEMCACHE_SHAPES = {
    # name: (request, reply, items left in the queue afterwards), for a queue named q
    "set": (lambda q: memcache_set(q, b"a"), lambda q: b"STORED\r\n", [b"a"]),
    "set+get": (lambda q: memcache_set(q, b"a") + b"get %s\r\n" % q.encode(),
                lambda q: b"STORED\r\n" + value(q, b"a"), []),
    "set+set": (lambda q: memcache_set(q, b"a") + memcache_set(q, b"b"),
                lambda q: b"STORED\r\nSTORED\r\n", [b"a", b"b"]),
    # the open read goes back to the queue once its reply is written
    "set+get/open": (lambda q: memcache_set(q, b"a") + b"get %s/open\r\n" % q.encode(),
                     lambda q: b"STORED\r\n" + value(q, b"a"), [b"a"]),
}


@pytest.mark.parametrize("shape", list(MEMCACHE_SHAPES))
def test_memcache_requests_before_a_half_close_are_answered(server, shape):
    request, reply, left = MEMCACHE_SHAPES[shape]
    for _ in range(TRIES):
        queue = unique("half")
        assert half_close(server.host, server.port, request(queue)) == reply(queue)
        assert drain_queue(server, queue) == left
    assert wait_for(lambda: stats_of(server)["curr_connections"] == "1")  # the stats client


# -- the text protocol ------------------------------------------------------------------------


TEXT_SHAPES = {
    "put": (lambda q: text_put(q, b"a"), b"+1\n", [b"a"]),
    "put+peek": (lambda q: text_put(q, b"a") + b"peek %s\n" % q.encode(), b"+1\n:a\n", [b"a"]),
    "put+put": (lambda q: text_put(q, b"a") + text_put(q, b"b"), b"+1\n+1\n", [b"a", b"b"]),
    # every text fetch is an open read: it goes back to the queue once its reply is written
    "put+get": (lambda q: text_put(q, b"a") + b"get %s\n" % q.encode(), b"+1\n:a\n", [b"a"]),
}


@pytest.fixture
def text_server(tmp_path):
    server = start_text_server(tmp_path / "data")
    yield server
    server.stop()


@pytest.mark.parametrize("shape", list(TEXT_SHAPES))
def test_text_requests_before_a_half_close_are_answered(text_server, shape):
    request, reply, left = TEXT_SHAPES[shape]
    for _ in range(TRIES):
        queue = unique("half")
        assert half_close(text_server.host, text_server.text_port, request(queue)) == reply
        assert drain_queue(text_server, queue) == left


# -- what else a half-close meets -------------------------------------------------------------


def test_a_blocking_get_before_a_half_close_is_answered_at_once_and_swallows_nothing(server):
    """From the end of input on, no fetch of the connection waits (a FIN cannot be told from a
    close, and an item handed to a client that has gone would be lost): a blocking GET answers
    what is there now, or a miss at once, and leaves no waiter behind."""
    queue = unique("wait")
    started = time.monotonic()
    request = b"get %s/t=60000\r\nget %s/t=60000/open\r\n" % (queue.encode(), queue.encode())
    assert half_close(server.host, server.port, request) == b"END\r\nEND\r\n"
    assert time.monotonic() - started < DEADLINE  # not the 60 s timeout
    assert stats_of(server)[f"queue_{queue}_waiters"] == "0"
    client = server.client()
    assert client.set(queue, b"precious") == b"STORED"
    assert client.get(queue) == b"precious"
    # an item there already is taken as by any GET
    request = memcache_set(queue, b"there") + b"get %s/t=60000\r\n" % queue.encode()
    assert half_close(server.host, server.port, request) == b"STORED\r\n" + value(queue, b"there")


def test_a_parked_get_ends_with_the_half_close_and_the_later_requests_are_answered(server):
    """The FIN arrives while the GET waits in its queue: the wait ends with a miss, and the
    requests behind it are answered."""
    queue = unique("parked")
    with socket.create_connection((server.host, server.port), timeout=DEADLINE) as sock:
        sock.sendall(b"get %s/t=60000\r\n" % queue.encode())
        assert wait_for(lambda: stats_of(server).get(f"queue_{queue}_waiters") == "1")
        sock.sendall(memcache_set(queue, b"late"))
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(DEADLINE)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received == b"END\r\nSTORED\r\n"
    assert drain_queue(server, queue) == [b"late"]


def test_a_backlog_that_pauses_reading_is_answered_whole_before_the_close(server):
    """More requests than the backlog that pauses reading (4,096), then the FIN: the FIN is seen
    while reading is paused, and every request before it is still read and answered."""
    queue = unique("backlog")
    count = 10_000
    request = b"version\r\n" * count + memcache_set(queue, b"last") + b"get %s\r\n" % queue.encode()
    received = half_close(server.host, server.port, request)
    lines = received.split(b"\r\n")
    assert len([line for line in lines if line.startswith(b"VERSION ")]) == count
    assert received.endswith(b"STORED\r\n" + value(queue, b"last"))


def openbsd_netcat() -> str | None:
    nc = shutil.which("nc")
    if nc is None:
        return None
    usage = subprocess.run([nc, "-h"], capture_output=True, timeout=10)
    return nc if b"OpenBSD" in usage.stdout + usage.stderr else None


@pytest.mark.skipif(openbsd_netcat() is None, reason="OpenBSD netcat (make test installs netcat-openbsd)")
@pytest.mark.parametrize("option", ["-N", "-q1"])
def test_a_newcomers_first_pipe_through_nc_is_answered(server: ServerProcess, option):
    """The issue's own try: ``printf 'set k 0 0 1\\r\\na\\r\\nget k\\r\\n' | nc -N host port``."""
    queue = unique("nc")
    request = b"set %s 0 0 1\r\na\r\nget %s\r\n" % (queue.encode(), queue.encode())
    for _ in range(5):
        result = subprocess.run([openbsd_netcat(), option, server.host, str(server.port)], input=request,
                                capture_output=True, timeout=DEADLINE)
        assert result.stdout == b"STORED\r\n" + value(queue, b"a"), result
