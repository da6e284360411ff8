"""The connection actor of the text protocol (port 2222, reference §3).

Same queues, same actors, same request loop as memcache; only the commands and the reply
formats differ. Every text fetch is transactional and first confirms whatever this connection
holds open on the queue; errors are ``-message`` lines and never close the connection.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from .. import protocol as p
from ..protocol import _text as t
from ..protocol import _text_commands as tc
from ._collection import AliasAdd, Delete, Gather, Resolved
from ._connection import ConnectionActor, _first_failure
from ._messages import OP_ADD, OP_CONFIRM, OP_FLUSH, OP_OPEN, OP_PEEK
from ._queue_core import epoch_ms
from ._session import _pop_oldest, _ReplyTo

__all__ = ["TextConnectionActor"]


class TextConnectionActor(ConnectionActor):
    """Session logic of one text-protocol client."""

    QUEUE_KINDS = frozenset((tc.TextPut, tc.TextGet, tc.TextConfirm, tc.TextFlush))
    MONITOR_END = t.TEXT_NO_ITEM
    WRITE_REFUSALS: dict[type, p.Bad] = {}  # text commands check their own and stay open

    # -- hooks of the request loop --------------------------------------------------------

    def _goes_to_queue(self, command: Any) -> bool:
        # an empty put adds nothing and creates no queue: it is answered locally
        return type(command) is not tc.TextPut or bool(command.items)

    def _creates(self, command: Any) -> bool:
        return type(command) in (tc.TextPut, tc.TextGet)

    def _missing_queue_reply(self, command: Any, opened: deque[int] | None) -> bytes:
        if type(command) is tc.TextConfirm:
            return t.text_count(command.count) if _pop_oldest(opened, command.count) else t.TEXT_NOT_THAT_MANY
        if type(command) is tc.TextFlush and not self.server.writes_allowed(self.session):
            # Kestrel checks the status before it looks the queue up (§3, §7.2): a flush of a
            # missing queue is refused like any other, not answered +0
            return t.text_unavailable(t.TEXT_OP_FLUSH)
        return t.TEXT_ZERO

    def _item_reply(self, queue: str, data: bytes) -> bytes:
        return t.text_item(data)

    def _server_error_reply(self, message: str) -> bytes:
        return t.text_error(message)

    def _compile(self, command: Any, ops: list[tuple]) -> tuple[p.Bad | None, bool]:
        kind = type(command)
        server = self.server
        if kind is tc.TextPut:
            if not server.writes_allowed(self.session):
                return _unavailable(t.TEXT_OP_SET_ITEM), False
            expiry = tc.text_expiry(command.expiry_ms, epoch_ms()) or 0
            server.stats.cmd_set += len(command.items)
            ops.extend((OP_ADD, item, expiry) for item in command.items)
            return None, False
        if kind is tc.TextGet:
            self._confirm_all(command.queue, ops)
            if not server.reads_allowed(self.session):
                return _unavailable(t.TEXT_OP_GET_ITEM), True
            limit = server.config.max_open_transactions
            if not command.peek and len(self.open_reads.get(command.queue, ())) >= limit:
                return p.Bad(t.text_too_many_open(limit), close=False), True
            self._fetch(OP_PEEK if command.peek else OP_OPEN, command.timeout_ms, ops)
            return None, True
        if kind is tc.TextConfirm:
            opened = self.open_reads.get(command.queue)
            count = command.count
            if count <= 0 or not opened or count > len(opened):
                return p.Bad(t.TEXT_NOT_THAT_MANY, close=False), False
            ops.append((OP_CONFIRM, tuple(opened.popleft() for _ in range(count))))
            return None, False
        if kind is tc.TextFlush:
            if not server.writes_allowed(self.session):
                return _unavailable(t.TEXT_OP_FLUSH), False
            ops.append((OP_FLUSH,))
            return None, False
        raise AssertionError(command)

    def _reply(self, command: Any, results: list[Any]) -> bytes:
        kind = type(command)
        if kind is tc.TextPut:
            failure = _first_failure(results)
            if failure is not None:  # the text protocol's SERVER_ERROR: an error line
                return t.text_error(failure.message)
            return t.text_count(sum(1 for stored in results if stored))
        if kind is tc.TextGet:
            item = results[-1] if results else None
            if item is None:
                return t.TEXT_NO_ITEM
            if not command.peek:
                self.open_reads.setdefault(command.queue, deque()).append(item.xid)
            return t.text_item(item.data)
        if kind is tc.TextConfirm:
            return t.text_count(command.count)
        return t.TEXT_ZERO

    def _local(self, command: Any) -> None:
        kind = type(command)
        server = self.server
        if kind is tc.TextPut:  # with no items
            self.out.append(t.TEXT_ZERO)
        elif kind is tc.TextMonitor:
            self._start_text_monitor(command)
        elif kind is tc.TextDelete:
            if not server.writes_allowed(self.session):
                self.out.append(t.text_unavailable(t.TEXT_OP_DELETE))
                return
            self.refs.pop(command.queue, None)
            self.waiting = "delete"
            server.collection.tell(Delete(command.queue, _ReplyTo(self.actor_ref, "delete")))
        elif kind is tc.TextStatus:
            if command.name is None:
                self.out.append(t.text_string(server.status.status.reply_name))
            else:
                server.status.set(command.name)
                self.out.append(t.TEXT_ZERO)
        elif kind is tc.TextVersion:
            self.out.append(t.text_string(server.version))
        elif kind is tc.TextShutdown:
            self.out.append(t.TEXT_ZERO)
            server.shutdown()
        elif kind is tc.TextQuit:
            self.closing = True
        else:
            super()._local(command)

    def _answer(self, answer: Any) -> None:
        if answer.tag == "delete":
            self.waiting = None
            self.out.append(t.TEXT_ZERO)
        elif answer.tag == "alias_put":
            # Kestrel counts an item when setItem returned true: every destination took it
            self.waiting = None
            failure = _first_failure(result for results in answer.value for result in results)
            if failure is not None:
                self.out.append(t.text_error(failure.message))
            else:
                self.out.append(t.text_count(sum(1 for results in answer.value if all(results))))
        else:
            super()._answer(answer)

    def _alias_request(self, resolved: Resolved) -> None:
        """Text requests on an alias (§5.10): put adds each item to every destination; get
        and peek find nothing (``*``). The memcache version only knows SET and GET."""
        command = self.pending[0]
        kind = type(command)
        server = self.server
        if kind is tc.TextPut:
            self.pending.popleft()
            if not server.writes_allowed(self.session):
                self.out.append(t.text_unavailable(t.TEXT_OP_SET_ITEM))
                return
            items = command.items
            server.stats.cmd_set += len(items)
            expiry = tc.text_expiry(command.expiry_ms, epoch_ms()) or 0
            self.waiting = "alias_put"
            gather = Gather(len(items), _ReplyTo(self.actor_ref, "alias_put").tell)
            for item in items:  # one AliasAdd per item, in order, as Kestrel's setItem loop
                server.collection.tell(AliasAdd(resolved.name, item, expiry, gather))
        elif kind is tc.TextGet:
            self.pending.popleft()
            if not server.reads_allowed(self.session):
                self.out.append(t.text_unavailable(t.TEXT_OP_GET_ITEM))
                return
            if command.peek:
                server.stats.cmd_peek += 1
            else:
                server.stats.cmd_get += 1
            self.out.append(t.TEXT_NO_ITEM)
        else:
            super()._alias_request(resolved)

    # -- helpers --------------------------------------------------------------------------

    def _confirm_all(self, queue: str, ops: list[tuple]) -> None:
        """Kestrel's ``closeAllReads``: a text fetch first confirms what is open on the queue."""
        opened = self.open_reads.get(queue)
        if opened:
            ops.append((OP_CONFIRM, tuple(opened)))
            opened.clear()

    def _start_text_monitor(self, command: tc.TextMonitor) -> None:
        confirm: list[tuple] = []
        self._confirm_all(command.queue, confirm)
        if confirm:  # ordered before the monitor's own batch on the same queue actor
            self._tell_queue(command.queue, confirm[0])
        if not self.server.reads_allowed(self.session):
            self.out.append(t.text_unavailable(t.TEXT_OP_MONITOR))
            return
        limit = self.server.config.max_open_transactions
        deadline = time.monotonic() + command.timeout_ms / 1000.0
        self.server.stats.cmd_monitor += 1
        self.monitor = [command.queue, deadline, limit, limit]
        self._monitor_next()


def _unavailable(op: str) -> p.Bad:
    return p.Bad(t.text_unavailable(op), close=False)
