"""The Kestrel client: a pool of servers, a pool of connections to each.

Servers are independent, as in a Kestrel cluster: a queue has items on every server, writes
go round-robin to the healthy servers, reads sweep them. A server that fails (no connection,
a reset, a reply that never came) is skipped and tried again after ``retry_after`` seconds.
A reliable read is confirmed or aborted on the connection that opened it, so on the server
the item came from.

The servers may be a ZooKeeper server set's members (:meth:`Client.from_server_set`, or a
``zk://host:port/path`` address), followed live: a member that leaves gets no new request, one
that joins is used. Puts may follow one set (``…/write``) and everything else another
(``…/read``), so a server taken out of the write path is still drained.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeVar

from ..cluster import ServerSetAddress
from ._address import ServerAddress
from ._connection import Connection, cooperative
from ._errors import ConnectFailed, ConnectionLost, KestrelError, ServerError
from ._wire import (
    confirm_request,
    expect_deleted,
    get_options,
    get_request,
    monitor_request,
    parse_status,
    parse_stored,
    parse_version,
    queue_key,
    set_request,
    status_request,
    wait_ms,
)

__all__ = ["Client", "MonitorBatch", "ServerAddress"]

T = TypeVar("T")



@dataclass(eq=False)
class _Server:
    """One server of the pool: its idle connections (per gevent hub, None for threads) and
    when it may be tried again after a failure."""

    address: ServerAddress
    idle: dict[Any, deque[Connection]] = field(default_factory=dict)
    down_until: float = 0.0
    failures: int = 0

    def __str__(self) -> str:
        return str(self.address)


@dataclass(eq=False)
class _Part:
    """The items one monitor batch holds open on one connection."""

    server: _Server
    conn: Connection
    count: int


class MonitorBatch:
    """Items opened by :meth:`Client.monitor`, held open on their servers until
    :meth:`confirm` (remove them for good) or :meth:`abort` (back to the head of the queue).

    As a context manager it confirms when the block ends normally and aborts on an exception.
    A batch that is neither confirmed nor aborted keeps its connections (and the server its
    open items) until :meth:`abort` or the client is closed.
    """

    def __init__(self, client: Client, queue: str, items: list[bytes], parts: list[_Part]) -> None:
        self.client = client
        self.queue = queue
        self.items = items
        self._parts = parts

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    @property
    def servers(self) -> list[str]:
        """Where the items came from, one address per connection holding some."""
        return [str(part.server) for part in self._parts]

    def confirm(self) -> None:
        """Remove every item for good (``confirm <q> <n>`` per server). Raises after trying
        every server if one failed: that server's items go back to its queue."""
        self._finish(lambda conn, count: _confirm(conn, self.queue, count))

    def abort(self) -> None:
        """Put every item back at the head of its queue (``get <q>/abort`` per item). Each
        abort returns the oldest open item to the head, so the batch comes back in reverse
        order, as it would after a disconnect (behaviour §2.6)."""
        self._finish(lambda conn, count: _abort(conn, self.queue, count))

    def _finish(self, action: Callable[[Connection, int], None]) -> None:
        parts, self._parts = self._parts, []
        failure: KestrelError | None = None
        for part in parts:
            try:
                # _use calls the lambda before the loop moves on
                self.client._use(part.server, part.conn, lambda conn: action(conn, part.count))  # noqa: B023
            except KestrelError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.confirm()
        else:
            self.abort()


class Client:
    """A client of one Kestrel server or a pool of them.

    ``servers`` is ``"host:port"`` or a list of them. ``timeout`` bounds each wait for a reply
    (a blocking read waits its ``/t=`` on top). ``retry_after`` is how long a failed server is
    left alone. ``wait_slice`` is how long a blocking read waits on one server of a pool before it
    tries the next. ``max_idle`` connections per server are kept for reuse. Safe to share
    between threads and between greenlets: each call takes its own connection.
    """

    servers: list[_Server]
    """The servers of every call (puts too, unless they follow a set of their own)."""

    def __init__(self, servers: str | ServerAddress | Sequence[str | ServerAddress] = "127.0.0.1:22133",
                 *, timeout: float = 5.0, retry_after: float = 2.0, wait_slice: float = 0.5,
                 max_idle: int = 8, use_gevent: bool | None = None) -> None:
        self._configure(timeout=timeout, retry_after=retry_after, wait_slice=wait_slice,
                        max_idle=max_idle, use_gevent=use_gevent)
        if isinstance(servers, str | ServerAddress):
            servers = [servers]
        sets = [s for s in servers if ServerSetAddress.is_address(s)]
        if sets:
            if len(servers) > 1:
                raise ValueError("a zk:// server set must be the only address")
            self._follow(ServerSetAddress.parse(str(sets[0])), writes_only=False)
            return
        self.servers = [self._server(ServerAddress.parse(s)) for s in servers]
        if not self.servers:
            raise ValueError("no servers")

    def _configure(self, *, timeout: float = 5.0, retry_after: float = 2.0, wait_slice: float = 0.5,
                   max_idle: int = 8, use_gevent: bool | None = None) -> None:
        self.timeout = timeout
        self.retry_after = retry_after
        self.wait_slice = wait_slice
        self.max_idle = max_idle
        self.use_gevent = use_gevent
        self._writes = itertools.count()
        self._reads = itertools.count()
        self.servers = []
        self._writers: list[_Server] | None = None
        """The servers puts go to when they follow a set of their own; None: :attr:`servers`."""
        self._known: dict[ServerAddress, _Server] = {}
        self._followers: list[Any] = []

    @classmethod
    def from_server_set(cls, zookeeper: str, path: str, *, read_path: str | None = None,
                        endpoint: str = "memcache", credentials: tuple[str, str] | None = None,
                        zookeeper_timeout: float = 10.0, **options: Any) -> Client:
        """A client of the members of the server set at ``path`` in ZooKeeper ``zookeeper``
        (``"host:port"``, or several comma-separated), followed live. With ``read_path``,
        puts go to ``path``'s members (``/kestrel/write``) and every other call to
        ``read_path``'s (``/kestrel/read``). ``endpoint`` names the member endpoint used
        (the memcache one); ``credentials`` are ZooKeeper digest credentials (a set anyone
        may read needs none). Waits up to ``zookeeper_timeout`` seconds for the first
        listing (:class:`ConnectFailed` if ZooKeeper cannot be reached); ``options`` are the
        constructor's."""
        client = cls.__new__(cls)
        client._configure(**options)
        client._endpoint = endpoint
        client._credentials = credentials
        client._zookeeper_timeout = zookeeper_timeout
        try:
            client._follow(ServerSetAddress.parse(f"zk://{zookeeper}{read_path or path}"), writes_only=False)
            if read_path is not None:
                client._follow(ServerSetAddress.parse(f"zk://{zookeeper}{path}"), writes_only=True)
        except BaseException:
            client.close()
            raise
        return client

    # -- server sets ----------------------------------------------------------------------

    _endpoint = "memcache"
    _credentials: tuple[str, str] | None = None
    _zookeeper_timeout = 10.0

    def _server(self, address: ServerAddress) -> _Server:
        """The one :class:`_Server` of ``address`` (its connections and backoff are shared
        by the read and the write set)."""
        server = self._known.get(address)
        if server is None:
            server = self._known[address] = _Server(address)
        return server

    def _follow(self, address: ServerSetAddress, writes_only: bool) -> None:
        from ..cluster import ServerSetFollower

        def changed(members: list[Any]) -> None:
            found = [member.endpoint(self._endpoint) for member in members]
            servers = [self._server(ServerAddress(e.host, e.port)) for e in found]
            if writes_only:
                self._writers = servers
            else:
                self.servers = servers
            self._forget_unused()

        follower = ServerSetFollower(address, changed, use_gevent=self._follow_on_gevent(),
                                     credentials=self._credentials)
        try:
            follower.start(self._zookeeper_timeout)
        except TimeoutError as exc:
            raise ConnectFailed(str(exc)) from None
        self._followers.append(follower)

    def _follow_on_gevent(self) -> bool:
        """Whether the followers' watches run on kazoo's gevent handler: only where gevent runs
        the program (``use_gevent=True``, or a monkey-patched socket module, under which kazoo's
        threads would be greenlets anyway). A hub that merely exists in this thread may never
        run again (a threaded program that once used gevent: a test run, say), and watches
        waiting for it would leave the client on a set's old members for good; on threads they
        need nothing from this one."""
        if self.use_gevent is not None:
            return self.use_gevent
        monkey = sys.modules.get("gevent.monkey")
        return monkey is not None and bool(monkey.is_module_patched("socket"))

    def _forget_unused(self) -> None:
        """Close the idle connections of servers no set lists any more."""
        used = {id(s) for s in self.servers} | {id(s) for s in self._writers or ()}
        for address, server in list(self._known.items()):
            if id(server) not in used:
                del self._known[address]
                _close_idle(server)

    # -- connections ----------------------------------------------------------------------

    @property
    def write_servers(self) -> list[str]:
        """The addresses puts go to now (``servers`` unless puts follow a set of their own)."""
        return [str(s) for s in (self.servers if self._writers is None else self._writers)]

    def _pool(self, servers: list[_Server] | None = None) -> list[_Server]:
        """``servers`` (default :attr:`servers`) as they are now; a followed set with no
        member fails the call as an unreachable server would."""
        pool = self.servers if servers is None else servers
        if not pool:
            raise ConnectFailed(f"no server: the server set {self._set_names()} has no ALIVE member")
        return pool

    def _set_names(self) -> str:
        return ", ".join(str(follower.address) for follower in self._followers) or "(none)"

    def connection(self, server: str | None = None) -> Connection:
        """A new raw :class:`Connection` to ``server`` (the first one when None), connected;
        the caller sends its own bytes and closes it."""
        address = ServerAddress.parse(server) if server else self._pool()[0].address
        return Connection(address.host, address.port, self.timeout,
                          use_gevent=self.use_gevent).connect()

    def _hub(self) -> Any:
        return None if self.use_gevent is False else cooperative()

    def _acquire(self, server: _Server) -> Connection:
        idle = server.idle.get(self._hub())
        while idle:
            try:
                conn = idle.pop()
            except IndexError:
                break
            if conn.connected:
                return conn
        conn = Connection(server.address.host, server.address.port, self.timeout,
                          use_gevent=self.use_gevent)
        try:
            return conn.connect()
        except ConnectionLost:
            self._failed(server)
            raise

    def _release(self, server: _Server, conn: Connection) -> None:
        if not conn.connected or conn.buf:
            conn.close()
            return
        idle = server.idle.setdefault(conn.hub, deque())
        if len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.close()

    def _failed(self, server: _Server) -> None:
        server.failures += 1
        server.down_until = time.monotonic() + self.retry_after
        _close_idle(server)  # connections from before the failure are suspect

    def _discard(self, server: _Server, conn: Connection, error: BaseException) -> None:
        """After any error on ``conn``: close it (its place in the reply stream is unknown)
        and, if the server is unreachable, mark it down."""
        conn.close()
        if isinstance(error, ConnectionLost):
            self._failed(server)

    def _use(self, server: _Server, conn: Connection, action: Callable[[Connection], T]) -> T:
        """Run ``action`` on ``conn``, then pool it (see :meth:`_discard` for an error)."""
        try:
            result = action(conn)
        except BaseException as exc:
            self._discard(server, conn, exc)
            raise
        server.failures = 0
        self._release(server, conn)
        return result

    def _call(self, server: _Server, action: Callable[[Connection], T]) -> T:
        return self._use(server, self._acquire(server), action)

    def _order(self, counter: Iterator[int], servers: list[_Server] | None = None) -> list[_Server]:
        """Every server (of ``servers``, default :attr:`servers`), starting at the next in
        turn; healthy ones first, then the ones in backoff (so a call fails only when every
        server has failed)."""
        pool = self._pool(servers)
        start = next(counter) % len(pool)
        turn = pool[start:] + pool[:start]
        now = time.monotonic()
        return [s for s in turn if s.down_until <= now] + [s for s in turn if s.down_until > now]

    def _healthy(self, counter: Iterator[int]) -> list[_Server]:
        """The servers to read from now: those not in backoff (all of them if none is)."""
        order = self._order(counter)
        now = time.monotonic()
        healthy = [s for s in order if s.down_until <= now]
        return healthy or order

    # -- writes -----------------------------------------------------------------------------

    def put(self, queue: str, data: bytes, expiry: int | None = None) -> bool:
        """Add ``data`` to the tail of ``queue`` on one server (the next healthy one in turn).

        ``expiry`` is memcache's: seconds from now (below 1,000,000) or a Unix time. True when
        ``STORED``; False when the queue refused it (full, or the item too large). A server
        that cannot be reached, or refuses writes, passes the item to the next one.
        """
        queue_key(queue)
        request = set_request(queue, data, expiry or 0)

        def call(conn: Connection) -> bool:
            conn.send(request)
            return parse_stored("set", conn.read_line())

        return self._write(call)

    def put_many(self, queue: str, items: Iterable[bytes], expiry: int | None = None) -> int:
        """Add ``items`` in order to ``queue`` on one server, pipelined; how many were
        ``STORED`` (fewer when the queue refused some). Items already stored stay stored if
        the connection fails part-way (the error is raised)."""
        queue_key(queue)
        requests = [set_request(queue, data, expiry or 0) for data in items]
        if not requests:
            return 0

        return self._write(lambda conn: conn.store(requests))

    def _write(self, call: Callable[[Connection], T]) -> T:
        failure: KestrelError | None = None
        for server in self._order(self._writes, self._writers):
            try:
                return self._call(server, call)
            except (ConnectionLost, ServerError) as exc:
                failure = exc
        assert failure is not None
        raise failure

    # -- reads ------------------------------------------------------------------------------

    def get(self, queue: str, timeout: float | None = None) -> bytes | None:
        """Remove and return the head item of ``queue`` from any server, waiting up to
        ``timeout`` seconds for one (None: do not wait); None when nothing came."""
        found = self._read(queue, timeout)
        return None if found is None else found[2]

    def peek(self, queue: str) -> bytes | None:
        """The head item of ``queue`` on the first server that has one, not removed."""
        found = self._read(queue, None, peek=True)
        return None if found is None else found[2]

    @contextmanager
    def reliable(self, queue: str, timeout: float | None = None) -> Iterator[bytes | None]:
        """A reliable read (``get <q>/open``): ``with client.reliable(q) as item:`` — the
        item is confirmed when the block ends normally and put back at the head of its queue
        when it raises; ``item`` is None when nothing came within ``timeout`` seconds.

        Confirming happens on the connection (so the server) that opened the item; if that
        fails, ConnectionLost is raised and the server gives the item to another reader.
        """
        found = self._read(queue, timeout, open=True)
        if found is None:
            yield None
            return
        server, conn, item = found
        try:
            yield item
        except BaseException:
            self._use(server, conn, lambda c: _abort(c, queue, 1))
            raise
        self._use(server, conn, lambda c: _close(c, queue))

    def _read(self, queue: str, timeout: float | None, open: bool = False,  # noqa: A002
              peek: bool = False) -> tuple[_Server, Connection, bytes] | None:
        """Sweep the servers for an item: each once without waiting (a pool), then one at a
        time for ``wait_slice`` seconds until ``timeout`` (one server: the whole wait at
        once). An ``open`` hit keeps its connection out of the pool (the open read lives on
        it) and returns it."""
        key = queue_key(queue)
        deadline = time.monotonic() + (timeout or 0)
        pool = len(self._pool()) > 1
        waited = not pool  # a pool first looks everywhere without waiting
        failure: KestrelError | None = None
        while True:
            servers = self._healthy(self._reads)
            answered = False
            for server in servers:
                left = deadline - time.monotonic()
                wait = 0.0
                if waited and left > 0:
                    wait = min(left, self.wait_slice) if pool else left
                request = get_request(queue, get_options(wait_ms(wait), open=open, peek=peek))
                try:
                    conn = self._acquire(server)
                    item = self._read_one(server, conn, request, key, wait, keep=open)
                except (ConnectionLost, ServerError) as exc:
                    failure = exc
                    continue
                answered = True
                if item is not None:
                    return server, conn, item
            if not answered:
                assert failure is not None
                raise failure
            if not waited and timeout:
                waited = True
                continue
            if deadline - time.monotonic() <= 0 or not timeout:
                return None

    def _read_one(self, server: _Server, conn: Connection, request: bytes, key: bytes,
                  wait: float, keep: bool) -> bytes | None:
        def call(c: Connection) -> bytes | None:
            c.send(request)
            with c.waiting(wait):
                return c.read_value(key)

        if not keep:
            return self._use(server, conn, call)
        try:
            item = call(conn)
        except BaseException as exc:
            self._discard(server, conn, exc)
            raise
        if item is None:
            self._release(server, conn)
        return item

    def monitor(self, queue: str, seconds: float, max_items: int) -> MonitorBatch:
        """Open up to ``max_items`` items of ``queue`` within ``seconds`` (``monitor``): a
        :class:`MonitorBatch` to confirm or abort. The server counts whole seconds and ends a
        monitor early only when it is full, so each server asked costs at least a second
        unless it fills the batch; a pool asks first the servers whose queue has items, then
        the others in turn, until the batch is full or the time is up."""
        if seconds < 0 or max_items < 1:
            raise ValueError("monitor needs seconds >= 0 and max_items >= 1")
        key = queue_key(queue)
        deadline = time.monotonic() + seconds
        pool = len(self._pool()) > 1
        items: list[bytes] = []
        parts: dict[int, _Part] = {}
        asked = False
        failure: KestrelError | None = None
        try:
            while len(items) < max_items:
                answered = False
                servers = self._healthy(self._reads)
                for server in self._holding_first(queue, key, servers) if pool else servers:
                    left = deadline - time.monotonic()
                    if asked and left <= 0:
                        return MonitorBatch(self, queue, items, list(parts.values()))
                    share = max(1, math.ceil(min(left, self.wait_slice) if pool else left))
                    part = parts.get(id(server))
                    try:
                        conn = part.conn if part else self._acquire(server)
                        got = self._monitor_one(server, conn, queue, key, share,
                                                max_items - len(items), held=part is not None)
                    except (ConnectionLost, ServerError) as exc:
                        failure = exc
                        parts.pop(id(server), None)  # its open items went back with the connection
                        continue
                    answered = asked = True
                    if got:
                        items.extend(got)
                        if part is None:
                            parts[id(server)] = _Part(server, conn, len(got))
                        else:
                            part.count += len(got)
                    elif part is None:
                        self._release(server, conn)
                    if len(items) >= max_items:
                        break
                if not answered:
                    assert failure is not None
                    raise failure
        except BaseException:
            for part in parts.values():
                part.conn.close()
            raise
        return MonitorBatch(self, queue, items, list(parts.values()))

    def _holding_first(self, queue: str, key: bytes, servers: list[_Server]) -> list[_Server]:
        """``servers`` with those whose queue has a head item (a peek each) first: a monitor
        holds its server until it is full or its time is up, so the time goes first where
        items are."""
        request = get_request(queue, "/peek")

        def peek(conn: Connection) -> bytes | None:
            conn.send(request)
            return conn.read_value(key)

        holding: list[_Server] = []
        others: list[_Server] = []
        for server in servers:
            try:
                (holding if self._call(server, peek) is not None else others).append(server)
            except (ConnectionLost, ServerError):
                others.append(server)  # the monitor will meet the failure again and say so
        return holding + others

    def _monitor_one(self, server: _Server, conn: Connection, queue: str, key: bytes,
                     seconds: int, max_items: int, held: bool) -> list[bytes]:
        try:
            conn.send(monitor_request(queue, seconds, max_items))
            with conn.waiting(seconds):
                return conn.read_values(key, max_items)
        except BaseException as exc:
            self._discard(server, conn, exc)
            raise

    # -- administration ---------------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, str]]:
        """``stats`` of every reachable server, by address (``"host:port"``); a server in
        backoff after a failure is left out."""
        def call(conn: Connection) -> dict[str, str]:
            conn.send(b"stats\r\n")
            return conn.read_stats()

        return self._everywhere(call)

    def queue_stats(self, queue: str) -> dict[str, int]:
        """The ``queue_<q>_*`` counters summed over the reachable servers (``items``,
        ``open_transactions``, ``total_items``, …)."""
        prefix = f"queue_{queue}_"
        total: dict[str, int] = {}
        for stats in self.stats().values():
            for name, value in stats.items():
                if name.startswith(prefix) and value.lstrip("-").isdigit():
                    short = name[len(prefix):]
                    total[short] = total.get(short, 0) + int(value)
        return total

    def version(self) -> dict[str, str]:
        """``version`` of every reachable server, by address (as :meth:`stats`)."""
        def call(conn: Connection) -> str:
            conn.send(b"version\r\n")
            return parse_version(conn.read_line())

        return self._everywhere(call)

    def status(self) -> dict[str, str]:
        """Each reachable server's status (``UP``, ``READONLY``, ``WRITEAVOID``, ``QUIESCENT``),
        by address (as :meth:`stats`)."""
        def call(conn: Connection) -> str:
            conn.send(status_request())
            return parse_status(conn.read_line())

        return self._everywhere(call)

    def set_status(self, status: str) -> None:
        """Set ``status`` (``up``, ``readonly``, ``writeavoid`` or ``quiescent``) on every
        server; the first failure is raised after trying them all. A change a grace period
        holds back is still answered ``END`` (behaviour §7.2)."""
        request = status_request(status)

        def call(conn: Connection) -> None:
            conn.send(request)
            conn.read_end("status")

        self._everywhere(call, every=True)

    def flush(self, queue: str) -> None:
        """Remove every ready item of ``queue`` on every server (open reads stay open)."""
        queue_key(queue)

        def call(conn: Connection) -> None:
            conn.send(b"flush %s\r\n" % queue.encode())
            conn.read_end("flush")

        self._everywhere(call, every=True)

    def delete(self, queue: str) -> None:
        """Drop ``queue`` and its journal on every server."""
        queue_key(queue)

        def call(conn: Connection) -> None:
            conn.send(b"delete %s\r\n" % queue.encode())
            expect_deleted(conn.read_line())

        self._everywhere(call, every=True)

    def _everywhere(self, call: Callable[[Connection], T], every: bool = False) -> dict[str, T]:
        """``call`` on each server: the answers of those that answered; with ``every`` the
        first failure is raised after trying them all (a flush must reach each server).
        Without it, servers in backoff are left out (unless every server is), as reads and
        writes leave them: a dead host is not waited for on each ``stats``."""
        results: dict[str, T] = {}
        failure: KestrelError | None = None
        servers = self._pool()
        if not every:
            now = time.monotonic()
            servers = [s for s in servers if s.down_until <= now] or servers
        for server in servers:
            try:
                results[str(server)] = self._call(server, call)
            except (ConnectionLost, ServerError) as exc:
                failure = failure or exc
        if failure is not None and (every or not results):
            raise failure
        return results

    def close(self) -> None:
        """Close every pooled connection (open reliable reads held elsewhere are not touched)
        and stop following server sets."""
        followers, self._followers = self._followers, []
        for follower in followers:
            follower.stop()
        for server in list(self._known.values()):
            _close_idle(server)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({[str(s) for s in self.servers]!r})"


def _close_idle(server: _Server) -> None:
    for idle in server.idle.values():
        while idle:
            try:
                idle.pop().close()
            except IndexError:
                break


def _confirm(conn: Connection, queue: str, count: int) -> None:
    conn.send(confirm_request(queue, count))
    conn.read_end("confirm")


def _close(conn: Connection, queue: str) -> None:
    conn.send(get_request(queue, "/close"))
    conn.read_end("get/close")


def _abort(conn: Connection, queue: str, count: int) -> None:
    conn.send(get_request(queue, "/abort") * count)
    for _ in range(count):
        conn.read_end("get/abort")
