"""Accepting a client: a :class:`Session`, its transport and its session actor, wired up.

The listeners (``server.py``) hand every accepted socket here with the protocol's decoder and
handler. The transport's callbacks run on the hub, so they hand their messages to the
dispatcher, which tells the session actor from a greenlet (ADR 0002).
"""

from __future__ import annotations

import socket
from typing import Any

import gevent.event
import structlog

from ..messages import Session
from ..runtime import Dispatcher, GeventRef, tell_quietly
from ..status import session_refusals
from ._actor import Disconnected, Drain, EndOfInput, SessionActor
from ._budget import BufferBudget
from ._context import SessionContext
from ._handler import Handler
from ._transport import UNSENT_IN_KERNEL, CommandSink, SocketTransport, heavy_first_read, take_turns

__all__ = ["Connections"]

log = structlog.get_logger("kestrel_actors.server")


class Connections:
    """The server's clients: counts them, refuses past ``max_connections``, starts sessions."""

    def __init__(self, context: SessionContext) -> None:
        self.context = context
        self.budget = BufferBudget(context.config.max_buffered_bytes)
        """What every connection buffers, bounded by ``max_buffered_bytes`` (not reloaded)."""
        self._next_session = 0
        self.live: dict[int, tuple[Session, Any]] = {}
        """Every session not yet finished, by id, with its actor (what a shutdown drains)."""
        self._none_live = gevent.event.Event()
        self._draining = False
        """Shutting down: a newcomer still waiting for its turn is closed, not served."""
        self._log = log.bind()
        """Resolved once (logging is configured by now): a module logger is a lazy proxy that
        binds anew on every call, and two of these calls come with every connection."""

    def accept(self, sock: Any, address: Any, decoder: Any, handler_class: type[Handler],
               heavy: bool | None = None) -> None:
        """Accept one client: a session, a session actor, and a transport feeding it. A
        newcomer whose first read is heavy is set up only when its turn comes (``_transport``):
        a burst of them costs a look at each, and a light newcomer behind them is served at
        once. ``heavy``: what the listener found when it accepted the socket (``None``: look)."""
        if heavy is None:
            heavy = heavy_first_read(sock.fileno())
        if not heavy:
            self._open(sock, address, decoder, handler_class, False)
            return

        def turn() -> bool:
            if self._draining:
                sock.close()
            else:
                self._open(sock, address, decoder, handler_class, True)
            return True

        if take_turns(turn):
            self._open(sock, address, decoder, handler_class, True)

    def _open(self, sock: Any, address: Any, decoder: Any, handler_class: type[Handler], first_turn: bool) -> None:
        context = self.context
        stats = context.stats
        config = context.config
        if stats.curr_connections >= config.max_connections:
            log.warning("connection refused: too many connections", peer=peer_name(address))
            sock.close()
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_IN_KERNEL)
        except OSError:  # gone already
            sock.close()
            return
        self._next_session += 1
        session = Session(self._next_session, peer_name(address))
        stats.curr_connections += 1
        stats.total_connections += 1
        session.refuse_writes, session.refuse_reads = session_refusals(
            stats.curr_connections, config.connection_limit_refuse_writes,
            config.connection_limit_refuse_reads,
        )
        holder: list[Any] = []
        dispatcher = Dispatcher.current()
        tell = dispatcher.tell_from_hub  # transport callbacks run on the hub
        on_commands = _ToSession(dispatcher)

        def on_hang_up() -> None:
            session.closed = True  # at once: a queue must not hand this client an item now
            tell(holder[0], Disconnected())

        def on_input_end(final: bool) -> None:
            session.input_ended = True  # at once: no fetch of this client's waits from now on
            tell(holder[0], EndOfInput(final))

        transport = SocketTransport(sock, decoder, on_commands, on_hang_up, stats, self.budget,
                                    config.client_timeout, session.peer,
                                    on_input_end if handler_class.ANSWERS_AFTER_FIN else None)
        holder.append(SessionActor.start_unlisted(context, transport, session, handler_class))
        on_commands.session = holder[0]
        self.live[session.id] = (session, holder[0])
        self._log.debug("connection opened", connection=session.id, peer=session.peer)
        transport.start(first_turn)

    def closed(self, session: Session) -> None:
        """A session finished (its actor calls this last)."""
        self.context.stats.curr_connections -= 1
        self.live.pop(session.id, None)
        if not self.live:
            self._none_live.set()
        self._log.debug("connection closed", connection=session.id, peer=session.peer)

    def drain(self, timeout: float) -> None:
        """Shutdown: every session answers what it has in flight and closes (:class:`Drain`);
        blocks the calling greenlet until all have, or ``timeout`` seconds. One still open
        then is cut off as if its client had hung up: from now on it sends nothing, so no
        client is answered by a queue that is closing."""
        self._draining = True
        if self.live:
            self._none_live.clear()
            for _session, ref in list(self.live.values()):
                tell_quietly(ref, Drain())
            self._none_live.wait(timeout)
        if self.live:
            log.warning("connections still busy at the end of the shutdown drain; cut off",
                        connections=len(self.live), seconds=timeout)
        for session, ref in list(self.live.values()):
            session.closed = True  # at once, as a hang-up: its replies are dropped from now on
            tell_quietly(ref, Disconnected())


def peer_name(address: Any) -> str:
    try:
        return f"{address[0]}:{address[1]}"
    except (TypeError, IndexError):
        return str(address)


class _ToSession(CommandSink):
    """A connection's decoded commands, told to its session from the hub: compiled and typed,
    so a read's hand-over is a native call (``CommandSink``)."""

    __slots__ = ("dispatcher", "session")

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__()
        self.dispatcher = dispatcher
        self.session: GeventRef | None = None
        """The session actor's ref, set once it is started (before the transport reads)."""

    def hand_over(self, commands: list[Any]) -> None:
        # the list itself is the message (``Received``): no record made per read
        self.dispatcher.tell_from_hub(self.session, commands)
