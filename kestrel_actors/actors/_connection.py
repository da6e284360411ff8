"""The connection actor: one per client connection, holding its session state.

A reader greenlet (in ``server``) feeds decoded commands in as :class:`Received`. The actor
answers them strictly in order: consecutive requests for one queue travel to that queue's
actor as one :class:`QueueBatch`, and the next batch leaves only when the previous one is
answered, so pipelined requests are answered in order, as Kestrel does. The actor keeps this
connection's open (tentative) reads per queue; close and abort act on the oldest. When the
client goes, its waits are cancelled first and then every open read goes back to the head.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import structlog
from pykka import ActorDeadError

from .. import protocol as p
from ._collection import AliasAdd, Delete, ForAll, Resolve, Resolved
from ._messages import (
    OP_ADD,
    OP_CONFIRM,
    OP_FLUSH,
    OP_FLUSH_EXPIRED,
    OP_OPEN,
    OP_OPEN_MANY,
    OP_PEEK,
    OP_REMOVE,
    OP_UNREMOVE,
    BatchDone,
    CancelWaits,
    QueueBatch,
    Session,
)
from ._queue_core import expiry_from_exptime
from ._runtime import GeventActor
from ._session_replies import compose_dump_config, compose_dump_stats, compose_stats

__all__ = ["ConnectionActor", "Disconnected", "Received"]

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


class _Ignore:
    @staticmethod
    def tell(_value: Any) -> None:
        pass


_MISSING = object()


class ConnectionActor(GeventActor):
    """Session logic of one client: request order, open reads, waits and monitor streams.

    This class speaks the memcache protocol's commands and replies; the text protocol's
    session (``_text_connection``) overrides the hooks marked as such.
    """

    QUEUE_KINDS: frozenset[type] = frozenset((p.Set, p.Get, p.Confirm, p.Flush, p.FlushExpired))
    """Commands that run as operations on one queue (hook)."""
    MONITOR_END = p.END
    """What ends a monitor stream (hook)."""
    WRITE_REFUSALS: dict[type, p.Bad] = {
        p.Set: p.Bad(p.SERVER_ERROR, close=True),
        p.Flush: p.Bad(p.SERVER_ERROR, close=True),
        p.FlushAll: p.Bad(p.SERVER_ERROR, close=True),
        p.Delete: p.Bad(p.SERVER_ERROR, close=True),
        p.FlushExpired: p.DROP,
    }
    """Writes that ReadOnly/Quiescent (or the write connection limit) refuse, and how (§7.2)."""

    def __init__(self, server: Any, transport: Any, session: Session) -> None:
        super().__init__()
        self.server = server
        self.transport = transport
        self.session = session
        self.log = log.bind(connection=session.id, peer=session.peer)
        self.open_reads: dict[str, deque[int]] = {}
        self.refs: dict[str, Any] = {}
        self.pending: deque[Any] = deque()
        self.out: list[bytes] = []
        self.waiting: str | None = None
        self.batch: list[tuple[Any, int]] = []
        self.batch_queue: str | None = None
        self.missing: str | None = None
        self.monitor: list[Any] | None = None
        self.closing = False
        self.hung_up = False
        self.finished = False

    # -- messages -------------------------------------------------------------------------

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

    # -- the request loop -----------------------------------------------------------------

    def _pump(self) -> None:
        pending = self.pending
        while pending and self.waiting is None and not self.closing:
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
            self.server.reader_may_continue(self.session)

    def _local(self, command: Any) -> None:
        kind = type(command)
        server = self.server
        if kind is p.Bad:
            if command.reply is not None:
                self.out.append(command.reply)
            if command.close:
                self.closing = True
        elif kind is p.Version:
            self.out.append(b"VERSION %s\r\n" % server.version.encode())
        elif kind is p.Stats:
            self._ask_all("stats", "stats")
        elif kind is p.DumpStats:
            self._ask_all("stats", "dump_stats", command.names or None)
            self.dump_names = command.names
        elif kind is p.FlushAll:
            self._ask_all("flush", "flush_all")
        elif kind is p.FlushAllExpired:
            self._ask_all("sweep", "flush_all_expired")
        elif kind is p.Delete:
            self.refs.pop(command.queue, None)
            self.waiting = "delete"
            server.collection.tell(Delete(command.queue, _ReplyTo(self.actor_ref, "delete")))
        elif kind is p.Monitor:
            self._start_monitor(command)
        elif kind is p.Status:
            self.out.append(server.status_reply(command.name))
        elif kind is p.Reload:
            # answered once the collection has told every queue, so that what this client
            # sends next reaches each queue after its new settings (actor inboxes are FIFO)
            self.waiting = "reload"
            server.reload(_ReplyTo(self.actor_ref, "reload"))
        elif kind is p.DumpConfig:
            self._ask_all("config", "dump_config")
        elif kind is p.Shutdown:
            self.closing = True
            server.shutdown()
        elif kind is p.Quit:
            self.closing = True
        elif kind is _MonitorResume:
            self._monitor_next()
        else:  # a command this server does not implement
            self.out.append(p.CLIENT_ERROR)
            self.closing = True

    def _ask_all(self, kind: str, tag: str, names: tuple[str, ...] | None = None) -> None:
        self.waiting = tag
        self.server.collection.tell(ForAll(kind, _ReplyTo(self.actor_ref, tag), names))

    def _answer(self, answer: _Answer) -> None:
        tag = answer.tag
        self.waiting = None
        if tag == "resolve":
            _tag, resolved = answer.value
            self._resolved(resolved)
        elif tag == "delete":
            self.out.append(p.DELETED)
        elif tag == "stats":
            self.out.append(compose_stats(self.server, answer.value))
        elif tag == "dump_stats":
            self.out.append(compose_dump_stats(self.dump_names, answer.value))
        elif tag == "flush_all":
            self.out.append(b"Flushed all queues.\r\n")
        elif tag == "reload":
            self.out.append(b"Reloaded config.\r\n")
        elif tag == "alias_set":
            self.out.append(p.STORED if all(answer.value) else p.NOT_STORED)
        elif tag == "flush_all_expired":
            self.out.append(b"%d\r\n" % sum(answer.value))
        elif tag == "dump_config":
            self.out.append(compose_dump_config(answer.value))

    # -- queue batches --------------------------------------------------------------------

    def _queue_ref(self, name: str, create: bool) -> Any:
        """The queue's actor, ``_MISSING`` if it does not exist, or ``None`` while resolving."""
        ref = self.refs.get(name)
        if ref is not None and ref.is_alive():
            return ref
        if self.missing == name:
            self.missing = None
            return _MISSING
        self.waiting = "resolve"
        self.server.collection.tell(Resolve(name, create, _ReplyTo(self.actor_ref, "resolve")))
        return None

    def _resolved(self, resolved: Resolved) -> None:
        if not resolved.valid:
            self.log.info("illegal queue name", queue=resolved.name)
            self.pending.clear()
            self.closing = True
        elif resolved.ref is not None:
            self.refs[resolved.name] = resolved.ref
        elif resolved.alias is not None and self.monitor is not None:
            self.pending.popleft()  # the monitor's resume marker: an alias has no items
            self.monitor = None
            self.out.append(self.MONITOR_END)
        elif resolved.alias is not None:
            self._alias_request(resolved)
        else:
            self.missing = resolved.name

    def _alias_request(self, resolved: Resolved) -> None:
        """An alias only takes SETs (forwarded to its destinations); reads find nothing."""
        command = self.pending.popleft()
        if type(command) is p.Set:
            if not self.server.writes_allowed(self.session):
                self._refuse_now(p.SERVER_ERROR)
                return
            self.server.stats.cmd_set += 1
            expiry = expiry_from_exptime(command.exptime, int(time.time() * 1000))
            self.waiting = "alias_set"
            self.server.collection.tell(
                AliasAdd(resolved.name, command.data, expiry, _ReplyTo(self.actor_ref, "alias_set"))
            )
        elif type(command) is p.Get and not command.abort and (command.open or not command.close):
            if command.peek:
                self.server.stats.cmd_peek += 1
            else:
                self.server.stats.cmd_get += 1
            self.out.append(p.END)
        else:
            self.out.append(self._missing_queue_reply(command, None))

    def _start_batch(self) -> bool:
        """Compile the requests at the head of ``pending`` into one batch and send it."""
        first = self.pending[0]
        name = first.queue
        ref = self._queue_ref(name, self._creates(first))
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
        self.batch_queue = name
        if not ops:
            self._batch_done(BatchDone(None, [], name))
            return True
        self.waiting = "batch"
        try:
            ref.tell(QueueBatch(ops, self.session, self.actor_ref))
        except ActorDeadError:  # deleted between the check and now: it answers as closed
            self._batch_done(BatchDone(None, [_closed_result(op) for op in ops], name))
        return True

    def _compile(self, command: Any, ops: list[tuple]) -> tuple[p.Bad | None, bool]:
        """Append ``command``'s operations to ``ops``.

        Returns a preset reply (an error that replaces the normal one, maybe closing) and
        whether the batch must end after this command (its result changes session state, or
        it may wait).
        """
        kind = type(command)
        server = self.server
        if kind is p.Set:
            if not server.writes_allowed(self.session):
                return _SERVER_ERROR_CLOSE, True
            server.stats.cmd_set += 1
            expiry = expiry_from_exptime(command.exptime, int(time.time() * 1000))
            ops.append((OP_ADD, command.data, expiry))
            return None, False
        if kind is p.Get:
            opened = self.open_reads.get(command.queue)
            if command.abort:
                if opened:
                    ops.append((OP_UNREMOVE, (opened.popleft(),)))
                return None, False
            if command.close and opened:
                ops.append((OP_CONFIRM, (opened.popleft(),)))
            if command.close and not command.open:
                return None, False
            if not command.open and not command.peek and opened:
                return _ERROR_CLOSE, True
            if not server.reads_allowed(self.session):
                return _SERVER_ERROR_CLOSE, True
            if command.open and opened and len(opened) >= server.config.max_open_transactions:
                return _ERROR_CLOSE, True
            deadline = None
            if command.timeout_ms is not None:
                deadline = time.monotonic() + command.timeout_ms / 1000.0
            if command.peek:
                server.stats.cmd_peek += 1
                ops.append((OP_PEEK, deadline))
            else:
                server.stats.cmd_get += 1
                ops.append((OP_OPEN if command.open else OP_REMOVE, deadline))
            return None, deadline is not None or command.open
        if kind is p.Confirm:
            opened = self.open_reads.get(command.queue)
            count = command.count
            if count <= 0 or not opened or count > len(opened):
                return _ERROR_OPEN, False
            ops.append((OP_CONFIRM, tuple(opened.popleft() for _ in range(count))))
            return None, False
        if kind is p.Flush:
            if not server.writes_allowed(self.session):
                return _SERVER_ERROR_CLOSE, True
            ops.append((OP_FLUSH,))
            return None, False
        if kind is p.FlushExpired:
            if not server.writes_allowed(self.session):
                return p.DROP, True
            ops.append((OP_FLUSH_EXPIRED,))
            return None, False
        raise AssertionError(command)

    def _refuse_now(self, reply: bytes) -> None:
        self.pending.clear()
        self.out.append(reply)
        self.closing = True

    def _batch_done(self, done: BatchDone) -> None:
        self.waiting = None
        results = done.results
        if self.monitor is not None:
            self._monitor_step(results[-1] if results else [])
            return
        position = 0
        gone = self.session.closed
        for command, count, preset in self.batch:
            mine = results[position : position + count]
            position += count
            if gone:
                if type(command) is p.Get and command.open and mine and mine[-1] is not None:
                    self._give_back(command.queue, [mine[-1].xid])
                continue
            if preset is not None:
                if preset.reply is not None:
                    self.out.append(preset.reply)
                if preset.close:
                    self.closing = True
                continue
            self.out.append(self._reply(command, mine))
        self.batch = []

    def _reply(self, command: Any, results: list[Any]) -> bytes:
        kind = type(command)
        if kind is p.Set:
            return p.STORED if results[0] else p.NOT_STORED
        if kind is p.Get:
            if command.abort or (command.close and not command.open):
                return p.END
            item = results[-1] if results else None
            if item is None:
                return p.END
            if command.open:
                self.open_reads.setdefault(command.queue, deque()).append(item.xid)
            return p.value_reply(command.queue, item.data)
        if kind is p.Confirm or kind is p.Flush:
            return p.END
        if kind is p.FlushExpired:
            return b"%d\r\n" % results[0]
        raise AssertionError(command)

    # -- protocol hooks -------------------------------------------------------------------

    def _goes_to_queue(self, command: Any) -> bool:
        """Whether a command of a ``QUEUE_KINDS`` type needs its queue at all (hook)."""
        return True

    def _creates(self, command: Any) -> bool:
        """Whether a request creates a missing queue (reference §5.2) (hook)."""
        if type(command) is p.Get:
            return not command.abort and (command.open or not command.close)
        return type(command) is p.Set

    def _missing_queue_reply(self, command: Any, opened: deque[int] | None) -> bytes:
        """The reply to a request on a queue that does not exist and is not created (hook)."""
        kind = type(command)
        if kind is p.Confirm:
            return p.END if _pop_oldest(opened, command.count) else p.ERROR
        if kind is p.Get:
            if (command.close or command.abort) and opened:
                opened.popleft()
            return p.END
        if kind is p.FlushExpired:
            return b"0\r\n"
        return p.END

    def _item_reply(self, queue: str, data: bytes) -> bytes:
        """One item of a monitor stream (hook)."""
        return p.value_reply(queue, data)

    # -- monitor --------------------------------------------------------------------------

    def _start_monitor(self, command: p.Monitor) -> None:
        server = self.server
        if not server.reads_allowed(self.session):
            self.pending.clear()
            self.closing = True
            return
        config = server.config
        max_items = command.max_items if command.max_items is not None else config.max_open_transactions
        limit = min(max(max_items, config.max_open_transactions), config.monitor_max_items)
        deadline = time.monotonic() + command.seconds
        self.monitor = [command.queue, deadline, max_items, limit]
        self._monitor_next()

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
            self._queue_ref(name, True)
            return
        self.waiting = "batch"
        self.batch_queue = name
        op = (OP_OPEN_MANY, min(remaining, limit - opened), deadline)
        try:
            ref.tell(QueueBatch([op], self.session, self.actor_ref))
        except ActorDeadError:
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
        self._monitor_next()

    # -- output and the end of the session ------------------------------------------------

    def _flush(self) -> None:
        if not self.out or self.session.closed:
            self.out.clear()
            return
        data = b"".join(self.out)
        self.out.clear()
        self.server.stats.bytes_written += len(data)
        try:
            self.transport.sendall(data)
        except OSError:
            self._hang_up()

    def _hang_up(self) -> None:
        """The client is gone: cancel waits first, then return every open read to its queue."""
        if self.hung_up:
            return
        self.hung_up = True
        self.session.closed = True
        self.pending.clear()
        self.closing = True
        if self.waiting == "batch" and self.batch_queue in self.refs:
            try:
                self.refs[self.batch_queue].tell(CancelWaits(self.session))
            except ActorDeadError:
                pass
        for name, xids in self.open_reads.items():
            if xids:
                self._give_back(name, list(xids))
        self.open_reads.clear()
        if self.waiting is None:
            self._finish()

    def _give_back(self, name: str, xids: list[int]) -> None:
        self._tell_queue(name, (OP_UNREMOVE, tuple(xids)))

    def _tell_queue(self, name: str, op: tuple) -> None:
        """Send one operation whose answer nobody waits for (a deleted queue ignores it)."""
        ref = self.refs.get(name)
        if ref is None:
            return
        try:
            ref.tell(QueueBatch([op], None, _Ignore))
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


def _closed_result(op: tuple) -> Any:
    """What a closed (deleted) queue answers to ``op``."""
    code = op[0]
    if code == OP_ADD:
        return False
    if code == OP_OPEN_MANY:
        return []
    if code == OP_CONFIRM or code == OP_FLUSH_EXPIRED:
        return 0
    return None


_ERROR_OPEN = p.Bad(p.ERROR, close=False)
_ERROR_CLOSE = p.Bad(p.ERROR, close=True)
_SERVER_ERROR_CLOSE = p.Bad(p.SERVER_ERROR, close=True)
