"""The requests of Kestrel's text protocol (port 2222), as the text codec emits them.

They are separate classes from the memcache ones because their semantics and replies differ:
every text fetch is transactional and first confirms what the connection holds open on the
queue, ``put`` carries several items and an expiry in milliseconds *relative to now*, and every
reply is a ``+n`` / ``-message`` / ``:data`` / ``*`` line (behaviour §3). Errors found while
parsing are plain :class:`~._commands.Bad` commands, as for memcache.
"""

from __future__ import annotations

from ._commands import _Command

__all__ = [
    "TextConfirm",
    "TextDelete",
    "TextFlush",
    "TextGet",
    "TextMonitor",
    "TextPut",
    "TextQuit",
    "TextShutdown",
    "TextStatus",
    "TextVersion",
    "text_expiry",
]


class TextPut(_Command):
    """``put <queue> [expiry_ms]:`` + item lines: add each item the way SET adds one.

    ``expiry_ms`` is milliseconds **relative to now**: ``None`` (omitted) never expires, ``0``
    expires at once (Kestrel's quirk, unlike memcache), negatives are already expired. Convert
    it with :func:`text_expiry`. ``items`` may be empty (``put q`` without a colon, or an empty
    block): then nothing is added, no status check runs, and the reply is ``+0``.
    """

    __slots__ = ("queue", "expiry_ms", "items")

    def __init__(self, queue: str, expiry_ms: int | None, items: tuple[bytes, ...]) -> None:
        self.queue = queue
        self.expiry_ms = expiry_ms
        self.items = items


class TextGet(_Command):
    """``get <queue> [timeout_ms]`` or ``peek <queue> [timeout_ms]``.

    Both first confirm every item this connection holds open on ``queue``; then ``get`` opens
    the head item (always transactional) and ``peek`` returns it without removing it.
    ``timeout_ms`` is ``None`` when the request must not wait (omitted, ``0`` or negative).
    """

    __slots__ = ("queue", "timeout_ms", "peek")

    def __init__(self, queue: str, timeout_ms: int | None = None, peek: bool = False) -> None:
        self.queue = queue
        self.timeout_ms = timeout_ms
        self.peek = peek


class TextMonitor(_Command):
    """``monitor <queue> <timeout_ms>``: confirm open items, then stream opened items.

    The stream stops after ``maxOpenTransactions`` items or at ``now + timeout_ms`` (a value
    ``<= 0`` ends it at once) and always ends with ``*``.
    """

    __slots__ = ("queue", "timeout_ms")

    def __init__(self, queue: str, timeout_ms: int) -> None:
        self.queue = queue
        self.timeout_ms = timeout_ms


class TextConfirm(_Command):
    """``confirm <queue> <count>``: confirm the ``count`` oldest open items, or none at all."""

    __slots__ = ("queue", "count")

    def __init__(self, queue: str, count: int) -> None:
        self.queue = queue
        self.count = count


class TextFlush(_Command):
    """``flush <queue>``: reply ``+0`` (a write: blocked by ReadOnly/Quiescent as ``flush``)."""

    __slots__ = ("queue",)

    def __init__(self, queue: str) -> None:
        self.queue = queue


class TextDelete(_Command):
    """``delete <queue>``: reply ``+0`` (a write: blocked by ReadOnly/Quiescent as ``delete``)."""

    __slots__ = ("queue",)

    def __init__(self, queue: str) -> None:
        self.queue = queue


class TextStatus(_Command):
    """``status`` (``name is None``: reply ``:UP`` etc.) or ``status <name>`` (reply ``+0``).

    ``name`` is lower-cased and always one of ``up``, ``readonly``, ``writeavoid``,
    ``quiescent``; the codec answers unknown names and ``down`` itself.
    """

    __slots__ = ("name",)

    def __init__(self, name: str | None) -> None:
        self.name = name


class TextVersion(_Command):
    """``version``: reply ``:<version>``."""

    __slots__ = ()


class TextShutdown(_Command):
    """``shutdown``: reply ``+0``, then shut the server down (the connection is not closed)."""

    __slots__ = ()


class TextQuit(_Command):
    """``quit``: close the connection. Kestrel queues a ``+0`` that may or may not arrive;
    closing without a reply is the faithful choice."""

    __slots__ = ()


def text_expiry(expiry_ms: int | None, now_ms: int) -> int | None:
    """The absolute expiry (epoch ms, ``None`` = never) of a text ``put`` made at ``now_ms``.

    ``0`` gives ``now_ms``: the item is expired as soon as the clock moves on (expiry is
    ``expiry < now``, strictly). The result is at least 1 because 0 means "no expiry" in the
    journal.
    """
    if expiry_ms is None:
        return None
    return max(1, now_ms + expiry_ms)
