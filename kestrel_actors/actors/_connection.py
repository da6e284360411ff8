"""The memcache session: what each memcache command does to a queue, and its reply bytes.

The request loop, batching and hang-up are :class:`SessionActor`'s; this class supplies the
memcache protocol's guards (reference §2.5: the open limit, a plain GET while a read is open)
and replies, and is the base of the text protocol's session.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from .. import protocol as p
from ._collection import AliasAdd, Delete, Resolved
from ._messages import (
    JournalFailure,
    OP_ADD,
    OP_CONFIRM,
    OP_FLUSH,
    OP_FLUSH_EXPIRED,
    OP_OPEN,
    OP_PEEK,
    OP_REMOVE,
    OP_UNREMOVE,
)
from ._queue_core import expiry_from_exptime
from ._session import (
    _ERROR_CLOSE,
    _Answer,
    _ERROR_OPEN,
    _SERVER_ERROR_CLOSE,
    Disconnected,
    Received,
    SessionActor,
    _MonitorResume,
    _pop_oldest,
    _ReplyTo,
)
from ._session_replies import compose_dump_config, compose_dump_stats, compose_stats

__all__ = ["ConnectionActor", "Disconnected", "Received"]


class ConnectionActor(SessionActor):
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
            failure = _first_failure(answer.value)
            if failure is not None:
                self.out.append(p.server_error(failure.message))
            else:
                self.out.append(p.STORED if all(answer.value) else p.NOT_STORED)
        elif tag == "flush_all_expired":
            self.out.append(b"%d\r\n" % sum(answer.value))
        elif tag == "dump_config":
            self.out.append(compose_dump_config(answer.value))

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
                self.out.append(self.MONITOR_END)
            else:
                self.out.append(self._server_error_reply(resolved.error))
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
            expiry = expiry_from_exptime(command.exptime)
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
            expiry = expiry_from_exptime(command.exptime)
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
            code = OP_PEEK if command.peek else OP_OPEN if command.open else OP_REMOVE
            waits = self._fetch(code, command.timeout_ms, ops)
            return None, waits or command.open
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

    def _reply(self, command: Any, results: list[Any]) -> bytes:
        kind = type(command)
        if kind is p.Set:
            stored = results[0]
            if stored:
                return p.STORED
            if type(stored) is JournalFailure:
                return p.server_error(stored.message)  # not acknowledged; the connection stays
            return p.NOT_STORED
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

    def _server_error_reply(self, message: str) -> bytes:
        """The reply to a request the server could not carry out (a full disk) (hook)."""
        return p.server_error(message)

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
        server.stats.cmd_monitor += 1
        self.monitor = [command.queue, deadline, max_items, limit]
        self._monitor_next()


def _first_failure(results: Any) -> JournalFailure | None:
    """The first :class:`JournalFailure` among add results, if a journal failed one."""
    for result in results:
        if type(result) is JournalFailure:
            return result
    return None
