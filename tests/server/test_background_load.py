"""behaviour §7.1: the server listens at once and replays the queues found on disk in the
background; a queue still loading shows ``loading`` in stats, a request naming it waits for it,
and every other queue is served meanwhile (issue 56, point 3).

The big queue's journal is written here directly in the journal format (fast to set up): adds
with removes between them, two reads opened and one of them confirmed, so that the head after
the restart is only known once the whole journal is read. The admin port's ``/stats.json``
(the page) has the gauge ``q/<name>/loading``.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections import deque

from kestrel_actors.journal import Item, encode_add, encode_confirm_remove, encode_remove, encode_remove_tentative

from ..helpers import ServerProcess, assert_numbered, drain_pipelined, number_of, numbered, wait_for, write_config

BIG = 400_000
"""Items in the big queue's journal: a replay of seconds in the pure-Python build."""


def _write_big_journal(path) -> list[int]:
    """The big queue's journal; answers the items it holds after a restart, head first."""
    now = 1_700_000_000_000
    records = []
    queue: deque[int] = deque()
    for i in range(BIG):
        records.append(encode_add(Item(numbered(i, 100), now)))
        queue.append(i)
        if i % 4 == 3:  # a later REMOVE takes the head, an item written long before it
            records.append(encode_remove())
            queue.popleft()
    records.append(encode_remove_tentative(1))
    records.append(encode_remove_tentative(2))
    records.append(encode_confirm_remove(1))
    queue.popleft()  # xid 1: confirmed, gone
    # xid 2 is open at the restart: given back at the head (behaviour §6.4)
    path.write_bytes(b"".join(records))
    return list(queue)


def _line_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    return sock


def _reply(sock: socket.socket, end: bytes = b"END\r\n") -> bytes:
    data = b""
    while not data.endswith(end):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def test_other_queues_are_served_while_a_big_queue_loads(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    expected = _write_big_journal(data_dir / "big")
    (data_dir / "small").write_bytes(encode_add(Item(b"small item", 1_700_000_000_000)))
    config = write_config(tmp_path, '[queues.big]\nmax_memory_size = "4MiB"\n')
    server = ServerProcess(data_dir, ("--config", config), admin_port=True).start(timeout=120, loaded=False)
    try:
        _check_served_while_loading(server, expected)
    finally:
        server.stop()


def _check_served_while_loading(server: ServerProcess, expected: list[int]) -> None:

    # asked first: it waits for the big queue's replay, then answers the true head
    waiting = _line_client(server.port)
    waiting.sendall(b"get big\r\n")
    other = _line_client(server.port)
    other.sendall(b"get small\r\n")
    assert _reply(other) == b"VALUE small 0 10\r\nsmall item\r\nEND\r\n"
    other.sendall(b"stats\r\n")
    stats = _reply(other)
    assert b"STAT queue_big_loading 1\r\n" in stats
    assert b"STAT queue_small_items 0\r\n" in stats
    with urllib.request.urlopen(server.admin_url + "/stats.json", timeout=60) as answer:
        gauges = json.load(answer)["gauges"]
    assert gauges["q/big/loading"] == 1 and "q/big/items" not in gauges and gauges["q/small/items"] == 0
    other.sendall(b"dump_stats\r\n")
    assert b"queue 'big' {\r\n  loading=1\r\n}" in _reply(other)

    head = _reply(waiting)
    assert head.startswith(b"VALUE big 0 100\r\n")
    assert number_of(head[len(b"VALUE big 0 100\r\n"):]) == expected[0]
    waiting.close()
    other.close()

    client = server.client()
    assert wait_for(lambda: "queue_big_loading" not in client.stats(), timeout=120)
    assert int(client.stats()["queue_big_items"]) == len(expected) - 1
    client.close()
    values = drain_pipelined(server, "big")
    assert_numbered(values, expected[1:], size=100)
