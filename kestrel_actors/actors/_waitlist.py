"""A queue's wait-list: the batches parked on an empty queue, oldest first, and their deadlines.

Blocking reads (``get q/t=1000``) are the normal case under load: many-clients parks and wakes
a batch for nearly every item. So waking one costs two dictionary deletions and no timer
work: deadlines sit in a heap whose stale entries are skipped when they come up, and one
timer per queue is set for the earliest deadline (a timer per waiter meant a libev watcher
made and closed for every read).
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Any, Callable

__all__ = ["WaitList", "Waiter"]

_NEVER = float("inf")


class Waiter:
    """A batch parked at its fetch operation ``index`` until an item or its deadline comes."""

    __slots__ = ("batch", "index", "results")

    def __init__(self, batch: Any, index: int, results: list[Any]) -> None:
        self.batch = batch
        self.index = index
        self.results = results


class WaitList:
    """Parked :class:`Waiter` objects in arrival order, found also by their session.

    ``arm(delay)`` is called to set the queue's one timer (replacing the one set before); when
    it fires the owner calls :meth:`take_due`. Everything runs on the owner's actor.
    """

    def __init__(self, arm: Callable[[float], Any]) -> None:
        self._arm = arm
        self._waiters: dict[Waiter, None] = {}
        self._by_session: dict[Any, Waiter] = {}
        self._deadlines: list[tuple[float, int, Waiter]] = []
        self._order = itertools.count()
        self._timer: Any = None
        self._timer_at = _NEVER

    def __len__(self) -> int:
        return len(self._waiters)

    def __bool__(self) -> bool:
        return bool(self._waiters)

    def park(self, waiter: Waiter, deadline: float) -> None:
        waiters = self._waiters
        waiters[waiter] = None
        session = waiter.batch.session
        if session is not None:
            self._by_session[session] = waiter
        deadlines = self._deadlines
        if len(deadlines) > 2 * len(waiters) + 64:  # mostly entries of woken waiters: drop them
            deadlines[:] = [entry for entry in deadlines if entry[2] in waiters]
            heapq.heapify(deadlines)
        heapq.heappush(deadlines, (deadline, next(self._order), waiter))
        if deadline < self._timer_at:
            self._set_timer(deadline)

    def remove(self, waiter: Waiter) -> None:
        del self._waiters[waiter]
        session = waiter.batch.session
        if session is not None and self._by_session.get(session) is waiter:
            del self._by_session[session]

    def oldest(self) -> Waiter | None:
        """The waiter parked longest, still parked (``None`` if there is none)."""
        for waiter in self._waiters:
            return waiter
        return None

    def of_session(self, session: Any) -> Waiter | None:
        return self._by_session.get(session)

    def take_due(self) -> list[Waiter]:
        """Remove and return the waiters whose deadline has passed, oldest deadline first,
        and set the timer for the next deadline."""
        self._timer_at = _NEVER
        deadlines = self._deadlines
        waiters = self._waiters
        now = time.monotonic()
        due = []
        while deadlines and (deadlines[0][0] <= now or deadlines[0][2] not in waiters):
            waiter = heapq.heappop(deadlines)[2]
            if waiter in waiters:
                self.remove(waiter)
                due.append(waiter)
        if deadlines:
            self._set_timer(deadlines[0][0])
        return due

    def clear(self) -> list[Waiter]:
        """Remove every waiter (oldest first) and stop the timer."""
        waiters = list(self._waiters)
        self._waiters.clear()
        self._by_session.clear()
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
