"""The text protocol handler (port 2222, behaviour §3).

Same queues, same session as memcache; only the commands and the reply formats differ. Every
text fetch is transactional and first confirms whatever this connection holds open on the
queue; errors are ``-message`` lines and never close the connection.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from .. import protocol as p
from ..messages import FLUSH, Add, AliasAdd, Confirm, Gather, Open, Peek, Resolved, first_failure
from ..queue import epoch_ms
from ._handler import Answer, Handler, HandlerSession
from ._opened import OpenXids

__all__ = ["TextHandler"]


class TextHandler(Handler):
    """Kestrel's ``TextHandler``: text commands to queue operations, results to text lines."""

    QUEUE_KINDS: ClassVar[frozenset[type]] = frozenset((p.TextPut, p.TextGet, p.TextConfirm, p.TextFlush))
    MONITOR_END: ClassVar[bytes] = p.TEXT_NO_ITEM
    QUIT: ClassVar[type] = p.TextQuit
    WRITE_REFUSALS: ClassVar[dict[type, p.Bad]] = {}  # text commands check their own and stay open

    def __init__(self, session: HandlerSession) -> None:
        self.s = session
        self.context = session.context

    def release(self) -> None:
        pass  # everything a memcache/text client holds is in the session's open reads

    def goes_to_queue(self, command: Any) -> bool:
        # an empty put adds nothing and creates no queue: it is answered locally
        return type(command) is not p.TextPut or bool(command.items)

    def creates(self, command: Any) -> bool:
        return type(command) in (p.TextPut, p.TextGet)

    def missing_queue_reply(self, command: Any, opened: OpenXids | None) -> bytes:
        if type(command) is p.TextConfirm:
            if opened is None or opened.take(command.count) is None:
                return p.TEXT_NOT_THAT_MANY
            return p.text_count(command.count)
        if type(command) is p.TextFlush and not self.context.writes_allowed(self.s.session):
            # Kestrel checks the status before it looks the queue up (behaviour §3, §7.2): a flush of a
            # missing queue is refused like any other, not answered +0
            return p.text_unavailable(p.TEXT_OP_FLUSH)
        return p.TEXT_ZERO

    def item_reply(self, queue: str, data: bytes) -> bytes:
        return p.text_item(data)

    def server_error_reply(self, message: str) -> bytes:
        return p.text_error(message)

    def compile(self, command: Any, ops: list[Any]) -> tuple[p.Bad | None, bool]:
        kind = type(command)
        s = self.s
        context = self.context
        if kind is p.TextPut:
            if not context.writes_allowed(s.session):
                return _unavailable(p.TEXT_OP_SET_ITEM), False
            expiry = p.text_expiry(command.expiry_ms, epoch_ms()) or 0
            context.stats.cmd_set += len(command.items)
            ops.extend(Add(item, expiry) for item in command.items)
            return None, False
        if kind is p.TextGet:
            self._confirm_all(command.queue, ops)
            if not context.reads_allowed(s.session):
                return _unavailable(p.TEXT_OP_GET_ITEM), True
            limit = context.config.max_open_transactions
            if not command.peek and s.open_count(command.queue) >= limit:
                return p.Bad(p.text_too_many_open(limit), close=False), True
            s.fetch(Peek if command.peek else Open, command.timeout_ms, ops)
            return None, True
        if kind is p.TextConfirm:
            xids = s.take_open(command.queue, command.count)
            if xids is None:
                return p.Bad(p.TEXT_NOT_THAT_MANY, close=False), False
            ops.append(Confirm(runs=xids))
            return None, False
        if kind is p.TextFlush:
            if not context.writes_allowed(s.session):
                return _unavailable(p.TEXT_OP_FLUSH), False
            ops.append(FLUSH)
            return None, False
        raise AssertionError(command)

    def reply(self, command: Any, results: list[Any]) -> bytes:
        kind = type(command)
        if kind is p.TextPut:
            failure = first_failure(results)
            if failure is not None:  # the text protocol's SERVER_ERROR: an error line
                return p.text_error(failure.message)
            return p.text_count(sum(1 for stored in results if stored))
        if kind is p.TextGet:
            item = results[-1] if results else None
            if item is None:
                return p.TEXT_NO_ITEM
            return p.text_item(item.data)
        if kind is p.TextConfirm:
            return p.text_count(command.count)
        return p.TEXT_ZERO

    def local(self, command: Any) -> None:
        kind = type(command)
        s = self.s
        context = self.context
        if kind is p.TextPut:  # with no items
            s.send_reply(p.TEXT_ZERO)
        elif kind is p.TextMonitor:
            self._start_monitor(command)
        elif kind is p.TextDelete:
            if not context.writes_allowed(s.session):
                s.send_reply(p.text_unavailable(p.TEXT_OP_DELETE))
                return
            s.delete_queue(command.queue)
        elif kind is p.TextStatus:
            name = context.status_command(command.name)
            s.send_reply(p.TEXT_ZERO if name is None else p.text_string(name))
        elif kind is p.TextVersion:
            s.send_reply(p.text_string(context.version))
        elif kind is p.TextShutdown:
            s.send_reply(p.TEXT_ZERO)
            s.shutdown()
        else:
            s.not_implemented(command)

    def answered(self, tag: Answer, value: Any) -> None:
        if tag is Answer.DELETE:
            self.s.send_reply(p.TEXT_ZERO)
        elif tag is Answer.ALIAS_PUT:
            # Kestrel counts an item when setItem returned true: every destination took it
            failure = first_failure(result for results in value for result in results)
            if failure is not None:
                self.s.send_reply(p.text_error(failure.message))
            else:
                self.s.send_reply(p.text_count(sum(1 for results in value if all(results))))

    def alias_request(self, command: Any, resolved: Resolved) -> None:
        """Text requests on an alias (behaviour §5.10): put adds each item to every destination; get
        and peek find nothing (``*``)."""
        kind = type(command)
        s = self.s
        context = self.context
        if kind is p.TextPut:
            if not context.writes_allowed(s.session):
                s.send_reply(p.text_unavailable(p.TEXT_OP_SET_ITEM))
                return
            items = command.items
            context.stats.cmd_set += len(items)
            expiry = p.text_expiry(command.expiry_ms, epoch_ms()) or 0
            gather = Gather(len(items), s.reply_to(Answer.ALIAS_PUT).tell)
            for item in items:  # one AliasAdd per item, in order, as Kestrel's setItem loop
                context.collection.tell(AliasAdd(resolved.name, item, expiry, gather))
        elif kind is p.TextGet:
            if not context.reads_allowed(s.session):
                s.send_reply(p.text_unavailable(p.TEXT_OP_GET_ITEM))
                return
            s.count_fetch(command.peek)
            s.send_reply(p.TEXT_NO_ITEM)
        else:
            s.send_reply(self.missing_queue_reply(command, None))

    def _confirm_all(self, queue: str, ops: list[Any]) -> None:
        """Kestrel's ``closeAllReads``: a text fetch first confirms what is open on the queue."""
        runs = self.s.take_all_open(queue)
        if runs:
            ops.append(Confirm(runs=runs))

    def _start_monitor(self, command: p.TextMonitor) -> None:
        s = self.s
        confirm: list[Any] = []
        self._confirm_all(command.queue, confirm)
        if confirm:  # ordered before the monitor's own batch on the same queue actor
            s.tell_queue(command.queue, confirm[0])
        if not self.context.reads_allowed(s.session):
            s.send_reply(p.text_unavailable(p.TEXT_OP_MONITOR))
            return
        limit = self.context.config.max_open_transactions
        s.start_monitor(command.queue, time.monotonic() + command.timeout_ms / 1000.0, limit, limit)


def _unavailable(op: str) -> p.Bad:
    return p.Bad(p.text_unavailable(op), close=False)
