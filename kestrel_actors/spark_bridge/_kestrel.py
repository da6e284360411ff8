"""The one place the Spark code talks to a server: a seam over :mod:`kestrel_actors.client`.

Everything Spark-side — the bridge's batches, the data source's reads, the sinks' writes, the
dead-letter parking — goes through :class:`Connection`, one raw
:class:`kestrel_actors.client.Connection` per server (not the pooled ``Client``: open items
live on one connection, and the keep-alive must ping that very connection). What the rest
relies on:

* ``open_items`` / ``open_available`` open items that stay open *on this connection* until
  ``confirm`` (memcache reliable reads are tied to a connection);
* once the connection drops, the server has taken those items back. A ``Connection`` never
  hides that by reconnecting: ``check`` and ``confirm`` raise :class:`ConnectionLost` while it
  still believes it holds items, and only a new ``open_*`` starts a fresh connection;
* any failure of a command closes the connection (its place in the reply stream is unknown),
  so a failure is always followed by the server taking the open items back;
* every method takes the connection's lock, so a :class:`KeepAlive` thread may ping it
  between commands.

Sockets are plain blocking ones (``use_gevent=False``): py4j and Spark need real threads, and
the client never imports gevent on its own.
"""

from __future__ import annotations

import math
import select
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ..client import Connection as _Wire
from ..client import (
    ConnectionLost,
    PackedValues,
    ServerAddress,
    ServerError,
    confirm_request,
    get_request,
    monitor_request,
    parse_version,
    queue_key,
    set_request,
)

__all__ = ["Connection", "ConnectionLost", "KeepAlive", "keep_alive"]

# One monitor waits whole seconds; asking for exactly what is waiting makes it return at once.
_MONITOR_SECONDS = 1


class Connection:
    """One connection to one server that may hold open items of one or more queues."""

    def __init__(self, address: ServerAddress, connect_timeout: float = 5.0,
                 io_timeout: float = 30.0) -> None:
        self.address = address
        self.lock = threading.RLock()
        self._wire = _Wire(address.host, address.port, io_timeout, use_gevent=False,
                           connect_timeout=connect_timeout)
        self.holding = 0  # items opened here and not yet confirmed

    @property
    def connected(self) -> bool:
        return self._wire.connected

    @contextmanager
    def _command(self) -> Iterator[_Wire]:
        """A command on the connection (made if need be); any failure closes it."""
        wire = self._wire
        if not wire.connected:
            wire.connect()
        try:
            yield wire
        except BaseException:
            wire.close()
            raise

    def _fresh(self) -> None:
        """Before opening: a dropped connection's items are back on the server already."""
        if not self._wire.connected:
            self.holding = 0
            self._wire.connect()

    def _monitor(self, queue: str, seconds: int, max_items: int, stamped: bool = False,
                 into: bytearray | None = None) -> PackedValues:
        """``monitor``: the items stay open on this connection until confirmed; ``stamped``
        asks for their enqueue times (a server that does not know the option sends none);
        ``into``: the buffer their bytes are written into (:class:`ValueScan`)."""
        key = queue_key(queue)
        with self._command() as wire:
            wire.send(monitor_request(queue, seconds, max_items, stamped))
            with wire.waiting(seconds):
                items = wire.read_packed_values(key, max_items, stamped=stamped, into=into)
        self.holding += items.count
        return items

    def open_items(self, queue: str, max_items: int, wait: float) -> list[bytes]:
        """Open up to ``max_items`` within ``wait`` seconds, with as many ``monitor`` commands
        as the server's per-monitor cap needs.

        ``monitor`` counts whole seconds, so a sub-second ``wait`` becomes one second. A
        monitor only ends before its deadline when it is full, so another one is sent only if
        the previous one returned items and time is left; a server whose cap is reached
        answers the next one at once with nothing.
        """
        with self.lock:
            self._fresh()
            deadline = time.monotonic() + wait
            items: list[bytes] = []
            seconds = max(1, math.ceil(wait))
            while True:
                got = self._monitor(queue, seconds, max_items - len(items)).values()
                items.extend(got)
                left = deadline - time.monotonic()
                if not got or len(items) >= max_items or left <= 0:
                    return items
                seconds = max(1, math.ceil(left))

    def open_available(self, queue: str, max_items: int) -> list[bytes]:
        """Open what is waiting now, up to ``max_items``, without waiting for more.

        ``monitor`` only returns early when full, so it asks for exactly the number of items
        the server reports waiting; another reader taking some first costs at most one second.
        """
        with self.lock:
            self._fresh()
            return self.open_waiting(queue, min(max_items, self.depth(queue))).values()

    def open_waiting(self, queue: str, count: int, stamped: bool = False,
                     into: bytearray | None = None) -> PackedValues:
        """Open ``count`` items known to be waiting (one ``monitor`` asking for exactly them,
        so it returns at once; should another reader take some first, it costs one second).
        Lets a caller that looked at the depth once open on several connections. The items
        come back to back (:class:`PackedValues`), as the write-ahead log keeps them, with
        their enqueue times if ``stamped``, their bytes written into ``into`` if given (a
        buffer of a committed batch: no fresh pages to fault in)."""
        if count <= 0:
            return PackedValues(b"", b"", b"" if stamped else None)
        with self.lock:
            self._fresh()
            return self._monitor(queue, _MONITOR_SECONDS, count, stamped, into)

    def depth(self, queue: str) -> int:
        """Items waiting (not open) in ``queue``."""
        with self.lock:
            return int(self.stats().get(f"queue_{queue}_items", 0))

    def depths(self, queues: tuple[str, ...]) -> dict[str, int]:
        """Items waiting (not open) in each of ``queues``, from one ``stats``."""
        with self.lock:
            stats = self.stats()
        return {queue: int(stats.get(f"queue_{queue}_items", 0)) for queue in queues}

    def _still_holding(self, doing: str) -> None:
        """Refuse to work on a fresh connection while items opened on a dropped one are
        believed held (reconnecting would hide that the server took them back)."""
        if self.holding and not self._wire.connected:
            raise ConnectionLost(f"connection to {self.address} dropped before {doing}; the "
                                 f"server has taken its {self.holding} open items back")

    def _version(self) -> str:
        with self._command() as wire:
            wire.send(b"version\r\n")
            return parse_version(wire.read_line())

    def check(self) -> None:
        """Raise :class:`ConnectionLost` unless the connection that opened the held items is
        still up (one ``version`` round trip)."""
        with self.lock:
            self._still_holding("the check")
            try:
                self._version()
            except ConnectionLost as exc:
                raise ConnectionLost(f"connection to {self.address} lost: {exc}") from exc

    def peek(self, queue: str) -> bytes | None:
        """The item at the head of ``queue``, left there (``get <queue>/peek``); None if
        the queue is empty."""
        key = queue_key(queue)
        with self.lock, self._command() as wire:
            wire.send(get_request(queue, "/peek"))
            return wire.read_value(key)

    def hung_up(self) -> bool:
        """Whether the server has closed this connection already (a look at the socket, no
        round trip): then it has taken this connection's open items back, and a confirm sent
        now could not land."""
        with self.lock:
            sock = self._wire.sock
            if sock is None:
                return True
            try:
                readable, _, _ = select.select([sock], [], [], 0)
                # readable with nothing to read is the end of the stream
                return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

    def confirm(self, queue: str, count: int) -> None:
        """Confirm the ``count`` oldest items this connection opened on ``queue``."""
        if count < 1:
            return
        with self.lock:
            if not self._wire.connected:
                raise ConnectionLost(f"connection to {self.address} dropped before confirming "
                                     f"{count} items; the server has taken them back")
            try:
                with self._command() as wire:
                    wire.send(confirm_request(queue, count))
                    wire.read_end("confirm")
            except ConnectionLost as exc:
                raise ConnectionLost(f"confirm on {self.address} failed: {exc}") from exc
            self.holding = max(0, self.holding - count)

    def put_many(self, queue: str, items: Iterable[bytes]) -> int:
        """Enqueue items in order (pipelined); returns how many were stored. A refused item
        (``NOT_STORED``: the queue is full) raises :class:`ServerError` after the others were
        sent, so a caller never confirms input whose output was dropped (at least once)."""
        queue_key(queue)
        requests = [set_request(queue, data) for data in items]
        with self.lock:
            self._still_holding("writing")
            if not requests:
                return 0
            with self._command() as wire:
                stored = wire.store(requests)
            if stored != len(requests):
                raise ServerError("set", b"NOT_STORED",
                                  f"set: {queue} on {self.address} refused "
                                  f"{len(requests) - stored} of {len(requests)} items")
            return stored

    def stats(self) -> dict[str, str]:
        with self.lock, self._command() as wire:
            wire.send(b"stats\r\n")
            return wire.read_stats()

    def ping(self) -> None:
        """Keep-alive: one round trip if connected; never reconnects, never raises (a failure
        closes the connection, which ``check``/``confirm`` then report)."""
        if not self.lock.acquire(timeout=0.1):
            return  # a command is in flight: the connection is not idle anyway
        try:
            if self._wire.connected:
                self._version()
        except Exception:  # noqa: BLE001 - any failure has closed it; check/confirm say so
            pass
        finally:
            self.lock.release()

    def close(self) -> None:
        """Drop the connection; the server returns whatever it holds open."""
        with self.lock:
            self._wire.close()
            self.holding = 0


class KeepAlive:
    """Pings connections from a daemon thread so that a server's ``--client-timeout`` (idle
    timeout) never closes a connection holding open items while Spark works on them."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._connections: set[Connection] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, connection: Connection) -> None:
        with self._lock:
            self._connections.add(connection)
            if self._thread is None and self.interval > 0:
                self._thread = threading.Thread(target=self._run, name="kestrel-keepalive",
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.interval + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                connections = list(self._connections)
            for connection in connections:
                connection.ping()


@contextmanager
def keep_alive(connection: Connection, interval: float):
    """Ping ``connection`` every ``interval`` seconds inside the block (0: never)."""
    pinger = KeepAlive(interval)
    pinger.add(connection)
    try:
        yield
    finally:
        pinger.stop()
