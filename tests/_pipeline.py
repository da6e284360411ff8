"""Deeply pipelined memcache traffic for the durability and read-behind tests.

:class:`Pipeline` is one connection on which a background thread streams requests while the
test thread parses the replies, so hundreds of thousands of SETs or GETs cost about what the
server needs to answer them. The replies are parsed by the client's own
:class:`~kestrel_actors.client.Connection`.
"""

from __future__ import annotations

import threading
from typing import Iterable, Iterator

from kestrel_actors.client import Connection, set_request

__all__ = ["Pipeline", "numbered", "number_of", "read_rss_kib"]


def numbered(i: int, size: int = 1024, tag: bytes = b"") -> bytes:
    """Item ``i`` of a sequence: ``<tag><i, 10 digits>:`` padded with ``.`` to ``size`` bytes."""
    head = b"%s%010d:" % (tag, i)
    return head + b"." * (size - len(head))


def number_of(data: bytes, tag: bytes = b"") -> int:
    """The ``i`` of :func:`numbered` data (asserts the tag)."""
    assert data.startswith(tag), data[:40]
    return int(data[len(tag):len(tag) + 10])


def read_rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB, from ``/proc/<pid>/status``."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


class Pipeline(Connection):
    """One memcache connection (:class:`kestrel_actors.client.Connection`, blocking sockets):
    :meth:`stream` sends from a thread while the ``read_*`` methods parse the replies."""

    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        super().__init__(host, port, timeout, use_gevent=False)
        self.connect()
        self._sender: threading.Thread | None = None
        self.send_error: BaseException | None = None

    # -- sending --------------------------------------------------------------------------

    def stream(self, chunks: Iterable[bytes]) -> None:
        """Send ``chunks`` from a background thread (replies are read meanwhile)."""
        self.wait_sent()
        sock = self.sock

        def send() -> None:
            try:
                for chunk in chunks:
                    sock.sendall(chunk)
            except BaseException as exc:  # noqa: BLE001 - reported by wait_sent
                self.send_error = exc

        self._sender = threading.Thread(target=send, daemon=True)
        self._sender.start()

    def wait_sent(self, timeout: float = 120.0) -> None:
        if self._sender is not None:
            self._sender.join(timeout)
            assert not self._sender.is_alive(), "sender stuck"
            self._sender = None
        if self.send_error is not None:
            raise self.send_error

    def stream_sets(self, queue: str, items: Iterable[bytes], batch: int = 1000) -> None:
        """Stream ``set queue 0 0 <len>`` for every item, ``batch`` requests per ``sendall``."""
        self.stream(_batches((set_request(queue, data) for data in items), batch))

    def stream_gets(self, key: str, count: int, batch: int = 1000) -> None:
        """Stream ``count`` times ``get key``."""
        request = b"get %s\r\n" % key.encode()
        self.stream(request * min(batch, count - start) for start in range(0, count, batch))

    # -- receiving ------------------------------------------------------------------------

    def read_replies(self, count: int) -> Iterator[bytes | None]:
        for _ in range(count):
            yield self.read_value()

    def expect_stored(self, count: int) -> None:
        for i in range(count):
            line = self.read_line()
            assert line == b"STORED", f"reply {i}: {line[:100]!r}"

    def set_all(self, queue: str, items: list[bytes], batch: int = 1000) -> None:
        """SET every item, pipelined; every reply must be ``STORED``."""
        self.stream_sets(queue, items, batch)
        self.expect_stored(len(items))
        self.wait_sent()

    def get_all(self, queue: str, count: int, batch: int = 1000) -> list[bytes | None]:
        """``count`` pipelined GETs; the replies (None for a miss)."""
        self.stream_gets(queue, count, batch)
        values = list(self.read_replies(count))
        self.wait_sent()
        return values


def _batches(requests: Iterable[bytes], size: int) -> Iterator[bytes]:
    batch: list[bytes] = []
    for request in requests:
        batch.append(request)
        if len(batch) >= size:
            yield b"".join(batch)
            batch = []
    if batch:
        yield b"".join(batch)
