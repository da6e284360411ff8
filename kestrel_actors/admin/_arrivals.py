"""Requests still arriving on the admin port: each must arrive whole by a fixed deadline, and
the oldest gives way when too many are arriving at once (issue 21.4).

A per-read timeout does not bound a client that sends one byte just before each read would
time out: it holds its place for ever. Here the clock starts when the connection begins to wait
for a request (at accept, or when the previous reply has been sent) and is never reset. When it
runs out, or when a newer arrival needs the place, the socket is shut down: the handler's read
returns end-of-file, and :meth:`Arrival.done` tells it that what it has read is not a request
and must not be acted on.
"""

from __future__ import annotations

import socket
from typing import Any

import gevent
import structlog

__all__ = ["Arrival", "Arrivals"]

log = structlog.get_logger("kestrel_actors.admin")


class Arrival:
    """One request being waited for on one connection."""

    __slots__ = ("_arrivals", "_peer", "_sock", "_timer", "was_cut")

    def __init__(self, arrivals: Arrivals, sock: Any, peer: str, deadline: float) -> None:
        self._arrivals = arrivals
        self._sock = sock
        self._peer = peer
        self.was_cut = False
        """The deadline ran out, or the place was taken: the connection is being closed."""
        self._timer = gevent.get_hub().loop.timer(deadline)
        self._timer.start(self.cut_off, "not whole within the deadline")

    def done(self) -> bool:
        """The request has been read; ``False`` if it was cut off first (it is not whole)."""
        self._timer.close()
        self._arrivals.pending.pop(self, None)
        return not self.was_cut

    def cut_off(self, why: str) -> None:
        """Close the connection's reading and writing; its handler reads end-of-file."""
        self.was_cut = True
        self._timer.close()
        self._arrivals.pending.pop(self, None)
        log.info("admin connection closed", reason=why, peer=self._peer)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone


class Arrivals:
    """The requests being waited for on one admin port, oldest first: at most ``limit`` of
    them, each for at most ``deadline`` seconds."""

    def __init__(self, limit: int, deadline: float) -> None:
        self.limit = limit
        self.deadline = deadline
        self.pending: dict[Arrival, None] = {}

    def expect(self, sock: Any, peer: str) -> Arrival:
        """Start waiting for a request on ``sock``, first cutting off the oldest arrival if
        ``limit`` are pending: a client that sends its request at once is always served."""
        if len(self.pending) >= self.limit:
            next(iter(self.pending)).cut_off(f"the oldest of {self.limit} requests still arriving")
        arrival = Arrival(self, sock, peer, self.deadline)
        self.pending[arrival] = None
        return arrival
