"""A queue's wait-list: the batches parked on an empty queue, oldest first, and their deadlines.

Blocking reads (``get q/t=1000``) are the normal case under load: many-clients parks and wakes
a batch for nearly every item. So parking and waking cost O(1) and no timer work: a waiter
that leaves is only marked, and its entries in the arrival order and the deadline structures are
dropped when they come up; one timer per queue is set for the earliest deadline (a timer
per waiter meant a libev watcher made and closed for every read). A dict would not do as
the arrival queue: finding its first key after many deletions at the front scans the holes.

Clients mostly wait with one timeout, so deadlines mostly come in the order waiters park: those
go on a second list in arrival order, in order for free, and only a deadline earlier than the
last one there goes on a heap (a heap entry is a tuple made, compared and freed for every read).

Both orders are lists read from an index (``_first``, ``_in_order_first``), not deques: the
compiled build reads a list's item natively, a deque's through a generic lookup with a boxed
index (about 100 instructions, six of them per item under many-clients). Waiters are woken
oldest first, so the one woken is nearly always at both fronts, and :meth:`remove` steps past it;
the entries before an index are cut off :data:`_CUT_AT` at a time.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Final

__all__ = ["WaitList", "Waiter"]

_NEVER: Final = float("inf")  # Final: a C static, not a lookup in the module's dict (ADR 0015)
_heappush: Final = heapq.heappush
_CUT_AT: Final = 32
"""Entries passed at the front of an order are cut off this many at a time: a cut moves the rest
of the list, and until it the passed entries keep their waiters (and their batches) alive."""


class Waiter:
    """A batch parked at its fetch operation ``index`` until an item or its deadline comes.

    ``session`` is the batch's (``None``: it has none), read once by the owner, which knows the
    batch's type: read here, through ``Any``, it was a lookup by name at each park and wake.
    The owner may park the same waiter again (a new batch, index and results) once it has left
    ``reusable``: a waiter made and freed for every blocking read cost about 300 instructions.
    """

    __slots__ = ("batch", "index", "results", "session", "parked", "deadline", "on_heap", "reusable")

    def __init__(self, batch: Any, index: int, results: list[Any] | None, session: Any) -> None:
        self.batch = batch
        self.index = index
        self.results = results
        self.session = session
        self.parked = False
        self.deadline = _NEVER
        self.on_heap = False
        self.reusable = False
        """Left by :meth:`WaitList.take`, passed in both orders and never on the heap: no entry
        of it is left unpassed, so parking it again cannot put it in an order twice."""


class WaitList:
    """Parked :class:`Waiter` objects in arrival order.

    Finding a session's waiter is the owner's: a dict here by session cost a store and a delete
    per park (600 instructions an item under many-clients), where the owner links the session to
    its waiter natively (``Session.waiter``).

    ``arm(delay)`` is called to set the queue's one timer (replacing the one set before); when
    it fires the owner calls :meth:`take_due`. Everything runs on the owner's actor.
    """

    def __init__(self, arm: Callable[[float], Any]) -> None:
        self._arm = arm
        self._arrivals: list[Waiter] = []
        self._first = 0
        """The index of the first entry of ``_arrivals`` not yet passed."""
        self._count = 0
        self._in_order: list[Waiter] = []
        """Waiters by deadline, which never decreases along it (from ``_in_order_first``): most."""
        self._in_order_first = 0
        self._last_in_order = -_NEVER
        """The latest deadline put on ``_in_order``: a later or equal one goes there too."""
        self._deadlines: list[tuple[float, int, Waiter]] = []
        """The heap of the rest: each deadline came earlier than the last one in order."""
        self._order = itertools.count()
        self._timer: Any = None
        self._timer_at = _NEVER

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def park(self, waiter: Waiter, deadline: float) -> None:
        waiter.parked = True
        waiter.reusable = False
        waiter.deadline = deadline
        count = self._count + 1
        self._count = count
        arrivals = self._arrivals
        arrivals.append(waiter)
        if deadline >= self._last_in_order:
            in_order = self._in_order
            in_order.append(waiter)
            waiter.on_heap = False
            self._last_in_order = deadline
            if len(in_order) - self._in_order_first > 2 * count + 64:  # woken out of order (hung up)
                self._in_order = [waiter for waiter in in_order[self._in_order_first:] if waiter.parked]
                self._in_order_first = 0
        else:
            waiter.on_heap = True
            deadlines = self._deadlines
            if len(deadlines) > 2 * count + 64:
                deadlines[:] = [entry for entry in deadlines if entry[2].parked]
                heapq.heapify(deadlines)
            _heappush(deadlines, (deadline, next(self._order), waiter))
        if len(arrivals) - self._first > 2 * count + 64:
            self._arrivals = [waiter for waiter in arrivals[self._first:] if waiter.parked]
            self._first = 0
        if deadline < self._timer_at:
            self._set_timer(deadline)

    def remove(self, waiter: Waiter) -> None:
        self._forget(waiter)
        # woken oldest first: nearly always the front of both orders, passed here at once
        arrivals = self._arrivals
        first = self._first
        if first < len(arrivals) and arrivals[first] is waiter:
            self._first = _pass(arrivals, first + 1)
        in_order = self._in_order
        first = self._in_order_first
        if first < len(in_order) and in_order[first] is waiter:
            self._in_order_first = _pass(in_order, first + 1)

    def take(self) -> Waiter | None:
        """Remove and return the waiter parked longest (``None`` if there is none): the one an
        item goes to. Marked ``reusable`` when it leaves no entry behind (nearly always)."""
        arrivals = self._arrivals
        first = self._first
        size = len(arrivals)
        while first < size and not arrivals[first].parked:
            first += 1
        if first == size:
            self._first = _pass(arrivals, first)
            return None
        waiter = arrivals[first]
        self._forget(waiter)
        reusable = not waiter.on_heap  # a heap entry stays until it comes up
        if self._count:  # else _forget has passed every entry
            self._first = _pass(arrivals, first + 1)
            in_order = self._in_order
            first = self._in_order_first
            if first < len(in_order) and in_order[first] is waiter:
                self._in_order_first = _pass(in_order, first + 1)
            else:
                reusable = False  # its entry in order is further on (it parked after a hung-up one)
        waiter.reusable = reusable
        return waiter

    def _forget(self, waiter: Waiter) -> None:
        waiter.parked = False
        count = self._count - 1
        self._count = count
        if not count:
            # every entry left is a woken waiter's: all passed, and any deadline is in order again
            self._first = _pass(self._arrivals, len(self._arrivals))
            self._in_order_first = _pass(self._in_order, len(self._in_order))
            self._last_in_order = -_NEVER

    def oldest(self) -> Waiter | None:
        """The waiter parked longest, still parked (``None`` if there is none)."""
        arrivals = self._arrivals
        first = self._first
        size = len(arrivals)
        while first < size:
            waiter = arrivals[first]
            if waiter.parked:
                self._first = _pass(arrivals, first)
                return waiter
            first += 1
        self._first = _pass(arrivals, first)
        return None

    def take_due(self) -> list[Waiter]:
        """Remove and return the waiters whose deadline has passed, oldest deadline first,
        and set the timer for the next deadline."""
        self._timer_at = _NEVER
        now = time.monotonic()
        due = []
        in_order = self._in_order
        first = self._in_order_first
        size = len(in_order)
        while first < size:
            waiter = in_order[first]
            if waiter.parked:
                if waiter.deadline > now:
                    break
                self._forget(waiter)
                due.append(waiter)
                if not self._count:
                    break  # _forget has passed every entry (and may have cut the list)
            first += 1
        if self._count:
            self._in_order_first = _pass(in_order, first)
        deadlines = self._deadlines
        from_heap = False
        while deadlines and (deadlines[0][0] <= now or not deadlines[0][2].parked):
            waiter = heapq.heappop(deadlines)[2]
            if waiter.parked:
                self._forget(waiter)
                due.append(waiter)
                from_heap = True
        if from_heap:
            due.sort(key=_deadline_of)
        following = _NEVER
        first = self._in_order_first
        if first < len(self._in_order):
            following = self._in_order[first].deadline
        if deadlines and deadlines[0][0] < following:
            following = deadlines[0][0]
        if following < _NEVER:
            self._set_timer(following)
        return due

    def clear(self) -> list[Waiter]:
        """Remove every waiter (oldest first) and stop the timer."""
        waiters = [waiter for waiter in self._arrivals[self._first:] if waiter.parked]
        for waiter in waiters:
            waiter.parked = False
        self._arrivals = []
        self._first = 0
        self._count = 0
        self._in_order = []
        self._in_order_first = 0
        self._last_in_order = -_NEVER
        self._deadlines.clear()
        if self._timer is not None:
            self._timer.close()
            self._timer, self._timer_at = None, _NEVER
        return waiters

    def _set_timer(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.close()
        self._timer_at = deadline
        self._timer = self._arm(max(0.0, deadline - time.monotonic()))


def _pass(entries: list[Waiter], first: int) -> int:
    """``first``, the index of the first entry of ``entries`` not passed, after cutting the
    passed ones off if there are :data:`_CUT_AT` of them -> the index then."""
    if first < _CUT_AT:
        return first
    del entries[:first]
    return 0


def _deadline_of(waiter: Waiter) -> float:
    return waiter.deadline
