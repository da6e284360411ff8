"""What a protocol handler gives the session: commands to operations, results to bytes.

A handler is composed into one :class:`~._actor.SessionActor` (``handler_class(session)``)
and keeps the protocol's own rules; the session keeps the state. Adding a protocol is adding
one more handler beside ``_memcache`` and ``_text``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr

from .. import protocol as p

__all__ = ["Handler"]


@mypyc_attr(allow_interpreted_subclasses=True)  # the text and thrift handlers are interpreted
class Handler:
    """The base of every protocol handler.

    A class, not a ``Protocol``: the session calls its handler's methods for every request,
    and through a compiled base class those calls go by mypyc's method table, where a
    ``Protocol``'s are generic lookups by name (ADR 0015).
    """

    QUEUE_KINDS: ClassVar[frozenset[type]] = frozenset()
    """Commands that run as operations on one queue."""
    MONITOR_END: ClassVar[bytes] = b""
    """What ends a monitor stream."""
    QUIT: ClassVar[type] = type(None)
    """The command that ends the session."""
    WRITE_REFUSALS: ClassVar[dict[type, p.Bad]] = {}
    ANSWERS_AFTER_FIN: ClassVar[bool] = True
    """A client's FIN ends its input, not its session: what it sent before is answered
    (behaviour §1). ``False``: a FIN is a hang-up."""
    """Writes refused while the server blocks writes, and how (checked before a lookup)."""

    def __init__(self, session: Any) -> None:
        pass  # ``session`` is the SessionActor the handler is composed into

    def local(self, command: Any) -> None:
        """Handle a command that is not an operation on one queue."""
        raise NotImplementedError

    def goes_to_queue(self, command: Any) -> bool:
        """Whether a command of a ``QUEUE_KINDS`` type needs its queue at all."""
        raise NotImplementedError

    def creates(self, command: Any) -> bool:
        """Whether a request creates a missing queue (behaviour §5.2)."""
        raise NotImplementedError

    def compile(self, command: Any, ops: list[Any]) -> tuple[p.Bad | None, bool]:
        """Append ``command``'s operations to ``ops``; return a preset reply (an error that
        replaces the normal one, maybe closing) and whether the batch must end after it."""
        raise NotImplementedError

    def reply(self, command: Any, results: list[Any]) -> bytes:
        """The reply to ``command`` given its operations' results (changes no state)."""
        raise NotImplementedError

    def missing_queue_reply(self, command: Any, opened: deque[int] | None) -> bytes:
        """The reply to a request on a queue that does not exist and is not created."""
        raise NotImplementedError

    def item_reply(self, queue: str, data: bytes) -> bytes:
        """One item of a monitor stream."""
        raise NotImplementedError

    def server_error_reply(self, message: str) -> bytes:
        """The reply to a request the server could not carry out (a full disk)."""
        raise NotImplementedError

    def failed_reply(self, command: Any, message: str) -> bytes:
        """The reply to ``command`` whose confirm or removing fetch a journal could not make
        durable (behaviour §1): the protocol's server error."""
        return self.server_error_reply(message)

    def alias_request(self, command: Any, resolved: Any) -> None:
        """A request on an alias (behaviour §5.10)."""
        raise NotImplementedError

    def answered(self, tag: Any, value: Any) -> None:
        """An answer the session waited for (``Answer``), other than a lookup."""
        raise NotImplementedError

    def release(self) -> None:
        """The client has gone: give back what the handler holds that the session does not
        (items a thrift get fetched but has not answered yet)."""
        raise NotImplementedError
