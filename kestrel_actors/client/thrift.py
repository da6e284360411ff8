"""A small client for Kestrel's thrift protocol (framed transport, binary protocol).

It is thriftpy2's client for the IDL the server ships (``protocol/kestrel.thrift``), so it
speaks exactly what any client generated from that file speaks; the load tests and the tests
use it. :func:`encode_call` and :func:`decode_reply` are the same encoding without a socket
(thriftpy2's framed transport over a memory buffer), for tests and pipelining::

    with ThriftClient("127.0.0.1", 2229) as client:
        client.put("jobs", [b"one", b"two"])
        items = client.get("jobs", max_items=2, auto_abort_msec=30_000)
        client.confirm("jobs", {item.id for item in items})
"""

from __future__ import annotations

import builtins
import socket
from collections.abc import Iterable
from typing import Any, Protocol, Self

from thriftpy2.protocol import TBinaryProtocol
from thriftpy2.thrift import TApplicationException, TClient, TMessageType
from thriftpy2.transport import TFramedTransport, TMemoryBuffer, TSocket, TTransportException

from ..protocol.thrift import KESTREL_IDL, ThriftItem, ThriftQueueInfo, ThriftStatus
from ._connection import connect_socket, cooperative

__all__ = [
    "Item",
    "QueueInfo",
    "Status",
    "ThriftClient",
    "decode_reply",
    "encode_call",
]

Item = ThriftItem
"""``Item(data: bytes, id: int)``: ``id`` is 0 unless the get opened it (``auto_abort_msec``)."""
QueueInfo = ThriftQueueInfo
Status = ThriftStatus
"""``Status.NOT_CONFIGURED``, ``QUIESCENT``, ``READ_ONLY``, ``UP`` (ints)."""

_SERVICE = KESTREL_IDL.Kestrel


# thriftpy2 makes the IDL's classes at run time, so a type checker sees only their fields here.
class _ItemFields(Protocol):
    data: bytes
    id: int


class _QueueInfoFields(Protocol):
    head_item: builtins.bytes | None
    items: int
    bytes: int
    journal_bytes: int
    age: int
    waiters: int
    open_transactions: int


class ThriftClient:
    """One connection to a server's thrift port; calls are synchronous, one at a time.

    ``timeout`` (seconds) bounds the connect and each reply; a ``get`` that may wait on the
    server gets its ``timeout_msec`` on top. The socket is gevent's where gevent is in charge
    (a hub running in this thread, or a monkey-patched socket module; ``use_gevent`` forces
    the choice), as for the memcache client, so greenlets of a load test share one thread. A
    ``TApplicationException`` reply is raised as one; a closed connection raises thriftpy2's ``TTransportException``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 2229, timeout: float = 10.0,
                 use_gevent: bool | None = None) -> None:
        self._timeout_ms = max(1, int(timeout * 1000))
        socket_module = _socket_module(use_gevent)
        try:
            sock = connect_socket(socket_module, host, port, timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise TTransportException(TTransportException.NOT_OPEN,
                                      f"Could not connect to {(host, port)}: {exc}") from exc
        self._socket = TSocket(sock=sock, socket_timeout=self._timeout_ms)
        self._client = TClient(_SERVICE, TBinaryProtocol(TFramedTransport(self._socket)))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def put(self, queue: str, items: Iterable[bytes], expiration_msec: int = 0) -> int:
        """Add ``items`` in order; returns how many were added (it stops at a refusal)."""
        return self._client.put(queue, list(items), expiration_msec)

    def get(
        self, queue: str, max_items: int = 1, timeout_msec: int = 0, auto_abort_msec: int = 0
    ) -> list[_ItemFields]:
        if timeout_msec > 0:
            self._socket.set_timeout(self._timeout_ms + timeout_msec)
        try:
            return self._client.get(queue, max_items, timeout_msec, auto_abort_msec)
        finally:
            if timeout_msec > 0:
                self._socket.set_timeout(self._timeout_ms)

    def confirm(self, queue: str, ids: Iterable[int]) -> int:
        return self._client.confirm(queue, set(ids))

    def abort(self, queue: str, ids: Iterable[int]) -> int:
        return self._client.abort(queue, set(ids))

    def peek(self, queue: str) -> _QueueInfoFields:
        return self._client.peek(queue)

    def flush_queue(self, queue: str) -> None:
        self._client.flush_queue(queue)

    def flush_all_queues(self) -> None:
        self._client.flush_all_queues()

    def delete_queue(self, queue: str) -> None:
        self._client.delete_queue(queue)

    def current_status(self) -> int:
        return self._client.current_status()

    def set_status(self, status: int) -> None:
        self._client.set_status(status)

    def get_version(self) -> str:
        return self._client.get_version()


def _socket_module(use_gevent: bool | None) -> Any:
    """gevent's socket module where gevent is in charge (:func:`cooperative`, the one rule)."""
    if use_gevent or (use_gevent is None and cooperative() is not None):
        from gevent import socket as gevent_socket

        return gevent_socket
    return socket


def encode_call(method: str, seqid: int = 0, /, **args: object) -> bytes:
    """The framed CALL message a thriftpy2 client sends for ``method(**args)``."""
    buffer = TMemoryBuffer()
    transport = TFramedTransport(buffer)
    protocol = TBinaryProtocol(transport)
    protocol.write_message_begin(method, TMessageType.CALL, seqid)
    protocol.write_struct(getattr(_SERVICE, f"{method}_args")(**args))
    protocol.write_message_end()
    transport.flush()
    return buffer.getvalue()


def decode_reply(method: str, data: bytes) -> tuple[int, object]:
    """The seqid and return value of a framed reply to ``method``, as a thriftpy2 client reads
    it; an exception reply is returned (not raised) as the ``TApplicationException``."""
    protocol = TBinaryProtocol(TFramedTransport(TMemoryBuffer(data)))
    _name, message_type, seqid = protocol.read_message_begin()
    if message_type == TMessageType.EXCEPTION:
        error = TApplicationException()
        protocol.read_struct(error)
        return seqid, error
    result = getattr(_SERVICE, f"{method}_result")()
    protocol.read_struct(result)
    return seqid, getattr(result, "success", None)
