"""A small blocking-socket memcache client for the bridge: set, monitor, confirm, stats, version.

Why not pymemcache: ``monitor`` streams many ``VALUE`` blocks (each with its own ``END``)
before a final ``END``, and ``confirm`` is Kestrel-only, so a general memcache client cannot
parse them. This one parses every reply exactly (reference §2.1, §2.7) and treats anything
unexpected as fatal for the connection: the bridge then drops it, the server puts every open
item back at the head of its queue (§2.6), and the batch is retried.

It uses plain blocking sockets with timeouts (no gevent: py4j and Spark need real threads).
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

from .._names import name_bytes, name_from_wire

__all__ = [
    "KestrelClient",
    "KestrelConnectionError",
    "KestrelError",
    "KestrelProtocolError",
    "KestrelReplyError",
    "ServerAddress",
]

_CRLF = b"\r\n"
_END = b"END"
_SET_CHUNK = 256  # pipelined SETs per round trip; small enough that neither side's buffers fill


class KestrelError(Exception):
    """Any failure talking to a server; the connection must be dropped afterwards."""


class KestrelConnectionError(KestrelError, ConnectionError):
    """The connection could not be made, was closed, or timed out."""


class KestrelProtocolError(KestrelError):
    """The server sent something this client does not expect at this point."""


class KestrelReplyError(KestrelError):
    """The server answered with an error line (``ERROR``, ``CLIENT_ERROR``, ``SERVER_ERROR``) or
    refused a SET (``NOT_STORED``)."""

    def __init__(self, command: str, reply: bytes) -> None:
        super().__init__(f"{command}: server replied {reply!r}")
        self.command = command
        self.reply = reply


@dataclass(frozen=True, order=True)
class ServerAddress:
    """``host:port`` of one server (port 22133 when omitted)."""

    host: str
    port: int = 22133

    @classmethod
    def parse(cls, text: str) -> ServerAddress:
        text = text.strip()
        if not text:
            raise ValueError("empty server address")
        if text.startswith("["):  # [v6]:port
            host, _, rest = text[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        elif text.count(":") == 1:
            host, _, port = text.partition(":")
        else:
            host, port = text, ""
        if not host:
            raise ValueError(f"no host in server address {text!r}")
        try:
            number = int(port) if port else 22133
        except ValueError:
            raise ValueError(f"bad port in server address {text!r}") from None
        if not 0 < number < 65536:
            raise ValueError(f"port out of range in server address {text!r}")
        return cls(host, number)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class KestrelClient:
    """One blocking connection to one server.

    Every method either returns a fully parsed reply or raises :class:`KestrelError` (after
    closing the socket, since the stream position is then unknown). ``io_timeout`` bounds each
    wait for bytes; a ``monitor`` adds its own ``seconds`` to that bound.
    """

    def __init__(self, address: ServerAddress, connect_timeout: float = 5.0,
                 io_timeout: float = 30.0) -> None:
        self.address = address
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout
        self._sock: socket.socket | None = None
        self._rfile = None

    # -- connection ---------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> KestrelClient:
        if self._sock is not None:
            return self
        try:
            sock = socket.create_connection((self.address.host, self.address.port),
                                            timeout=self.connect_timeout)
        except OSError as exc:
            raise KestrelConnectionError(f"cannot connect to {self.address}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.settimeout(self.io_timeout)
        self._sock = sock
        self._rfile = sock.makefile("rb", buffering=1 << 18)
        return self

    def close(self) -> None:
        """Drop the connection. The server then returns this connection's open items (§2.6)."""
        sock, rfile = self._sock, self._rfile
        self._sock = self._rfile = None
        for thing in (rfile, sock):
            if thing is not None:
                try:
                    thing.close()
                except OSError:
                    pass

    def __enter__(self) -> KestrelClient:
        return self.connect()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- commands -----------------------------------------------------------------------

    def set(self, queue: str, data: bytes, exptime: int = 0) -> None:
        """Enqueue one item; raises :class:`KestrelReplyError` on ``NOT_STORED``."""
        self.set_many(queue, [data], exptime)

    def set_many(self, queue: str, items: Iterable[bytes], exptime: int = 0) -> int:
        """Enqueue items in order, pipelined in chunks; returns how many were ``STORED``.

        The first refusal raises (items before it stay stored: at-least-once on retry).
        """
        key = _key(queue)
        stored = 0
        chunk: list[bytes] = []
        for data in items:
            chunk.append(b"set %s 0 %d %d\r\n%s\r\n" % (key, exptime, len(data), data))
            if len(chunk) >= _SET_CHUNK:
                stored += self._send_sets(chunk)
                chunk = []
        if chunk:
            stored += self._send_sets(chunk)
        return stored

    def _send_sets(self, requests: list[bytes]) -> int:
        with self._guard("set"):
            self._sock.sendall(b"".join(requests))
            for _ in requests:
                line = self._read_line()
                if line != b"STORED":
                    self._raise_reply("set", line)
        return len(requests)

    def get(self, key: str) -> bytes | None:
        """``get key`` (options allowed, e.g. ``q/t=100``): the item, or ``None`` on ``END``."""
        with self._guard("get"):
            self._sock.sendall(b"get %s\r\n" % _key(key))
            items = self._read_values(_key(key.split("/", 1)[0]), final_end=False, limit=1)
        return items[0] if items else None

    def monitor(self, queue: str, seconds: int, max_items: int) -> list[bytes]:
        """``monitor queue seconds max_items``: open up to ``max_items`` items, waiting at most
        ``seconds`` (whole seconds, as the server counts them). The items stay open on this
        connection until :meth:`confirm` or a disconnect."""
        if seconds < 0 or max_items < 1:
            raise ValueError("monitor needs seconds >= 0 and max_items >= 1")
        key = _key(queue)
        with self._guard("monitor"):
            self._sock.settimeout(seconds + self.io_timeout)
            try:
                self._sock.sendall(b"monitor %s %d %d\r\n" % (key, seconds, max_items))
                return self._read_values(key, final_end=True, limit=max_items)
            finally:
                if self._sock is not None:
                    self._sock.settimeout(self.io_timeout)

    def fetch_batch(self, queue: str, max_items: int, wait: float) -> list[bytes]:
        """Open up to ``max_items`` items within ``wait`` seconds, using as many ``monitor``
        commands as the server's per-monitor cap needs.

        ``monitor`` counts whole seconds, so a sub-second ``wait`` becomes one second. A monitor
        only ends before its deadline when it is full, so another one is sent only if the
        previous one returned items and time is left; a server whose cap is reached answers the
        next one at once with nothing.
        """
        deadline = time.monotonic() + wait
        items: list[bytes] = []
        seconds = max(1, math.ceil(wait))
        while True:
            got = self.monitor(queue, seconds, max_items - len(items))
            items.extend(got)
            left = deadline - time.monotonic()
            if not got or len(items) >= max_items or left <= 0:
                return items
            seconds = max(1, math.ceil(left))

    def confirm(self, queue: str, count: int) -> None:
        """``confirm queue count``: permanently remove this connection's ``count`` oldest open
        items. Raises unless the server answers ``END``."""
        if count < 1:
            raise ValueError("confirm needs count >= 1")
        with self._guard("confirm"):
            self._sock.sendall(b"confirm %s %d\r\n" % (_key(queue), count))
            line = self._read_line()
            if line != _END:
                self._raise_reply("confirm", line)

    def version(self) -> str:
        """``version``: a harmless round trip (the bridge's keep-alive and liveness check)."""
        with self._guard("version"):
            self._sock.sendall(b"version\r\n")
            line = self._read_line()
            if not line.startswith(b"VERSION "):
                self._raise_reply("version", line)
        return line[8:].decode("latin-1")

    def stats(self) -> dict[str, str]:
        """``stats`` as a name → value mapping."""
        result: dict[str, str] = {}
        with self._guard("stats"):
            self._sock.sendall(b"stats\r\n")
            while True:
                line = self._read_line()
                if line == _END:
                    return result
                parts = name_from_wire(line).split(" ", 2)
                if len(parts) != 3 or parts[0] != "STAT":
                    self._raise_reply("stats", line)
                result[parts[1]] = parts[2]

    # -- reply parsing ------------------------------------------------------------------

    def _guard(self, command: str) -> _Guard:
        if self._sock is None:
            self.connect()
        return _Guard(self, command)

    def _read_line(self) -> bytes:
        line = self._rfile.readline()
        if not line.endswith(_CRLF):
            if not line or not line.endswith(b"\n"):
                raise KestrelConnectionError(f"connection to {self.address} closed by the server")
            raise KestrelProtocolError(f"line without CR before LF: {line[-40:]!r}")
        return line[:-2]

    def _read_values(self, key: bytes, final_end: bool, limit: int) -> list[bytes]:
        """Parse ``VALUE key 0 len`` + data + ``END`` blocks; with ``final_end`` they are
        followed by a bare ``END`` (monitor), otherwise a bare ``END`` means no item (get)."""
        prefix = b"VALUE " + key + b" 0 "
        rfile = self._rfile
        items: list[bytes] = []
        while True:
            line = self._read_line()
            if line == _END:
                return items
            if not line.startswith(prefix):
                self._raise_reply("read", line)
            length_text = line[len(prefix):]
            if not length_text.isdigit():
                raise KestrelProtocolError(f"bad VALUE line {line[:200]!r}")
            length = int(length_text)
            block = rfile.read(length + 2)
            if len(block) != length + 2:
                raise KestrelConnectionError(f"connection to {self.address} closed mid-value")
            if not block.endswith(_CRLF):
                raise KestrelProtocolError("value not followed by CRLF")
            end = self._read_line()
            if end != _END:
                raise KestrelProtocolError(f"expected END after a value, got {end[:200]!r}")
            items.append(block[:-2])
            if len(items) > limit:
                raise KestrelProtocolError(f"server sent more than the {limit} items asked for")
            if not final_end:
                return items

    def _raise_reply(self, command: str, line: bytes) -> None:
        if line in (b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR", b"NOT_STORED"):
            raise KestrelReplyError(command, line)
        raise KestrelProtocolError(f"{command}: unexpected reply {line[:200]!r}")


class _Guard:
    """Close the connection on any failure inside a command and turn socket errors into
    :class:`KestrelConnectionError`."""

    __slots__ = ("client", "command")

    def __init__(self, client: KestrelClient, command: str) -> None:
        self.client = client
        self.command = command

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            return False
        self.client.close()
        if isinstance(exc, KestrelError):
            return False
        if isinstance(exc, OSError | ValueError):  # ValueError: I/O on a closed file object
            raise KestrelConnectionError(
                f"{self.command} on {self.client.address} failed: {exc!r}") from exc
        return False


def _key(name: str) -> bytes:
    key = name_bytes(name)  # the server's rule: a name is the same bytes everywhere
    if not key or any(ch in key for ch in b" \r\n\t"):
        raise ValueError(f"bad queue name {name!r}")
    return key
