"""The one place the Spark code talks to a server: a seam over the bridge's memcache client.

Everything Spark-side — the bridge's batches, the data source's reads, the sinks' writes, the
dead-letter parking — goes through :class:`Connection`, so replacing the client underneath
(for the public ``kestrel_actors.client``) means rewriting this module only. What the rest
relies on:

* ``open_items`` / ``open_available`` open items that stay open *on this connection* until
  ``confirm`` (memcache reliable reads are tied to a connection);
* once the connection drops, the server has taken those items back. A ``Connection`` never
  hides that by reconnecting: ``check`` and ``confirm`` raise :class:`ConnectionLost` while it
  still believes it holds items, and only a new ``open_*`` starts a fresh connection;
* every method takes the connection's lock, so a :class:`KeepAlive` thread may ping it
  between commands.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from contextlib import contextmanager

from ._client import KestrelClient, KestrelConnectionError, ServerAddress

__all__ = ["Connection", "ConnectionLost", "KeepAlive", "keep_alive"]

# One monitor waits whole seconds; asking for exactly what is waiting makes it return at once.
_MONITOR_SECONDS = 1


class ConnectionLost(KestrelConnectionError):
    """The connection that held open items dropped: the server has put them back."""


class Connection:
    """One connection to one server that may hold open items of one or more queues."""

    def __init__(self, address: ServerAddress, connect_timeout: float = 5.0,
                 io_timeout: float = 30.0) -> None:
        self.address = address
        self.lock = threading.RLock()
        self._client = KestrelClient(address, connect_timeout, io_timeout)
        self.holding = 0  # items opened here and not yet confirmed

    @property
    def connected(self) -> bool:
        return self._client.connected

    def _fresh(self) -> None:
        """Before opening: a dropped connection's items are back on the server already."""
        if not self._client.connected:
            self.holding = 0
            self._client.connect()

    def open_items(self, queue: str, max_items: int, wait: float) -> list[bytes]:
        """Open up to ``max_items`` within ``wait`` seconds (several monitors if needed)."""
        with self.lock:
            self._fresh()
            items = self._client.fetch_batch(queue, max_items, wait)
            self.holding += len(items)
            return items

    def open_available(self, queue: str, max_items: int) -> list[bytes]:
        """Open what is waiting now, up to ``max_items``, without waiting for more.

        ``monitor`` only returns early when full, so it asks for exactly the number of items
        the server reports waiting; another reader taking some first costs at most one second.
        """
        with self.lock:
            self._fresh()
            waiting = self.depth(queue)
            if waiting <= 0:
                return []
            items = self._client.monitor(queue, _MONITOR_SECONDS, min(max_items, waiting))
            self.holding += len(items)
            return items

    def depth(self, queue: str) -> int:
        """Items waiting (not open) in ``queue``."""
        with self.lock:
            return int(self._client.stats().get(f"queue_{queue}_items", 0))

    def _still_holding(self, doing: str) -> None:
        """Refuse to work on a fresh connection while items opened on a dropped one are
        believed held (the client would reconnect silently and the loss would go unseen)."""
        if self.holding and not self._client.connected:
            raise ConnectionLost(f"connection to {self.address} dropped before {doing}; the "
                                 f"server has taken its {self.holding} open items back")

    def check(self) -> None:
        """Raise :class:`ConnectionLost` unless the connection that opened the held items is
        still up (one ``version`` round trip)."""
        with self.lock:
            self._still_holding("the check")
            try:
                self._client.version()
            except KestrelConnectionError as exc:
                raise ConnectionLost(f"connection to {self.address} lost: {exc}") from exc

    def confirm(self, queue: str, count: int) -> None:
        """Confirm the ``count`` oldest items this connection opened on ``queue``."""
        if count < 1:
            return
        with self.lock:
            if not self._client.connected:
                raise ConnectionLost(f"connection to {self.address} dropped before confirming "
                                     f"{count} items; the server has taken them back")
            try:
                self._client.confirm(queue, count)
            except KestrelConnectionError as exc:
                raise ConnectionLost(f"confirm on {self.address} failed: {exc}") from exc
            self.holding = max(0, self.holding - count)

    def put_many(self, queue: str, items: Iterable[bytes]) -> int:
        """Enqueue items in order (pipelined); returns how many were stored."""
        with self.lock:
            self._still_holding("writing")
            return self._client.set_many(queue, items)

    def stats(self) -> dict[str, str]:
        with self.lock:
            return self._client.stats()

    def ping(self) -> None:
        """Keep-alive: one round trip if connected; never reconnects, never raises (a failure
        closes the connection, which ``check``/``confirm`` then report)."""
        if not self.lock.acquire(timeout=0.1):
            return  # a command is in flight: the connection is not idle anyway
        try:
            if self._client.connected:
                self._client.version()
        except KestrelConnectionError:
            pass
        except Exception:  # noqa: BLE001 - a protocol surprise also just closes it
            pass
        finally:
            self.lock.release()

    def close(self) -> None:
        """Drop the connection; the server returns whatever it holds open."""
        with self.lock:
            self._client.close()
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
