"""Kestrel's thrift protocol against a real server process (behaviour §4, ADR 0004).

Every call goes through :class:`kestrel_actors.client.thrift.ThriftClient` -- thriftpy2's
client generated from the IDL the server ships -- over a socket to ``serve --thrift-port``.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import time

import pytest
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TTransportException

from kestrel_actors import KESTREL_VERSION
from kestrel_actors.client.thrift import Item, Status, ThriftClient, decode_reply, encode_call

from ..helpers import PATIENCE, ServerProcess, default_ports_held, wait_for, write_config


@pytest.fixture
def make_thrift_server(make_server):
    def start(*args: str) -> ServerProcess:
        return make_server(*args, thrift_port=True)

    return start


@pytest.fixture
def server(make_thrift_server):
    return make_thrift_server()


def memcache_get(server: ServerProcess, queue: str) -> bytes | None:
    client = server.client()
    try:
        return client.get(queue)
    finally:
        client.close()


# -- the port ------------------------------------------------------------------------------------


def _listening(server: ServerProcess) -> dict[str, int]:
    """The server's ``listening`` log events: port by protocol."""
    events = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
    return {event["protocol"]: event["port"] for event in events if event.get("event") == "listening"}


class _DefaultThriftPort(ServerProcess):
    """``serve`` without ``--thrift-port`` (the helper otherwise passes 0)."""

    def command(self) -> list[str]:
        command = super().command()
        at = command.index("--thrift-port")
        del command[at : at + 2]
        return command


def test_thrift_listens_on_2229_by_default(tmp_path):
    with default_ports_held():  # the README examples' server serves on 2229 too
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", 2229))
            except OSError:
                pytest.skip("port 2229 is taken on this machine")
        server = _DefaultThriftPort(tmp_path / "data").start()
        try:
            assert wait_for(lambda: "thrift" in _listening(server))
            assert _listening(server)["thrift"] == 2229
            with ThriftClient(server.host, 2229) as client:
                assert client.get_version() == KESTREL_VERSION
        finally:
            server.stop()


def test_thrift_port_0_disables_the_listener(make_server, make_thrift_server):
    off = make_server("--thrift-port", "0")
    on = make_thrift_server()
    assert wait_for(lambda: "thrift" in _listening(on))  # the event this test looks for exists
    assert _listening(on)["thrift"] == on.thrift_port
    assert "memcache" in _listening(off) and "thrift" not in _listening(off)


# -- every method -------------------------------------------------------------------------------


def test_version_and_status(server):
    with server.thrift_client() as client:
        memcache = server.client()
        assert client.get_version() == KESTREL_VERSION
        assert memcache.call(b"version") == b"VERSION " + client.get_version().encode()
        memcache.close()
        assert client.current_status() == Status.UP


def test_put_get_without_auto_abort_removes_items_with_id_0(server):
    with server.thrift_client() as client:
        assert client.put("jobs", [b"one", b"two", b"three"]) == 3
        assert client.get("jobs", max_items=2) == [Item(b"one", 0), Item(b"two", 0)]
        assert client.get("jobs", max_items=5) == [Item(b"three", 0)]
        assert client.get("jobs", max_items=5) == []
        assert client.peek("jobs").items == 0


def test_put_with_no_items_is_0_and_creates_nothing(server):
    with server.thrift_client() as client:
        assert client.put("nothing", []) == 0
    assert "queue_nothing_items" not in server.client().stats()


def test_get_edge_arguments(server):
    with server.thrift_client() as client:
        client.put("edges", [b"%d" % i for i in range(5)])
        assert client.get("edges", max_items=0) == []
        # a negative timeout is a deadline already passed: nothing, even with items waiting
        assert client.get("edges", max_items=3, timeout_msec=-1) == []
        # a negative max_items is an error (Kestrel read it as "no limit"), and removes nothing
        for auto_abort_msec in (0, 1000):
            with pytest.raises(TApplicationException, match=r"max_items must not be negative \(-1\)") as error:
                client.get("edges", max_items=-1, auto_abort_msec=auto_abort_msec)
            assert error.value.type == TApplicationException.PROTOCOL_ERROR
        assert client.peek("edges").items == 5 and client.peek("edges").open_transactions == 0
        assert [item.data for item in client.get("edges", max_items=10)] == [b"0", b"1", b"2", b"3", b"4"]


def test_get_with_timeout_waits_for_max_items_or_the_deadline(server):
    with server.thrift_client() as client:
        client.put("slow", [b"first"])
        started = time.monotonic()
        assert client.get("slow", max_items=2, timeout_msec=400) == [Item(b"first", 0)]
        assert time.monotonic() - started >= 0.35  # it waited for a second item until the deadline
        with server.thrift_client() as producer:
            waiting = socket.create_connection((server.host, server.thrift_port))
            waiting.sendall(encode_call("get", 5, queue_name="slow", max_items=2, timeout_msec=10_000))
            time.sleep(0.2)
            producer.put("slow", [b"a"])
            time.sleep(0.1)
            producer.put("slow", [b"b"])
            reply = _read_frame(waiting)
            waiting.close()
        assert b"a" in reply and b"b" in reply  # answered once both arrived, long before 10 s


def test_peek_answers_queue_info(server):
    with server.thrift_client() as client:
        empty = client.peek("info")
        assert empty.head_item is None and empty.items == 0 and empty.open_transactions == 0
        client.put("info", [b"head", b"tail"])
        client.get("info", max_items=1, auto_abort_msec=60_000)
        info = client.peek("info")
        assert info.head_item == b"tail"
        assert info.items == 1 and info.bytes == 4 and info.open_transactions == 1
        assert info.journal_bytes > 0 and info.waiters == 0


def test_flush_delete_and_flush_all(server):
    with server.thrift_client() as client:
        client.put("f1", [b"x", b"y"])
        client.put("f2", [b"z"])
        client.flush_queue("f1")
        assert client.peek("f1").items == 0
        client.put("f1", [b"again"])
        client.flush_all_queues()
        assert client.peek("f1").items == 0 and client.peek("f2").items == 0
        client.put("f3", [b"gone"])
        client.delete_queue("f3")
        assert "queue_f3_items" not in server.client().stats()
        client.flush_queue("never-made")  # a missing queue: nothing to flush, no error
        assert "queue_never-made_items" not in server.client().stats()


def test_put_stops_at_the_first_refusal(make_thrift_server, tmp_path):
    server = make_thrift_server("--config", write_config(tmp_path, '[queues."small"]\nmax_item_size = 4\n'))
    with server.thrift_client() as client:
        assert client.put("small", [b"ok", b"too long", b"ok2"]) == 1
        assert client.get("small", max_items=10) == [Item(b"ok", 0)]


# -- reliable reads -------------------------------------------------------------------------------


def test_ids_are_global_across_queues_and_connections(make_thrift_server):
    server = make_thrift_server("--max-open-transactions", "10")
    with server.thrift_client() as one, server.thrift_client() as two:
        one.put("qa", [b"a1", b"a2"])
        one.put("qb", [b"b1"])
        first = one.get("qa", max_items=2, auto_abort_msec=60_000)
        second = two.get("qb", max_items=1, auto_abort_msec=60_000)
        ids = [item.id for item in first + second]
        assert all(i >= 1 for i in ids) and len(set(ids)) == 3
        assert ids == sorted(ids)
        # confirm from the other connection, whichever queue the call names
        assert two.confirm("qa", {first[0].id, first[1].id}) == 2
        assert one.confirm("anything", {second[0].id}) == 1
        assert one.confirm("qa", {first[0].id}) == 0  # known no more
        assert one.peek("qa").open_transactions == 0 and one.peek("qb").open_transactions == 0


def test_abort_from_another_connection_puts_the_item_back_at_the_head(server):
    with server.thrift_client() as one, server.thrift_client() as two:
        one.put("ab", [b"first", b"second"])
        [item] = one.get("ab", max_items=1, auto_abort_msec=60_000)
        assert item.data == b"first"
        assert two.abort("ab", {item.id, 12345}) == 1
        assert two.get("ab", max_items=1) == [Item(b"first", 0)]


def test_auto_abort_returns_the_item_after_its_time(server):
    with server.thrift_client() as client:
        client.put("leak", [b"dropped"])
        opened = time.monotonic()
        [item] = client.get("leak", max_items=1, auto_abort_msec=800)
        assert item.id >= 1
        half_way = client.peek("leak")
        if time.monotonic() - opened < 0.8:  # answered before the abort was due (load may delay it)
            assert half_way.items == 0 and half_way.open_transactions == 1  # not before its time
        assert wait_for(lambda: client.peek("leak").items == 1)
        assert time.monotonic() - opened >= 0.8  # its timer, not an earlier one, returned it
        assert client.peek("leak").open_transactions == 0
        assert client.confirm("leak", {item.id}) == 0  # aborted: the id is unknown now
        [again] = client.get("leak", max_items=1, auto_abort_msec=60_000)
        assert again.data == b"dropped" and again.id != item.id


def test_confirm_cancels_the_auto_abort(server):
    """A confirm that came before the auto-abort was due leaves nothing for its timer to do: when
    the timer comes up, the item stays confirmed and the opener's open count is not lowered a
    second time (it would let the connection open more than ``--max-open-transactions``).

    The confirm travels in the same write as its get, so the server reads both at once and runs
    the confirm right after it answers the get, with no loop turn between: however long load
    holds either process back, the timer cannot come first. Its id is known beforehand, ids
    being handed out in turn (one read opened and confirmed just before tells the next one)."""
    short_ms = 200
    opener = socket.create_connection((server.host, server.thrift_port))
    opener.settimeout(PATIENCE)

    def call(*calls: tuple[str, int, dict]) -> list[object]:
        opener.sendall(b"".join(encode_call(method, seqid, **args) for method, seqid, args in calls))
        replies = [decode_reply(method, reply) for (method, _seqid, _args), reply
                   in zip(calls, _read_frames(opener, len(calls)), strict=True)]
        assert [seqid for seqid, _value in replies] == [seqid for _method, seqid, _args in calls]
        return [value for _seqid, value in replies]

    def get(seqid: int, auto_abort_msec: int) -> tuple[str, int, dict]:
        return "get", seqid, {"queue_name": "kept", "max_items": 1, "auto_abort_msec": auto_abort_msec}

    def confirm(seqid: int, read_id: int) -> tuple[str, int, dict]:
        return "confirm", seqid, {"queue_name": "kept", "ids": {read_id}}

    with server.thrift_client() as other:
        assert other.put("kept", [b"probe", b"confirmed", b"held", b"sentinel"]) == 4
        [[probe]] = call(get(1, 60_000))
        assert call(confirm(2, probe.id)) == [1]
        got, confirmed = call(get(3, short_ms), confirm(4, probe.id + 1))  # one write
        assert got == [Item(b"confirmed", probe.id + 1)] and confirmed == 1
        [[held]] = call(get(5, 60_000))  # the opener's one open read on the queue now
        assert held.data == b"held"
        # the sentinel's timer is due after the confirmed item's: once it is back, that timer
        # has come up too (the due ids leave in deadline order, their aborts in that order)
        [sentinel] = other.get("kept", max_items=1, auto_abort_msec=short_ms)
        assert sentinel.data == b"sentinel"
        assert wait_for(lambda: other.peek("kept").items == 1)
        info = other.peek("kept")
        assert info.items == 1 and info.open_transactions == 1  # the sentinel back; held open
        assert call(get(6, 0)) == [[]]  # still at its limit: it holds "held"
        assert call(confirm(7, probe.id + 1)) == [0]  # confirmed: known no more
        assert other.get("kept", max_items=1) == [Item(b"sentinel", 0)]
    opener.close()


def test_closing_a_connection_does_not_abort_its_reads(server):
    client = server.thrift_client()
    client.put("held", [b"x"])
    [item] = client.get("held", max_items=1, auto_abort_msec=60_000)
    client.close()
    with server.thrift_client() as other:
        time.sleep(0.2)
        info = other.peek("held")
        assert info.items == 0 and info.open_transactions == 1
        assert other.confirm("held", {item.id}) == 1
        assert other.peek("held").open_transactions == 0


def test_open_read_limit_per_connection(server):
    # --max-open-transactions is 1 (the default): a get opens at most one item, and a
    # connection holding one open read on a queue gets nothing more there, opening or not
    with server.thrift_client() as client, server.thrift_client() as other:
        client.put("lim", [b"1", b"2", b"3"])
        [first] = client.get("lim", max_items=3, auto_abort_msec=60_000)
        assert client.get("lim", max_items=3, auto_abort_msec=60_000) == []
        assert client.get("lim", max_items=1) == []
        assert len(other.get("lim", max_items=1, auto_abort_msec=60_000)) == 1
        assert other.confirm("lim", {first.id}) == 1  # the opener's count goes down
        assert [item.data for item in client.get("lim", max_items=1)] == [b"3"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_open_reads_come_back_after_a_restart(server, sig):
    client = server.thrift_client()
    client.put("crash", [b"opened", b"waiting"])
    [item] = client.get("crash", max_items=1, auto_abort_msec=600_000)
    client.close()
    server.stop(sig)
    server.start()
    with server.thrift_client() as client:
        assert client.confirm("crash", {item.id}) == 0  # ids do not survive a restart
        assert [i.data for i in client.get("crash", max_items=5)] == [b"opened", b"waiting"]


@pytest.mark.parametrize("auto_abort_msec", [60_000, 0])
def test_a_get_cut_off_by_a_hang_up_loses_nothing(make_thrift_server, auto_abort_msec):
    server = make_thrift_server("--max-open-transactions", "10")  # so the get goes on waiting
    waiting = socket.create_connection((server.host, server.thrift_port))
    waiting.sendall(encode_call("get", 1, queue_name="cut", max_items=5, timeout_msec=5_000,
                                auto_abort_msec=auto_abort_msec))
    time.sleep(0.2)
    with server.thrift_client() as client:
        client.put("cut", [b"only"])  # taken by the waiting get, which still waits for more
        time.sleep(0.2)
        waiting.close()
        # its fetched item was never answered: it goes back at once (opened: not after 60 s;
        # removed: not lost)
        assert wait_for(lambda: client.peek("cut").items == 1, timeout=5)
        assert client.get("cut", max_items=1) == [Item(b"only", 0)]


# -- interop ----------------------------------------------------------------------------------------


def test_thrift_put_memcache_get_and_back(server):
    with server.thrift_client() as client:
        assert client.put("both", [b"from thrift"]) == 1
        assert memcache_get(server, "both") == b"from thrift"
        memcache = server.client()
        assert memcache.set("both", b"from memcache") == b"STORED"
        memcache.close()
        assert client.get("both", max_items=1) == [Item(b"from memcache", 0)]


def test_queue_names_are_the_same_bytes_over_both_protocols(server):
    with server.thrift_client() as client:
        client.put("caf\u00e9", [b"x"])
    memcache = server.client()
    memcache.send("get caf\u00e9\r\n".encode())
    assert memcache.read_value() == b"x"
    memcache.close()


# -- bad input ------------------------------------------------------------------------------------


def _read_frame(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    return data


def _closes(sock: socket.socket) -> bool:
    sock.settimeout(PATIENCE)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("name", [b"no_such_method", b"__can__finagle__trace__v3__"])
def test_unknown_method_is_an_exception_and_the_connection_stays(server, name):
    # the second is the probe a Finagle client with a ClientId sends first: an UNKNOWN_METHOD
    # answer makes it go on in plain framed thrift on the same connection
    with server.thrift_client() as client:
        client.put("bad", [b"kept"])
    sock = socket.create_connection((server.host, server.thrift_port))
    body = struct.pack(">iI", -2147418111, len(name)) + name + struct.pack(">i", 9) + b"\x00"
    sock.sendall(struct.pack(">i", len(body)) + body)
    seqid, error = decode_reply("get_version", _read_frame(sock))
    assert seqid == 9 and isinstance(error, TApplicationException)
    assert error.type == TApplicationException.UNKNOWN_METHOD
    assert error.message == f"Invalid method name: '{name.decode()}'"
    sock.sendall(encode_call("get_version", 10))
    assert b"get_version" in _read_frame(sock)
    sock.close()
    assert memcache_get(server, "bad") == b"kept"


@pytest.mark.parametrize("garbage", [
    struct.pack(">i", 1 << 30) + b"x",          # a frame over the limit
    struct.pack(">i", -5),                      # a negative frame length
    struct.pack(">i", 6) + b"\x80\x01\x00\x01\x00\x00",  # a header cut short
])
def test_bad_frames_close_the_connection_and_the_next_client_is_served(server, garbage):
    with server.thrift_client() as client:
        client.put("safe", [b"kept"])
    sock = socket.create_connection((server.host, server.thrift_port))
    sock.sendall(garbage)
    assert _closes(sock)
    sock.close()
    with server.thrift_client() as client:
        assert client.get("safe", max_items=1) == [Item(b"kept", 0)]


def test_the_frame_limit_follows_max_item_bytes(make_thrift_server):
    server = make_thrift_server("--max-item-bytes", "1000")
    limit = 1000 + 64 * 1024
    # a put of one item filling the limit exactly is read and answered
    call = encode_call("put", 1, queue_name="lim", items=[b""])
    body = call[4:]
    pad = limit - len(body)
    fits = encode_call("put", 1, queue_name="lim", items=[b"x" * pad])
    assert len(fits) - 4 == limit
    sock = socket.create_connection((server.host, server.thrift_port))
    sock.sendall(fits)
    assert decode_reply("put", _read_frame(sock)) == (1, 1)
    # one byte more is refused from its length alone: closed before the body is sent
    sock.sendall(struct.pack(">i", limit + 1))
    assert _closes(sock)
    sock.close()
    with server.thrift_client() as client:
        assert client.peek("lim").items == 1


def test_arguments_that_do_not_parse_are_a_protocol_error(server):
    sock = socket.create_connection((server.host, server.thrift_port))
    good = encode_call("put", 3, queue_name="args", items=[b"a"])
    cut = good[4:-3]  # the arguments end early
    sock.sendall(struct.pack(">i", len(cut)) + cut)
    seqid, error = decode_reply("put", _read_frame(sock))
    assert seqid == 3 and isinstance(error, TApplicationException)
    assert error.type == TApplicationException.PROTOCOL_ERROR
    sock.sendall(encode_call("get_version", 4))
    assert b"get_version" in _read_frame(sock)
    sock.close()
    with server.thrift_client() as client:
        assert client.peek("args").items == 0  # the broken put added nothing


def test_an_illegal_queue_name_closes_the_connection(server):
    client = server.thrift_client()
    with pytest.raises((TTransportException, OSError, EOFError)):
        client.put("bad/name", [b"x"])
    client.close()
    with server.thrift_client() as client:
        assert client.current_status() == Status.UP


# -- status -------------------------------------------------------------------------------------


def test_read_only_refuses_writes_by_closing(server):
    with server.thrift_client() as admin:
        admin.put("ro", [b"x"])
        admin.set_status(Status.READ_ONLY)
        assert admin.current_status() == Status.READ_ONLY
    for call in (lambda c: c.put("ro", [b"y"]), lambda c: c.flush_queue("ro"),
                 lambda c: c.delete_queue("ro"), lambda c: c.flush_all_queues()):
        client = server.thrift_client()
        with pytest.raises((TTransportException, OSError, EOFError)):
            call(client)
        client.close()
    with server.thrift_client() as client:
        assert client.get("ro", max_items=5) == [Item(b"x", 0)]  # reads go on
        client.set_status(Status.UP)
        assert client.put("ro", [b"y"]) == 1


def test_read_only_refuses_a_put_pipelined_behind_a_peek(server):
    with server.thrift_client() as admin:
        admin.put("ro_pipe", [b"x"])
        admin.set_status(Status.READ_ONLY)
    sock = socket.create_connection((server.host, server.thrift_port))
    # one batch on one queue: only the peek, its head, is checked before the lookup
    sock.sendall(encode_call("peek", 1, queue_name="ro_pipe")
                 + encode_call("put", 2, queue_name="ro_pipe", items=[b"y"]))
    seqid, info = decode_reply("peek", _read_frame(sock))
    assert (seqid, info.items) == (1, 1)
    assert _closes(sock)  # the put is refused as if it had come alone: closed, no reply
    sock.close()
    with server.thrift_client() as client:
        client.set_status(Status.UP)
        assert client.get("ro_pipe", max_items=5) == [Item(b"x", 0)]


def test_quiescent_refuses_reads_by_closing_but_confirm_works(server):
    with server.thrift_client() as client:
        client.put("qu", [b"x"])
        [item] = client.get("qu", max_items=1, auto_abort_msec=60_000)
        client.set_status(Status.QUIESCENT)
        assert client.confirm("qu", {item.id}) == 1
    for call in (lambda c: c.get("qu", max_items=1), lambda c: c.peek("qu")):
        client = server.thrift_client()
        with pytest.raises((TTransportException, OSError, EOFError)):
            call(client)
        client.close()
    with server.thrift_client() as client:
        client.set_status(Status.UP)


def test_set_status_not_configured_closes(server):
    client = server.thrift_client()
    with pytest.raises((TTransportException, OSError, EOFError)):
        client.set_status(Status.NOT_CONFIGURED)
    client.close()
    with server.thrift_client() as client:
        assert client.current_status() == Status.UP


def test_write_avoid_is_not_configured_over_thrift(server):
    memcache = server.client()
    assert memcache.call(b"status writeavoid") == b"END"
    memcache.close()
    with server.thrift_client() as client:
        assert client.current_status() == Status.NOT_CONFIGURED


# -- stats ---------------------------------------------------------------------------------------


def test_stats_count_thrift_sessions_and_items(server):
    memcache = server.client()

    def connections() -> int:
        return int(memcache.stats()["curr_connections"])

    assert wait_for(lambda: connections() == 1)  # this one (the start-up probes have gone)
    before = memcache.stats()
    one, two = server.thrift_client(), server.thrift_client()
    one.get_version()
    two.get_version()
    assert connections() == 3
    assert one.put("counted", [b"a", b"b", b"c"]) == 3
    assert len(one.get("counted", max_items=2)) == 2
    one.peek("counted")
    one.close()
    two.close()
    assert wait_for(lambda: connections() == 1)
    after = memcache.stats()
    assert int(after["total_connections"]) - int(before["total_connections"]) == 2
    assert int(after["cmd_set"]) - int(before["cmd_set"]) == 3
    assert int(after["cmd_get"]) - int(before["cmd_get"]) == 2
    assert int(after["cmd_peek"]) - int(before["cmd_peek"]) == 1
    assert int(after["get_hits"]) - int(before["get_hits"]) == 3  # 2 removed + the peek
    memcache.close()


# -- pipelining and aliases --------------------------------------------------------------------


def _read_frames(sock: socket.socket, count: int) -> list[bytes]:
    data = b""
    frames = []
    while len(frames) < count:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {len(frames)} replies")
        data += chunk
        while len(data) >= 4 and len(data) >= 4 + struct.unpack(">i", data[:4])[0]:
            end = 4 + struct.unpack(">i", data[:4])[0]
            frames.append(data[:end])
            data = data[end:]
    return frames


def test_pipelined_calls_are_answered_in_order(server):
    sock = socket.create_connection((server.host, server.thrift_port))
    sock.sendall(
        encode_call("put", 1, queue_name="pipe", items=[b"a", b"b"])
        + encode_call("get", 2, queue_name="pipe", max_items=5)
        + encode_call("peek", 3, queue_name="pipe")
        + encode_call("get_version", 4)
    )
    replies = _read_frames(sock, 4)
    sock.close()
    assert decode_reply("put", replies[0]) == (1, 2)
    assert decode_reply("get", replies[1]) == (2, [Item(b"a", 0), Item(b"b", 0)])
    seqid, info = decode_reply("peek", replies[2])
    assert seqid == 3 and info.items == 0
    assert decode_reply("get_version", replies[3])[0] == 4


def test_put_to_an_alias_reaches_every_destination(make_thrift_server, tmp_path):
    server = make_thrift_server("--config", write_config(tmp_path, '[aliases]\nboth = ["d1", "d2"]\n'))
    with server.thrift_client() as client:
        assert client.put("both", [b"x", b"y"]) == 2
        assert client.get("both", max_items=5) == []  # an alias holds no items
        assert client.peek("both").items == 0
        for name in ("d1", "d2"):
            assert [item.data for item in client.get(name, max_items=5)] == [b"x", b"y"]
