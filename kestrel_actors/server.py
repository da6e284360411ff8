"""The server: gevent listeners, one reader greenlet and one connection actor per client.

The reader greenlet is the only code that touches a client socket for input: it feeds bytes
to the protocol decoder and hands the commands to the connection actor, pausing when the
actor falls behind (so a client pipelining without reading replies cannot fill our memory).
Everything else happens in actors.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any, Callable

import gevent
import gevent.event
import structlog
from gevent.server import StreamServer
from pykka import ActorDeadError, ActorRegistry

from . import __version__
from .actors import ConnectionActor, Disconnected, QueueCollection, Received, ReplyFuture, ServerStats, Session
from .actors._collection import ForAll, Load, QueueOpener, memory_opener
from .config import ServerConfig
from .protocol import END, MemcacheDecoder

__all__ = ["Server", "StartupError"]

log = structlog.get_logger("kestrel_actors.server")

READ_SIZE = 256 * 1024
BACKLOG_COMMANDS = 4096
"""Commands a reader hands over before it waits for its connection actor to catch up."""


class StartupError(Exception):
    """The server cannot start (unusable data directory, port in use, bad journal)."""


class Server:
    """One kestrel-actors server: a queue collection and its listeners."""

    version = __version__

    def __init__(self, config: ServerConfig, opener: QueueOpener | None = None) -> None:
        self.config = config
        self.stats = ServerStats()
        self.status = "UP"
        self._next_session = 0
        self._stopped = gevent.event.Event()
        self._listeners: list[StreamServer] = []
        self._sweeper: Any = None
        self._shutting_down = False
        self._check_data_dir()
        self.collection = QueueCollection.start(config, self.stats, opener or memory_opener)

    # -- life cycle -----------------------------------------------------------------------

    def _check_data_dir(self) -> None:
        path = Path(self.config.data_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"cannot create data directory {path}: {exc}") from exc
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise StartupError(f"data directory {path} is not a writable directory")

    def load(self, names: list[str]) -> None:
        """Create (and replay) the queues found on disk, before any client connects."""
        self.collection.ask(Load(names))

    def start(self) -> None:
        listener = self._listen(self.config.host, self.config.port, self._serve_memcache)
        self._listeners.append(listener)
        frequency = self.config.expiration_timer_frequency
        if frequency:
            self._sweeper = gevent.spawn(self._sweep_forever, frequency)
        log.info("listening", protocol="memcache", host=self.config.host, port=listener.server_port,
                 data_dir=str(self.config.data_dir))

    def _listen(self, host: str, port: int, handle: Callable[[Any, Any], None]) -> StreamServer:
        listener = StreamServer((host, port), handle, backlog=1024)
        try:
            listener.start()
        except OSError as exc:
            raise StartupError(f"cannot listen on {host}:{port}: {exc}") from exc
        return listener

    @property
    def port(self) -> int:
        return self._listeners[0].server_port

    def serve_forever(self) -> None:
        """Start, and return once the server has shut down (``shutdown`` or a signal)."""
        self.start()
        gevent.signal_handler(signal.SIGTERM, self.shutdown)
        gevent.signal_handler(signal.SIGINT, self.shutdown)
        self._stopped.wait()

    def shutdown(self) -> None:
        """Begin an orderly shutdown 100 ms from now, as Kestrel does (§7.4)."""
        if not self._shutting_down:
            self._shutting_down = True
            gevent.spawn_later(0.1, self._stop)

    def _stop(self) -> None:
        log.info("shutting down")
        for listener in self._listeners:
            listener.close()
        if self._sweeper is not None:
            self._sweeper.kill()
        closed = ReplyFuture()
        self.collection.tell(ForAll("close", closed))
        try:
            closed.get(timeout=30)
        except Exception:  # noqa: BLE001 - a stuck queue must not keep the process alive
            log.error("queues did not close in time")
        ActorRegistry.stop_all(block=False)
        log.info("goodbye")
        self._stopped.set()

    def _sweep_forever(self, frequency: float) -> None:
        while True:
            gevent.sleep(frequency)
            self.collection.tell(ForAll("sweep", _IGNORE))

    # -- connections ----------------------------------------------------------------------

    def _serve_memcache(self, sock: Any, address: Any) -> None:
        self._serve(sock, address, MemcacheDecoder(self.config.max_line_bytes, self.config.max_item_bytes))

    def _serve(self, sock: Any, address: Any, decoder: Any) -> None:
        """The reader greenlet of one connection."""
        stats = self.stats
        if stats.curr_connections >= self.config.max_connections:
            log.warning("connection refused: too many connections", peer=_peer(address))
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self._next_session += 1
        gate = gevent.event.Event()
        gate.set()
        session = Session(self._next_session, _peer(address), gate)
        stats.curr_connections += 1
        stats.total_connections += 1
        connection = ConnectionActor.start(self, sock, session)
        handed = 0
        try:
            while True:
                data = sock.recv(READ_SIZE)
                if not data:
                    break
                stats.bytes_read += len(data)
                commands = decoder.feed(data)
                if commands:
                    connection.tell(Received(commands))
                    handed += len(commands)
                if decoder.closed:
                    return  # the actor replies, then closes the socket itself
                if handed > BACKLOG_COMMANDS:
                    gate.clear()
                    gate.wait()
                    handed = 0
        except (OSError, ActorDeadError):
            pass
        session.closed = True
        try:
            connection.tell(Disconnected())
        except ActorDeadError:
            pass

    def reader_may_continue(self, session: Session) -> None:
        session.reader_gate.set()

    def connection_closed(self, connection: ConnectionActor) -> None:
        self.stats.curr_connections -= 1

    # -- server status (a fuller model arrives with the configuration issue) --------------

    def writes_allowed(self, session: Session) -> bool:
        return True

    def reads_allowed(self, session: Session) -> bool:
        return True

    def status_reply(self, name: str | None) -> bytes:
        if name is None:
            return self.status.encode() + b"\r\n"
        return END

    def reload(self) -> bytes:
        return b"Reloaded config.\r\n"


class _Ignore:
    @staticmethod
    def tell(_value: Any) -> None:
        pass


_IGNORE = _Ignore()


def _peer(address: Any) -> str:
    try:
        return f"{address[0]}:{address[1]}"
    except (TypeError, IndexError):
        return str(address)
