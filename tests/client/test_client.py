"""kestrel_actors.client against one real server: every method, waits, reliable reads, errors."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from kestrel_actors.client import (
    Client,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    ReplyTimeout,
    ServerAddress,
    ServerError,
    UnexpectedReply,
    reply_error,
)
from kestrel_actors.client._connection import Connection
from kestrel_actors.client._wire import (
    expect_deleted,
    get_options,
    parse_stat,
    parse_stored,
    parse_value_header,
    wait_ms,
)

from ..helpers import PATIENCE, free_port, wait_for, wait_queue_stat


@pytest.fixture
def client(module_server):
    with Client(module_server.address, timeout=PATIENCE) as client:
        yield client


@pytest.fixture
def qname(request):
    return "c_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:60]


def later(seconds: float, action) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    thread.start()
    return thread


def test_put_get_peek_round_trip(client, qname):
    assert client.put(qname, b"one") is True
    assert client.put(qname, b"two\r\nwith a line break") is True
    assert client.peek(qname) == b"one"
    assert client.get(qname) == b"one"
    assert client.get(qname) == b"two\r\nwith a line break"
    assert client.get(qname) is None
    assert client.peek(qname) is None


def test_put_many_is_pipelined_in_order_and_counts_stored(client, qname):
    items = [b"item %d" % i for i in range(1000)]  # several pipelined chunks
    assert client.put_many(qname, items) == 1000
    assert client.put_many(qname, []) == 0
    assert [client.get(qname) for _ in range(1000)] == items
    assert client.get(qname) is None


def test_put_with_expiry(client, qname):
    assert client.put(qname, b"gone", expiry=-1)  # memcache: a negative expiry is already past
    assert client.put(qname, b"kept", expiry=60)
    assert client.get(qname) == b"kept"


def test_put_into_a_full_queue_is_false_and_put_many_counts_only_the_stored(make_server, tmp_path):
    config = tmp_path / "full.toml"
    config.write_text('[queues."small"]\nmax_items = 2\n')
    server = make_server("--config", str(config))
    with Client(server.address) as client:
        assert client.put("small", b"1") and client.put("small", b"2")
        assert client.put("small", b"3") is False
        assert client.put_many("small", [b"4", b"5"]) == 0
        assert client.get("small") == b"1"
        assert client.put_many("small", [b"6", b"7"]) == 1


def test_get_waits_for_an_item(client, qname):
    later(0.3, lambda: Client(client.servers[0].address).put(qname, b"late"))
    assert client.get(qname, timeout=PATIENCE) == b"late"


def test_a_wait_longer_than_the_socket_timeout(module_server, qname):
    """``/t=`` beyond the socket timeout: the read's socket waits its wait plus the margin.
    Each item comes well after the socket timeout (0.5 s) and long before the wait ends, so
    no deadline of the test's own is raced by a loaded machine (an END at a 1.5 s wait, read
    within the 0.5 s margin, was)."""
    with Client(module_server.address, timeout=0.5) as client:
        later(1.2, lambda: Client(module_server.address).put(qname, b"after the socket timeout"))
        assert client.get(qname, timeout=PATIENCE) == b"after the socket timeout"
        later(1.2, lambda: Client(module_server.address).put(qname, b"reliable, after it too"))
        with client.reliable(qname, timeout=PATIENCE) as item:
            assert item == b"reliable, after it too"
    with Client(module_server.address) as client:
        assert client.get(qname) is None  # the reliable read was confirmed


def test_reliable_read_is_confirmed_when_the_block_ends(client, qname):
    client.put_many(qname, [b"a", b"b"])
    with client.reliable(qname) as item:
        assert item == b"a"
        assert client.queue_stats(qname)["open_transactions"] == 1
    stats = client.queue_stats(qname)
    assert (stats["open_transactions"], stats["items"]) == (0, 1)
    assert client.get(qname) == b"b"


def test_reliable_read_that_raises_puts_the_item_back_at_the_head(client, qname):
    client.put_many(qname, [b"first", b"second"])
    with pytest.raises(RuntimeError, match="handler failed"), client.reliable(qname) as item:
        assert item == b"first"
        raise RuntimeError("handler failed")
    assert client.queue_stats(qname)["open_transactions"] == 0
    assert client.get(qname) == b"first"
    assert client.get(qname) == b"second"


def test_reliable_read_of_nothing_yields_none(client, qname):
    with client.reliable(qname, timeout=0.2) as item:
        assert item is None
    with client.reliable(qname) as item:
        assert item is None


def test_reliable_read_waits(client, qname):
    later(0.3, lambda: Client(client.servers[0].address).put(qname, b"x"))
    with client.reliable(qname, timeout=PATIENCE) as item:
        assert item == b"x"
    assert client.get(qname) is None


def test_monitor_batch_confirm(client, qname):
    client.put_many(qname, [b"%d" % i for i in range(5)])
    batch = client.monitor(qname, 1, 3)
    assert batch.items == [b"0", b"1", b"2"] and len(batch) == 3
    assert client.queue_stats(qname)["open_transactions"] == 3
    batch.confirm()
    stats = client.queue_stats(qname)
    assert (stats["open_transactions"], stats["items"]) == (0, 2)
    with client.monitor(qname, 1, 10) as batch:  # fewer than asked: waits the second, then ends
        assert list(batch) == [b"3", b"4"]
    assert client.queue_stats(qname)["items"] == 0


def test_monitor_batch_abort_and_exception(client, qname):
    client.put_many(qname, [b"a", b"b"])
    batch = client.monitor(qname, 1, 2)
    batch.abort()
    # each abort puts the oldest open item at the head, so they come back in reverse order,
    # as after a disconnect (behaviour §2.6)
    stats = client.queue_stats(qname)
    assert (stats["items"], stats["open_transactions"]) == (2, 0)
    assert client.peek(qname) == b"b"
    with pytest.raises(KeyError), client.monitor(qname, 1, 2) as batch:
        assert sorted(batch.items) == [b"a", b"b"]
        raise KeyError("no")
    assert sorted([client.get(qname), client.get(qname)]) == [b"a", b"b"]
    empty = client.monitor(qname, 0, 5)
    assert not empty and empty.items == []
    empty.confirm()


def test_stats_version_flush_delete(client, qname, module_server):
    client.put_many(qname, [b"1", b"2"])
    stats = client.stats()
    assert list(stats) == [module_server.address]
    assert stats[module_server.address][f"queue_{qname}_items"] == "2"
    assert client.version() == {module_server.address: "2.4.7"}
    client.flush(qname)
    assert client.queue_stats(qname)["items"] == 0
    client.delete(qname)
    assert f"queue_{qname}_items" not in client.stats()[module_server.address]


def test_stats_of_a_non_ascii_queue_name(client, qname):
    # Stat names carry queue names in the server's bytes (UTF-8): they must read back as the
    # name the caller spelled, or queue_stats (and the Spark source's depth) would miss them.
    name = f"{qname}-caf\u00e9"
    client.put_many(name, [b"1", b"2"])
    assert client.queue_stats(name)["items"] == 2
    client.delete(name)


def test_bad_queue_names_are_refused_before_sending(client):
    for name in ("", "a/b", "a b", "dots.here", "+child", "x" * 201):
        with pytest.raises(ValueError):
            client.put(name, b"x")
        with pytest.raises(ValueError):
            client.get(name)


def test_writes_refused_by_the_server_status_are_a_server_error(make_server):
    server = make_server()
    raw = server.client()
    assert raw.call(b"status readonly") == b"END"
    with Client(server.address) as client:
        with pytest.raises(ServerError):
            client.put("ro", b"x")
        assert client.get("ro") is None  # reads are still allowed


def test_a_refused_request_is_a_client_error(client, qname, module_server):
    """confirm of more items than are open: ``ERROR``."""
    client.put(qname, b"x")
    batch = client.monitor(qname, 1, 1)
    batch._parts[0].count = 2  # ask the server to confirm more than it holds open
    with pytest.raises(ClientError, match="ERROR"):
        batch.confirm()
    # the failed connection was dropped; the server gives its open item back when it has seen
    # the close, which a loaded machine can hold back past the next request
    wait_queue_stat(module_server, qname, "open_transactions", "0")
    assert client.get(qname) == b"x"  # the item came back


def test_no_server_is_connect_failed(qname):
    with Client(f"127.0.0.1:{free_port()}", timeout=0.5) as client:
        with pytest.raises(ConnectFailed):
            client.put(qname, b"x")
        with pytest.raises(ConnectionLost):
            client.get(qname)


def test_a_server_that_dies_mid_call_is_connection_lost(make_server, qname):
    server = make_server()
    with Client(server.address, timeout=PATIENCE, retry_after=0.1) as client:
        waiter = threading.Thread(target=lambda: (time.sleep(0.5), server.kill()), daemon=True)
        waiter.start()
        with pytest.raises(ConnectionLost):
            client.get(qname, timeout=10.0)
        waiter.join()
        server.start()
        time.sleep(0.2)  # past the backoff
        assert client.put(qname, b"back")
        assert client.get(qname) == b"back"


def test_raw_connection(client, qname):
    conn = client.connection()
    try:
        conn.exchange(b"set %s 0 0 2\r\nhi\r\n" % qname.encode(), b"STORED\r\n")
        conn.send(b"get %s/peek\r\n" % qname.encode())
        assert conn.read_value(qname.encode()) == b"hi"
        with pytest.raises(UnexpectedReply):
            conn.exchange(b"get %s\r\n" % qname.encode(), b"END\r\n")
    finally:
        conn.close()


def test_a_monitor_reply_read_from_the_pieces_received_leaves_the_next_reply(client, qname):
    """``read_packed_values`` scans each received piece where it lies (values larger than a
    piece, headers cut between two); what follows the reply stays for the next read."""
    values = [bytes([i]) * size for i, size in enumerate([1, 70_000, 0, 3, 150_000, 5000])]
    client.put_many(qname, values)
    conn = client.connection()
    try:
        conn.send(b"monitor %s 1 10 stamp\r\nversion\r\n" % qname.encode())
        packed = conn.read_packed_values(qname.encode(), 10, stamped=True)
        assert packed.values() == values and conn.read_line().startswith(b"VERSION ")
        stamps = memoryview(packed.stamps).cast("q").tolist()
        assert len(stamps) == len(values) and min(stamps) > 1_600_000_000_000
        conn.send(b"confirm %s %d\r\n" % (qname.encode(), len(values)))
        conn.read_end("confirm")
    finally:
        conn.close()
    assert client.queue_stats(qname)["items"] == 0


def test_a_monitor_reply_that_stops_halfway_is_the_server_s_fault():
    """Part of a reply, then silence past the timeout: UnexpectedReply (an empty queue's
    silence would be a ReplyTimeout)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        conn = Connection("127.0.0.1", listener.getsockname()[1], timeout=0.3).connect()
        peer, _ = listener.accept()
        try:
            peer.sendall(b"VALUE q 0 3\r\nabc\r\nEND\r\nVALUE q 0 10\r\nab")
            with pytest.raises(UnexpectedReply, match="incomplete monitor reply"):
                conn.read_packed_values(b"q", 5)
        finally:
            peer.close()
            conn.close()


def test_reply_lines_map_to_one_exception_each():
    assert isinstance(reply_error("get", b"ERROR"), ClientError)
    assert isinstance(reply_error("get", b"CLIENT_ERROR bad data chunk"), ClientError)
    assert isinstance(reply_error("set", b"SERVER_ERROR"), ServerError)
    assert isinstance(reply_error("set", b"EXISTS"), UnexpectedReply)
    assert issubclass(ReplyTimeout, ConnectionLost) and issubclass(ReplyTimeout, TimeoutError)
    assert issubclass(ConnectionLost, ConnectionError)


def test_wire_parsers_are_pure():
    assert parse_value_header("get", b"VALUE q 0 5", b"q") == 5
    assert parse_value_header("get", b"END", b"q") is None
    with pytest.raises(UnexpectedReply):
        parse_value_header("get", b"VALUE other 0 5", b"q")
    with pytest.raises(ClientError):
        parse_value_header("get", b"ERROR", b"q")
    assert parse_stored("set", b"STORED") is True and parse_stored("set", b"NOT_STORED") is False
    assert parse_stat(b"STAT uptime 5") == ("uptime", "5") and parse_stat(b"END") is None
    assert get_options(wait_ms(0.25), open=True, close=True) == "/t=250/close/open"
    assert get_options(0, peek=True) == "/peek" and wait_ms(None) == 0 and wait_ms(1e-6) == 1
    expect_deleted(b"DELETED")
    # delete's reply goes through the same mapping as every other reply
    with pytest.raises(ServerError):
        expect_deleted(b"SERVER_ERROR")
    with pytest.raises(ClientError):
        expect_deleted(b"CLIENT_ERROR bad")
    with pytest.raises(UnexpectedReply):
        expect_deleted(b"END")


def test_server_address_parsing():
    assert ServerAddress.parse("h") == ServerAddress("h", 22133)
    assert ServerAddress.parse(" h:1 ") == ServerAddress("h", 1)
    assert str(ServerAddress.parse("[::1]:5")) == "[::1]:5"
    for bad in ("", "h:x", "h:0", ":5"):
        with pytest.raises(ValueError):
            ServerAddress.parse(bad)
    with pytest.raises(ValueError):
        Client([])


def test_connections_are_pooled(make_server, qname):
    """One caller at a time reuses one connection; ``max_idle`` bounds how many are kept."""
    server = make_server()

    def connections() -> tuple[int, int]:
        """Connections this client made, and those open now."""
        stats = client.stats()[server.address]
        return int(stats["total_connections"]) - before, int(stats["curr_connections"])

    with Client(server.address, max_idle=1) as client:
        before = 0
        before = connections()[0] - 1  # the one asking, and the start-up check's before it
        for i in range(20):
            assert client.put(qname, b"%d" % i)
            assert client.get(qname) == b"%d" % i
        with client.reliable(qname, timeout=0.1) as item:
            assert item is None
        # one made; one open once the start-up check's hang-up is counted (it may lag on load)
        assert wait_for(lambda: connections() == (1, 1))
        client.put_many(qname, [b"a", b"b", b"c"])
        held = [client.monitor(qname, 1, 1) for _ in range(3)]  # each holds its connection
        assert [batch.items for batch in held] == [[b"a"], [b"b"], [b"c"]]
        for batch in held:
            batch.confirm()
        assert wait_for(lambda: connections() == (3, 1))  # two closed, one kept
