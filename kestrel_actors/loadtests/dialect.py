"""What a scenario sends and expects, in Kestrel's memcache protocol or (``--resp``) in Redis's.

A scenario's clients take their requests, the whole reply of a hit and their reply readers from
a :class:`Dialect`, chosen once per client (:func:`dialect_of`), so the same scenario code drives
Kestrel and Redis, and the memcache path keeps its bound methods and pre-built bytes: a reader
is picked once, not dispatched per request.

* ``put_request`` is ``set <q> …`` or ``RPUSH <q> <item>``; ``stored(n)`` is what ``expect_stored``
  needs for ``n`` of them (``STORED`` × n, or the count of ``:<length>`` replies);
* ``take_request`` is ``get <q>`` (``get <q>/t=<ms>`` when waiting) or ``LPOP <q>`` (``BLPOP <q>
  <s>``); ``hit_reply`` the whole reply that returns an item, which a checker compares;
* ``read_take`` (a greenlet's client) and ``lean_takes`` (the lean loop, :mod:`.fleet`) give each
  take's whole reply, or None for a miss (``END``, or a nil).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kestrel_actors.client import STORED, Connection, get_request, set_request, value_reply

from . import resp
from .fleet import LeanClient

__all__ = ["MEMCACHE", "RESP", "Dialect", "dialect_of"]

Expected = bytes | int
"""What ``expect_stored`` takes for ``n`` stores: memcache's exact reply bytes, or RESP's count."""


@dataclass(frozen=True)
class Dialect:
    name: str
    put_request: Callable[[str, bytes], bytes]
    """``put_request(queue, data)``: a plain function (scenarios that stamp every item call it
    per request)."""

    @property
    def is_resp(self) -> bool:
        return self.name == "resp"

    def take_request(self, queue: str, wait_ms: int = 0) -> bytes:
        """A GET; with ``wait_ms``, one the server holds that long for an item (RESP: whole seconds)."""
        if self.is_resp:
            return resp.blocking_pop_request(queue, max(1, -(-wait_ms // 1000))) if wait_ms else resp.pop_request(queue)
        return get_request(queue, f"/t={wait_ms}" if wait_ms else "")

    def hit_reply(self, queue: str, data: bytes, waiting: bool = False) -> bytes:
        """The whole reply of a take (``waiting``: a blocking one) that returns ``data``."""
        if self.is_resp:
            return resp.blocking_pop_reply(queue, data) if waiting else resp.pop_reply(queue, data)
        return value_reply(queue, data)

    def stored(self, count: int) -> Expected:
        return count if self.is_resp else STORED * count

    def expect_stored(self, conn: Connection) -> Callable[[Any], None]:
        """``expect(self.stored(n))`` reads the replies of ``n`` puts, or raises."""
        if self.is_resp:
            return functools.partial(_read_lengths, conn)
        return conn.expect

    def read_take(self, conn: Connection) -> Callable[[int], bytes | None]:
        """``read(hit_len)``: one take's whole reply, None for a miss."""
        if self.is_resp:
            return functools.partial(_read_pop, conn)
        return conn.read_get

    def lean_stored(self, client: LeanClient) -> Callable[[bytes, Any], bool]:
        """``feed(chunk, self.stored(n))`` for the lean loop: whether all ``n`` replies came."""
        return client.lengths if self.is_resp else client.fixed

    def lean_takes(self, client: LeanClient) -> Callable[[bytes, int, int], list[bytes | None] | None]:
        """``feed(chunk, count, hit_len)`` for the lean loop: the replies once all ``count`` came."""
        return client.pops if self.is_resp else client.get_replies


MEMCACHE = Dialect("memcache", set_request)
RESP = Dialect("resp", resp.push_request)


def dialect_of(options: Any) -> Dialect:
    """The dialect of a run's ``Options`` (``--resp``)."""
    return RESP if getattr(options, "resp", False) else MEMCACHE


def _read_lengths(conn: Connection, count: int) -> None:
    for _ in range(count):
        resp.parse_integer(conn.read_line())


def _read_pop(conn: Connection, hit_len: int) -> bytes | None:
    return resp.pop_item(resp.read_reply(conn))
