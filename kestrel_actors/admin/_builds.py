"""Scrapes that share one build: parallel ones, and back-to-back ones of a big server.

With thousands of queues, building ``/metrics`` or ``/stats.json`` costs the hub a fraction
of a second of CPU (in slices; see :mod:`kestrel_actors.admin._app`), and a monitoring setup
may ask for it back to back, or from two Prometheus servers at once. A request that comes
while the same build is under way waits for it and gets its answer; and an answer whose
build took at least :data:`SLOW_BUILD` seconds is given again, unchanged, to the same request
for :data:`REUSE_FACTOR` times as long as it took, so scrapes never keep the server busy more
than a tenth of its time. A small server's scrapes take milliseconds and are never reused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, NamedTuple, TypeVar, cast

import gevent.event

__all__ = ["REUSE_FACTOR", "SLOW_BUILD", "SharedBuilds"]

SLOW_BUILD = 0.1
"""Seconds a build must take for its answer to be reused."""
REUSE_FACTOR = 10
"""A slow build's answer is reused for this many times as long as it took."""

T = TypeVar("T")


class _Reusable(NamedTuple, Generic[T]):
    answer: T
    until: float
    """``time.monotonic()`` after which it is built anew."""


class SharedBuilds(Generic[T]):
    """Answers by key (an endpoint and its parameters), built by whoever asks first."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._building: dict[Hashable, gevent.event.AsyncResult[T]] = {}
        self._reusable: dict[Hashable, _Reusable[T]] = {}

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        reusable = self._reusable.get(key)
        if reusable is not None and self.clock() < reusable.until:
            return reusable.answer
        building = self._building.get(key)
        if building is not None:
            # the builder set() it with a T or raised; the stub's ``T | None`` is for a bare set()
            return cast(T, building.get())
        building = self._building[key] = gevent.event.AsyncResult()
        started = self.clock()
        try:
            answer = build()
        except BaseException as exc:
            building.set_exception(exc)
            raise
        finally:
            del self._building[key]
        building.set(answer)
        finished = self.clock()
        took = finished - started
        if took >= SLOW_BUILD:
            self._reusable[key] = _Reusable(answer, finished + REUSE_FACTOR * took)
        else:
            self._reusable.pop(key, None)
        return answer
