"""Deeply pipelined memcache traffic for the durability and read-behind tests.

:class:`Pipeline` is one connection on which a background thread streams requests while the
test thread parses the replies, so hundreds of thousands of SETs or GETs cost about what the
server needs to answer them. Replies are parsed from a ``bytearray`` by offset; nothing is
copied per reply except the item itself.
"""

from __future__ import annotations

import socket
import threading
from typing import Iterable, Iterator

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


class Pipeline:
    """One memcache connection: :meth:`stream` sends, the ``read_*`` methods parse replies."""

    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._pos = 0
        self._sender: threading.Thread | None = None
        self.send_error: BaseException | None = None

    # -- sending --------------------------------------------------------------------------

    def stream(self, chunks: Iterable[bytes]) -> None:
        """Send ``chunks`` from a background thread (replies are read meanwhile)."""
        self.wait_sent()

        def send() -> None:
            try:
                for chunk in chunks:
                    self.sock.sendall(chunk)
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
        self.stream(_batches((b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(d), d) for d in items), batch))

    def stream_gets(self, key: str, count: int, batch: int = 1000) -> None:
        """Stream ``count`` times ``get key``."""
        request = b"get %s\r\n" % key.encode()
        self.stream(request * min(batch, count - start) for start in range(0, count, batch))

    # -- receiving ------------------------------------------------------------------------

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        if self._pos > (1 << 20):
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += chunk

    def read_line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n", self._pos)
            if end >= 0:
                line = bytes(self._buf[self._pos:end])
                self._pos = end + 2
                return line
            self._fill()

    def read_exact(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n:
            self._fill()
        data = bytes(self._buf[self._pos:self._pos + n])
        self._pos += n
        return data

    def read_value(self) -> bytes | None:
        """One GET reply: the item, or None for ``END``."""
        line = self.read_line()
        if line == b"END":
            return None
        assert line.startswith(b"VALUE "), line[:100]
        data = self.read_exact(int(line.rsplit(b" ", 1)[1]) + 2)
        assert data.endswith(b"\r\n")
        end = self.read_line()
        assert end == b"END", end[:100]
        return data[:-2]

    def read_values(self, count: int) -> Iterator[bytes | None]:
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
        values = list(self.read_values(count))
        self.wait_sent()
        return values

    def close(self) -> None:
        self.sock.close()


def _batches(requests: Iterable[bytes], size: int) -> Iterator[bytes]:
    batch: list[bytes] = []
    for request in requests:
        batch.append(request)
        if len(batch) >= size:
            yield b"".join(batch)
            batch = []
    if batch:
        yield b"".join(batch)
