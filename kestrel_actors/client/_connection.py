"""One TCP connection to one server, with a receive buffer: the client's only socket code.

:class:`Connection` is both what :class:`~kestrel_actors.client.Client` pools and the raw API
for callers that build their own request bytes (the load tests, the protocol tests):
``send`` bytes, then ``expect`` an exact reply, ``read_get`` a GET reply of a known size, or
read lines and values. Kestrel's load tests work this way (send pre-built bytes, compare the
reply byte for byte), and the per-request cost stays at one ``send`` and usually one ``recv``.

Sockets are cooperative when gevent is in use, chosen once per connection (:func:`cooperative`):
gevent's socket when the socket module is monkey-patched or the current thread already runs a
gevent hub, the standard blocking socket otherwise. gevent is never imported here unless the
program has imported it already, so a threads-only program (the Spark bridge) never loads it.
"""

from __future__ import annotations

import _socket
import socket as _stdlib_socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ._errors import ConnectFailed, ConnectionLost, ReplyTimeout, UnexpectedReply
from ._wire import PackedValues, ValueScan, expect_end, get_reply_size, parse_stat, parse_stored, parse_value_header

__all__ = ["Connection", "connect_socket", "cooperative"]

_RECV = 64 * 1024  # larger recv() buffers are mmap-allocated per call: 10x slower
_PIPELINE = 256  # pipelined SETs per round trip: neither side's socket buffer fills
_END = b"END\r\n"


def cooperative() -> Any | None:
    """The gevent hub that sockets made now must cooperate with, or None for plain blocking
    sockets: a monkey-patched socket module or a hub already running in this thread means
    gevent is in charge here; a thread without a hub (py4j's, a worker pool's) blocks."""
    gevent_hub = sys.modules.get("gevent.hub")
    if gevent_hub is None:
        return None
    get_hub_if_exists: Callable[[], Any] | None = getattr(gevent_hub, "_get_hub", None)  # never creates a hub
    if get_hub_if_exists is None:
        from gevent._hub_local import get_hub_if_exists as hub_local_getter
        get_hub_if_exists = hub_local_getter
    hub = get_hub_if_exists()
    if hub is not None:
        return hub
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("socket"):
        return gevent_hub.get_hub()
    return None


def connect_socket(socket_module: Any, host: str, port: int, timeout: float | None) -> Any:
    """``socket_module.create_connection((host, port), timeout)``, but a numeric address (the
    load tests' 127.0.0.1) is connected to as it is, without the module's resolver.

    gevent's ``create_connection`` resolves every address on the hub's threadpool, a numeric
    one too: ten clients connecting at once started ten OS threads. Python 3.11 crashes
    (SIGSEGV in ``_PyThreadState_SetCurrent``) when a process exits before a thread it started
    has first run: the load generator did, on a loaded machine, a fraction of a second after
    its clients had connected. A name still goes through the module's resolver, whose lookup
    may block (gevent's keeps it off the hub).
    """
    try:  # the C module's: gevent never patches it, and a numeric address needs no lookup
        found = _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM, 0,
                                    _socket.AI_NUMERICHOST | _socket.AI_NUMERICSERV)
    except (OSError, UnicodeError):  # a name
        return socket_module.create_connection((host, port), timeout=timeout)
    family, kind, proto, _, address = found[0]
    sock = socket_module.socket(family, kind, proto)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


class Connection:
    """One connection (one greenlet or thread at a time), connected by :meth:`connect`.

    ``timeout`` bounds every wait for bytes (:class:`ReplyTimeout` after it). With
    ``watched=True`` the socket has no timeout of its own (gevent arms a timer per wait, which
    costs more than a request): ``waiting_since`` tells an outside watchdog how long the
    connection has been waiting, and the watchdog enforces ``timeout`` (the load tests).
    ``use_gevent`` forces the socket kind; None decides by :func:`cooperative`.
    ``connect_timeout`` bounds making the connection (default: ``timeout``).
    """

    EOL = b"\r\n"

    __slots__ = ("host", "port", "timeout", "connect_timeout", "watched", "use_gevent", "sock",
                 "raw", "buf", "retries", "waiting_since", "hub", "_wait", "_readable", "_sleep")

    def __init__(self, host: str, port: int, timeout: float = 30.0, watched: bool = False,
                 use_gevent: bool | None = None, connect_timeout: float | None = None) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self.watched = watched
        self.use_gevent = use_gevent
        self.sock: Any = None
        self.raw: Any = None
        self.buf = bytearray()
        self.retries = 0
        self.waiting_since = 0
        self.hub: Any = None
        self._wait = self._readable = None
        self._sleep: Callable[[float], None] = time.sleep

    # -- connection ---------------------------------------------------------------------

    def connect(self, attempts: int = 1, pause: float = 0.01) -> Connection:
        """Connect, trying up to ``attempts`` times ``pause`` apart (Kestrel's load tests
        retry like its ``tryHard``); :class:`ConnectFailed` when none succeeds."""
        if self.sock is not None:
            self.close()
        socket_module = self._socket_module()
        for attempt in range(1, attempts + 1):
            try:
                sock = connect_socket(socket_module, self.host, self.port, self.connect_timeout)
                break
            except OSError as exc:
                self.retries += 1
                if attempt == attempts:
                    raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
                self._sleep(pause)
        sock.setsockopt(_stdlib_socket.IPPROTO_TCP, _stdlib_socket.TCP_NODELAY, 1)
        sock.setsockopt(_stdlib_socket.SOL_SOCKET, _stdlib_socket.SO_KEEPALIVE, 1)
        sock.settimeout(None if self.watched else self.timeout)
        self.sock = sock
        # gevent internals, used when present: the raw non-blocking socket (one C call per
        # send) and the socket's own read watcher (park until readable without first paying
        # for an EAGAIN exception). Without them the public socket methods are used.
        self.raw = getattr(sock, "_sock", None) if self.hub is not None else None
        wait, readable = getattr(sock, "_wait", None), getattr(sock, "_read_event", None)
        if self.watched and self.raw is not None and wait is not None and readable is not None:
            self._wait, self._readable = wait, readable
        return self

    def _socket_module(self) -> Any:
        hub = cooperative() if self.use_gevent is None else None
        if self.use_gevent or hub is not None:
            import gevent
            from gevent import socket as gevent_socket

            self.hub = hub if hub is not None else gevent.get_hub()
            self._sleep = gevent.sleep
            return gevent_socket
        self.hub = None
        self._sleep = time.sleep
        return _stdlib_socket

    def close(self) -> None:
        """Close the socket (a hang-up: the server aborts this connection's open reads)."""
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            finally:
                self.sock = self.raw = self._wait = self._readable = None
                self.buf.clear()
                self.waiting_since = 0

    @property
    def connected(self) -> bool:
        return self.sock is not None

    @contextmanager
    def waiting(self, seconds: float) -> Iterator[None]:
        """For a request the server may hold ``seconds`` (``/t=``, ``monitor``): the socket
        timeout is that wait plus ``timeout``, never less than the wait."""
        if self.watched or seconds <= 0:
            yield
            return
        self.sock.settimeout(seconds + self.timeout)
        try:
            yield
        finally:
            if self.sock is not None:
                self.sock.settimeout(self.timeout)

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
        except AttributeError:
            if self.sock is None:
                raise ConnectionLost("not connected") from None
            raise
        except OSError as exc:
            raise ConnectionLost(f"send to {self.host}:{self.port} failed: {exc}") from exc

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
        except TimeoutError:
            raise self.stalled(want) from None
        except OSError as exc:
            raise ConnectionLost(f"receive from {self.host}:{self.port} failed: {exc}; "
                                 f"buffered {_show(self.buf)}") from exc
        except AttributeError:
            if self.sock is None:
                raise ConnectionLost("not connected") from None
            raise
        finally:
            self.waiting_since = 0
        if not chunk:
            raise ConnectionLost(f"{self.host}:{self.port} closed the connection; buffered "
                                 f"{_show(self.buf)} (wanted {_show(want)})")
        return chunk

    def stalled(self, want: bytes | None = None) -> Exception:
        """The error for a reply that did not come within ``timeout``: part of a reply then
        silence is the server's fault, silence alone may be the load's."""
        timeout = self.sock.gettimeout() if self.sock is not None and not self.watched else None
        after = timeout or self.timeout
        if self.buf:
            return UnexpectedReply(f"incomplete reply after {after:g}s: {_show(self.buf)}"
                                   + (f" (wanted {_show(want)})" if want else ""))
        return ReplyTimeout(f"no reply from {self.host}:{self.port} within {after:g}s"
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
        """One GET reply whose hit is ``hit_len`` bytes long in all (the load tests know it):
        None for ``END``, else the whole ``VALUE … END`` block."""
        buf = self.buf
        if not buf:
            chunk = self._chunk(b"VALUE|END")
            if len(chunk) == hit_len and chunk.startswith(b"VALUE"):  # the fast path
                return chunk
            if chunk == _END:
                return None
            buf += chunk
        while not (size := get_reply_size(buf, 0, hit_len)):
            self._recv(b"VALUE|END")
        data = bytes(buf[:size])
        del buf[:size]
        return None if data == _END else data

    def read_line(self) -> bytes:
        """One reply line without its end-of-line bytes."""
        eol = self.EOL
        while True:
            i = self.buf.find(eol)
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + len(eol)]
                return line
            self._recv(b"a line")

    def read_exact(self, n: int) -> bytes:
        """The next ``n`` bytes."""
        while len(self.buf) < n:
            self._recv(b"%d bytes" % n)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def exchange(self, request: bytes, expected: bytes) -> None:
        """Send ``request`` and require exactly ``expected`` back."""
        self.send(request)
        self.expect(expected)

    def store(self, requests: Sequence[bytes]) -> int:
        """Send pre-built ``set`` requests pipelined, a chunk per round trip; how many were
        ``STORED`` (a ``NOT_STORED`` one is counted out, the rest still go)."""
        stored = 0
        for start in range(0, len(requests), _PIPELINE):
            chunk = requests[start:start + _PIPELINE]
            self.send(b"".join(chunk))
            for _ in chunk:
                stored += parse_stored("set", self.read_line())
        return stored

    # -- replies ------------------------------------------------------------------------

    def read_value(self, key: bytes | None = None, command: str = "get") -> bytes | None:
        """One GET reply (for queue ``key``; None: any): the item, or None for ``END``."""
        length = parse_value_header(command, self.read_line(), key)
        if length is None:
            return None
        return self._value_body(length)

    def _value_body(self, length: int) -> bytes:
        block = self.read_exact(length + 2)
        if block[-2:] != b"\r\n":
            raise UnexpectedReply(f"value of {length} bytes not followed by CRLF")
        end = self.read_line()
        if end != b"END":
            raise UnexpectedReply(f"expected END after a value, got {end[:200]!r}")
        return block[:-2]

    def read_values(self, key: bytes, limit: int, command: str = "monitor") -> list[bytes]:
        """A monitor stream: ``VALUE`` blocks (each with its ``END``), then a final ``END``."""
        return self.read_packed_values(key, limit, command).values()

    def read_packed_values(self, key: bytes, limit: int, command: str = "monitor",
                           stamped: bool = False, into: bytearray | None = None) -> PackedValues:
        """A monitor stream, its values back to back (:class:`ValueScan`, written into
        ``into`` if given), with their enqueue times if the stream was asked for them
        (``stamped``)."""
        scan = ValueScan(command, key, limit, stamped, into)
        buf = self.buf
        # Each piece goes to the scan as ``recv`` made it, never onto ``buf`` (ADR 0022: the
        # scan reads it where it lies); ``buf`` keeps only what follows the reply.
        piece = bytes(buf) if buf else self._chunk(b"VALUE|END")
        buf.clear()
        while True:
            taken = scan.feed(piece)
            if scan.done:
                buf += memoryview(piece)[taken:]
                return scan.values()
            try:
                piece = self._chunk(b"VALUE|END")
            except ReplyTimeout as exc:  # part of a reply, then silence: the server's fault
                raise UnexpectedReply(f"incomplete {command} reply ({scan.taken} values "
                                      f"taken): {exc}") from None

    def read_stats(self) -> dict[str, str]:
        """The ``STAT name value`` lines up to ``END``."""
        result: dict[str, str] = {}
        while True:
            stat = parse_stat(self.read_line())
            if stat is None:
                return result
            result[stat[0]] = stat[1]

    def read_end(self, command: str) -> None:
        """A reply that must be ``END``."""
        expect_end(command, self.read_line())


def _show(data: bytes | bytearray | None, limit: int = 80) -> str:
    if data is None:
        return "nothing"
    data = bytes(data)
    return repr(data[:limit]) + (f"...({len(data)} bytes)" if len(data) > limit else "")
