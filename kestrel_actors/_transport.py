"""A client socket as the connection actor sees it: bytes in through a callback, bytes out.

Reading runs in a hub I/O watcher callback, not in a greenlet of its own: when the socket is
readable the callback does one non-blocking ``recv``, decodes, and tells the connection actor.
That saves a greenlet switch per request over a reader loop. Writes try one non-blocking
``send`` first and only fall back to gevent's cooperative ``sendall`` when the kernel buffer
is full. The watcher pauses when the actor has a backlog, so a client that pipelines without
reading replies cannot make the server buffer without bound.
"""

from __future__ import annotations

from typing import Any, Callable

import gevent
import gevent.event
import structlog

__all__ = ["SocketTransport"]

log = structlog.get_logger("kestrel_actors.transport")

READ_SIZE = 64 * 1024
"""Below malloc's mmap threshold: a larger recv buffer costs an mmap and munmap per read."""
BACKLOG_COMMANDS = 4096
"""Commands handed over before reading pauses until the connection actor catches up."""


class SocketTransport:
    """Owns one accepted gevent socket; see the module docstring."""

    __slots__ = ("sock", "raw", "decoder", "on_commands", "on_eof", "on_bytes", "_watcher", "_handed",
                 "_paused", "closed", "done", "_idle_timer", "_idle_timeout", "_last_read")

    def __init__(
        self,
        sock: Any,
        decoder: Any,
        on_commands: Callable[[list[Any]], None],
        on_eof: Callable[[], None],
        on_bytes: Callable[[int], None],
        idle_timeout: float | None = None,
    ) -> None:
        self.sock = sock
        self.raw = sock._sock  # the non-blocking OS socket under gevent's wrapper
        self.decoder = decoder
        self.on_commands = on_commands
        self.on_eof = on_eof
        self.on_bytes = on_bytes
        self._handed = 0
        self._paused = False
        self.closed = False
        self.done = gevent.event.Event()
        """Set once closed; the accepting greenlet waits on it."""
        loop = gevent.get_hub().loop
        self._watcher = loop.io(sock.fileno(), 1)
        self._idle_timeout = idle_timeout
        self._idle_timer = None
        self._last_read = loop.now()
        if idle_timeout:
            # Kestrel's client_timeout: a connection that sends nothing for that long is closed
            self._idle_timer = loop.timer(idle_timeout, idle_timeout / 4)

    def start(self) -> None:
        self._watcher.start(self._readable)
        if self._idle_timer is not None:
            self._idle_timer.start(self._check_idle)

    def _check_idle(self) -> None:
        if self.closed:
            return
        if self._idle_timer.loop.now() - self._last_read >= self._idle_timeout:
            log.info("closing idle connection", idle_seconds=self._idle_timeout)
            self._watcher.stop()
            self._idle_timer.stop()
            self.on_eof()

    def _readable(self) -> None:
        try:
            data = self.raw.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        except Exception:  # noqa: BLE001 - nothing may escape into the hub
            log.exception("read failed")
            data = b""
        if not data:
            self._watcher.stop()
            self.on_eof()
            return
        if self._idle_timer is not None:
            self._last_read = self._idle_timer.loop.now()
        self.on_bytes(len(data))
        decoder = self.decoder
        try:
            commands = decoder.feed(data)
        except Exception:  # noqa: BLE001 - a decoder bug must not kill the server
            log.exception("decoder failed")
            self._watcher.stop()
            self.on_eof()
            return
        if decoder.closed:
            self._watcher.stop()  # the actor answers what came before, then closes
        if commands:
            self._handed += len(commands)
            self.on_commands(commands)
            if self._handed > BACKLOG_COMMANDS and not decoder.closed:
                self._paused = True
                self._watcher.stop()

    def resume(self) -> None:
        """The connection actor has caught up: read again if reading was paused."""
        self._handed = 0
        if self._paused and not self.closed:
            self._paused = False
            self._watcher.start(self._readable)

    def sendall(self, data: bytes) -> None:
        try:
            sent = self.raw.send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            self.sock.sendall(data[sent:])

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._watcher.stop()
        self._watcher.close()
        if self._idle_timer is not None:
            self._idle_timer.close()
        try:
            self.sock.close()
        except OSError:
            pass
        self.done.set()
