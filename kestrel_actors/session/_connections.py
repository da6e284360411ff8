"""Accepting a client: a :class:`Session`, its transport and its session actor, wired up.

The listeners (``server.py``) hand every accepted socket here with the protocol's decoder and
handler. The transport's callbacks run on the hub, so they hand their messages to the
dispatcher, which tells the session actor from a greenlet (ADR 0002).
"""

from __future__ import annotations

import _socket
import array
import fcntl
import logging
import os
import struct
import termios
from collections.abc import Callable
from typing import Any, Final

import gevent.event
import structlog

from ..messages import Session, peer_name
from ..runtime import Dispatcher, GeventRef, tell_quietly
from ..status import session_refusals
from ._actor import Disconnected, Drain, EndOfInput, SessionActor
from ._budget import BufferBudget
from ._context import SessionContext
from ._handler import Handler
from ._transport import LIGHT_FIRST_READ, BusyPoll, CommandSink, SocketTransport, first_read_bytes, take_turns

__all__ = ["Acceptor", "ClientSocket", "Connections", "accept_burst", "backlog_length"]

log = structlog.get_logger("kestrel_actors.server")


class Connections:
    """The server's clients: counts them, refuses past ``max_connections``, starts sessions."""

    def __init__(self, context: SessionContext) -> None:
        self.context = context
        config = context.config
        self.budget = BufferBudget(config.max_buffered_bytes)
        """What every connection buffers, bounded by ``max_buffered_bytes`` (not reloaded)."""
        # read once here, not per connection (an interpreted dataclass's attributes, looked up by
        # name: about 1,000 instructions a connection); a reload changes only queue settings
        # and aliases, never these (``Server.reload``)
        self.max_connections: int = config.max_connections
        self.refuse_writes: int | None = config.connection_limit_refuse_writes
        self.refuse_reads: int | None = config.connection_limit_refuse_reads
        self.client_timeout: float | None = config.client_timeout
        self.busy_poll: float = config.busy_poll
        self._next_session = 0
        self.live: dict[int, _ToSession] = {}
        """Every session not yet finished, by id: its link, which holds the session and its actor
        (what a shutdown drains; no pair made per connection)."""
        self._none_live = gevent.event.Event()
        self._draining = False
        """Shutting down: a newcomer still waiting for its turn is closed, not served."""
        self._log = log.bind()
        """Resolved once (logging is configured by now): a module logger is a lazy proxy that
        binds anew on every call, and two of these calls come with every connection."""
        self._debug = self._log.is_enabled_for(logging.DEBUG)
        """Whether those two lines are logged: asked once, since a filtered call still costs its
        arguments and a call (``serve`` configures logging once, before the server exists)."""
        self._dispatcher: Dispatcher | None = None
        """The dispatcher of the hub the clients are accepted on, asked once (at the first):
        ``Dispatcher.current()`` looks the hub up, 1,500 instructions a connection."""

    def accept(self, sock: Any, address: Any, decoder: Any, handler_class: type[Handler],
               waiting: int | None = None) -> None:
        """Accept one client: a session, a session actor, and a transport feeding it. A
        newcomer whose first read is heavy is set up only when its turn comes (``_transport``):
        a burst of them costs a look at each, and a light newcomer behind them is served at
        once. ``waiting``: the bytes of its first read that the listener found waiting when it
        accepted the socket (``None``: look); a light request found waiting is read at once."""
        if waiting is None:
            waiting = first_read_bytes(sock.fileno())
        if waiting <= LIGHT_FIRST_READ:
            self._open(sock, address, decoder, handler_class, waiting > 0)
            return

        def turn() -> bool:
            if self._draining:
                sock.close()
            else:
                self._open(sock, address, decoder, handler_class, True)
            return True

        if take_turns(turn):
            self._open(sock, address, decoder, handler_class, True)

    def _open(self, sock: Any, address: Any, decoder: Any, handler_class: type[Handler], read_now: bool) -> None:
        """Set the client up; its socket has the listener's options (``TCP_NODELAY``,
        ``SO_KEEPALIVE``, ``TCP_NOTSENT_LOWAT``: ``server._Listener``). ``read_now``: its first
        read is due now (``SocketTransport.start``)."""
        context = self.context
        stats = context.stats
        if stats.curr_connections >= self.max_connections:
            log.warning("connection refused: too many connections", peer=peer_name(address))
            sock.close()
            return
        self._next_session += 1
        session = Session(self._next_session, address)
        stats.curr_connections += 1
        stats.total_connections += 1
        session.refuse_writes, session.refuse_reads = session_refusals(
            stats.curr_connections, self.refuse_writes, self.refuse_reads)
        dispatcher = self._dispatcher
        if dispatcher is None:
            dispatcher = self._dispatcher = Dispatcher.current()
            BusyPoll.of(dispatcher.loop).seconds = self.busy_poll
        link = _ToSession(dispatcher, session)
        transport = SocketTransport(sock, decoder, link, link.hang_up, stats, self.budget,
                                    self.client_timeout, address,
                                    link.input_end if handler_class.ANSWERS_AFTER_FIN else None,
                                    dispatcher.loop)
        ref = SessionActor.start_unlisted(context, transport, session, handler_class)
        link.session = ref
        self.live[session.id] = link
        if self._debug:
            self._log.debug("connection opened", connection=session.id, peer=session.peer)
        transport.start(read_now)

    def closed(self, session: Session) -> None:
        """A session finished (its actor calls this last)."""
        self.context.stats.curr_connections -= 1
        live = self.live
        live.pop(session.id, None)
        if not live and self._draining:
            self._none_live.set()
        if self._debug:
            self._log.debug("connection closed", connection=session.id, peer=session.peer)

    def drain(self, timeout: float) -> None:
        """Shutdown: every session answers what it has in flight and closes (:class:`Drain`);
        blocks the calling greenlet until all have, or ``timeout`` seconds. One still open
        then is cut off as if its client had hung up: from now on it sends nothing, so no
        client is answered by a queue that is closing."""
        self._draining = True
        if self.live:
            self._none_live.clear()
            for link in list(self.live.values()):
                tell_quietly(link.session, Drain())
            self._none_live.wait(timeout)
        if self.live:
            log.warning("connections still busy at the end of the shutdown drain; cut off",
                        connections=len(self.live), seconds=timeout)
        for link in list(self.live.values()):
            link.record.closed = True  # at once, as a hang-up: its replies are dropped from now on
            tell_quietly(link.session, Disconnected())


def accept_burst(listening: Any, handle: Callable[[Any, Any, int], None], lights: int, heavies: int,
                 give_options: Callable[[Any], bool] | None) -> None:
    """A listener's accept loop (``server._Listener``), compiled: gevent's is interpreted, and so
    were the five calls it made per client. Accepts until the kernel's backlog is empty (as many
    as it held when asked, :func:`backlog_length`, or until would-block if it cannot say), at most
    ``lights`` clients whose first read is light (they are set up at once) and ``heavies`` heavy
    ones in a row (only looked at: they wait for their turn), and hands each to ``handle(sock,
    address, waiting)``, ``waiting`` the bytes of its first read the kernel holds already.
    ``give_options``: asked of each socket while the listener does not know that the kernel
    copies its options (``False``: the socket is closed, its client gone). Raises what
    ``accept`` raises other than would-block, for the listener to handle."""
    light = 0
    heavy = 0
    # the accept that finds the backlog empty costs a system call and a raised BlockingIOError
    # (about 6,000 instructions, one per burst: per reconnecting client); with the backlog's
    # length known, the burst ends without it. Clients that come meanwhile are not missed: the
    # listener's watcher is level-triggered, so it fires again while any wait
    queued = backlog_length(listening)
    while light < lights and heavy < heavies:
        if queued == 0:
            return
        queued -= 1  # from -1 (not known) on, it never reaches 0: accept until would-block
        try:
            # the raw descriptor: no socket object made and thrown away
            fd, address = listening._accept()
        except BlockingIOError:
            return
        # no socket object: made from a descriptor, CPython's checks it with a getsockname
        # system call, and nothing here needs more than the descriptor (``ClientSocket``)
        sock = ClientSocket(fd)
        _ioctl(fd, _FIONBIO, _ON)  # non-blocking: one system call, as setblocking(False) made
        if give_options is not None and not give_options(sock):
            continue
        waiting = first_read_bytes(fd)
        if waiting <= LIGHT_FIRST_READ:
            light += 1
            heavy = 0
        else:
            heavy += 1
        handle(sock, address, waiting)


_ioctl: Final = fcntl.ioctl
_FIONBIO: Final = termios.FIONBIO
_ON: Final = array.array("i", [1])
"""``FIONBIO``'s argument (read, never written: one for every thread)."""


class ClientSocket:
    """An accepted client's descriptor with what the server asks of its socket: ``fileno``,
    ``close`` and, rarely, an option (a shed's reset, the first socket's option check). A
    ``socket`` object made from a descriptor costs a ``getsockname`` system call (CPython checks
    the descriptor), one of ten per connection, and more instructions than this. Closes the
    descriptor when let go of unclosed, as a socket does."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd
        """The descriptor, -1 once closed."""

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        fd = self.fd
        if fd >= 0:
            self.fd = -1
            os.close(fd)

    def getsockopt(self, level: int, option: int) -> int:
        sock = _socket.socket(fileno=self.fd)
        try:
            value: int = sock.getsockopt(level, option)
        finally:
            sock.detach()
        return value

    def setsockopt(self, level: int, option: int, value: int | bytes) -> None:
        sock = _socket.socket(fileno=self.fd)
        try:
            sock.setsockopt(level, option, value)
        finally:
            sock.detach()

    def __del__(self) -> None:
        if self.fd >= 0:
            self.close()


_TCP_INFO: Final = getattr(_socket, "TCP_INFO", -1)
_BACKLOG_AT: Final = 24
"""Where ``struct tcp_info`` holds ``tcpi_unacked``: for a listening socket, Linux reports there
the clients waiting in its accept backlog (what ``ss`` shows as a listener's Recv-Q)."""
_unpack_count: Final = struct.Struct("=I").unpack_from


def backlog_length(listening: Any) -> int:
    """How many clients wait in ``listening``'s accept backlog now (Linux's ``TCP_INFO``), or -1
    if the kernel does not say (another system, another kind of socket)."""
    if _TCP_INFO < 0:
        return -1
    try:
        info = listening.getsockopt(_socket.IPPROTO_TCP, _TCP_INFO, _BACKLOG_AT + 4)
    except OSError:
        return -1
    if len(info) < _BACKLOG_AT + 4:
        return -1
    count: int = _unpack_count(info, _BACKLOG_AT)[0]
    return count


class Acceptor:
    """What a listener hands each client it accepts (``handle(sock, address, waiting)``): a
    fresh decoder of its protocol and the protocol's handler class, to :meth:`Connections.accept`.
    Compiled, so the listener's loop sets a client up with no interpreted call between."""

    __slots__ = ("connections", "decoder_class", "decoder_args", "handler_class")

    def __init__(self, connections: Connections, decoder_class: type[Any], decoder_args: tuple[Any, ...],
                 handler_class: type[Handler]) -> None:
        self.connections = connections
        self.decoder_class = decoder_class
        self.decoder_args = decoder_args
        self.handler_class = handler_class

    def __call__(self, sock: Any, address: Any, waiting: int | None = None) -> None:
        self.connections.accept(sock, address, self.decoder_class(*self.decoder_args), self.handler_class, waiting)


class _ToSession(CommandSink):
    """A connection's transport callbacks, each told to its session from the hub: its decoded
    commands, its hang-up, the end of its input. Compiled and typed, so a read's hand-over is a
    native call (``CommandSink``); one object per connection where closures cost three more."""

    __slots__ = ("dispatcher", "session", "record")

    def __init__(self, dispatcher: Dispatcher, record: Session) -> None:
        super().__init__()
        self.dispatcher = dispatcher
        self.record = record
        """The connection's :class:`Session`, marked at once when its client goes."""
        self.session: GeventRef | None = None
        """The session actor's ref, set once it is started (before the transport reads)."""

    def hand_over(self, commands: list[Any]) -> None:
        # the list itself is the message (``Received``): no record made per read
        self.dispatcher.tell_from_hub(self.session, commands)

    def hang_up(self) -> None:
        self.record.closed = True  # at once: a queue must not hand this client an item now
        self.dispatcher.tell_from_hub(self.session, Disconnected())

    def input_end(self, final: bool) -> None:
        self.record.input_ended = True  # at once: no fetch of this client's waits from now on
        self.dispatcher.tell_from_hub(self.session, EndOfInput(final))
