"""The protocol-neutral session of one client: the request loop and its bookkeeping.

A transport hands decoded commands in as :class:`Received`. The actor answers them strictly in
order: consecutive requests for one queue travel to that queue's actor as one
:class:`QueueBatch`, and the next batch leaves only when the previous one is answered, so
pipelined requests are answered in order, as Kestrel does. The session keeps its open
(tentative) reads per queue, its wait for an answer, its monitor stream; when the client goes,
its waits are cancelled first and then every open read goes back to the head of its queue.
When its input ends (:class:`EndOfInput`, a half-close), its waits end at once with a miss,
every request read before is answered, and then the session finishes as on a hang-up.
An item that reaches the session after its client has gone, or whose reply could not be sent,
goes back too: an open one as an abort, a plain GET's with ``PutBack``. This is Kestrel's
``KestrelHandler``.

Output is bounded: a queue answers a batch in parts once its fetches took
``BATCH_FETCH_BYTES`` (``actors/_session_queue``), and the session asks for the rest only once
the transport is no longer backed up (it is as soon as a reply waits unsent), so a client that
pipelines fetches and never reads holds about one part's replies (see docs/operations.md,
"Limits per connection").
A handler that raises closes its connection (logged), as a hang-up would.

What a command means and how its reply looks is the protocol's: the session is composed with
one protocol handler (``_memcache.MemcacheHandler``, ``_text.TextHandler``), which turns
commands into queue operations and results into bytes through ``protocol/``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Final, cast

import structlog
from pykka import ActorDeadError

from .. import protocol as p
from .._clock import epoch_seconds
from ..messages import (
    IGNORE,
    Add,
    BatchDone,
    CancelWaits,
    Delete,
    ForAll,
    ForAllKind,
    JournalFailure,
    Open,
    OpenMany,
    Peek,
    PutBack,
    QueueBatch,
    Remove,
    RemoveMany,
    Resolve,
    Resolved,
    Session,
    Unremove,
    XidRun,
    closed_result,
    failed_result,
)
from ..queue import Item
from ..runtime import CountedDeque, GeventActor, GeventRef
from ..stats import QueueMetrics, record_batch
from ._context import Reload, SessionContext, Shutdown
from ._handler import Answer, Handler
from ._opened import OpenXids
from ._transport import Transport

__all__ = ["Answer", "Disconnected", "Drain", "EndOfInput", "MonitorState", "Received", "SessionActor"]

log = structlog.get_logger("kestrel_actors.connection")

MAX_BATCH: Final = 256
JOIN_BELOW: Final = 64 * 1024
"""A flush of several replies is joined into one write below this many bytes; from it on the
transport writes them as they are (a megabyte joined cost a mapping and its page faults:
issue 53)."""
LONE_PARTS: Final = 3
LONE_WRITEV_FROM: Final = 8 * 1024
"""A flush of at most ``LONE_PARTS`` parts (a lone GET hit's header, data and ``END``) of at least
this many bytes is written as its parts with one ``writev``, not joined. Below it joining costs
less: a ``writev`` of three buffers saves the copy and about 570 user-space instructions, but
costs the kernel more than a ``write`` of one (0.1-0.2 µs more CPU per reply of 1 KiB, about the
same at 2-4 KiB, 0.1 µs less at 8 KiB; ADR 0020)."""
_NO_OPS: Final[list[Any]] = []
"""``batch_ops`` between batches (never changed): a session keeps no operation, and so no
item's bytes, after its batch is answered."""
_NO_DATA: Final = b""
"""A spare ``Add``'s data (``SessionActor.spare_add``): its item's bytes are let go."""
_NO_ENTRIES: Final[list[tuple[Any, int, p.Bad | None, bool]]] = []
"""``batch`` between batches (never changed: each batch gets a list of its own)."""

_REMOVE_NOW: Final = Remove(None)
_OPEN_NOW: Final = Open(None)
_PEEK_NOW: Final = Peek(None)

_monotonic: Final = time.monotonic  # read through a C static, not the module (ADR 0015)


Received = list
"""Commands the transport decoded, in order: the decoder's list itself, told as it is (a record
around it was one more object per read). No other message to a session is a list."""


class Disconnected:
    """The client hung up (or the socket failed): finish the session."""

    __slots__ = ()


class EndOfInput:
    """The client sent its last request (a FIN): answer what it sent, then finish (behaviour §1).

    ``final``: every request before the FIN has been handed over (the transport read it).
    Otherwise the FIN was seen while reading was paused: the waits end now, and the requests
    still unread come first, then a final one."""

    __slots__ = ("final",)

    def __init__(self, final: bool) -> None:
        self.final = final


class Drain:
    """The server is shutting down: answer the request in flight (a blocking read ends now,
    with a miss), take no other, then close as a hang-up does (Kestrel's drain, behaviour
    §7.4). The queues close only after this, so every answer a client got is on disk."""

    __slots__ = ()


# Enum members as Final module names: ``Answer.BATCH`` costs an enum class lookup on every
# request, a Final name a read of a C static in the compiled build (a global in the pure one).
_BATCH: Final = Answer.BATCH
_MORE: Final = Answer.MORE
_RESOLVE: Final = Answer.RESOLVE


@dataclass(slots=True, eq=False)
class _Answered:
    """An answer the session waited for, as a message to itself."""

    tag: Answer
    value: Any


class _ReplyTo:
    """Turns a collection or gather answer into an :class:`_Answered` message to this actor."""

    __slots__ = ("ref", "tag")

    def __init__(self, ref: Any, tag: Answer) -> None:
        self.ref = ref
        self.tag = tag

    def tell(self, value: Any) -> None:
        try:
            self.ref.tell(_Answered(self.tag, value))
        except ActorDeadError:
            pass


@dataclass(slots=True, eq=False)
class MonitorState:
    """A monitor stream in progress: which queue, until when, how many items are still due."""

    queue: str
    deadline: float
    remaining: int
    limit: int
    """At most this many reads open on the queue at once."""
    stamped: bool = False
    """Each item's reply carries its enqueue time (memcache's ``stamp`` option)."""


class _MonitorResume:
    """A placeholder at the head of ``pending``: continue the monitor once the queue resolves."""

    __slots__ = ()
    queue: ClassVar[None] = None


_MONITOR_RESUME: Final = _MonitorResume()

_NO_HANDLER: Final = Handler(cast(Any, None))
"""A stopped session's handler: none (the base class, which holds nothing)."""


class SessionActor(GeventActor):
    """One client's session: request order, open reads, waits, monitor streams, hang-up."""

    inline_dispatch: ClassVar[bool] = True
    """An idle session's messages (reads from the transport, a queue's answers) run on the
    sender's greenlet: its handlers never wait (replies go to the transport's buffer)."""

    greenlet_on_demand: ClassVar[bool] = True
    """One session per connection, and most never need a greenlet of their own (no on_start)."""

    hot_messages: ClassVar[tuple[type, ...]] = (list, BatchDone)  # (Received, a queue's answer)

    def may_run_on_hub(self) -> bool:
        # never suspends: what it asks of queues or the collection is a tell, and each of those
        # decides for itself whether it may run on the hub
        return True

    def __init__(self, context: SessionContext, transport: Transport, session: Session,
                 handler_class: type[Handler]) -> None:
        super().__init__()
        self.context = context
        self.transport = transport
        self.session = session
        self.handler = handler = handler_class(self)
        self.queue_kinds = handler.QUEUE_KINDS
        self.queue_kind: type | None = None
        """The kind of the last request found in ``queue_kinds``."""
        self.write_refusals = handler.WRITE_REFUSALS
        self.open_reads: dict[str, OpenXids] = {}
        self.refs: dict[str, GeventRef] = {}
        self.pending = CountedDeque()
        self.out: list[bytes] = []
        self.waiting: Answer | None = None
        self.batch: list[tuple[Any, int, p.Bad | None, bool]] = _NO_ENTRIES
        """The batch in flight: per command, its operation count, preset reply, and whether
        its last operation opens an item (empty for a batch of one request: :attr:`lone`)."""
        self.lone: Any = None
        """The one request of the batch in flight when it holds one and no preset reply (the
        usual case): every operation is its own, so it needs no entry, nor a list of them."""
        self.batch_ops: list[Any] = _NO_OPS
        """The operations of the batch in flight (or of its unanswered rest): a SET's carries
        its item's bytes, so it is let go as soon as the batch is answered (issue 53)."""
        self.batch_results: list[Any] | None = None
        """Results of a batch the queue answered in parts, kept until the rest comes."""
        self.batch_failure: JournalFailure | None = None
        """The ``failure`` of the parts of that batch answered so far."""
        self.batch_queue = ""
        self.sent: QueueBatch | None = None
        """The batch awaiting its answer (its ``sent_at``, in a read's callback when the request
        was read, starts its latency)."""
        self.spare: QueueBatch | None = None
        """The last batch, answered: nothing else holds it once it is (a queue lets go of a
        batch before it answers it), and the next one is it, refilled, not made again."""
        self.spare_ops: list[Any] | None = None
        """The operations' list of the last batch of one SET, answered and emptied: the next
        batch's, not made again (held by nobody as its ``Add`` is: ``spare_add``)."""
        self.spare_add: Add | None = None
        """The operation of the last batch of one SET, answered, with its data let go: the next
        SET's, refilled (:meth:`add_op`), not made again."""
        self.last_queue: str | None = None
        self.last_ref: GeventRef | None = None
        self.last_metrics: QueueMetrics | None = None
        """The queue of the last batch, its actor as ``refs`` had it and its metrics then: a
        client's next request names it again, mostly as the very same string (a decoder's
        repeated line), which is then not looked up by its hash. A deleted queue's actor is
        dead: it is looked up again (its metrics were merged into the retired ones as it was
        deleted: what is recorded in them after is not counted, as it is not recorded at all
        when they are looked up by name)."""
        self.missing: str | None = None
        self.monitor: MonitorState | None = None
        self.closing = False
        self.draining = False
        """The server is shutting down: open reads stay open, for the next start to back out."""
        self.hung_up = False
        self.finished = False
        self.input_ended = False
        """The client's last request has been handed over: finish once all are answered."""

    @property
    def log(self) -> Any:
        """This session's logger (bound on use: most sessions never log)."""
        return log.bind(connection=self.session.id, peer=self.session.peer)

    def on_receive(self, message: Any) -> Any:
        # type(message) tested on the message itself, not a local: that narrows its type, so
        # the compiled build reads the record's fields natively
        if type(message) is list:  # Received
            if len(message) != 1:
                self.pending.extend(message)
                self._pump(None)
            elif not self.pending.count:  # one request, none before it (the usual case)
                self._pump(message[0])
            else:  # (deque.extend costs an iterator)
                self.pending.append(message[0])
                self._pump(None)
        elif type(message) is BatchDone:
            self._batch_done(message)
            # read: its items' bytes go (issue 53), and the spare batch's next answer is it
            ops = message.ops
            message.ops = None
            if ops is not None and len(ops) == 1 and type(ops[0]) is Add:
                # a lone SET's: nothing else holds its Add now (see ``add_op``)
                op: Add = ops[0]
                op.data = _NO_DATA
                self.spare_add = op
                ops.clear()  # nor its list, held as the Add is: the next batch's (``spare_ops``)
                self.spare_ops = ops
                # its one result (no item) stays: the queue puts the next SET's in its place
                # (QueueActor._run_lone_add)
            else:
                message.results = _NO_OPS
            self._pump(None)
        elif type(message) is _Answered:
            self._answered(message)
            self._pump(None)
        elif type(message) is Disconnected:
            self._hang_up()
        elif type(message) is EndOfInput:
            self._input_end(message.final)
        elif type(message) is Drain:
            self._wind_down()
        else:
            return super().on_receive(message)
        return None

    def _pump(self, first: Any) -> None:
        """Run the requests not yet run, in order, while nothing is awaited. ``first``: a
        request just read, with none in ``pending`` before it, or ``None``: a lone request
        (nearly every one) is run without passing through the deque."""
        pending = self.pending
        transport = self.transport
        if self.waiting is _MORE:
            if self.closing:  # draining: the rest was never run, and is not answered
                self._drop_rest()
            elif not transport.backed_up:
                self._send_rest()
        while self.waiting is None and not self.closing and not transport.backed_up:
            # each request is taken off first and put back if it must wait: a deque has no
            # native index, and a look at ``pending[0]`` was a generic read per request
            if first is not None:
                command = first
                first = None
            elif pending.count:
                command = pending.popleft()
            else:
                break
            kind = type(command)
            refusal = self._write_refusal(command)
            if refusal is not None:
                # checked before the queue is looked up: a missing queue is refused alike
                pending.clear()
                self._local(refusal)
                break
            if kind is not self.queue_kind and kind in self.queue_kinds:
                self.queue_kind = kind  # a client's requests are mostly of one kind: no look-up for its next
            if kind is self.queue_kind and self.handler.goes_to_queue(command):
                if not self._start_batch(command):
                    pending.appendleft(command)  # at the head until its queue's lookup answers
                    break
                continue
            self._local(command)
        if first is not None:  # not run yet (the session waits or is backed up): it waits first
            pending.append(first)
        if self.out:  # asked here: twice per lone request, nothing is out (its reply went alone)
            self._flush()
        if self.closing and self.waiting is None:
            self._finish()
        elif not pending.count:
            if not self.input_ended:
                transport.resume()
            elif self.waiting is None:  # every request the client sent is answered
                self._finish()

    def _write_refusal(self, command: Any) -> p.Bad | None:
        """The handler's ``WRITE_REFUSALS`` entry for ``command`` if the server blocks writes
        now, else ``None``. Asked before the queue lookup (for the head request) and again for
        each request compiled into a batch (a SET pipelined behind a GET under ReadOnly);
        handlers never check it themselves."""
        if self.context.writes_allowed(self.session):
            return None  # asked first: nearly always, and then no look-up by the request's type
        return self.write_refusals.get(type(command))

    def _local(self, command: Any) -> None:
        kind = type(command)
        if kind is p.Bad:
            if command.reply is not None:
                self.out.append(command.reply)
            if command.close:
                self.closing = True
        elif kind is _MonitorResume:
            self._monitor_next()
        elif kind is self.handler.QUIT:
            self.closing = True
        else:
            self.handler.local(command)

    # -- what a handler may ask of its session (``_handler.HandlerSession``) ------------------

    def send_reply(self, data: bytes) -> None:
        """One reply's bytes, sent after every reply before it (at the end of this turn)."""
        self.out.append(data)

    def end_session(self) -> None:
        """Run no request after this one: the connection closes once the replies are sent."""
        self.closing = True

    def refuse_silently(self) -> None:
        """Kestrel's refusal by exception (Finagle closes the connection): drop the requests
        not yet run, and close with no reply."""
        self.pending.clear()
        self.closing = True

    def open_count(self, queue: str) -> int:
        """How many ids this connection holds open on ``queue``."""
        opened = self.open_reads.get(queue)
        return 0 if opened is None else opened.count

    def take_open(self, queue: str, count: int) -> list[XidRun] | None:
        """The ``count`` oldest ids open on ``queue``, no longer held open, if that many are;
        else ``None``, and none is taken."""
        opened = self.open_reads.get(queue)
        return None if opened is None else opened.take(count)

    def take_all_open(self, queue: str) -> list[XidRun]:
        """Every id open on ``queue``, oldest first, no longer held open."""
        opened = self.open_reads.get(queue)
        return [] if opened is None else opened.take_all()

    def run_next(self, command: Any) -> None:
        """Put ``command`` at the head of the requests not yet run (a thrift get's next step)."""
        self.pending.appendleft(command)

    def reply_to(self, tag: Answer) -> _ReplyTo:
        """Wait for an answer tagged ``tag``: the ``reply_to`` to hand whoever gives it."""
        self.waiting = tag
        return _ReplyTo(self.ref, tag)

    def ask_all(self, kind: ForAllKind, tag: Answer, names: tuple[str, ...] | None = None) -> None:
        self.context.collection.tell(ForAll(kind, self.reply_to(tag), names))

    def delete_queue(self, name: str) -> None:
        self.refs.pop(name, None)
        self.last_ref = None
        self.context.collection.tell(Delete(name, self.reply_to(Answer.DELETE)))

    def reload(self) -> None:
        # answered once the collection has told every queue, so that what this client
        # sends next reaches each queue after its new settings (actor inboxes are FIFO)
        self.context.control.tell(Reload(self.reply_to(Answer.RELOAD)))

    def shutdown(self) -> None:
        self.context.control.tell(Shutdown())

    def fetch(self, kind: type, timeout_ms: int | None, ops: list[Any]) -> bool:
        """Append a fetch (``Peek``, ``Open`` or ``Remove``) and count it (behaviour §7.3).

        Returns whether it may wait (a timeout was given).
        """
        stats = self.context.stats  # counted here, not by count_fetch: one call less per GET
        if kind is Peek:
            stats.cmd_peek += 1
        else:
            stats.cmd_get += 1
        if timeout_ms is None:
            # a fetch that does not wait: one shared operation (a queue only reads them), not
            # an object made and freed per GET
            ops.append(_REMOVE_NOW if kind is Remove else _OPEN_NOW if kind is Open else _PEEK_NOW)
            return False
        deadline = _monotonic() + timeout_ms / 1000.0
        # a plain GET's Remove made by a native call; through ``kind`` it parses arguments
        ops.append(Remove(deadline) if kind is Remove else kind(deadline))
        return True

    def add_op(self, data: bytes, expiry: int) -> Add:
        """An ``Add`` of ``data`` expiring at ``expiry``: the spare one (``spare_add``) if there is
        one. Answered, an ``Add`` is held by no one else: a queue keeps its data, not the
        operation, and its batch and answer let go of their operations (``_batch_done``,
        ``on_receive``)."""
        op = self.spare_add
        if op is None:
            return Add(data, expiry)
        self.spare_add = None
        op.data = data
        op.expiry = expiry
        return op

    def not_implemented(self, _command: Any) -> None:
        """A command this server does not implement: ``CLIENT_ERROR``, and the connection closes."""
        self.out.append(p.CLIENT_ERROR)
        self.closing = True

    def count_fetch(self, peek: bool) -> None:
        """Count a fetch in STATS (``cmd_peek`` or ``cmd_get``, behaviour §7.3), alias fetches too."""
        if peek:
            self.context.stats.cmd_peek += 1
        else:
            self.context.stats.cmd_get += 1

    def refuse_now(self, reply: bytes) -> None:
        self.pending.clear()
        self.out.append(reply)
        self.closing = True

    def start_monitor(self, queue: str, deadline: float, remaining: int, limit: int,
                      stamped: bool = False) -> None:
        self.context.stats.cmd_monitor += 1
        self.monitor = MonitorState(queue, deadline, remaining, limit, stamped)
        self._monitor_next()

    def tell_queue(self, name: str, op: Any) -> None:
        """Send one operation whose answer nobody waits for (a deleted queue ignores it)."""
        ref = self.refs.get(name)
        if ref is None:
            return
        try:
            ref.tell(QueueBatch([op], None, IGNORE))
        except ActorDeadError:
            pass

    # -- answers ----------------------------------------------------------------------------

    def _answered(self, answer: _Answered) -> None:
        self.waiting = None
        if answer.tag is _RESOLVE:
            self._resolved(answer.value)
        else:
            self.handler.answered(answer.tag, answer.value)

    def _resolved(self, resolved: Resolved) -> None:
        if not resolved.valid:
            self.log.info("illegal queue name", queue=resolved.name)
            self.pending.clear()
            self.closing = True
        elif resolved.ref is not None:
            self.refs[resolved.name] = resolved.ref
        elif resolved.error is not None:
            self.pending.popleft()  # the request (or a monitor's resume marker) is answered
            if self.monitor is not None:
                self.monitor = None
                self.out.append(self.handler.MONITOR_END)
            else:
                self.out.append(self.handler.server_error_reply(resolved.error))
        elif resolved.alias is not None and self.monitor is not None:
            self.pending.popleft()  # the monitor's resume marker: an alias has no items
            self.monitor = None
            self.out.append(self.handler.MONITOR_END)
        elif resolved.alias is not None:
            self.handler.alias_request(self.pending.popleft(), resolved)
        else:
            self.missing = resolved.name

    def _listed_queue(self, name: str) -> GeventRef | None:
        """The live queue ``name`` as the collection lists it for sessions (``SessionContext.queues``),
        kept in ``refs``; ``None``: ask the collection (:meth:`_resolve`). Most connections'
        first request names a queue that exists: no message to the collection and back."""
        ref: GeventRef | None = self.context.queues.get(name)
        if ref is None or not ref.is_alive():
            return None
        self.refs[name] = ref
        return ref

    def _resolve(self, name: str, create: bool) -> bool:
        """For a queue whose live actor this session does not hold: ``True`` if the
        collection answered that it does not exist, else ``False`` after asking it."""
        if self.missing == name:
            self.missing = None
            return True
        self.context.collection.tell(Resolve(name, create, self.reply_to(_RESOLVE)))
        return False

    # -- batches ------------------------------------------------------------------------------

    def _start_batch(self, first: Any) -> bool:
        """Compile ``first`` (taken off ``pending``) and the requests at the head of ``pending``
        that join it into one batch and send it; ``False``: ``first`` waits for its queue's
        lookup (the caller puts it back at the head)."""
        handler = self.handler
        name = handler.queue_of(first)
        ref = self.last_ref
        if name is not self.last_queue or ref is None or not ref.is_alive():
            ref = self.refs.get(name)
            if ref is None or not ref.is_alive():
                ref = self._listed_queue(name)
            self.last_queue = name
            self.last_ref = ref
            self.last_metrics = self.context.stats.queues.get(name)
        if ref is None:
            if not self._resolve(name, handler.creates(first)):
                return False  # asked: the batch starts once the answer comes
            self.out.append(handler.missing_queue_reply(first, self.open_reads.get(name)))
            return True
        ops = self.spare_ops
        if ops is None:
            ops = []
        else:
            self.spare_ops = None
        pending = self.pending
        preset, last = handler.compile(first, ops)  # _pump checked its write refusal
        if preset is None:
            if last or not pending.count or not handler.joins(pending.head(), name):
                self.lone = first  # a batch of one request: no entries (see ``lone``)
                entries = _NO_ENTRIES
            else:  # the next request joins: _compile_rest takes it without asking again
                entries = self._compile_rest(first, None, False, ops, name, True)
        else:
            entries = self._compile_rest(first, preset, last, ops, name, False)
        self.batch = entries
        self.batch_ops = ops
        self.batch_queue = name
        if not ops:
            self._batch_done(BatchDone([]))
            return True
        self.waiting = _BATCH
        # one clock reading for the batch: its requests' time in the queue and its latency's start
        sent = self.spare
        if sent is None:
            sent = QueueBatch(ops, self.session, self.ref, None, epoch_seconds())
        else:
            self.spare = None
            sent.ops = ops
            sent.sent_at = epoch_seconds()
        self.sent = sent
        try:
            ref.tell_from(sent, self.mailbox.runner)  # from this handler's greenlet
        except ActorDeadError:  # deleted between the check and now: it answers as closed
            self.sent = None
            self._batch_done(BatchDone([closed_result(op) for op in ops]))
        return True

    def _compile_rest(self, first: Any, preset: p.Bad | None, last: bool, ops: list[Any],
                      name: str, joining: bool) -> list[tuple[Any, int, p.Bad | None, bool]]:
        """The entries of a batch that does not hold ``first`` alone (compiled into ``ops``
        already): the requests for queue ``name`` that follow it join it. ``joining``: the
        head of ``pending`` is known to join (the caller asked).

        Each request is taken off ``pending`` before it is asked about, and put back if it
        does not join: one ``popleft`` per request, where a look at ``pending[0]`` first
        was two generic reads more (a deque has no native index)."""
        pending = self.pending
        handler = self.handler
        opens = bool(ops) and type(ops[-1]) is Open
        entries = [(first, len(ops), preset, opens)]
        if preset is not None and preset.close:
            pending.clear()
            return entries
        # the request last compiled, if the same object again compiles alike (handler.repeats):
        # a repeat joins as its operation and entry again, and is counted once per run
        # ``entries`` read as objects: the compiled build unboxes a tuple read from a list typed
        # as holding them, and a repeat's entry must be the very object it repeats
        # (``_batch_done`` answers a run of them at once)
        listed: list[Any] = entries
        repeat: Any = None
        repeat_op: Any = None
        repeat_entry: Any = None
        repeats = 0
        if preset is None and not last and len(ops) == 1 and not opens and handler.repeats(first):
            repeat = first
            repeat_op = ops[0]
            repeat_entry = listed[0]
        while not last and pending.count and len(entries) < MAX_BATCH:
            command = pending.popleft()
            if command is repeat:  # joins its queue, and was not refused (nor is its repeat)
                ops.append(repeat_op)
                listed.append(repeat_entry)
                repeats += 1
                joining = False
                continue
            if not joining and not handler.joins(command, name):
                pending.appendleft(command)
                break
            joining = False
            if repeats:
                handler.repeated(repeat, repeats)
                repeats = 0
            before = len(ops)
            # a request behind the head (a write after a read) is checked here, not by _pump
            refusal = self._write_refusal(command)
            if refusal is not None:
                preset, last = refusal, True
            else:
                preset, last = handler.compile(command, ops)
            count = len(ops) - before
            opens = count > 0 and type(ops[-1]) is Open
            entries.append((command, count, preset, opens))
            if preset is not None and preset.close:
                pending.clear()
                break
            if preset is None and not last and count == 1 and not opens and handler.repeats(command):
                repeat = command
                repeat_op = ops[-1]
                repeat_entry = listed[-1]
            else:
                repeat = None
        if repeats:
            handler.repeated(repeat, repeats)
        return entries

    def _batch_done(self, done: BatchDone) -> None:
        self.waiting = None
        results = done.results
        sent = self.sent
        if sent is not None:
            if done.failure is None:  # a batch a journal failed is not timed: it took nothing
                name = self.batch_queue  # a monitor's may be another queue
                metrics = self.last_metrics if name is self.last_queue else self.context.stats.queues.get(name)
                record_batch(metrics, sent, results, sent.sent_at, done.answered_at)
            self.sent = None
            sent.ops = _NO_OPS  # its items' bytes go with the answer (issue 53)
            sent.copies = None
            sent.parked = False
            sent.failure = None
            sent.answer = done  # emptied once read (on_receive), then refilled by the queue
            self.spare = sent
        if self.monitor is not None:
            self._monitor_step(results[-1] if results else [])
            return
        failure = done.failure
        if self.batch_results is not None:  # the next part of a batch answered in parts
            results = self.batch_results + results
            self.batch_results = None
            if failure is None:
                failure = self.batch_failure
            self.batch_failure = None
        entries = self.batch
        lone = self.lone
        ops = self.batch_ops
        self.batch = _NO_ENTRIES
        self.lone = None
        self.batch_ops = _NO_OPS
        if self.session.closed:  # no item may stay with a client that has gone
            self._return_items(ops, results, 0, len(results), opened=True)
            return
        total = len(results)
        if lone is not None:
            if total < len(ops):  # the queue stopped before one of its fetches (its output budget)
                entries = _entries_of(lone, ops)
            else:
                opens = bool(ops) and type(ops[-1]) is Open
                if failure is None and not opens and not self.out:
                    data = self.handler.lone_reply(lone, results)
                    if data is not None:  # one part (a SET's, a miss's): sent through no list
                        # answered: nothing reads the request again (``lone`` and its batch have
                        # let go of it, the read's list was read once), so its decoder may refill it
                        self.transport.reuse(lone)
                        if not self._send(data):
                            self._return_items(ops, results, 0, total, opened=False)
                        return
                self._answer(lone, None, opens, ops, results, 0, total, failure)
                if self.out and not self._flush():
                    self._return_items(ops, results, 0, total, opened=False)
                return
        position = 0
        answered = 0
        entry_count = len(entries)
        listed: list[Any] = entries  # read as objects, as _compile_rest made them (its ``listed``)
        while answered < entry_count:
            command, count, preset, opens = entries[answered]
            end = position + count
            if end > total:  # the queue stopped before this one's fetch (its output budget)
                break
            answered += 1
            entry = listed[answered - 1]
            if failure is None and answered < entry_count and listed[answered] is entry:
                # a run of repeats (_compile_rest): one operation each, answered in one call
                run_end = answered + 1
                while run_end < entry_count and listed[run_end] is entry:
                    run_end += 1
                run_end = min(run_end, answered + total - end)  # those the queue answered
                self.handler.add_replies(command, results, position, end + run_end - answered, self.out)
                position = end + run_end - answered
                answered = run_end
                continue
            self._answer(command, preset, opens, ops, results, position, end, failure)
            position = end
        if answered < len(entries):  # the rest once the client has taken these replies
            self.batch = entries[answered:]
            self.batch_ops = ops[position:]
            self.batch_results = results[position:]
            self.batch_failure = failure
            self.waiting = _MORE
        if self.out and not self._flush():
            # the client is gone and these replies with it: their plain GETs' items go back
            # (open ones were given back by the hang-up, from ``open_reads``)
            self._return_items(ops, results, 0, position, opened=False)

    def _answer(self, command: Any, preset: p.Bad | None, opens: bool, ops: list[Any], results: list[Any],
                position: int, end: int, failure: JournalFailure | None) -> None:
        """Reply to ``command`` of the answered batch, whose results are ``results[position:end]``."""
        out = self.out
        if preset is not None:
            if preset.reply is not None:
                out.append(preset.reply)
            if preset.close:
                self.closing = True
            return
        if failure is not None:
            failed = failed_result(ops, results, position, end)
            if failed is not None:
                # its confirm or fetch was not made durable: an error, and what else it
                # opened or took goes back, since the client is not told of it
                out.append(self.handler.failed_reply(command, failed.message))
                self._return_items(ops, results, position, end, opened=True)
                return
        if opens:
            opened: Item | None = results[end - 1]
            if opened is not None:
                # the session, not the reply, records what the client now holds open
                open_reads = self.open_reads
                opened_here = open_reads.get(self.batch_queue)
                if opened_here is None:  # not ``setdefault``: that makes one for every open read
                    opened_here = open_reads[self.batch_queue] = OpenXids()
                opened_here.add(opened.xid)
        self.handler.add_reply(command, results, position, end, out)

    def _drop_rest(self) -> None:
        self.waiting = None
        self.batch = _NO_ENTRIES
        self.batch_results = None
        self.batch_failure = None

    def _send_rest(self) -> None:
        """Ask the queue for the rest of a batch it answered in parts."""
        name = self.batch_queue
        rest = self.batch_ops[len(self.batch_results):]  # type: ignore[arg-type]
        self.waiting = _BATCH
        try:
            self.refs[name].tell(QueueBatch(rest, self.session, self.ref))
        except (ActorDeadError, KeyError):
            self._batch_done(BatchDone([closed_result(op) for op in rest]))

    def _return_items(self, ops: list[Any], results: list[Any], start: int, end: int, opened: bool) -> None:
        """Give the items fetched by ``ops[start:end]`` back to the batch's queue: open ones
        (if ``opened``) as an abort, those a plain GET removed with ``PutBack``."""
        plain = []
        xids = []
        for index in range(start, min(end, len(results))):
            item = results[index]
            if item is None or type(item) is JournalFailure:
                continue  # nothing taken (a refused operation took nothing either)
            kind = type(ops[index])
            if kind is Remove:
                plain.append(item)
            elif kind is Open and opened:
                xids.append(item.xid)
            elif kind is RemoveMany:
                plain.extend(item)
            elif kind is OpenMany and opened:
                xids.extend(one.xid for one in item)
        name = self.batch_queue
        if xids:
            # Kestrel's ``finished_but_add``: reads opened for a client that had gone
            self.context.stats.finished_but_add += len(xids)
            self._give_back(name, xids)
        if plain:
            self.log.warning("client gone before its item was sent; the item goes back",
                             queue=name, items=len(plain))
            self.tell_queue(name, PutBack(tuple(plain)))

    # -- monitor --------------------------------------------------------------------------------

    def _monitor_next(self) -> None:
        monitor = self.monitor
        assert monitor is not None
        name = monitor.queue
        opened = self.open_count(name)
        if (
            monitor.remaining <= 0
            or opened >= monitor.limit
            or time.monotonic() >= monitor.deadline
            or self.session.closed
            or self.closing
            or not self.context.reads_allowed(self.session)
        ):
            self.monitor = None
            self.out.append(self.handler.MONITOR_END)
            return
        ref = self.refs.get(name)
        if ref is None:
            ref = self._listed_queue(name)
        if ref is None:
            self.pending.appendleft(_MONITOR_RESUME)
            self._resolve(name, True)
            return
        self.waiting = _BATCH
        self.batch_queue = name
        op = OpenMany(min(monitor.remaining, monitor.limit - opened), monitor.deadline)
        self.context.stats.cmd_monitor_get += 1
        self.sent = QueueBatch([op], self.session, self.ref, None, epoch_seconds())
        try:
            ref.tell(self.sent)
        except ActorDeadError:
            self.sent = None
            self.refs.pop(name, None)
            self.waiting = None
            self.pending.appendleft(_MONITOR_RESUME)

    def _monitor_step(self, items: list[Item]) -> None:
        monitor = self.monitor
        assert monitor is not None
        name = monitor.queue
        if items:
            if self.session.closed:
                self.context.stats.finished_but_add += len(items)
                self._give_back(name, [item.xid for item in items])
                return
            opened = self.open_reads.get(name)
            if opened is None:
                opened = self.open_reads[name] = OpenXids()
            opened.add_items(items)  # a run, which a confirm hands back as it is
            self.handler.add_item_replies(name, items, monitor.stamped, self.out)
            monitor.remaining -= len(items)
        elif _monotonic() < monitor.deadline:
            monitor.deadline = 0.0  # the queue answered a miss: it closed, so the stream ends
        self._flush()
        if self.transport.backed_up:  # go on once the client has taken what it was sent
            self.pending.appendleft(_MONITOR_RESUME)
            return
        self._monitor_next()

    # -- output and the end ---------------------------------------------------------------------

    def _flush(self) -> bool:
        """Send what ``out`` holds; ``False`` if it could not be (the client has gone)."""
        out = self.out
        if not out:  # (twice per request: a list's clear costs a call even when it is empty)
            return not self.session.closed
        parts = len(out)
        if parts == 1:  # a reply of one part: sent as it is
            data = out[0]
            out.clear()
            return self._send(data)
        if self.session.closed:
            out.clear()
            return False
        size = 0
        for part in out:
            size += len(part)
        self.context.stats.bytes_written += size
        try:
            if size >= JOIN_BELOW or (parts <= LONE_PARTS and size >= LONE_WRITEV_FROM):
                self.transport.send_parts(out, size)
                out.clear()
            else:
                data = b"".join(out)
                out.clear()
                self.transport.sendall(data)
        except OSError:
            out.clear()
            self._hang_up()
            return False
        return True

    def _send(self, data: bytes) -> bool:
        """Send one reply of one part (a SET's, a miss's) as it is; ``False`` if it could not be
        (the client has gone)."""
        if self.session.closed:
            return False
        self.context.stats.bytes_written += len(data)
        try:
            self.transport.sendall(data)
        except OSError:
            self._hang_up()
            return False
        return True

    def _hang_up(self) -> None:
        """The client is gone: cancel waits first, then return every open read to its queue."""
        if self.hung_up:
            return
        self._release()
        if self.waiting is None:
            self._finish()

    def _release(self) -> None:
        """Let go of everything this client holds in queues: its waits, its open reads."""
        self.hung_up = True
        self.session.closed = True
        self.pending.clear()
        self.closing = True
        if self.waiting is _MORE:  # nothing of the rest was fetched: nothing to give back
            self._drop_rest()
        self._cancel_wait()
        if self.draining:  # as Kestrel at shutdown: not aborted into the journal (behaviour §7.4)
            self.open_reads.clear()
        for name, opened in self.open_reads.items():
            if opened:
                self.context.stats.cmd_get_open_dropped += opened.count
                self.tell_queue(name, Unremove(runs=opened.take_all()))
        self.open_reads.clear()
        self.handler.release()

    def _cancel_wait(self) -> None:
        """A fetch of the batch in flight that waits in its queue is answered now, a miss."""
        if self.waiting is _BATCH and self.batch_queue in self.refs:
            try:
                self.refs[self.batch_queue].tell(CancelWaits(self.session))
            except ActorDeadError:
                pass

    def _input_end(self, final: bool) -> None:
        """The client sent its FIN: a fetch of its waiting in a queue ends now with a miss (none
        of its fetches waits from now on: ``Session.input_ended``); once ``final``, the session
        finishes when the requests read before it are answered."""
        if self.hung_up:
            return
        self._cancel_wait()
        if final:
            self.input_ended = True
            self._pump(None)

    def _wind_down(self) -> None:
        if self.hung_up:
            return
        pending = self.pending
        head = pending.head() if pending.count and self.waiting is _RESOLVE else None
        pending.clear()
        if head is not None:  # its queue's lookup, in flight, pops it when answered
            pending.append(head)
        self.draining = True
        self.closing = True  # _pump starts nothing more, and finishes once nothing is awaited
        self._cancel_wait()
        self._pump(None)

    def _give_back(self, name: str, xids: list[int]) -> None:
        self.tell_queue(name, Unremove(tuple(xids)))

    def _finish(self) -> None:
        if self.finished:
            return
        if not self.hung_up:
            self._hang_up()
            return
        self.finished = True
        self.context.closed(self.session)
        self.stop()

    def on_stop(self) -> None:
        self.transport.close()
        # the handler refers back to this actor: let go of it, so that reference counting, not
        # the cyclic collector, frees the connection (nothing asks the handler after the stop)
        self.handler = _NO_HANDLER

    def on_failure(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """A handler raised (a bug): the client must not be left waiting for a reply that
        will never come. Log it, then end the session as a hang-up does (waits cancelled,
        open reads given back) and close the connection; the actor has stopped already."""
        # the runtime has logged the traceback already; this line says which connection
        self.log.error("connection handler failed; closing the connection",
                       error=f"{exc_type.__name__}: {exc_value}")
        self.out.clear()
        if not self.hung_up:
            self._release()
        if not self.finished:
            self.finished = True
            self.context.closed(self.session)
        self.transport.close()


def _entries_of(lone: Any, ops: list[Any]) -> list[tuple[Any, int, p.Bad | None, bool]]:
    """The entries of a batch of one request (``SessionActor.lone``), all of ``ops`` its own."""
    return [(lone, len(ops), None, type(ops[-1]) is Open)]

