"""ADR 0020: what a connection made is freed when the connection ends, by reference counting.

A session actor and its mailbox, and a session and its handler, refer to each other; once the
session's loop has ended the runtime cuts those references, so that a connection's life does
not leave a cycle for the collector to find (on the many-clients row with 10% of connections
dropped, that pass was a measurable part of the server's CPU per item). A real server runs in
this process on its own thread (``loadtests.loop_bench.InProcessServer``); clients come and go
over real sockets while the cyclic collector is off, and the session actors still in memory are
counted. Counted, not timed.
"""

from __future__ import annotations

import gc
import socket
import time

from kestrel_actors.loadtests.loop_bench import InProcessServer
from kestrel_actors.session import SessionActor

CLIENTS = 30


def _sessions_in_memory() -> int:
    return sum(1 for thing in gc.get_objects() if type(thing) is SessionActor)


def _read_until(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end):
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def test_an_ended_connections_session_is_freed_without_the_cyclic_collector() -> None:
    server = InProcessServer(None)
    gc.collect()
    gc.disable()
    try:
        before = _sessions_in_memory()
        for number in range(CLIENTS):
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                if number % 3 == 0:  # an item held open when the client hangs up: given back
                    sock.sendall(b"set lifetime 0 0 1\r\nx\r\n")
                    assert _read_until(sock, b"\r\n") == b"STORED\r\n"
                    sock.sendall(b"get lifetime/open\r\n")
                    assert _read_until(sock, b"END\r\n").startswith(b"VALUE lifetime")
                elif number % 3 == 1:  # a blocking read waiting in the queue (many-clients' kill)
                    sock.sendall(b"get lifetime-empty/t=10000/open\r\n")
                    sock.sendall(b"version\r\n")  # answered once the wait is cancelled
                    time.sleep(0.01)
                else:  # an orderly end
                    sock.sendall(b"get lifetime-empty\r\nquit\r\n")
                    assert _read_until(sock, b"END\r\n") == b"END\r\n"
        deadline = time.monotonic() + 20
        left = _sessions_in_memory() - before
        while left > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            left = _sessions_in_memory() - before
        # before the cut, every one of them stayed until a collector pass
        assert left == 0, f"{left} of {CLIENTS} ended sessions still in memory"
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            # the items held open came back (and the server still serves)
            sock.sendall(b"get lifetime\r\n")
            assert _read_until(sock, b"END\r\n").startswith(b"VALUE lifetime 0 1\r\nx\r\n")
    finally:
        gc.enable()
        server.stop()
