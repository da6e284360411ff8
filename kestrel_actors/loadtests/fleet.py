"""Closed-loop clients driven together from one epoll loop: the lean path of the load generator.

A role run on a greenlet of its own pays, for every reply it waits for, a read watcher started
and stopped, a switch to gevent's hub and one back, and the hub's dispatch of that one socket.
At 100 clients of one request in flight each, that made the Python load generator spend 24–43 µs
of CPU per request, more than either server it measured, and on two vCPUs the generator then set
the pace of the 100-client rows and the durable row. Here every connection of a process is
registered with one ``epoll`` object, and one greenlet waits on that (one watcher, one switch
there and back per loop turn, however many replies came) and feeds each reply to its client's
:class:`LeanClient`: the same requests on the wire, one in flight per connection as in Kestrel's
tools, at about half the CPU.

A role offers a lean form by :func:`lean_form`; the runner drives a process's clients whose
roles all have one this way, unless ``--greenlets`` asks for the old way (kept to compare with,
and for sockets without gevent's internals). A :class:`LeanClient` is sans-I/O: ``request``
gives the bytes to send, ``feed`` takes what came back and says when the reply is complete; the
driver owns the sockets and the waiting. The runner's ``--io-timeout`` watchdog still reads
each connection's ``waiting_since``, and a stalled reply ends the run as before.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gevent

from kestrel_actors.client import END, Connection, ConnectionLost, UnexpectedReply, get_reply_size

from .resp import NILS, check_lengths, pop_item, reply_end

__all__ = ["Connected", "LeanClient", "MakeLean", "drive", "lean_form", "lean_form_of"]

_RECV = 64 * 1024


class LeanClient:
    """One connection's requests and the checks of their replies, without I/O.

    ``request`` is called for the first request and again after each complete reply; ``feed``
    gets every chunk received. One request is in flight at a time (Kestrel's tools), so a
    reply followed by more bytes is an error.
    """

    __slots__ = ("buf",)

    def __init__(self, buf: bytearray | None = None) -> None:
        self.buf = bytearray() if buf is None else buf
        """What came of a reply so far: the connection's own buffer when given, so that a reply
        cut short shows in the watchdog's error as it does for a greenlet's client."""

    def request(self, t0: int) -> bytes | None:
        """The next request to send at ``t0`` (``time.monotonic_ns``, the start of its latency),
        or None when this client has finished."""
        raise NotImplementedError

    def feed(self, chunk: bytes) -> bool:
        """Take ``chunk``: whether the reply to the last request is now complete (and checked)."""
        raise NotImplementedError

    def fixed(self, chunk: bytes, expected: bytes) -> bool:
        """``feed`` for a reply that must be exactly ``expected`` (``STORED`` × n)."""
        buf = self.buf
        if not buf and chunk == expected:
            return True
        buf += chunk
        if len(buf) < len(expected) and expected.startswith(buf):
            return False
        if buf != expected:
            raise UnexpectedReply(f"expected {bytes(expected[:60])!r}, got {bytes(buf[:60])!r}")
        buf.clear()
        return True

    def get_replies(self, chunk: bytes, count: int, hit_len: int) -> list[bytes | None] | None:
        """``feed`` for ``count`` GETs whose hits are ``hit_len`` bytes long (the load tests
        know it): each reply, None for ``END``, once all ``count`` have come; else None."""
        buf = self.buf
        if not buf and count == 1:  # the usual case: one whole reply in one chunk
            if len(chunk) == hit_len and chunk.startswith(b"VALUE"):
                return [chunk]
            if chunk == END:
                return [None]
        buf += chunk
        replies: list[bytes | None] = []
        at = 0
        while len(replies) < count:
            size = get_reply_size(buf, at, hit_len)
            if not size:
                return None
            replies.append(None if size == len(END) else bytes(buf[at:at + size]))
            at += size
        if at != len(buf):
            raise UnexpectedReply(f"more than {count} replies: {bytes(buf[at:at + 60])!r}")
        buf.clear()
        return replies

    def lengths(self, chunk: bytes, count: int) -> bool:
        """``feed`` for ``count`` pipelined ``RPUSH``es (``--resp``): whether all their integer
        replies have come (:func:`.resp.check_lengths`)."""
        buf = self.buf
        if not buf:
            if count == 1 and chunk[:1] == b":" and chunk[-2:] == b"\r\n" and chunk[1:-2].isdigit():
                return True
            if check_lengths(chunk, count):
                return True
            buf += chunk
            return False
        buf += chunk
        if not check_lengths(buf, count):
            return False
        buf.clear()
        return True

    def pops(self, chunk: bytes, count: int, hit_len: int) -> list[bytes | None] | None:
        """``get_replies`` for ``count`` pipelined pops (``--resp``): each whole reply (a hit is
        ``hit_len`` bytes, which the caller's checker reads), None for a nil."""
        buf = self.buf
        if not buf and count == 1:  # the usual case: one whole reply in one chunk
            if len(chunk) == hit_len and chunk[:1] in (b"$", b"*"):
                return [chunk]
            if chunk in NILS:
                return [None]
        buf += chunk
        replies: list[bytes | None] = []
        at = 0
        while len(replies) < count:
            end = reply_end(buf, at)
            if end < 0:
                return None
            replies.append(pop_item(bytes(buf[at:end])))
            at = end
        if at != len(buf):
            raise UnexpectedReply(f"more than {count} replies: {bytes(buf[at:at + 60])!r}")
        buf.clear()
        return replies


class Connected(Protocol):
    """What the loop needs of a client's context (the runner's ``ClientContext``): its connection."""

    conn: Connection


MakeLean = Callable[[Any], LeanClient]
"""A lean form: builds the client from the runner's ``ClientContext`` (typed ``Any`` here: the
runner imports this module, not the other way round)."""

_LEAN_FORMS: dict[Callable[..., Any], MakeLean] = {}


def lean_form(make: MakeLean) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a role function as having a lean form: ``make(ctx)`` builds the client that does
    what the role does (same requests, same checks, same recorders)."""

    def mark(role: Callable[..., Any]) -> Callable[..., Any]:
        _LEAN_FORMS[role] = make
        return role

    return mark


def lean_form_of(role: Callable[..., Any]) -> MakeLean | None:
    return _LEAN_FORMS.get(role)


@dataclass(slots=True)
class _Lane:
    """One connection on the loop: its socket, its client, and the connection for the watchdog."""

    conn: Connection
    raw: Any
    client: LeanClient


def drive(contexts: Sequence[Connected], makes: Sequence[MakeLean]) -> None:
    """Run the clients ``makes[i](contexts[i])`` on this greenlet until each has finished.

    Every connection must be connected, with gevent's raw socket (``Connection.raw``). Raises
    what a client raises (a wrong reply), :class:`ConnectionLost`, or what the watchdog throws
    in while a reply is late.
    """
    now = time.monotonic_ns
    poller = select.epoll(max(1, len(contexts)))
    hub = gevent.get_hub()
    ready = hub.loop.io(poller.fileno(), 1)
    lanes: dict[int, _Lane] = {}
    try:
        for ctx, make in zip(contexts, makes, strict=True):
            conn = ctx.conn
            lane = _Lane(conn, conn.raw, make(ctx))
            t0 = now()
            first = lane.client.request(t0)
            if first is None:
                continue
            fd = lane.raw.fileno()
            lanes[fd] = lane
            poller.register(fd, select.EPOLLIN)
            conn.waiting_since = t0
            conn.send(first)
        poll = poller.poll
        while lanes:
            events = poll(0)
            if not events:
                hub.wait(ready)  # until some connection is readable; the hub runs the rest
                continue
            for fd, _mask in events:
                lane = lanes[fd]
                try:
                    chunk = lane.raw.recv(_RECV)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise ConnectionLost(f"receive failed: {exc}") from exc
                if not chunk:
                    raise ConnectionLost(f"the server closed the connection; buffered {bytes(lane.client.buf[:60])!r}")
                if not lane.client.feed(chunk):
                    continue
                conn = lane.conn
                t0 = now()
                following = lane.client.request(t0)
                if following is None:
                    conn.waiting_since = 0
                    poller.unregister(fd)
                    del lanes[fd]
                    continue
                conn.waiting_since = t0
                try:
                    sent = lane.raw.send(following)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:  # as Connection.send says it: the server's doing, a failure
                    raise ConnectionLost(f"send failed: {exc}") from exc
                if sent < len(following):  # the socket's buffer is full: the rest as a greenlet would
                    conn.send(following[sent:])
    finally:
        ready.close()
        poller.close()
