"""What a protocol handler gives the session: commands to operations, results to bytes.

A handler is composed into one :class:`~._actor.SessionActor` (``handler_class(session)``)
and keeps the protocol's own rules; the session keeps the state. Adding a protocol is adding
one more handler beside ``_memcache`` and ``_text``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar, Protocol

from .. import protocol as p

__all__ = ["Handler", "write_refusal"]


class Handler(Protocol):
    QUEUE_KINDS: ClassVar[frozenset[type]]
    """Commands that run as operations on one queue."""
    MONITOR_END: ClassVar[bytes]
    """What ends a monitor stream."""
    QUIT: ClassVar[type]
    """The command that ends the session."""
    WRITE_REFUSALS: ClassVar[dict[type, p.Bad]]
    """Writes refused while the server blocks writes, and how (checked before a lookup)."""

    def __init__(self, session: Any) -> None: ...

    def local(self, command: Any) -> None:
        """Handle a command that is not an operation on one queue."""

    def goes_to_queue(self, command: Any) -> bool:
        """Whether a command of a ``QUEUE_KINDS`` type needs its queue at all."""

    def creates(self, command: Any) -> bool:
        """Whether a request creates a missing queue (behaviour §5.2)."""

    def compile(self, command: Any, ops: list[Any]) -> tuple[p.Bad | None, bool]:
        """Append ``command``'s operations to ``ops``; return a preset reply (an error that
        replaces the normal one, maybe closing) and whether the batch must end after it."""

    def reply(self, command: Any, results: list[Any]) -> bytes:
        """The reply to ``command`` given its operations' results (changes no state)."""

    def missing_queue_reply(self, command: Any, opened: deque[int] | None) -> bytes:
        """The reply to a request on a queue that does not exist and is not created."""

    def item_reply(self, queue: str, data: bytes) -> bytes:
        """One item of a monitor stream."""

    def server_error_reply(self, message: str) -> bytes:
        """The reply to a request the server could not carry out (a full disk)."""

    def alias_request(self, command: Any, resolved: Any) -> None:
        """A request on an alias (behaviour §5.10)."""

    def answered(self, tag: Any, value: Any) -> None:
        """An answer the session waited for (``Answer``), other than a lookup."""

    def release(self) -> None:
        """The client has gone: give back what the handler holds that the session does not
        (items a thrift get fetched but has not answered yet)."""


def write_refusal(session: Any, command: Any) -> p.Bad | None:
    """The handler's ``WRITE_REFUSALS`` entry for ``command`` if the server blocks writes
    now, else ``None``. The session asks before its queue lookup (for the head request) and
    again for each request it compiles into a batch (a SET pipelined behind a GET under
    ReadOnly); handlers never check it themselves."""
    refusal: p.Bad | None = session.write_refusals.get(type(command))
    if refusal is not None and not session.context.writes_allowed(session.session):
        return refusal
    return None
