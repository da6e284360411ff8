"""A queue's wait-list: the batches parked on an empty queue, oldest first, and their deadlines.

Blocking reads (``get q/t=1000``) are the normal case under load: many-clients parks and wakes
a batch for nearly every item. So parking and waking cost O(1) and no timer work: a waiter
that leaves is only marked, and its entries in the arrival deque and the deadline structures are
dropped when they come up; one timer per queue is set for the earliest deadline (a timer
per waiter meant a libev watcher made and closed for every read). A dict would not do as
the arrival queue: finding its first key after many deletions at the front scans the holes.

Clients mostly wait with one timeout, so deadlines mostly come in the order waiters park: those
go on a deque, in order for free, and only a deadline earlier than the last one queued goes on a
heap (a heap entry is a tuple made, compared and freed for every read).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

__all__ = ["WaitList", "Waiter"]

_NEVER = float("inf")
_heappush: Final = heapq.heappush  # through a C static, not the module's dict (ADR 0015)
_append: Final = deque.append  # deque's methods likewise: ``d.append(x)`` looks the name up
_popleft: Final = deque.popleft


class Waiter:
    """A batch parked at its fetch operation ``index`` until an item or its deadline comes.

    ``session`` is the batch's (``None``: it has none), read once by the owner, which knows the
    batch's type: read here, through ``Any``, it was a lookup by name at each park and wake.
    """

    __slots__ = ("batch", "index", "results", "session", "parked", "deadline")

    def __init__(self, batch: Any, index: int, results: list[Any], session: Any) -> None:
        self.batch = batch
        self.index = index
        self.results = results
        self.session = session
        self.parked = False
        self.deadline = _NEVER


class WaitList:
    """Parked :class:`Waiter` objects in arrival order, found also by their session.

    ``arm(delay)`` is called to set the queue's one timer (replacing the one set before); when
    it fires the owner calls :meth:`take_due`. Everything runs on the owner's actor.
    """

    def __init__(self, arm: Callable[[float], Any]) -> None:
        self._arm = arm
        self._arrivals: deque[Waiter] = deque()
        self._count = 0
        self._by_session: dict[Any, Waiter] = {}
        self._in_order: deque[Waiter] = deque()
        """Waiters by deadline, which never decreases along it: most of them."""
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
        waiter.deadline = deadline
        self._count += 1
        arrivals = self._arrivals
        _append(arrivals, waiter)
        session = waiter.session
        if session is not None:
            self._by_session[session] = waiter
        in_order = self._in_order
        while in_order and not in_order[0].parked:  # woken, mostly oldest first
            _popleft(in_order)
        if not in_order or deadline >= in_order[-1].deadline:
            _append(in_order, waiter)
            if len(in_order) > 2 * self._count + 64:  # woken out of order (hung up): drop them
                self._in_order = deque([waiter for waiter in in_order if waiter.parked])
        else:
            deadlines = self._deadlines
            if len(deadlines) > 2 * self._count + 64:
                deadlines[:] = [entry for entry in deadlines if entry[2].parked]
                heapq.heapify(deadlines)
            _heappush(deadlines, (deadline, next(self._order), waiter))
        if len(arrivals) > 2 * self._count + 64:
            self._arrivals = deque([waiter for waiter in arrivals if waiter.parked])
        if deadline < self._timer_at:
            self._set_timer(deadline)

    def remove(self, waiter: Waiter) -> None:
        waiter.parked = False
        self._count -= 1
        session = waiter.session
        if session is not None and self._by_session.get(session) is waiter:
            del self._by_session[session]

    def oldest(self) -> Waiter | None:
        """The waiter parked longest, still parked (``None`` if there is none)."""
        arrivals = self._arrivals
        while arrivals:
            waiter = arrivals[0]
            if waiter.parked:
                return waiter
            _popleft(arrivals)
        return None

    def of_session(self, session: Any) -> Waiter | None:
        return self._by_session.get(session)

    def take_due(self) -> list[Waiter]:
        """Remove and return the waiters whose deadline has passed, oldest deadline first,
        and set the timer for the next deadline."""
        self._timer_at = _NEVER
        now = time.monotonic()
        due = []
        in_order = self._in_order
        while in_order and (in_order[0].deadline <= now or not in_order[0].parked):
            waiter = _popleft(in_order)
            if waiter.parked:
                self.remove(waiter)
                due.append(waiter)
        deadlines = self._deadlines
        from_heap = False
        while deadlines and (deadlines[0][0] <= now or not deadlines[0][2].parked):
            waiter = heapq.heappop(deadlines)[2]
            if waiter.parked:
                self.remove(waiter)
                due.append(waiter)
                from_heap = True
        if from_heap:
            due.sort(key=_deadline_of)
        following = min(in_order[0].deadline if in_order else _NEVER, deadlines[0][0] if deadlines else _NEVER)
        if following < _NEVER:
            self._set_timer(following)
        return due

    def clear(self) -> list[Waiter]:
        """Remove every waiter (oldest first) and stop the timer."""
        waiters = [waiter for waiter in self._arrivals if waiter.parked]
        for waiter in waiters:
            waiter.parked = False
        self._arrivals.clear()
        self._count = 0
        self._by_session.clear()
        self._in_order.clear()
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


def _deadline_of(waiter: Waiter) -> float:
    return waiter.deadline
