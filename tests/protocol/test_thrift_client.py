"""``ThriftClient`` over a real loopback socket, answered by the thrift codec.

The server's thrift session handler is not wired yet (ADR 0004), so the far end here is the
codec under test behind a socket -- ``ThriftDecoder`` in, ``encode_thrift_result`` out, with
fixed answers -- not a stand-in for the queue server: these tests prove the client's framing,
timeouts and error paths against our codec over TCP. Tests of the semantics belong with the
handler, against a real ``serve --thrift-port``.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TTransportException

from kestrel_actors import protocol as p
from kestrel_actors.client.thrift import Item, QueueInfo, Status, ThriftClient


class CodecPeer:
    """Accepts one connection and answers each decoded call; records what it decoded."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.calls: list[object] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _answer(self, call: object) -> bytes | None:
        if isinstance(call, p.ThriftPut):
            return p.encode_thrift_result(call, len(call.items))
        if isinstance(call, p.ThriftGet):
            if call.timeout_msec > 0:
                time.sleep(call.timeout_msec / 1000)  # a get that waits its whole timeout
            items = [Item(data=b"item%d" % i, id=i + 1) for i in range(call.max_items)]
            return p.encode_thrift_result(call, items)
        if isinstance(call, (p.ThriftConfirm, p.ThriftAbort)):
            return p.encode_thrift_result(call, len(call.ids))
        if isinstance(call, p.ThriftPeek):
            if call.queue == "drop":
                return None
            if call.queue == "boom":
                return p.encode_thrift_exception(
                    "peek", call.seqid, TApplicationException.INTERNAL_ERROR, "boom"
                )
            return p.encode_thrift_result(call, QueueInfo(b"h", 1, 2, 3, 4, 5, 6))
        if isinstance(call, p.ThriftCurrentStatus):
            return p.encode_thrift_result(call, Status.READ_ONLY)
        if isinstance(call, p.ThriftGetVersion):
            return p.encode_thrift_result(call, "test-version")
        return p.encode_thrift_result(call)  # the void methods

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        decoder = p.ThriftDecoder()
        with connection:
            while data := connection.recv(65536):
                for call in decoder.feed(data):
                    self.calls.append(call)
                    reply = call.reply if type(call) is p.Bad else self._answer(call)
                    if reply is None:
                        return
                    connection.sendall(reply)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def peer():
    peer = CodecPeer()
    yield peer
    peer.close()


def test_every_method_round_trips(peer):
    with ThriftClient("127.0.0.1", peer.port, timeout=5) as client:
        assert client.put("q", [b"a", b"b"], expiration_msec=100) == 2
        assert client.get("q", max_items=2, auto_abort_msec=500) == [
            Item(data=b"item0", id=1),
            Item(data=b"item1", id=2),
        ]
        assert client.confirm("q", [1, 2, 2]) == 2
        assert client.abort("q", {7}) == 1
        assert client.peek("q") == QueueInfo(b"h", 1, 2, 3, 4, 5, 6)
        assert client.flush_queue("q") is None
        assert client.flush_all_queues() is None
        assert client.delete_queue("q") is None
        assert client.current_status() == Status.READ_ONLY
        assert client.set_status(Status.UP) is None
        assert client.get_version() == "test-version"
    assert [type(c) for c in peer.calls] == [
        p.ThriftPut, p.ThriftGet, p.ThriftConfirm, p.ThriftAbort, p.ThriftPeek,
        p.ThriftFlushQueue, p.ThriftFlushAllQueues, p.ThriftDeleteQueue,
        p.ThriftCurrentStatus, p.ThriftSetStatus, p.ThriftGetVersion,
    ]
    assert peer.calls[0] == p.ThriftPut(0, "q", (b"a", b"b"), 100)
    assert peer.calls[2] == p.ThriftConfirm(0, "q", frozenset({1, 2}))
    assert peer.calls[9] == p.ThriftSetStatus(0, Status.UP)


def test_a_waiting_get_is_not_cut_off_by_the_socket_timeout(peer):
    with ThriftClient("127.0.0.1", peer.port, timeout=0.2) as client:
        assert client.get("q", max_items=1, timeout_msec=600) == [Item(data=b"item0", id=1)]
        assert client.get_version() == "test-version"


def test_an_exception_reply_is_raised_and_the_connection_goes_on(peer):
    with ThriftClient("127.0.0.1", peer.port, timeout=5) as client:
        with pytest.raises(TApplicationException) as raised:
            client.peek("boom")
        assert raised.value.type == TApplicationException.INTERNAL_ERROR
        assert client.get_version() == "test-version"


def test_a_closed_connection_raises(peer):
    with ThriftClient("127.0.0.1", peer.port, timeout=5) as client, pytest.raises(TTransportException):
        client.peek("drop")
