"""The contract between a session and its protocol handler, in both directions.

:class:`Handler` is what the session calls on a handler: commands to operations, results to
bytes. :class:`HandlerSession` is what a handler may call on its session: it reads the
session's state and changes it only through these verbs. A handler is composed into one
:class:`~._actor.SessionActor` (``handler_class(session)``) and keeps the protocol's own rules;
the session keeps the state. Adding a protocol is adding one more handler beside ``_memcache``
and ``_text``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from mypy_extensions import mypyc_attr

from .. import protocol as p

if TYPE_CHECKING:
    from ..messages import Add, ForAllKind, Session, XidRun
    from ..runtime import GeventRef
    from ._context import SessionContext
    from ._opened import OpenXids

__all__ = ["Answer", "Handler", "HandlerSession", "ReplyTarget"]


class Answer(enum.Enum):
    """What the session waits for; the tag of an answer from the collection or the server."""

    BATCH = "batch"
    MORE = "more"
    """A batch answered in parts: the rest is asked for once the client has taken these."""
    RESOLVE = "resolve"
    DELETE = "delete"
    STATS = "stats"
    DUMP_STATS = "dump_stats"
    DUMP_CONFIG = "dump_config"
    FLUSH_ALL = "flush_all"
    FLUSH_ALL_EXPIRED = "flush_all_expired"
    RELOAD = "reload"
    ALIAS_SET = "alias_set"
    ALIAS_PUT = "alias_put"
    CLOSE_READS = "close_reads"
    """Thrift's confirm or abort, answered once every queue concerned has journaled it."""


class ReplyTarget(Protocol):
    """Where an answer the session waits for is told (the session's own tagged reply-to)."""

    def tell(self, value: Any) -> None: ...


class HandlerSession(Protocol):
    """What a handler may ask of the session it is composed into (``SessionActor`` is one).

    The attributes are read only; every change to the session is one of the methods. The
    memcache handler holds its session as the ``SessionActor`` itself, so that the compiled
    build calls these methods natively (ADR 0015).
    """

    @property
    def context(self) -> SessionContext:
        """What the session may ask of the server."""

    @property
    def session(self) -> Session:
        """The connection's record (its status checks take it)."""

    @property
    def refs(self) -> Mapping[str, GeventRef]:
        """The queue actors this session has looked up, by name."""

    def send_reply(self, data: bytes) -> None:
        """One reply's bytes, sent after every reply before it."""

    def end_session(self) -> None:
        """Run no request after this one: the connection closes once the replies are sent."""

    def refuse_silently(self) -> None:
        """Kestrel's refusal by exception: drop the requests not yet run, close with no reply."""

    def refuse_now(self, reply: bytes) -> None:
        """Drop the requests not yet run, send ``reply``, close."""

    def not_implemented(self, _command: Any) -> None:
        """A command this server does not implement: ``CLIENT_ERROR``, and the connection closes."""

    def open_count(self, queue: str) -> int:
        """How many ids this connection holds open on ``queue``."""

    def take_open(self, queue: str, count: int) -> list[XidRun] | None:
        """The ``count`` oldest ids open on ``queue``, taken, if that many are; else ``None``."""

    def take_all_open(self, queue: str) -> list[XidRun]:
        """Every id open on ``queue``, oldest first, taken."""

    def run_next(self, command: Any) -> None:
        """Put ``command`` at the head of the requests not yet run."""

    def add_op(self, data: bytes, expiry: int) -> Add:
        """An ``Add`` of ``data`` expiring at ``expiry`` for the batch being compiled."""

    def reply_to(self, tag: Answer) -> ReplyTarget:
        """Wait for an answer tagged ``tag``: the ``reply_to`` to hand whoever gives it."""

    def ask_all(self, kind: ForAllKind, tag: Answer, names: tuple[str, ...] | None = None) -> None:
        """Ask the collection for something of every queue; the answer comes tagged ``tag``."""

    def delete_queue(self, name: str) -> None:
        """Delete a queue; the answer comes tagged ``Answer.DELETE``."""

    def reload(self) -> None:
        """Reload the config; the answer comes tagged ``Answer.RELOAD``."""

    def shutdown(self) -> None:
        """Shut the server down."""

    def fetch(self, kind: type, timeout_ms: int | None, ops: list[Any]) -> bool:
        """Append a fetch to ``ops`` and count it; whether it may wait."""

    def count_fetch(self, peek: bool) -> None:
        """Count a fetch that reaches no queue (an alias's)."""

    def start_monitor(self, queue: str, deadline: float, remaining: int, limit: int,
                      stamped: bool = False) -> None:
        """Stream ``queue``'s items until ``deadline`` (at most ``remaining``, ``limit`` open),
        each with its enqueue time if ``stamped``."""

    def tell_queue(self, name: str, op: Any) -> None:
        """Send one operation whose answer nobody waits for."""


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

    def __init__(self, session: HandlerSession) -> None:
        pass  # ``session`` is the SessionActor the handler is composed into

    def local(self, command: Any) -> None:
        """Handle a command that is not an operation on one queue."""
        raise NotImplementedError

    def goes_to_queue(self, command: Any) -> bool:
        """Whether a command of a ``QUEUE_KINDS`` type needs its queue at all."""
        raise NotImplementedError

    def queue_of(self, command: Any) -> str:
        """The queue a command of a ``QUEUE_KINDS`` type names (its ``queue``). A handler may
        read it from its own command classes natively; here it is a lookup by name."""
        name: str = command.queue
        return name

    def joins(self, command: Any, queue: str) -> bool:
        """Whether ``command``, pending behind a request for ``queue`` in the batch being
        compiled, joins that batch: an operation on ``queue`` too. A handler may answer it
        from its own command classes (a field read natively, no lookup by name)."""
        return type(command) in self.QUEUE_KINDS and command.queue == queue and self.goes_to_queue(command)

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

    def add_reply(self, command: Any, results: list[Any], start: int, end: int, out: list[bytes]) -> None:
        """Append the reply to ``command``, whose operations' results are ``results[start:end]``,
        to ``out``, which goes to the client as one stream of bytes: :meth:`reply` whole, or its
        parts unjoined (a handler whose replies carry an item's data). The results of a batch's
        commands are not sliced apart first: a list per request."""
        # a batch of one command (the usual case) is answered by every result: no copy
        whole = start == 0 and end == len(results)
        out.append(self.reply(command, results if whole else results[start:end]))

    def lone_reply(self, command: Any, results: list[Any]) -> bytes | None:
        """The reply to ``command``, the one request of its batch (``results`` all its own), when
        :meth:`add_reply` would make it one ``bytes`` (the session sends it through no list), else
        ``None``: the session asks :meth:`add_reply`."""
        return self.reply(command, results)

    def repeats(self, command: Any) -> bool:
        """Whether ``command`` (compiled with no preset reply into one operation that neither
        waits nor opens) compiles the same way again if the same object follows it in a batch: its
        repeats then join the batch as its operation and entry again, uncompiled, and are
        counted with :meth:`repeated` and answered with :meth:`add_replies`. A decoder hands a
        repeated request line over as one object (a pipelined burst of ``get q``)."""
        return False

    def repeated(self, command: Any, count: int) -> None:
        """``command`` joined a batch ``count`` times more as its repeats (:meth:`repeats`):
        count them as its compile counts it."""

    def add_replies(self, command: Any, results: list[Any], start: int, end: int, out: list[bytes]) -> None:
        """:meth:`add_reply` for each of a run of repeats of ``command`` (:meth:`repeats`),
        one operation each, whose results are ``results[start:end]``."""
        for index in range(start, end):
            self.add_reply(command, results, index, index + 1, out)

    def missing_queue_reply(self, command: Any, opened: OpenXids | None) -> bytes:
        """The reply to a request on a queue that does not exist and is not created."""
        raise NotImplementedError

    def item_reply(self, queue: str, data: bytes) -> bytes:
        """One item of a monitor stream."""
        raise NotImplementedError

    def stamped_item_reply(self, queue: str, item: Any) -> bytes:
        """One item of a monitor stream that asked for enqueue times (only memcache's can)."""
        raise NotImplementedError

    def add_item_replies(self, queue: str, items: list[Any], stamped: bool, out: list[bytes]) -> None:
        """Append the replies of a monitor stream's ``items`` to ``out``, which goes to the
        client as one stream of bytes: whole replies, or each reply's parts unjoined."""
        if stamped:
            for item in items:
                out.append(self.stamped_item_reply(queue, item))
        else:
            for item in items:
                out.append(self.item_reply(queue, item.data))

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
