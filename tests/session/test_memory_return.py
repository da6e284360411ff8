"""Memory returns once the items are read, whatever the connections that SET them did (issue 53,
point 2), against real server processes with their resident set read from ``/proc``.

* Two 40 MiB items, each SET on a connection that then closes, read back, three rounds: the
  server is back within 64 MiB of its start after every round (it kept every item; the issue's
  two 60 MiB items a round took it from 46 to 166, 286 and 406 MiB).
* 3,000 items of 32 KiB, one connection each, read back: the same (it kept every item).
* 2,000 items of 64 KiB on one kept connection, read back: the same (heap blocks under glibc's
  mmap threshold stayed with the process).
* ``max_memory_size`` bounds what the items hold while a queue keeps them, however they came.
* A reader and a producer cycling the queue by more than ``_malloc.TRIM_STEP`` have the server
  give back nothing (the pages would be faulted in again by the next cycle, ADR 0022); the
  backlog read out once they stop is given back in one trim (the admin port's ``heap_trims``).
"""

from __future__ import annotations

import socket

import pytest

from kestrel_actors._malloc import TRIM_STEP
from kestrel_actors.client import set_request

from ..helpers import PATIENCE, Pipeline, ServerProcess, get_json, settled_rss, wait_for, write_config
from ..helpers import server_rss as rss

MIB = 1024 * 1024
SLACK = 64 * MIB
"""How far above its starting point the server may stay once the items are read (the issue's)."""

pytestmark = pytest.mark.slow


def started(make_server, *args: str) -> tuple[ServerProcess, int]:
    """A server and its resident set once it is idle (the first client served)."""
    server = make_server(*args)
    client = server.client()
    assert client.set("warm", b"x") == b"STORED"
    assert client.get("warm") == b"x"
    client.close()
    return server, rss(server)


def set_on_its_own_connection(server: ServerProcess, queue: str, data: bytes) -> None:
    """SET ``data`` on a connection of its own, closed once the server has stored it."""
    with socket.create_connection((server.host, server.port), timeout=30.0) as producer:
        producer.sendall(b"set %s 0 0 %d\r\n" % (queue.encode(), len(data)) + data + b"\r\n")
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = producer.recv(64)
            assert chunk, reply
            reply += chunk
        assert reply == b"STORED\r\n"


def read_all(server: ServerProcess, queue: str, count: int, size: int) -> None:
    """GET ``count`` items of ``size`` bytes from ``queue`` (pipelined, 100 at a time), then a miss."""
    reader = server.client(timeout=30.0)
    value = b"VALUE %s 0 %d\r\n" % (queue.encode(), size)
    left = count
    while left:
        batch = min(left, 100)
        reader.send(b"get %s\r\n" % queue.encode() * batch)
        for _ in range(batch):
            assert reader.read_exact(len(value)) == value
            assert len(reader.read_exact(size + len(b"\r\nEND\r\n"))) == size + 7
        left -= batch
    assert reader.get(queue) is None
    reader.close()


LARGE = 40 * MIB


def test_large_items_set_on_short_connections_give_their_memory_back_once_read(make_server):
    server, start = started(make_server)
    rounds = []
    for number in range(3):
        for index in range(2):
            set_on_its_own_connection(server, "big", bytes([number * 2 + index]) * LARGE)
        held = rss(server)
        read_all(server, "big", 2, LARGE)
        rounds.append((held, settled_rss(server, start + SLACK)))
    summary = f"start {start // MIB} MiB; (held, after reading) per round: " + ", ".join(
        f"({held // MIB}, {after // MIB})" for held, after in rounds)
    print(summary)
    assert all(held - start >= 70 * MIB for held, _ in rounds), summary  # the items were in memory
    assert all(after - start <= SLACK for _, after in rounds), summary


SMALL_ITEMS = 3000
SMALL = 32 * 1024
"""3,000 connections of one 32 KiB SET each: 94 MiB, more than the slack (10,000 of 4 KiB, the
issue's recipe, keep 44 MiB, which is less; and take longer than a test should)."""


def test_small_items_set_one_connection_each_give_their_memory_back_once_read(make_server):
    server, start = started(make_server)
    for index in range(SMALL_ITEMS):
        set_on_its_own_connection(server, "small", index.to_bytes(4, "big") * (SMALL // 4))
    held = rss(server)
    read_all(server, "small", SMALL_ITEMS, SMALL)
    after = settled_rss(server, start + SLACK)
    summary = f"start {start // MIB} MiB, held {held // MIB} MiB, after reading {after // MIB} MiB"
    print(summary)
    assert held - start >= 80 * MIB, summary
    assert after - start <= SLACK, summary


KEPT_ITEMS = 2000
KEPT = 64 * 1024


def test_items_set_on_one_kept_connection_give_their_memory_back_once_read(make_server):
    server, start = started(make_server)
    producer = server.client(timeout=30.0)
    request = b"set kept 0 0 %d\r\n" % KEPT + bytes(range(256)) * (KEPT // 256) + b"\r\n"
    for _ in range(KEPT_ITEMS // 100):
        producer.send(request * 100)
        for _ in range(100):
            assert producer.read_line() == b"STORED"
    held = rss(server)
    read_all(server, "kept", KEPT_ITEMS, KEPT)
    after = settled_rss(server, start + SLACK)
    producer.close()
    summary = f"start {start // MIB} MiB, held {held // MIB} MiB, after reading {after // MIB} MiB"
    print(summary)
    assert held - start >= 100 * MIB, summary
    assert after - start <= SLACK, summary


def test_max_memory_size_bounds_what_items_set_on_short_connections_hold(make_server, tmp_path):
    # ten 16 MiB items, each on a connection of its own: two in memory, the rest in the journal
    config = write_config(tmp_path, '[queues.bounded]\nmax_memory_size = "32MiB"\n')
    server, start = started(make_server, "--config", config)
    for index in range(10):
        set_on_its_own_connection(server, "bounded", bytes([index]) * (16 * MIB))
    stats = server.client().stats()
    assert (stats["queue_bounded_items"], stats["queue_bounded_mem_bytes"]) == ("10", str(32 * MIB))
    held = settled_rss(server, start + 32 * MIB + SLACK)
    reader = server.client(timeout=30.0)
    for index in range(10):
        assert reader.get("bounded") == bytes([index]) * (16 * MIB)
    reader.close()
    after = settled_rss(server, start + SLACK)
    summary = (f"start {start // MIB} MiB, while the queue holds them {held // MIB} MiB,"
               f" after reading {after // MIB} MiB")
    print(summary)
    assert held - start <= 32 * MIB + SLACK, summary
    assert after - start <= SLACK, summary


CYCLED = 64 * 1024
CYCLE_ITEMS = (TRIM_STEP + 4 * MIB) // CYCLED
"""Items a cycle reads out and puts back: the held memory falls 4 MiB more than a step, so it
is back within a step after the first 4 MiB put back (a moment, however loaded the machine)."""


def heap_trims(server: ServerProcess) -> int:
    return get_json(server.admin_url + "/stats.json")["counters"]["heap_trims"]


def test_a_queue_cycled_by_more_than_a_trim_step_keeps_its_heap_until_read_out(make_server):
    server = make_server(admin_port=True)
    pipe = Pipeline(server.host, server.port)
    item = bytes(range(256)) * (CYCLED // 256)
    pipe.set_all("cycled", [item] * CYCLE_ITEMS, batch=64)
    before = heap_trims(server)
    get = b"get cycled\r\n" * CYCLE_ITEMS
    put = set_request("cycled", item) * CYCLE_ITEMS
    for _ in range(4):  # one stream: read out, put back
        pipe.stream([get, put])
        assert all(value == item for value in pipe.read_replies(CYCLE_ITEMS))
        pipe.expect_stored(CYCLE_ITEMS)
        pipe.wait_sent()
    pipe.set_all("cycled", [item] * CYCLE_ITEMS, batch=64)  # a backlog of two steps
    assert pipe.get_all("cycled", 2 * CYCLE_ITEMS, batch=64) == [item] * (2 * CYCLE_ITEMS)
    pipe.close()
    assert wait_for(lambda: heap_trims(server) > before, PATIENCE, 0.2), "the read-out backlog kept"
    assert heap_trims(server) == before + 1  # none for the cycles, one for the backlog
