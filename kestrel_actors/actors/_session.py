"""The protocol-independent part of a client session: the request loop and its bookkeeping.

A transport hands decoded commands in as :class:`Received`. The actor answers them strictly in
order: consecutive requests for one queue travel to that queue's actor as one
:class:`QueueBatch`, and the next batch leaves only when the previous one is answered, so
pipelined requests are answered in order, as Kestrel does. The session keeps its open
(tentative) reads per queue; when the client goes, its waits are cancelled first and then
every open read goes back to the head of its queue. An item that reaches the session after its
client has gone, or whose reply could not be sent, goes back too: an open one as an abort, a
plain GET's with ``OP_PUT_BACK``.

Output is bounded: a queue answers a batch in parts once its fetches took
``BATCH_FETCH_BYTES`` (``_messages``), and the session asks for the rest only once the
transport is no longer backed up, so a client that pipelines fetches and never reads holds
at most the transport's ``OUTPUT_HIGH`` plus one part's replies (see README, "Limits").
A handler that raises closes its connection (logged), as a hang-up would.

What a command means and how its reply looks is the protocol's: :class:`SessionActor`
subclasses (``ConnectionActor`` for memcache, ``TextConnectionActor``) supply ``_local``,
``_answer``, ``_resolved``, ``_compile``, ``_reply`` and the hooks.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import structlog
from pykka import ActorDeadError

from .. import protocol as p
from ._collection import ForAll, Resolve
from ._messages import (
    OP_OPEN,
    OP_OPEN_MANY,
    OP_PEEK,
    OP_PUT_BACK,
    OP_REMOVE,
    OP_UNREMOVE,
    IGNORE,
    BatchDone,
    CancelWaits,
    QueueBatch,
    Session,
    closed_result,
)
from ._runtime import GeventActor
from ._stats import record_batch

__all__ = ["Disconnected", "Received", "SessionActor"]

log = structlog.get_logger("kestrel_actors.connection")

MAX_BATCH = 256

class Received:
    __slots__ = ("commands",)

    def __init__(self, commands: list[Any]) -> None:
        self.commands = commands


class Disconnected:
    """The client hung up (or the socket failed): finish the session."""

    __slots__ = ()


class _Answer:
    __slots__ = ("tag", "value")

    def __init__(self, tag: str, value: Any) -> None:
        self.tag = tag
        self.value = value


class _ReplyTo:
    """Turns a collection or gather answer into an :class:`_Answer` message to this actor."""

    __slots__ = ("ref", "tag")

    def __init__(self, ref: Any, tag: str) -> None:
        self.ref = ref
        self.tag = tag

    def tell(self, value: Any) -> None:
        try:
            self.ref.tell(_Answer(self.tag, value))
        except ActorDeadError:
            pass


_MISSING = object()


class SessionActor(GeventActor):
    """One client's session: request order, open reads, waits, monitor streams, hang-up."""

    inline_dispatch = True
    """An idle session's messages (reads from the dispatcher, a queue's answers) run on the
    sender's greenlet: its handlers never wait (replies go to the transport's buffer)."""

    QUEUE_KINDS: frozenset[type] = frozenset()
    """Commands that run as operations on one queue (protocol hook)."""
    MONITOR_END = b""
    """What ends a monitor stream (protocol hook)."""
    WRITE_REFUSALS: dict[type, p.Bad] = {}
    """Writes refused while the server blocks writes, and how (protocol hook)."""

    def __init__(self, server: Any, transport: Any, session: Session) -> None:
        super().__init__()
        self.server = server
        self.transport = transport
        self.session = session
        self.open_reads: dict[str, deque[int]] = {}
        self.refs: dict[str, Any] = {}
        self.pending: deque[Any] = deque()
        self.out: list[bytes] = []
        self.waiting: str | None = None
        self.batch: list[tuple[Any, int, p.Bad | None]] = []
        self.batch_ops: list[tuple] = []
        self.batch_results: list[Any] | None = None
        """Results of a batch the queue answered in parts, kept until the rest comes."""
        self.batch_queue: str | None = None
        self.sent: QueueBatch | None = None
        self.sent_at = 0.0
        """The batch awaiting its answer, and when it left (``perf_counter``): latency figures."""
        self.missing: str | None = None
        self.monitor: list[Any] | None = None
        self.closing = False
        self.hung_up = False
        self.finished = False

    @property
    def log(self) -> Any:
        """This session's logger (bound on use: most sessions never log)."""
        return log.bind(connection=self.session.id, peer=self.session.peer)

    def on_receive(self, message: Any) -> Any:
        kind = type(message)
        if kind is Received:
            self.pending.extend(message.commands)
            self._pump()
        elif kind is BatchDone:
            self._batch_done(message)
            self._pump()
        elif kind is _Answer:
            self._answer(message)
            self._pump()
        elif kind is Disconnected:
            self._hang_up()
        else:
            return super().on_receive(message)
        return None

    def _pump(self) -> None:
        pending = self.pending
        transport = self.transport
        if self.waiting == "more" and not transport.backed_up:
            self._send_rest()
        while pending and self.waiting is None and not self.closing and not transport.backed_up:
            command = pending[0]
            kind = type(command)
            refusal = self.WRITE_REFUSALS.get(kind)
            if refusal is not None and not self.server.writes_allowed(self.session):
                # checked before the queue is looked up: a missing queue is refused alike
                pending.clear()
                self._local(refusal)
                break
            if kind in self.QUEUE_KINDS and self._goes_to_queue(command):
                if not self._start_batch():
                    break
                continue
            pending.popleft()
            self._local(command)
        self._flush()
        if self.closing and self.waiting is None:
            self._finish()
        elif not pending:
            transport.resume()

    def _ask_all(self, kind: str, tag: str, names: tuple[str, ...] | None = None) -> None:
        self.waiting = tag
        self.server.collection.tell(ForAll(kind, _ReplyTo(self.actor_ref, tag), names))

    def _resolve(self, name: str, create: bool) -> Any:
        """For a queue whose live actor this session does not hold: ``_MISSING`` if the
        collection answered that it does not exist, else ``None`` after asking it."""
        if self.missing == name:
            self.missing = None
            return _MISSING
        self.waiting = "resolve"
        self.server.collection.tell(Resolve(name, create, _ReplyTo(self.actor_ref, "resolve")))
        return None

    def _start_batch(self) -> bool:
        """Compile the requests at the head of ``pending`` into one batch and send it."""
        first = self.pending[0]
        name = first.queue
        ref = self.refs.get(name)
        if ref is None or not ref.is_alive():
            ref = self._resolve(name, self._creates(first))
        if ref is None:
            return False
        if ref is _MISSING:
            self.pending.popleft()
            self.out.append(self._missing_queue_reply(first, self.open_reads.get(name)))
            return True
        ops: list[tuple] = []
        entries: list[tuple[Any, int, p.Bad | None]] = []
        pending = self.pending
        while pending and len(entries) < MAX_BATCH:
            command = pending[0]
            kind = type(command)
            if kind not in self.QUEUE_KINDS or command.queue != name or not self._goes_to_queue(command):
                break
            before = len(ops)
            preset, last = self._compile(command, ops)
            pending.popleft()
            entries.append((command, len(ops) - before, preset))
            if preset is not None and preset.close:
                pending.clear()
                break
            if last:
                break
        self.batch = entries
        self.batch_ops = ops
        self.batch_queue = name
        if not ops:
            self._batch_done(BatchDone(None, [], name))
            return True
        self.waiting = "batch"
        self.sent = QueueBatch(ops, self.session, self.actor_ref)
        self.sent_at = time.perf_counter()
        try:
            ref.tell(self.sent)
        except ActorDeadError:  # deleted between the check and now: it answers as closed
            self.sent = None
            self._batch_done(BatchDone(None, [closed_result(op) for op in ops], name))
        return True

    def _fetch(self, code: int, timeout_ms: int | None, ops: list[tuple]) -> bool:
        """Append a fetch (``OP_PEEK``, ``OP_OPEN`` or ``OP_REMOVE``) and count it (§7.3).

        Returns whether it may wait (a timeout was given).
        """
        stats = self.server.stats
        if code == OP_PEEK:
            stats.cmd_peek += 1
        else:
            stats.cmd_get += 1
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000.0
        ops.append((code, deadline))
        return deadline is not None

    def _refuse_now(self, reply: bytes) -> None:
        self.pending.clear()
        self.out.append(reply)
        self.closing = True

    def _batch_done(self, done: BatchDone) -> None:
        self.waiting = None
        results = done.results
        if self.sent is not None:
            record_batch(self.server.stats, done.queue, self.sent, results, self.sent_at)
            self.sent = None
        if self.monitor is not None:
            self._monitor_step(results[-1] if results else [])
            return
        if self.batch_results is not None:  # the next part of a batch answered in parts
            results = self.batch_results + results
            self.batch_results = None
        entries = self.batch
        ops = self.batch_ops
        self.batch = []
        if self.session.closed:  # no item may stay with a client that has gone
            self._return_items(ops, results, 0, len(results), opened=True)
            return
        position = 0
        answered = 0
        total = len(results)
        out = self.out
        for command, count, preset in entries:
            end = position + count
            if end > total:  # the queue stopped before this one's fetch (its output budget)
                break
            answered += 1
            if preset is not None:
                position = end
                if preset.reply is not None:
                    out.append(preset.reply)
                if preset.close:
                    self.closing = True
                continue
            out.append(self._reply(command, results[position:end]))
            position = end
        if answered < len(entries):  # the rest once the client has taken these replies
            self.batch = entries[answered:]
            self.batch_ops = ops[position:]
            self.batch_results = results[position:]
            self.waiting = "more"
        if out and not self._flush():
            # the client is gone and these replies with it: their plain GETs' items go back
            # (open ones were given back by the hang-up, from ``open_reads``)
            self._return_items(ops, results, 0, position, opened=False)

    def _send_rest(self) -> None:
        """Ask the queue for the rest of a batch it answered in parts."""
        name = self.batch_queue
        rest = self.batch_ops[len(self.batch_results):]  # type: ignore[arg-type]
        self.waiting = "batch"
        try:
            self.refs[name].tell(QueueBatch(rest, self.session, self.actor_ref))
        except (ActorDeadError, KeyError):
            self._batch_done(BatchDone(None, [closed_result(op) for op in rest], name))

    def _return_items(self, ops: list[tuple], results: list[Any], start: int, end: int,
                      opened: bool) -> None:
        """Give the items fetched by ``ops[start:end]`` back to the batch's queue: open ones
        (if ``opened``) as an abort, those a plain GET removed with ``OP_PUT_BACK``."""
        plain = []
        xids = []
        for index in range(start, min(end, len(results))):
            item = results[index]
            if item is None:
                continue
            code = ops[index][0]
            if code == OP_REMOVE:
                plain.append(item)
            elif code == OP_OPEN and opened:
                xids.append(item.xid)
        name = self.batch_queue
        if xids:
            self._give_back(name, xids)
        if plain:
            self.log.warning("client gone before its item was sent; the item goes back",
                             queue=name, items=len(plain))
            self._tell_queue(name, (OP_PUT_BACK, tuple(plain)))

    def _monitor_next(self) -> None:
        name, deadline, remaining, limit = self.monitor
        opened = len(self.open_reads.get(name, ()))
        if (
            remaining <= 0
            or opened >= limit
            or time.monotonic() >= deadline
            or self.session.closed
            or not self.server.reads_allowed(self.session)
        ):
            self.monitor = None
            self.out.append(self.MONITOR_END)
            return
        ref = self.refs.get(name)
        if ref is None:
            self.pending.appendleft(_MonitorResume())
            self._resolve(name, True)
            return
        self.waiting = "batch"
        self.batch_queue = name
        op = (OP_OPEN_MANY, min(remaining, limit - opened), deadline)
        self.server.stats.cmd_monitor_get += 1
        self.sent = QueueBatch([op], self.session, self.actor_ref)
        self.sent_at = time.perf_counter()
        try:
            ref.tell(self.sent)
        except ActorDeadError:
            self.sent = None
            self.refs.pop(name, None)
            self.waiting = None
            self.pending.appendleft(_MonitorResume())

    def _monitor_step(self, items: list[Any]) -> None:
        name = self.monitor[0]
        if items:
            if self.session.closed:
                self._give_back(name, [item.xid for item in items])
                return
            opened = self.open_reads.setdefault(name, deque())
            for item in items:
                opened.append(item.xid)
                self.out.append(self._item_reply(name, item.data))
            self.monitor[2] -= len(items)
        elif time.monotonic() < self.monitor[1]:
            self.monitor[1] = 0  # the queue answered a miss: it closed, so the stream ends
        self._flush()
        if self.transport.backed_up:  # go on once the client has taken what it was sent
            self.pending.appendleft(_MonitorResume())
            return
        self._monitor_next()

    def _flush(self) -> bool:
        """Send what ``out`` holds; ``False`` if it could not be (the client has gone)."""
        if not self.out or self.session.closed:
            self.out.clear()
            return not self.session.closed
        data = b"".join(self.out)
        self.out.clear()
        self.server.stats.bytes_written += len(data)
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
        if self.waiting == "more":  # nothing of the rest was fetched: nothing to give back
            self.waiting = None
            self.batch = []
            self.batch_results = None
        if self.waiting == "batch" and self.batch_queue in self.refs:
            try:
                self.refs[self.batch_queue].tell(CancelWaits(self.session))
            except ActorDeadError:
                pass
        for name, xids in self.open_reads.items():
            if xids:
                self.server.stats.cmd_get_open_dropped += len(xids)
                self._give_back(name, list(xids))
        self.open_reads.clear()

    def _give_back(self, name: str, xids: list[int]) -> None:
        self._tell_queue(name, (OP_UNREMOVE, tuple(xids)))

    def _tell_queue(self, name: str, op: tuple) -> None:
        """Send one operation whose answer nobody waits for (a deleted queue ignores it)."""
        ref = self.refs.get(name)
        if ref is None:
            return
        try:
            ref.tell(QueueBatch([op], None, IGNORE))
        except ActorDeadError:
            pass

    def _finish(self) -> None:
        if self.finished:
            return
        if not self.hung_up:
            self._hang_up()
            return
        self.finished = True
        self.server.connection_closed(self)
        self.stop()

    def on_stop(self) -> None:
        self.transport.close()

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
            self.server.connection_closed(self)
        self.transport.close()


class _MonitorResume:
    """A placeholder at the head of ``pending``: continue the monitor once the queue resolves."""

    __slots__ = ()
    queue = None


def _pop_oldest(opened: deque[int] | None, count: int) -> bool:
    """Pop ``count`` open xids if that many are open (confirm of a missing queue), else none."""
    if count <= 0 or not opened or count > len(opened):
        return False
    for _ in range(count):
        opened.popleft()
    return True


_ERROR_OPEN = p.Bad(p.ERROR, close=False)
_ERROR_CLOSE = p.Bad(p.ERROR, close=True)
_SERVER_ERROR_CLOSE = p.Bad(p.SERVER_ERROR, close=True)
