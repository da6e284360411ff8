"""The requests a client can make, independent of the wire protocol that carried them.

Each protocol codec turns bytes into these objects; the connection actor acts on them. They
are plain value objects with ``__slots__`` (the hot path makes one per request).
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

__all__ = [
    "Bad",
    "Confirm",
    "Delete",
    "DumpConfig",
    "DumpStats",
    "Flush",
    "FlushAll",
    "FlushAllExpired",
    "FlushExpired",
    "Get",
    "Monitor",
    "Quit",
    "Reload",
    "Set",
    "Shutdown",
    "Stats",
    "Status",
    "Version",
]


_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    """A command's attributes: ``__slots__`` up its classes when interpreted; a compiled class
    keeps no ``__slots__`` but lists its attributes (its bases' included) in ``__mypyc_attrs__``."""
    fields = _FIELDS.get(cls)
    if fields is None:
        compiled: tuple[str, ...] = tuple(getattr(cls, "__mypyc_attrs__", ()))
        slots = [name for klass in reversed(cls.__mro__) for name in klass.__dict__.get("__slots__", ())]
        fields = _FIELDS[cls] = compiled + tuple(name for name in slots if name not in compiled)
    return fields


@mypyc_attr(allow_interpreted_subclasses=True)
class _Command:
    """Base of every command; the text and thrift codecs (interpreted) subclass it."""

    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _fields(type(self)))
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, name) == getattr(other, name) for name in _fields(type(self))
        )


class Bad(_Command):
    """A request that gets an error: ``reply`` (``None`` for none at all), then maybe a close."""

    __slots__ = ("reply", "close")

    def __init__(self, reply: bytes | None, close: bool) -> None:
        self.reply = reply
        self.close = close


class Get(_Command):
    """``get q[/t=ms][/open][/close][/abort][/peek][/stamp]``; ``timeout_ms`` is ``None`` for no
    wait. ``stamp`` (ours, not Kestrel's) puts the item's enqueue time on its ``VALUE`` line."""

    __slots__ = ("queue", "timeout_ms", "open", "close", "abort", "peek", "stamp")

    def __init__(
        self,
        queue: str,
        timeout_ms: int | None = None,
        open: bool = False,  # noqa: A002
        close: bool = False,
        abort: bool = False,
        peek: bool = False,
        stamp: bool = False,
    ) -> None:
        self.queue = queue
        self.timeout_ms = timeout_ms
        self.open = open
        self.close = close
        self.abort = abort
        self.peek = peek
        self.stamp = stamp


class Set(_Command):
    """Add ``data`` to ``queue``; ``exptime`` is the raw memcache expiry (0 = never)."""

    __slots__ = ("queue", "exptime", "data")

    def __init__(self, queue: str, exptime: int, data: bytes) -> None:
        self.queue = queue
        self.exptime = exptime
        self.data = data


class _QueueCommand(_Command):
    __slots__ = ("queue",)

    def __init__(self, queue: str) -> None:
        self.queue = queue


class Delete(_QueueCommand):
    __slots__ = ()


class Flush(_QueueCommand):
    __slots__ = ()


class FlushExpired(_QueueCommand):
    __slots__ = ()


class Monitor(_Command):
    """Open up to ``max_items`` items (``None``: the server default) for ``seconds``;
    ``stamp`` (ours, not Kestrel's) puts each item's enqueue time on its ``VALUE`` line."""

    __slots__ = ("queue", "seconds", "max_items", "stamp")

    def __init__(self, queue: str, seconds: int, max_items: int | None, stamp: bool = False) -> None:
        self.queue = queue
        self.seconds = seconds
        self.max_items = max_items
        self.stamp = stamp


class Confirm(_Command):
    __slots__ = ("queue", "count")

    def __init__(self, queue: str, count: int) -> None:
        self.queue = queue
        self.count = count


class DumpStats(_Command):
    __slots__ = ("names",)

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names


class Status(_Command):
    """``status`` (``name is None``: query) or ``status <name>`` with a lower-cased name."""

    __slots__ = ("name",)

    def __init__(self, name: str | None) -> None:
        self.name = name


class _Bare(_Command):
    __slots__ = ()


class FlushAll(_Bare):
    __slots__ = ()


class FlushAllExpired(_Bare):
    __slots__ = ()


class Stats(_Bare):
    __slots__ = ()


class Version(_Bare):
    __slots__ = ()


class Shutdown(_Bare):
    __slots__ = ()


class Reload(_Bare):
    __slots__ = ()


class DumpConfig(_Bare):
    __slots__ = ()


class Quit(_Bare):
    __slots__ = ()
