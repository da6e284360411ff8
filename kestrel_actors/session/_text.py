"""The text protocol handler (port 2222, behaviour §3).

Same queues, same session as memcache; only the commands and the reply formats differ. Every
text fetch is transactional and first confirms whatever this connection holds open on the
queue; errors are ``-message`` lines and never close the connection.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, ClassVar

from .. import protocol as p
from ..messages import FLUSH, Add, AliasAdd, Confirm, Gather, Open, Peek, Resolved, first_failure
from ..protocol import _text as t
from ..protocol import _text_commands as tc
from ..queue import epoch_ms
from ._actor import Answer, take_oldest
from ._handler import Handler

__all__ = ["TextHandler"]


class TextHandler(Handler):
    """Kestrel's ``TextHandler``: text commands to queue operations, results to text lines."""

    QUEUE_KINDS: ClassVar[frozenset[type]] = frozenset((tc.TextPut, tc.TextGet, tc.TextConfirm, tc.TextFlush))
    MONITOR_END: ClassVar[bytes] = t.TEXT_NO_ITEM
    QUIT: ClassVar[type] = tc.TextQuit
    WRITE_REFUSALS: ClassVar[dict[type, p.Bad]] = {}  # text commands check their own and stay open

    def __init__(self, session: Any) -> None:
        self.s = session
        self.context = session.context

    def release(self) -> None:
        pass  # everything a memcache/text client holds is in the session's open reads

    def goes_to_queue(self, command: Any) -> bool:
        # an empty put adds nothing and creates no queue: it is answered locally
        return type(command) is not tc.TextPut or bool(command.items)

    def creates(self, command: Any) -> bool:
        return type(command) in (tc.TextPut, tc.TextGet)

    def missing_queue_reply(self, command: Any, opened: deque[int] | None) -> bytes:
        if type(command) is tc.TextConfirm:
            if take_oldest(opened, command.count) is None:
                return t.TEXT_NOT_THAT_MANY
            return t.text_count(command.count)
        if type(command) is tc.TextFlush and not self.context.writes_allowed(self.s.session):
            # Kestrel checks the status before it looks the queue up (behaviour §3, §7.2): a flush of a
            # missing queue is refused like any other, not answered +0
            return t.text_unavailable(t.TEXT_OP_FLUSH)
        return t.TEXT_ZERO

    def item_reply(self, queue: str, data: bytes) -> bytes:
        return t.text_item(data)

    def server_error_reply(self, message: str) -> bytes:
        return t.text_error(message)

    def compile(self, command: Any, ops: list[Any]) -> tuple[p.Bad | None, bool]:
        kind = type(command)
        s = self.s
        context = self.context
        if kind is tc.TextPut:
            if not context.writes_allowed(s.session):
                return _unavailable(t.TEXT_OP_SET_ITEM), False
            expiry = tc.text_expiry(command.expiry_ms, epoch_ms()) or 0
            context.stats.cmd_set += len(command.items)
            ops.extend(Add(item, expiry) for item in command.items)
            return None, False
        if kind is tc.TextGet:
            self._confirm_all(command.queue, ops)
            if not context.reads_allowed(s.session):
                return _unavailable(t.TEXT_OP_GET_ITEM), True
            limit = context.config.max_open_transactions
            if not command.peek and len(s.open_reads.get(command.queue, ())) >= limit:
                return p.Bad(t.text_too_many_open(limit), close=False), True
            s.fetch(Peek if command.peek else Open, command.timeout_ms, ops)
            return None, True
        if kind is tc.TextConfirm:
            xids = take_oldest(s.open_reads.get(command.queue), command.count)
            if xids is None:
                return p.Bad(t.TEXT_NOT_THAT_MANY, close=False), False
            ops.append(Confirm(xids))
            return None, False
        if kind is tc.TextFlush:
            if not context.writes_allowed(s.session):
                return _unavailable(t.TEXT_OP_FLUSH), False
            ops.append(FLUSH)
            return None, False
        raise AssertionError(command)

    def reply(self, command: Any, results: list[Any]) -> bytes:
        kind = type(command)
        if kind is tc.TextPut:
            failure = first_failure(results)
            if failure is not None:  # the text protocol's SERVER_ERROR: an error line
                return t.text_error(failure.message)
            return t.text_count(sum(1 for stored in results if stored))
        if kind is tc.TextGet:
            item = results[-1] if results else None
            if item is None:
                return t.TEXT_NO_ITEM
            return t.text_item(item.data)
        if kind is tc.TextConfirm:
            return t.text_count(command.count)
        return t.TEXT_ZERO

    def local(self, command: Any) -> None:
        kind = type(command)
        s = self.s
        context = self.context
        if kind is tc.TextPut:  # with no items
            s.out.append(t.TEXT_ZERO)
        elif kind is tc.TextMonitor:
            self._start_monitor(command)
        elif kind is tc.TextDelete:
            if not context.writes_allowed(s.session):
                s.out.append(t.text_unavailable(t.TEXT_OP_DELETE))
                return
            s.delete_queue(command.queue)
        elif kind is tc.TextStatus:
            name = context.status_command(command.name)
            s.out.append(t.TEXT_ZERO if name is None else t.text_string(name))
        elif kind is tc.TextVersion:
            s.out.append(t.text_string(context.version))
        elif kind is tc.TextShutdown:
            s.out.append(t.TEXT_ZERO)
            s.shutdown()
        else:
            s.not_implemented(command)

    def answered(self, tag: Answer, value: Any) -> None:
        if tag is Answer.DELETE:
            self.s.out.append(t.TEXT_ZERO)
        elif tag is Answer.ALIAS_PUT:
            # Kestrel counts an item when setItem returned true: every destination took it
            failure = first_failure(result for results in value for result in results)
            if failure is not None:
                self.s.out.append(t.text_error(failure.message))
            else:
                self.s.out.append(t.text_count(sum(1 for results in value if all(results))))

    def alias_request(self, command: Any, resolved: Resolved) -> None:
        """Text requests on an alias (behaviour §5.10): put adds each item to every destination; get
        and peek find nothing (``*``)."""
        kind = type(command)
        s = self.s
        context = self.context
        if kind is tc.TextPut:
            if not context.writes_allowed(s.session):
                s.out.append(t.text_unavailable(t.TEXT_OP_SET_ITEM))
                return
            items = command.items
            context.stats.cmd_set += len(items)
            expiry = tc.text_expiry(command.expiry_ms, epoch_ms()) or 0
            gather = Gather(len(items), s.reply_to(Answer.ALIAS_PUT).tell)
            for item in items:  # one AliasAdd per item, in order, as Kestrel's setItem loop
                context.collection.tell(AliasAdd(resolved.name, item, expiry, gather))
        elif kind is tc.TextGet:
            if not context.reads_allowed(s.session):
                s.out.append(t.text_unavailable(t.TEXT_OP_GET_ITEM))
                return
            s.count_fetch(command.peek)
            s.out.append(t.TEXT_NO_ITEM)
        else:
            s.out.append(self.missing_queue_reply(command, None))

    def _confirm_all(self, queue: str, ops: list[Any]) -> None:
        """Kestrel's ``closeAllReads``: a text fetch first confirms what is open on the queue."""
        opened = self.s.open_reads.get(queue)
        if opened:
            ops.append(Confirm(tuple(opened)))
            opened.clear()

    def _start_monitor(self, command: tc.TextMonitor) -> None:
        s = self.s
        confirm: list[Any] = []
        self._confirm_all(command.queue, confirm)
        if confirm:  # ordered before the monitor's own batch on the same queue actor
            s.tell_queue(command.queue, confirm[0])
        if not self.context.reads_allowed(s.session):
            s.out.append(t.text_unavailable(t.TEXT_OP_MONITOR))
            return
        limit = self.context.config.max_open_transactions
        s.start_monitor(command.queue, time.monotonic() + command.timeout_ms / 1000.0, limit, limit)


def _unavailable(op: str) -> p.Bad:
    return p.Bad(t.text_unavailable(op), close=False)
