"""The memcache protocol handler: what each memcache command does to a queue, and its reply.

The request loop, batching, open reads and hang-up are the :class:`~._actor.SessionActor`'s;
this handler supplies the memcache protocol's guards (behaviour §2.5: the open limit, a plain
GET while a read is open) and builds its replies through ``protocol/``.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Final

from mypy_extensions import mypyc_attr

from .. import protocol as p
from ..messages import (
    FLUSH,
    FLUSH_EXPIRED,
    AliasAdd,
    Confirm,
    ForAllKind,
    JournalFailure,
    Open,
    Peek,
    ReloadFailed,
    Remove,
    Resolved,
    Unremove,
    first_failure,
)
from ..protocol import (
    END,
    NOT_STORED,
    STORED,
    compose_dump_config,
    compose_dump_stats,
    count_reply,
    expiry_from_exptime,
    server_error,
)
from ..protocol import Confirm as ConfirmCommand
from ..protocol import Flush as FlushCommand
from ..protocol import FlushExpired as FlushExpiredCommand
from ..protocol import Get as GetCommand
from ..protocol import Set as SetCommand
from ..queue import Item
from ..snapshot import take_snapshot
from ._actor import SessionActor
from ._handler import Answer, Handler
from ._opened import OpenXids

__all__ = ["MemcacheHandler"]

_ERROR_OPEN: Final = p.Bad(p.ERROR, close=False)
_ERROR_CLOSE: Final = p.Bad(p.ERROR, close=True)
_SERVER_ERROR_CLOSE: Final = p.Bad(p.SERVER_ERROR, close=True)


@mypyc_attr(allow_interpreted_subclasses=True)  # a test's handler subclasses it
class MemcacheHandler(Handler):
    """Kestrel's ``MemcacheHandler``: memcache commands to queue operations, results to bytes."""

    QUEUE_KINDS: ClassVar[frozenset[type]] = frozenset((p.Set, p.Get, p.Confirm, p.Flush, p.FlushExpired))
    MONITOR_END: ClassVar[bytes] = p.END
    QUIT: ClassVar[type] = p.Quit
    WRITE_REFUSALS: ClassVar[dict[type, p.Bad]] = {
        p.Set: _SERVER_ERROR_CLOSE,
        p.Flush: _SERVER_ERROR_CLOSE,
        p.FlushAll: _SERVER_ERROR_CLOSE,
        p.Delete: _SERVER_ERROR_CLOSE,
        p.FlushExpired: p.DROP,
    }
    """Writes that ReadOnly/Quiescent (or the write connection limit) refuse, and how (behaviour §7.2)."""

    def __init__(self, session: SessionActor) -> None:
        self.s = session
        self.context = session.context
        self.dump_names: tuple[str, ...] = ()
        self.values = p.ValueReplies()

    def local(self, command: Any) -> None:
        kind = type(command)
        s = self.s
        context = self.context
        if kind is p.Version:
            s.send_reply(p.version_reply(context.version))
        elif kind is p.Stats:
            s.ask_all(ForAllKind.STATS, Answer.STATS)
        elif kind is p.DumpStats:
            s.ask_all(ForAllKind.STATS, Answer.DUMP_STATS, command.names or None)
            self.dump_names = command.names
        elif kind is p.FlushAll:
            s.ask_all(ForAllKind.FLUSH, Answer.FLUSH_ALL)
        elif kind is p.FlushAllExpired:
            s.ask_all(ForAllKind.SWEEP, Answer.FLUSH_ALL_EXPIRED)
        elif kind is p.Delete:
            s.delete_queue(command.queue)
        elif kind is p.Monitor:
            self._start_monitor(command)
        elif kind is p.Status:
            name = context.status_command(command.name)
            s.send_reply(p.END if name is None else p.status_reply(name))
        elif kind is p.Reload:
            s.reload()
        elif kind is p.DumpConfig:
            s.ask_all(ForAllKind.CONFIG, Answer.DUMP_CONFIG)
        elif kind is p.Shutdown:
            s.end_session()
            s.shutdown()
        else:
            s.not_implemented(command)

    def answered(self, tag: Answer, value: Any) -> None:
        s = self.s
        if tag is Answer.DELETE:
            s.send_reply(p.DELETED)
        elif tag is Answer.STATS:
            # the context has what a snapshot reads of a server: stats, status, config, version
            s.send_reply(p.stats_reply(take_snapshot(self.context, value, with_metrics=False).memcache_lines()))
        elif tag is Answer.DUMP_STATS:
            s.send_reply(compose_dump_stats(self.dump_names, value))
        elif tag is Answer.FLUSH_ALL:
            s.send_reply(p.FLUSHED_ALL)
        elif tag is Answer.RELOAD:
            # Kestrel answers only success; a file that cannot be used says why
            s.send_reply(p.server_error(f"config not reloaded: {value.reason}") if type(value) is ReloadFailed
                       else p.RELOADED)
        elif tag is Answer.ALIAS_SET:
            failure = first_failure(value)
            if failure is not None:
                s.send_reply(p.server_error(failure.message))
            else:
                s.send_reply(p.STORED if all(value) else p.NOT_STORED)
        elif tag is Answer.FLUSH_ALL_EXPIRED:
            s.send_reply(p.count_reply(sum(value)))
        elif tag is Answer.DUMP_CONFIG:
            s.send_reply(compose_dump_config(value))

    def alias_request(self, command: Any, resolved: Resolved) -> None:
        """An alias only takes SETs (forwarded to its destinations); reads find nothing."""
        s = self.s
        context = self.context
        if type(command) is p.Set:
            if not context.writes_allowed(s.session):
                s.refuse_now(p.SERVER_ERROR)
                return
            context.stats.cmd_set += 1
            expiry = p.expiry_from_exptime(command.exptime)
            context.collection.tell(AliasAdd(resolved.name, command.data, expiry, s.reply_to(Answer.ALIAS_SET)))
        elif type(command) is p.Get and not command.abort and (command.open or not command.close):
            s.count_fetch(command.peek)
            s.send_reply(p.END)
        else:
            s.send_reply(self.missing_queue_reply(command, None))

    # The request path's methods test ``type(command)`` on the command itself and name the
    # protocol's classes directly (not ``p.Set``): that narrows the command's type, so the
    # compiled build reads its fields natively and calls the protocol's functions directly.

    def compile(self, command: Any, ops: list[Any]) -> tuple[p.Bad | None, bool]:
        s = self.s
        if type(command) is SetCommand:
            self.context.stats.cmd_set += 1
            ops.append(s.add_op(command.data, expiry_from_exptime(command.exptime)))
            return None, False
        if type(command) is GetCommand:
            if command.abort:
                taken = s.take_open(command.queue, 1)
                if taken is not None:
                    ops.append(Unremove(runs=taken))
                return None, False
            if command.close:
                taken = s.take_open(command.queue, 1)
                if taken is not None:
                    ops.append(Confirm(runs=taken))
                if not command.open:
                    return None, False
            held_open = s.open_count(command.queue)
            if not command.open and not command.peek and held_open:
                return _ERROR_CLOSE, True
            if not self.context.reads_allowed(s.session):
                return _SERVER_ERROR_CLOSE, True
            if command.open and held_open and held_open >= self.context.config.max_open_transactions:
                return _ERROR_CLOSE, True
            fetch = Peek if command.peek else Open if command.open else Remove
            waits = s.fetch(fetch, command.timeout_ms, ops)
            return None, waits or command.open
        if type(command) is ConfirmCommand:
            xids = s.take_open(command.queue, command.count)
            if xids is None:
                return _ERROR_OPEN, False
            ops.append(Confirm(runs=xids))
            return None, False
        if type(command) is FlushCommand:
            ops.append(FLUSH)
            return None, False
        if type(command) is FlushExpiredCommand:
            ops.append(FLUSH_EXPIRED)
            return None, False
        raise AssertionError(command)

    def reply(self, command: Any, results: list[Any]) -> bytes:
        if type(command) is SetCommand:
            stored = results[0]
            if stored:
                return STORED
            if type(stored) is JournalFailure:
                return server_error(stored.message)  # not acknowledged; the connection stays
            return NOT_STORED
        if type(command) is GetCommand:
            if command.abort or (command.close and not command.open):
                return END
            item: Item | None = results[-1] if results else None
            if item is None:
                return END
            if command.stamp:
                return self.values.stamped(command.queue, item.data, item.add_time)
            return self.values.reply(command.queue, item.data)
        if type(command) is ConfirmCommand or type(command) is FlushCommand:
            return END
        if type(command) is FlushExpiredCommand:
            return count_reply(results[0])
        raise AssertionError(command)

    def add_reply(self, command: Any, results: list[Any], start: int, end: int, out: list[bytes]) -> None:
        # a hit's three parts, not joined: the session's flush joins the replies of a batch
        # once, where each reply joined copied its item's data one more time (ADR 0021)
        if type(command) is GetCommand and end > start and not command.abort and (command.open or not command.close):
            item: Item | None = results[end - 1]
            if item is not None:
                if command.stamp:
                    self.values.add_stamped_parts(out, command.queue, item.data, item.add_time)
                else:
                    self.values.add_parts(out, command.queue, item.data)
                return
        super().add_reply(command, results, start, end, out)

    def lone_reply(self, command: Any, results: list[Any]) -> bytes | None:
        if type(command) is GetCommand and results and results[-1] is not None:
            return None  # a hit, or what an abort or a close answers: add_reply's to tell
        return self.reply(command, results)

    def repeats(self, command: Any) -> bool:
        # a plain GET that does not wait: its compile depends on the connection's open reads of
        # its queue (it opens none) and the server's status (unchanged within a batch)
        return (type(command) is GetCommand and command.timeout_ms is None and not command.open
                and not command.close and not command.abort and not command.peek)

    def repeated(self, command: Any, count: int) -> None:
        self.context.stats.cmd_get += count  # as ``SessionActor.fetch`` counts each

    def add_replies(self, command: Any, results: list[Any], start: int, end: int, out: list[bytes]) -> None:
        # repeats of a plain GET (``repeats``): each a hit's three parts or END, as add_reply
        # makes them, for a burst in one native loop
        if type(command) is not GetCommand:
            super().add_replies(command, results, start, end, out)
            return
        queue = command.queue
        values = self.values
        item: Item | None
        if not command.stamp:
            datas: list[bytes | None] = []
            for index in range(start, end):
                item = results[index]
                datas.append(None if item is None else item.data)
            values.add_hits(out, queue, datas)
            return
        for index in range(start, end):
            item = results[index]
            if item is None:
                out.append(END)
            else:
                values.add_stamped_parts(out, queue, item.data, item.add_time)

    def release(self) -> None:
        pass  # everything a memcache/text client holds is in the session's open reads

    def goes_to_queue(self, command: Any) -> bool:
        return True

    def queue_of(self, command: Any) -> str:
        # a SET or a GET (nearly every request): its queue read natively
        if type(command) is SetCommand:
            return command.queue
        if type(command) is GetCommand:
            return command.queue
        return super().queue_of(command)

    def joins(self, command: Any, queue: str) -> bool:
        # a pipelined GET or SET (the usual follower): its queue read natively
        if type(command) is GetCommand:
            return command.queue == queue
        if type(command) is SetCommand:
            return command.queue == queue
        return type(command) in self.QUEUE_KINDS and command.queue == queue

    def creates(self, command: Any) -> bool:
        if type(command) is GetCommand:
            return not command.abort and (command.open or not command.close)
        return type(command) is SetCommand

    def missing_queue_reply(self, command: Any, opened: OpenXids | None) -> bytes:
        if type(command) is ConfirmCommand:
            return p.ERROR if opened is None or opened.take(command.count) is None else END
        if type(command) is GetCommand:
            if (command.close or command.abort) and opened is not None:
                opened.take(1)
            return END
        if type(command) is FlushExpiredCommand:
            return count_reply(0)
        return END

    def item_reply(self, queue: str, data: bytes) -> bytes:
        return self.values.reply(queue, data)

    def stamped_item_reply(self, queue: str, item: Item) -> bytes:
        return self.values.stamped(queue, item.data, item.add_time)

    def add_item_replies(self, queue: str, items: list[Any], stamped: bool, out: list[bytes]) -> None:
        values = self.values
        item: Item
        follows = False
        for item in items:  # typed: the compiled build reads its fields natively
            values.add_stream_parts(out, queue, item.data, item.add_time, stamped, follows)
            follows = True
        if follows:
            values.end_stream(out)

    def server_error_reply(self, message: str) -> bytes:
        return p.server_error(message)

    def _start_monitor(self, command: p.Monitor) -> None:
        s = self.s
        context = self.context
        if not context.reads_allowed(s.session):
            s.refuse_silently()
            return
        config = context.config
        max_items = command.max_items if command.max_items is not None else config.max_open_transactions
        limit = min(max(max_items, config.max_open_transactions), config.monitor_max_items)
        s.start_monitor(command.queue, time.monotonic() + command.seconds, max_items, limit, command.stamp)
