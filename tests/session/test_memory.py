"""Memory is given back, and one client cannot take it all (issue 21, point 3), against real
server processes with their resident set read from ``/proc``.

* Eight clients that each send half of a 48 MiB request (a memcache SET, or a thrift frame)
  and hang up, four rounds: after every round the server is back within 64 MiB of where it
  started (it used to keep every round's 192 MiB).
* A thousand clients that send requests and never read the replies: the server holds no more
  than ``--max-buffered-bytes`` for them (it used to take 2 GiB), is back within 64 MiB once
  they close, and answers another client meanwhile.
* Past the bound the connection holding the most is closed, and only it.

Probe clients time the round trips of other clients (a SET and a GET) during each recipe: one
connected before it, and (with the thousand non-readers) a fresh connection per round trip.
Each round trip must be answered within ``PROBE_DEADLINE``; the percentiles are printed, not
asserted (a loaded machine can cross any latency bound: issue 55). The load test
``kestrel_actors.loadtests.non_readers_bench`` measures the fresh clients' p50, p99 and max.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import threading
import time
from typing import Self

import pytest

from ..helpers import ServerProcess, settled_rss, stats_of, wait_for
from ..helpers import server_rss as rss

MIB = 1024 * 1024
SLACK = 64 * MIB
"""How far above its starting point the server may stay once the clients have gone."""
PROBE_DEADLINE = 5.0
"""Seconds within which every probe's round trip must be answered. Before ADR 0011 a probe
during the thousand-client recipe saw p99 1.4-2.5 s; before issue 53 a fresh client's SET and
GET went unanswered for 5 s in 4 of 40 tries (it waited behind the burst in the accept
backlog)."""

pytestmark = pytest.mark.slow


def bytes_read(server: ServerProcess) -> int:
    return int(stats_of(server)["bytes_read"])


class Probe:
    """Another client, timing a SET and a GET every 10 ms from a thread until stopped; with
    ``fresh``, each on a new connection (its connect included in the round trip)."""

    def __init__(self, server: ServerProcess, fresh: bool = False) -> None:
        self.address = (server.host, server.port)
        self.fresh = fresh
        self.sock = self._connect()
        self.round_trips: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=PROBE_DEADLINE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sock.close()

    def _run(self) -> None:
        expected = b"STORED\r\nVALUE probe 0 1\r\nx\r\nEND\r\n"
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                if self.fresh:
                    self.sock.close()
                    self.sock = self._connect()
                self.sock.sendall(b"set probe 0 0 1\r\nx\r\nget probe\r\n")
                reply = b""
                while len(reply) < len(expected):
                    self.sock.settimeout(max(0.001, PROBE_DEADLINE - (time.perf_counter() - started)))
                    chunk = self.sock.recv(4096)
                    if not chunk:
                        raise OSError("closed by the server")
                    reply += chunk
                assert reply == expected, reply
            except (OSError, AssertionError) as exc:
                self.failures.append(repr(exc))
                return
            self.round_trips.append(time.perf_counter() - started)
            time.sleep(0.01)

    def check(self, least: int) -> None:
        """Every round trip was answered within ``PROBE_DEADLINE``, and there were enough."""
        assert not self.failures, self.failures
        assert len(self.round_trips) >= least, len(self.round_trips)
        ordered = sorted(self.round_trips)
        print(f"{len(ordered)} round trips, p50 {ordered[len(ordered) // 2]:.3f} s, "
              f"p99 {ordered[int(len(ordered) * 0.99)]:.3f} s, max {ordered[-1]:.3f} s")


# -- half-sent 48 MiB requests, four rounds -----------------------------------------------------


HALF = 24 * MIB


def half_request(protocol: str) -> bytes:
    """The first half of a 48 MiB request: a SET's header, or a thrift frame's length."""
    if protocol == "memcache":
        return b"set big 0 0 %d\r\n" % (2 * HALF) + bytes(HALF)
    return (2 * HALF).to_bytes(4, "big") + bytes(HALF)


@pytest.mark.parametrize("protocol", ["memcache", "thrift"])
def test_half_sent_large_requests_give_their_memory_back_every_round(make_server, protocol):
    server = make_server(thrift_port=True)
    port = server.port if protocol == "memcache" else server.thrift_port
    request = half_request(protocol)
    with Probe(server) as probe:
        time.sleep(0.3)
        start = rss(server)
        rounds = []
        for _ in range(4):
            before = bytes_read(server)
            clients = [socket.create_connection((server.host, port)) for _ in range(8)]
            for client in clients:
                client.sendall(request)
            # all of it read by the server: it holds 8 x 24 MiB now
            wanted = before + 8 * len(request)
            assert wait_for(lambda wanted=wanted: bytes_read(server) >= wanted, 30.0, 0.05)
            held = rss(server)
            for client in clients:
                client.close()
            rounds.append((held, settled_rss(server, start + SLACK)))
    summary = f"start {start // MIB} MiB; (while held, after) per round: " + ", ".join(
        f"({held // MIB}, {after // MIB})" for held, after in rounds)
    print(summary)
    assert all(held - start >= 150 * MIB for held, _ in rounds), summary  # the recipe took hold
    assert all(after - start <= SLACK for _, after in rounds), summary
    probe.check(least=20)


# -- a thousand clients that never read -----------------------------------------------------------


NON_READERS = 1000
PEEKS = 200
"""Each non-reader asks for 200 peeks of a 64 KiB item: 12.5 MiB of replies it never reads."""
BOUND = 128 * MIB

NON_READERS_SCRIPT = r"""
import resource, socket, sys
host, port, count, peeks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
request = b"get big/peek\r\n" * peeks
clients = []
for _ in range(count):
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a window that fills at once
    client.connect((host, port))
    client.sendall(request)
    clients.append(client)
print("sent", flush=True)
sys.stdin.read()  # until the test says so
for client in clients:
    client.close()
print("closed", flush=True)
"""


def test_a_thousand_clients_that_never_read_stay_under_the_bound_and_give_memory_back(make_server):
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < NON_READERS + 256:
        pytest.skip(f"the hard open-file limit ({hard}) is below {NON_READERS + 256}")
    server = make_server("--max-buffered-bytes", str(BOUND))
    setup = server.client()
    assert setup.set("big", bytes(64 * 1024)) == b"STORED"
    with Probe(server) as probe, Probe(server, fresh=True) as fresh_probe:
        time.sleep(0.3)
        start = peak = rss(server)
        non_readers = subprocess.Popen(
            [sys.executable, "-c", NON_READERS_SCRIPT, server.host, str(server.port), str(NON_READERS), str(PEEKS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert non_readers.stdout.readline() == b"sent\n"
            deadline = time.monotonic() + 90
            # until the server has read every non-reader's requests (a peek is counted when read)
            while int(setup.stats()["cmd_peek"]) < NON_READERS * PEEKS and time.monotonic() < deadline:
                peak = max(peak, rss(server))
                time.sleep(0.1)
            assert int(setup.stats()["cmd_peek"]) == NON_READERS * PEEKS
            peak = max(peak, rss(server))
        finally:
            non_readers.stdin.close()
            assert non_readers.stdout.readline() == b"closed\n"
            non_readers.wait(10)
    setup.close()
    after = settled_rss(server, start + SLACK, timeout=30.0)
    summary = f"start {start // MIB} MiB, peak {peak // MIB} MiB, after {after // MIB} MiB"
    print(summary)
    assert peak - start <= BOUND + SLACK, summary
    assert after - start <= SLACK, summary
    shed = [json.loads(line) for line in server.log_path.read_text().splitlines() if "max-buffered-bytes" in line]
    assert len(shed) >= NON_READERS // 2, len(shed)  # 2 MiB each, 128 MiB for all: most were closed
    assert all(line["max_buffered_bytes"] == BOUND for line in shed)
    probe.check(least=50)
    fresh_probe.check(least=20)


# -- the bound closes the heaviest ----------------------------------------------------------------


def test_past_the_bound_the_connection_holding_the_most_is_closed_and_the_others_finish(make_server):
    server = make_server("--max-buffered-bytes", "48M")
    heavy = socket.create_connection((server.host, server.port))
    light = socket.create_connection((server.host, server.port))
    last = socket.create_connection((server.host, server.port))
    heavy.sendall(b"set q 0 0 %d\r\n" % (40 * MIB) + bytes(30 * MIB))
    light.sendall(b"set q 0 0 %d\r\n" % (8 * MIB) + bytes(6 * MIB))
    assert wait_for(lambda: bytes_read(server) >= 36 * MIB, 20.0, 0.05)  # 36 MiB held
    last.sendall(b"set q 0 0 %d\r\n" % (20 * MIB) + bytes(16 * MIB))  # 52 MiB: over the bound

    heavy.settimeout(10)
    with pytest.raises(ConnectionResetError):
        while heavy.recv(4096):
            pass
    for client, rest in ((light, 2 * MIB), (last, 4 * MIB)):
        client.settimeout(10)
        client.sendall(bytes(rest) + b"\r\n")
        assert client.recv(100) == b"STORED\r\n"
    assert stats_of(server)["curr_items"] == "2"
    [warning] = [json.loads(line) for line in server.log_path.read_text().splitlines()
                 if "max-buffered-bytes" in line]
    assert 30 * MIB <= warning["held_bytes"] < 31 * MIB, warning
    assert warning["buffered_bytes"] > 48 * MIB, warning
    for client in (heavy, light, last):
        client.close()
