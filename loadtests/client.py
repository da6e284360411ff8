"""The one memcache-protocol client every load scenario uses (gevent sockets, exact replies).

Kestrel's ``LoadTesting`` helpers send pre-built request bytes and read back exactly the
reply they expect, failing on the first byte that differs. ``Conn`` does the same with a
cooperative gevent socket, so one process can drive hundreds of connections, and keeps the
per-request cost to one ``send`` plus (usually) one wait and one ``recv`` (about 10 usec of
client CPU per request, measured against the real server):

* ``expect(reply)`` reads ``len(reply)`` bytes and raises ``UnexpectedReply`` on a mismatch.
  It gives up early if the bytes received so far already differ, so a short error reply
  (``ERROR``, ``CLIENT_ERROR``) is reported at once instead of after the I/O timeout.
* ``read_get(hit_len)`` reads one GET (or monitor) reply whose hit is known to be
  ``hit_len`` bytes long: ``None`` for ``END``, else the whole ``VALUE ... END`` block.

Request builders (``set_request`` …) and reply builders (``value_reply`` …) are plain
functions, so scenarios build their bytes once, before the timed loop.
"""

from __future__ import annotations

import ipaddress
import socket as _stdlib_socket
import time

import gevent
from gevent import socket

__all__ = [
    "Conn", "ConnectFailed", "ConnectionClosed", "HarnessError", "UnexpectedReply",
    "END", "STORED", "check_loopback", "confirm_request", "get_request", "monitor_request",
    "set_request", "value_reply", "read_stats",
]

END = b"END\r\n"
STORED = b"STORED\r\n"
_RECV = 64 * 1024  # larger recv() buffers are mmap-allocated per call: 10x slower


class UnexpectedReply(Exception):
    """The server sent bytes other than the ones the scenario requires (a correctness failure)."""


class ConnectionClosed(UnexpectedReply):
    """The server closed the connection where a reply was required (a correctness failure)."""


class HarnessError(Exception):
    """The run could not be carried out (no connection, timeout): not a verdict on the server."""


class ConnectFailed(HarnessError):
    """No connection could be made within the retry budget."""


def set_request(queue: str, data: bytes, exptime: int = 0) -> bytes:
    """``set <q> 0 <exptime> <len>\\r\\n<data>\\r\\n``."""
    return b"set %s 0 %d %d\r\n%s\r\n" % (queue.encode(), exptime, len(data), data)


def get_request(queue: str, options: str = "") -> bytes:
    """``get <q><options>\\r\\n``; ``options`` is e.g. ``/t=1000/close/open``."""
    return b"get %s%s\r\n" % (queue.encode(), options.encode())


def monitor_request(queue: str, seconds: int, max_items: int) -> bytes:
    """``monitor <q> <seconds> <max_items>\\r\\n``."""
    return b"monitor %s %d %d\r\n" % (queue.encode(), seconds, max_items)


def confirm_request(queue: str, count: int) -> bytes:
    """``confirm <q> <count>\\r\\n`` (reply ``END``)."""
    return b"confirm %s %d\r\n" % (queue.encode(), count)


def value_reply(queue: str, data: bytes) -> bytes:
    """The exact bytes of a GET hit: ``VALUE <q> 0 <len>\\r\\n<data>\\r\\nEND\\r\\n``."""
    return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (queue.encode(), len(data), data)


def check_loopback(host: str) -> None:
    """Refuse (HarnessError) to aim load at anything but a loopback address."""
    try:
        infos = _stdlib_socket.getaddrinfo(host, None)
    except OSError as exc:
        raise HarnessError(f"cannot resolve {host!r}: {exc}") from exc
    for info in infos:
        if not ipaddress.ip_address(info[4][0]).is_loopback:
            raise HarnessError(f"{host} is not a loopback address; pass --allow-remote to load it")


class Conn:
    """One TCP connection to the server with a receive buffer (used by one greenlet at a time).

    With ``watched=True`` (the connections of timed clients) the socket has no timeout of its
    own: gevent would otherwise arm a timer for every wait, which costs more than the
    request. Instead ``waiting_since`` tells the runner's watchdog how long the connection
    has been waiting for a reply, and the watchdog enforces ``timeout``.
    """

    __slots__ = ("host", "port", "timeout", "watched", "sock", "raw", "buf", "retries",
                 "waiting_since", "_wait", "_readable")

    def __init__(self, host: str, port: int, timeout: float = 30.0, watched: bool = False) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.watched = watched
        self.sock: socket.socket | None = None
        self.raw = None
        self.buf = bytearray()
        self.retries = 0
        self.waiting_since = 0
        self._wait = self._readable = None

    # -- connection ---------------------------------------------------------------------

    def connect(self, attempts: int = 1000, pause: float = 0.01) -> Conn:
        """Connect, retrying like Kestrel's ``tryHard`` (bounded by ``attempts``)."""
        self.close()
        for attempt in range(1, attempts + 1):
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
                break
            except OSError as exc:
                self.retries += 1
                if attempt % 1000 == 0:
                    print(f"Failed to connect after {attempt} attempts", flush=True)
                if attempt == attempts:
                    raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
                gevent.sleep(pause)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.watched:
            sock.settimeout(None)
        self.sock = sock
        # gevent internals, used when present: the raw non-blocking socket (one C call per
        # send) and the socket's own read watcher (park until readable without first paying
        # for an EAGAIN exception). Without them the public gevent methods are used.
        self.raw = getattr(sock, "_sock", None)
        wait, readable = getattr(sock, "_wait", None), getattr(sock, "_read_event", None)
        if self.watched and self.raw is not None and wait is not None and readable is not None:
            self._wait, self._readable = wait, readable
        return self

    def close(self) -> None:
        """Close the socket (a hang-up: the server aborts this connection's open reads)."""
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = self.raw = self._wait = self._readable = None
                self.buf.clear()
                self.waiting_since = 0

    @property
    def connected(self) -> bool:
        return self.sock is not None

    # -- I/O ----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        try:
            raw = self.raw
            if raw is not None:
                try:
                    sent = raw.send(data)
                except BlockingIOError:
                    sent = 0
                if sent == len(data):
                    return
                self.sock.sendall(memoryview(data)[sent:])
            else:
                self.sock.sendall(data)
        except OSError as exc:
            raise ConnectionClosed(f"send failed: {exc}") from exc

    def _chunk(self, want: bytes | None) -> bytes:
        """Receive one chunk; classify EOF, errors and (unwatched) timeouts."""
        self.waiting_since = time.monotonic_ns()
        try:
            if self._wait is not None:
                self._wait(self._readable)
                try:
                    chunk = self.raw.recv(_RECV)
                except BlockingIOError:  # a spurious wake-up
                    chunk = self.sock.recv(_RECV)
            else:
                chunk = self.sock.recv(_RECV)
        except socket.timeout:
            raise self.stalled(want) from None
        except OSError as exc:
            raise ConnectionClosed(f"receive failed: {exc}; buffered {_show(self.buf)}") from exc
        finally:
            self.waiting_since = 0
        if not chunk:
            raise ConnectionClosed(f"server closed the connection; buffered {_show(self.buf)} "
                                   f"(wanted {_show(want)})")
        return chunk

    def stalled(self, want: bytes | None = None) -> Exception:
        """The error for a reply that did not come within ``timeout``."""
        if self.buf:
            return UnexpectedReply(f"incomplete reply after {self.timeout:g}s: {_show(self.buf)}"
                                   + (f" (wanted {_show(want)})" if want else ""))
        return HarnessError(f"no reply within {self.timeout:g}s"
                            + (f" (wanted {_show(want)})" if want else ""))

    def _recv(self, want: bytes | None = None) -> None:
        """Append one chunk to the buffer."""
        self.buf += self._chunk(want)

    def expect(self, expected: bytes) -> None:
        """Read exactly ``expected``; UnexpectedReply as soon as the bytes differ."""
        buf = self.buf
        n = len(expected)
        if not buf:
            chunk = self._chunk(expected)
            if chunk == expected:  # the fast path: one recv, one compare
                return
            buf += chunk
        while len(buf) < n:
            if not expected.startswith(buf):
                break
            self._recv(expected)
        if buf[:n] != expected:
            raise UnexpectedReply(f"expected {_show(expected)}, got {_show(buf[:n])}")
        del buf[:n]

    def read_get(self, hit_len: int) -> bytes | None:
        """One GET reply: None for ``END``, else the whole ``hit_len``-byte VALUE block."""
        buf = self.buf
        if not buf:
            chunk = self._chunk(b"VALUE|END")
            if len(chunk) == hit_len and chunk.startswith(b"VALUE"):  # the fast path
                return chunk
            if chunk == END:
                return None
            buf += chunk
        while len(buf) < 5:
            if not (END.startswith(buf) or b"VALUE".startswith(buf)):
                break
            self._recv(b"VALUE|END")
        if buf[:5] == END:
            del buf[:5]
            return None
        if buf[:5] != b"VALUE":
            raise UnexpectedReply(f"expected VALUE or END, got {_show(buf)}")
        while len(buf) < hit_len:
            self._recv(b"VALUE block of %d bytes" % hit_len)
        data = bytes(buf[:hit_len])
        del buf[:hit_len]
        return data

    def read_line(self) -> bytes:
        """One reply line without its CRLF (for STATS and other non-hot paths)."""
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            self._recv(b"a line")

    def call(self, request: bytes, expected: bytes) -> None:
        """Send ``request`` and require exactly ``expected`` back."""
        self.send(request)
        self.expect(expected)


def read_stats(conn: Conn) -> dict[str, str]:
    """Send ``stats`` and return the ``STAT name value`` pairs."""
    conn.send(b"stats\r\n")
    result: dict[str, str] = {}
    for _ in range(100_000):
        line = conn.read_line()
        if line == b"END":
            return result
        parts = line.decode("latin-1").split(" ", 2)
        if len(parts) != 3 or parts[0] != "STAT":
            raise UnexpectedReply(f"bad STATS line {line!r}")
        result[parts[1]] = parts[2]
    raise UnexpectedReply("STATS reply never ended")


def _show(data: bytes | bytearray | None, limit: int = 80) -> str:
    if data is None:
        return "nothing"
    data = bytes(data)
    return repr(data[:limit]) + (f"...({len(data)} bytes)" if len(data) > limit else "")
