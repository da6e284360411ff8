"""The logic of one queue, as Kestrel's ``PersistentQueue`` has it, with no actors and no I/O.

:class:`QueueCore` is a plain object: the queue actor owns one and calls it from its handlers,
and tests can drive it directly. Time comes in as an argument (epoch milliseconds), so expiry
is deterministic. Every change is reported to the queue's journal in the order it happens.

What the items in memory hold (``mem_bytes``) is told to the process's ``_malloc.HELD`` as it
changes, so that the memory of items read goes back to the system (ADR 0011).

Read-behind (behaviour §5.8): once the queue holds ``max_memory_size`` bytes, new items go only to the
journal, and each removal refills memory from the journal. So ``length`` and ``bytes`` count
every item, while ``items`` and ``mem_bytes`` are what is in memory. With a file journal,
``check_rotate`` and ``read_behind`` do file I/O on gevent's threadpool, suspending only the
calling (queue actor) greenlet.

``metrics``, when set (the queue actor sets it), gets each read-behind fill's duration
(``fill_readbehind_usec``).
"""

from __future__ import annotations

import time
from typing import Any, Final, Protocol

from .._malloc import HELD, HeldMemory
from ..config import QueueConfig
from ..messages import XidRun
from ._items import PackedItems
from ._journal import Item, Journal
from ._open import OpenReads
from ._rules import XID_MAX, epoch_ms, next_xid

__all__ = ["QueueCore", "QueueLimits", "QueueSamples", "epoch_ms", "take_head"]

_perf_counter: Final = time.perf_counter

_NATIVE_INT_MAX: Final = (1 << 62) - 1
"""The largest int compiled code holds unboxed. Kestrel's "no limit" defaults (``LONG_MAX``)
are above it: each comparison with one boxed both sides, two allocations per SET (issue 24).
No queue reaches this many items or bytes, so a limit clamped to it is the same limit."""

FILL_BATCH: Final = 256
"""Items one removal brings into memory at most while the queue is in read-behind."""

FILL_SLACK: Final = 256 * 1024
"""How far below ``max_memory_size`` (at most an eighth of it) a queue in read-behind lets its
memory fall before it reads items back: a run of them per fill, instead of one per removal
that paid a fill's calls and timing per item read back (issue 57 point 4)."""

STAT_NAMES = (
    "items",
    "bytes",
    "total_items",
    "logsize",
    "expired_items",
    "mem_items",
    "mem_bytes",
    "age",
    "discarded",
    "waiters",
    "open_transactions",
    "transactions",
    "canceled_transactions",
    "total_flushes",
    "journal_rewrites",
    "journal_rotations",
)


class QueueSamples(Protocol):
    """Where a queue records its per-queue metrics (an ``actors.QueueMetrics``)."""

    def histogram(self, name: str) -> Any: ...


class HeldItems(Protocol):
    """A queue's items and what they count: a :class:`QueueCore`, or a journal replay's result."""

    items: PackedItems
    length: int
    bytes: int
    mem_bytes: int


def take_head(queue: HeldItems) -> Item:
    """Remove the in-memory head of ``queue`` (not empty) and count it out.

    The one rule for what an item leaving a queue takes with it, kept by a journal replay
    rebuilding a queue and, written out on its own type, by the live queue
    (``QueueCore._pop_head``).
    """
    item = queue.items.popleft()
    size = len(item.data)
    queue.length -= 1
    queue.bytes -= size
    queue.mem_bytes -= size
    return item


class QueueLimits:
    """The settings a queue reads for every request, copied out of its ``QueueConfig``.

    ``QueueConfig`` is an interpreted dataclass: compiled code reads each of its fields by name
    (six per SET). These copies are read natively (ADR 0015).
    """

    __slots__ = ("max_items", "max_size", "max_item_size", "max_age", "max_memory_size",
                 "discard_old_when_full", "open_transaction_timeout", "max_journal_size",
                 "default_journal_size", "fanout_only", "refill_below")

    def __init__(self, config: QueueConfig) -> None:
        self.max_items: int = min(config.max_items, _NATIVE_INT_MAX)
        self.max_size: int = min(config.max_size, _NATIVE_INT_MAX)
        self.max_item_size: int = min(config.max_item_size, _NATIVE_INT_MAX)
        self.max_age: float | None = config.max_age
        self.max_memory_size: int = min(config.max_memory_size, _NATIVE_INT_MAX)
        # read-behind refills memory once it holds less than this (FILL_SLACK)
        self.refill_below: int = self.max_memory_size - min(self.max_memory_size // 8, FILL_SLACK)
        self.discard_old_when_full: bool = config.discard_old_when_full
        self.open_transaction_timeout: float | None = config.open_transaction_timeout
        # read by the journal's rotation_due, once per request of a queue run on the hub
        self.max_journal_size: int = min(config.max_journal_size, _NATIVE_INT_MAX)
        self.default_journal_size: int = min(config.default_journal_size, _NATIVE_INT_MAX)
        self.fanout_only: bool = config.fanout_only  # read by the queue actor for every add


class QueueCore:
    """Items, open reads and counters of one queue (behaviour §5)."""

    _config: QueueConfig
    limits: QueueLimits
    """What the request path reads of ``config``; set with it."""

    def __init__(self, name: str, config: QueueConfig, journal: Journal) -> None:
        self.name = name
        self.config = config
        self.journal = journal
        self.items = PackedItems()
        """The items in memory, head first, packed (issue 56 point 4)."""
        self.length = 0
        self.bytes = 0
        self.mem_bytes = 0
        self.held: HeldMemory = HELD
        """Told of every change of ``mem_bytes`` (an attribute: the compiled build calls it natively)."""
        self.open_reads = OpenReads()
        """Open reads by xid, oldest first (each item's ``opened`` says when), held as runs of
        consecutive xids."""
        self._xid = 0
        self._xids_fresh = True
        """No xid above ``_xid`` is open: xids rise from an empty table until they wrap, so the
        next needs no look-up in ``open_reads`` (one per open read, ADR 0022) until then, and
        :meth:`open_many` opens a run of them at once."""
        self.total_items = 0
        self.put_bytes = 0
        """Bytes added since this queue object was made (ostrich's ``q/<name>/put_bytes``)."""
        self.expired_items = 0
        self.discarded = 0
        self.transactions = 0
        self.canceled_transactions = 0
        self.total_flushes = 0
        self.last_removed_add_time = 0
        self.closed = False
        self.expired_out: list[Item] = []
        """Expired items bound for ``expire_to_queue``; the owner drains and forwards them."""
        self.expired_holds: list[int] = []
        """Journal hold tokens taken for ``expired_out`` (one per item moved to another
        queue, in order): the owner releases each once the target's ADD is durable."""
        self.metrics: QueueSamples | None = None

    @property
    def config(self) -> QueueConfig:
        return self._config

    @config.setter
    def config(self, config: QueueConfig) -> None:  # at creation and on a reload
        self._config = config
        self.limits = QueueLimits(config)

    # -- adding ---------------------------------------------------------------------------

    def add(self, data: bytes, expiry: int, now_ms: int) -> bool:
        """Append an item; ``False`` when refused (too big, full, closed) as behaviour §2.4 lists."""
        limits = self.limits
        if self.closed or len(data) > limits.max_item_size:
            return False
        self.discard_expired(now_ms)
        while self.length >= limits.max_items or self.bytes >= limits.max_size:
            if not limits.discard_old_when_full or not self.length or self._pop_head() is None:
                return False
            self.journal.remove()
            self._fill_read_behind()
            self.discarded += 1
        if limits.max_age is not None:
            age_cap = now_ms + int(limits.max_age * 1000)
            expiry = age_cap if expiry == 0 else min(expiry, age_cap)
        item = Item(data, now_ms, expiry)
        journal = self.journal
        journal.check_rotate(self)
        behind = journal.in_read_behind
        if not behind and self.bytes >= limits.max_memory_size:
            journal.start_read_behind()
            behind = journal.in_read_behind
        journal.add(item)
        size = len(data)
        if not behind:
            self.items.append(item)
            self.mem_bytes += size
            self.held.moved(size)
        self.length += 1
        self.bytes += size
        self.total_items += 1
        self.put_bytes += size
        return True

    # -- removing -------------------------------------------------------------------------

    def remove(self, now_ms: int, transactional: bool = False) -> Item | None:
        """Take the head item for good, or open it under a new xid when ``transactional``."""
        if self.closed:
            return None
        if self.limits.open_transaction_timeout is not None:
            self._time_out_oldest_open(now_ms)
        if transactional and self.length:
            self.transactions += 1
        self.discard_expired(now_ms)
        if not self.length:
            return None
        item = self._pop_head()
        if item is None:
            return None  # read-behind waits for records the journal could not write yet
        self.last_removed_add_time = item.add_time
        if transactional:
            xid = self._next_xid()
            item.xid = xid
            item.opened = now_ms
            self.open_reads[xid] = item
            self.journal.remove_tentative(xid)
        else:
            self.journal.remove()
        self._fill_read_behind()
        self.journal.check_rotate(self)
        return item

    def remove_run(self, now_ms: int, count: int, budget: int, taken: list[Any]) -> int:
        """:meth:`remove` (for good) up to ``count`` times while the items taken hold less
        than ``budget`` bytes, each item appended to ``taken`` -> the bytes taken.

        A pipelined burst of plain GETs: what :meth:`remove` does per item, its REMOVE records
        journaled as one run and the rotation checked once, after the run (as a batch run on
        the hub leaves a rotation to its end). It stops, for :meth:`remove` to go on, at an
        empty queue and wherever :meth:`remove` would do more than take the head: an item that
        may expire (or a ``max_age``), a head still to be read back, open reads that may time
        out."""
        limits = self.limits
        if self.closed or limits.open_transaction_timeout is not None or limits.max_age is not None:
            return 0
        items = self.items
        journal = self.journal
        size = 0
        removed = 0
        unwritten = 0  # removes not yet handed to the journal
        while removed < count and size < budget and self.length:
            limit = budget - size
            if journal.in_read_behind:
                # up to the item that takes memory below the refill mark (_fill_due)
                limit = max(1, min(limit, self.mem_bytes - limits.refill_below + 1))
            start = len(taken)
            got = items.pop_run(count - removed, limit, taken)
            run = len(taken) - start
            if not run:
                break  # an item that may expire, or a head to read back
            self._count_out(run, got)
            size += got
            removed += run
            unwritten += run
            if self._fill_due():
                # a fill may wait for the disk while other greenlets run (a checkpoint takes
                # the queue's state and the journal's size): the removes are journaled first
                journal.remove_many(unwritten)
                unwritten = 0
                self._fill_read_behind()
        if removed:
            last: Item = taken[-1]
            self.last_removed_add_time = last.add_time
            if unwritten:
                journal.remove_many(unwritten)
            journal.check_rotate(self)
        return size

    def open_many(self, now_ms: int, limit: int, max_bytes: int) -> list[Item]:
        """:meth:`remove` with ``transactional`` up to ``limit`` times, or until the items opened
        hold ``max_bytes`` or more: those items, head first (a ``monitor``'s batch), each with its
        ``xid``.

        The heads are taken as runs (``PackedItems.pop_run``: each up to an item that may expire,
        or to the one that takes memory in read-behind below the refill mark), each run opened
        under consecutive xids in one step (``OpenReads.add_run``) and its REMOVE_TENTATIVE_XID
        records journaled together, in the order of the removals: before an expired head's
        REMOVE, before a read-behind fill (which may let other greenlets see the queue), and
        before the rotation check, made once for the call (ADR 0022). With
        ``open_transaction_timeout`` an open read may time out between two opens (an UNREMOVE
        between their records): the items are opened one by one."""
        items: list[Item] = []
        limits = self.limits
        if limits.open_transaction_timeout is not None:
            size = 0
            for _ in range(limit):
                item = self.remove(now_ms, transactional=True)
                if item is None:
                    break
                items.append(item)
                size += len(item.data)
                if size >= max_bytes:
                    break
            return items
        journal = self.journal
        open_reads = self.open_reads
        packed = self.items
        # with a ``max_age`` any head may have expired by its age: each is checked as remove does
        in_runs = limits.max_age is None
        size = 0
        while len(items) < limit and size < max_bytes and not self.closed and self.length:
            start = len(items)
            got = 0
            if in_runs:
                budget = max_bytes - size
                if journal.in_read_behind:
                    # up to the item that takes memory below the refill mark (_fill_due)
                    budget = max(1, min(budget, self.mem_bytes - limits.refill_below + 1))
                got = packed.pop_run(limit - start, budget, items)
            taken = len(items) - start
            if taken:
                self._count_out(taken, got)
            else:  # a head that may expire, or one still to be read back
                self.discard_expired(now_ms)
                if not self.length:
                    break
                if in_runs and self._head_never_expires():
                    continue  # the expired heads are gone: a run again
                head = self._pop_head()
                if head is None:
                    break  # read-behind waits for records the journal could not write yet
                items.append(head)
                got = len(head.data)
                taken = 1
            size += got
            self.transactions += taken
            self.last_removed_add_time = items[-1].add_time
            first = self._xid + 1
            if self._xids_fresh and self._xid <= XID_MAX - taken:
                self._xid += taken
                for index in range(start, start + taken):
                    item = items[index]
                    item.xid = first + index - start
                    item.opened = now_ms
                open_reads.add_run(first, items[start:])
                journal.remove_tentative_run(first, taken)
            else:  # wrapped: each xid skips those still open
                opened: list[int] = []
                for index in range(start, start + taken):
                    item = items[index]
                    xid = self._next_xid()
                    item.xid = xid
                    item.opened = now_ms
                    open_reads[xid] = item
                    opened.append(xid)
                journal.remove_tentative_many(opened)
            if self._fill_due():
                self._fill_read_behind()
        if items:
            journal.check_rotate(self)
        return items

    def put_back(self, item: Item) -> bool:
        """Return an item a plain GET removed but could not deliver (its client had gone).

        The journal has no record that adds at the head (its REMOVE takes the head, so memory
        and journal must agree on the order): the item is journaled as an add, with its own
        add time and expiry, and so goes back to the head when the queue is empty, the usual
        case (it was handed to a waiter because the queue was empty), else to the tail.
        Limits are not checked: the item was in the queue a moment ago.
        """
        if self.closed:
            return False
        item.xid = 0
        journal = self.journal
        journal.check_rotate(self)
        behind = journal.in_read_behind
        journal.add(item)
        size = len(item.data)
        if not behind:
            self.items.append(item)
            self.mem_bytes += size
            self.held.moved(size)
        self.length += 1
        self.bytes += size
        return True

    def peek(self, now_ms: int) -> Item | None:
        if self.closed:
            return None
        self.discard_expired(now_ms)
        return self._head()

    def confirm(self, xid: int) -> Item | None:
        """Drop open item ``xid`` for good and return it; ``None`` (nothing journaled) if it is
        unknown."""
        item = self.open_reads.pop(xid)
        if item is None:
            return None
        self.journal.confirm_remove(xid)
        return item

    def confirm_many(self, xids: tuple[int, ...], confirmed: list[Item]) -> int:
        """:meth:`confirm` of each of ``xids``, the items confirmed appended to ``confirmed``,
        their CONFIRM_REMOVE records journaled together -> how many were open.

        The confirm of a run a ``monitor`` opened (consecutive xids, all open) takes the run in
        one step (``OpenReads.pop_run``); any other set of xids is confirmed one by one."""
        open_reads = self.open_reads
        run = open_reads.pop_run(xids)
        if run is not None:
            confirmed.extend(run)
            self.journal.confirm_remove_run(xids[0], len(run))
            return len(run)
        done: list[int] = []
        for xid in xids:
            item = open_reads.pop(xid)
            if item is not None:
                done.append(xid)
                confirmed.append(item)
        if done:
            self.journal.confirm_remove_many(done)
        return len(done)

    def confirm_runs(self, runs: list[XidRun], confirmed: list[Item]) -> int:
        """:meth:`confirm_many` of the xids of ``runs`` (a session's, oldest first): a run all open
        in one of ``open_reads``' runs is taken in one step, its records laid from its ends."""
        open_reads = self.open_reads
        journal = self.journal
        total = 0
        for run in runs:
            first = run.first
            count = run.count
            taken = open_reads.pop_span(first, count)
            if taken is not None:
                confirmed.extend(taken)
                journal.confirm_remove_run(first, count)
                total += count
                continue
            done: list[int] = []
            for xid in range(first, first + count):
                item = open_reads.pop(xid)
                if item is not None:
                    done.append(xid)
                    confirmed.append(item)
            if done:
                journal.confirm_remove_many(done)
            total += len(done)
        return total

    def unremove(self, xid: int) -> bool:
        """Put open item ``xid`` back at the head; ``False`` if it is unknown."""
        item = self.open_reads.pop(xid)
        if item is None:
            return False
        item.xid = 0
        self.journal.unremove(xid)
        self.items.appendleft(item)  # an unremoved item always goes back into memory (behaviour §5.8)
        size = len(item.data)
        self.length += 1
        self.bytes += size
        self.mem_bytes += size
        self.held.moved(size)
        self.canceled_transactions += 1
        return True

    def flush(self, now_ms: int) -> None:
        """Remove every ready item (open reads stay open), one REMOVE each (behaviour §5.11)."""
        while self.length and self._pop_head() is not None:
            self.journal.remove()
            self._fill_read_behind()
            self.journal.check_rotate(self)
        self.total_flushes += 1

    def discard_expired(self, now_ms: int, limit: int | None = None) -> int:
        """Remove expired items at the head, at most ``max_expire_sweep`` (behaviour §5.6)."""
        if not self.length:
            return 0  # nothing to expire: an empty queue (a flood's SET, a blocking read's GET)
        items = self.items
        if items.count and not items.expiring and self.limits.max_age is None:
            # the common case, checked once per request: no item in memory expires, so neither
            # does the head, left unread (and packed: _head_never_expires cost ~100 an add)
            return 0
        if self._head_never_expires():
            return 0
        if limit is None:
            limit = self.config.max_expire_sweep
        max_age_ms = None if self.config.max_age is None else int(self.config.max_age * 1000)
        count = 0
        while count < limit:
            head = self._head()
            if head is None:
                break
            expiry = head.expiry
            if max_age_ms is not None:
                age_cap = head.add_time + max_age_ms
                expiry = age_cap if expiry == 0 else min(expiry, age_cap)
            if expiry == 0 or expiry >= now_ms:
                break
            self._pop_head()
            move = self.config.expire_to_queue
            if move and move != self.name:
                # durable-before-remove: this REMOVE reaches the disk only after the target's
                # ADD is durable (the queue actor releases the hold when the target says so)
                self.expired_holds.append(self.journal.hold())
            self.journal.remove()
            self._fill_read_behind()
            self.expired_items += 1
            count += 1
            if move:
                self.expired_out.append(head)
        return count

    # -- state ----------------------------------------------------------------------------

    def stats(self, now_ms: int, waiters: int) -> list[tuple[str, object]]:
        """The per-queue stats of behaviour §7.3, in Kestrel's order (without ``children``)."""
        age = 0 if self.bytes == 0 else now_ms - self.last_removed_add_time
        values = (
            self.length,
            self.bytes,
            self.total_items,
            self.journal.size(),
            self.expired_items,
            self.items.count,
            self.mem_bytes,
            age,
            self.discarded,
            waiters,
            len(self.open_reads),
            self.transactions,
            self.canceled_transactions,
            self.total_flushes,
            getattr(self.journal, "rewrites", 0),
            getattr(self.journal, "rotations", 0),
        )
        return list(zip(STAT_NAMES, values, strict=False))

    def oldest_item_age(self, now_ms: int) -> int:
        """Milliseconds since the head item (the next a read gets) was added, 0 when the queue
        holds none in memory. Kestrel's ``age`` dates the last item *read*, so a backlog nobody
        reads shows 0 there; this is the figure an operator alerts on. In read-behind the head
        is still in memory; it is not filled here (no journal I/O for a stats answer)."""
        head = self.items.head()
        return 0 if head is None else max(0, now_ms - head.add_time)

    def close(self) -> None:
        if not self.closed:
            self.held.moved(-self.mem_bytes)  # the queue and its items go
        self.closed = True

    def restore(self, state: Any) -> None:
        """Take the state a journal replay produced (``journal.ReplayResult``)."""
        self.items = state.items
        self.length = state.length
        self.bytes = state.bytes
        self.held.moved(state.mem_bytes - self.mem_bytes)
        self.mem_bytes = state.mem_bytes
        self.total_items = state.total_items
        self._xid = state.xid
        self._xids_fresh = not self.open_reads

    def _next_xid(self) -> int:
        """The next transaction id (:func:`next_xid`), looked up only once the ids have wrapped."""
        xid = self._xid
        if self._xids_fresh and xid < XID_MAX:
            xid += 1
        else:
            xid = next_xid(xid, self.open_reads)
            self._xids_fresh = False  # wrapped: ids still open lie ahead
        self._xid = xid
        return xid

    def _head_never_expires(self) -> bool:
        """Whether the head in memory is there and never expires (no expiry, no ``max_age``):
        :meth:`discard_expired` then has nothing to do."""
        head = self.items.head()
        return head is not None and head.expiry == 0 and self.limits.max_age is None

    def _head(self) -> Item | None:
        if not self.items.count and self.length:
            self._fill_read_behind()
        return self.items.head()

    def _pop_head(self) -> Item | None:
        """The head, removed (``None`` only while read-behind waits for unwritten records).

        :func:`take_head`'s rule, written out on this class (:meth:`_count_out`): through its
        ``Protocol`` the compiled build reads and writes these fields by name (2,800
        instructions a GET).
        """
        items = self.items
        if not items.count:
            self._fill_read_behind()
            if not items.count:
                return None
        item = items.popleft()
        self._count_out(1, len(item.data))
        return item

    def _count_out(self, removed: int, size: int) -> None:
        """``removed`` items of ``size`` bytes in all have left the items in memory for good:
        what they take with them (:func:`take_head`'s rule; :meth:`_pop_head` and
        :meth:`remove_run` count through here)."""
        self.length -= removed
        self.bytes -= size
        self.mem_bytes -= size
        self.held.moved(-size)

    def _fill_read_behind(self) -> None:
        """Read items back from the journal while memory is below ``max_memory_size``, once
        it is :data:`FILL_SLACK` below it (at once if memory holds none).

        Timed (``fill_readbehind_usec``) only in read-behind: Kestrel also timed the calls
        that found nothing to do, a zero per remove that costs the request path and hides
        the fills among zeros."""
        if not self._fill_due():
            return
        journal = self.journal
        started = _perf_counter()
        limit = self.limits.max_memory_size
        # a few items a call: after a restart from a checkpoint memory holds none of the
        # backlog, and filling it all at once would keep the first read waiting for seconds
        budget = FILL_BATCH
        items = self.items
        filled = 0  # told to ``held`` once for the fill, not per item
        try:
            while journal.in_read_behind and self.mem_bytes < limit and budget:
                budget -= 1
                item = journal.read_behind()
                if item is None:
                    break
                items.append(item)
                size = len(item.data)
                self.mem_bytes += size
                filled += size
        finally:
            self.held.moved(filled)
        if self.metrics is not None:
            self.metrics.histogram("fill_readbehind_usec").add(int((_perf_counter() - started) * 1e6))

    def _fill_due(self) -> bool:
        """Whether :meth:`_fill_read_behind` reads from the journal now: in read-behind, with
        memory empty or :data:`FILL_SLACK` below ``max_memory_size`` (closer to the limit, the
        next fill reads a run of items)."""
        return (self.mem_bytes < self.limits.refill_below or not self.items.count) and self.journal.in_read_behind

    def _time_out_oldest_open(self, now_ms: int) -> None:
        oldest = self.open_reads.oldest()
        if oldest is None:
            return
        xid, item = oldest
        timeout_ms = int(self.config.open_transaction_timeout * 1000)  # type: ignore[operator]
        if now_ms - item.opened > timeout_ms:
            self.unremove(xid)
