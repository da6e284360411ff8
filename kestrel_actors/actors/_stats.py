"""Server-wide counters (the global part of STATS, reference §7.3) and the latency figures.

Actors of one server all run on the same gevent hub thread, and a greenlet switches only at
an I/O or inbox wait, so ``stats.cmd_get += 1`` from any actor is atomic. Sharing these plain
integers avoids a message per request just to count it.

Latencies (Kestrel's ostrich metrics ``set_latency_usec``, ``get_hit_latency_usec``,
``get_miss_latency_usec``, ``delivery_latency_msec``, ``get_timeout_msec``) go into
:class:`Histogram`\\ s of fixed log-scale buckets: recording one value is a bisection and two
additions, and a histogram's memory never grows (Kestrel's sample-keeping collectors leaked:
its issues 95/96). They are kept per queue, in :class:`QueueMetrics`, created when the
collection creates the queue and dropped when it deletes it; the server-wide figure is the
sum of the live queues' and of those retired (:meth:`ServerStats.forget_queue`).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

from ._messages import FETCH_OPS, OP_ADD, OP_OPEN_MANY, OP_PEEK

__all__ = ["BOUNDS", "LATENCIES", "Histogram", "QueueMetrics", "ServerStats", "record_batch"]


def _bounds() -> tuple[int, ...]:
    """1..8 exactly, then four buckets per power of two up to 2**31 (about 19% apart)."""
    bounds = list(range(1, 9))
    base = 8
    while base < 2**31:
        step = base // 4
        bounds.extend(base + step * i for i in range(1, 5))
        base *= 2
    return tuple(bounds)


BOUNDS = _bounds()
"""Upper bounds (inclusive) of a histogram's buckets; one overflow bucket follows."""

LATENCIES = (
    "set_latency_usec",
    "get_hit_latency_usec",
    "get_miss_latency_usec",
    "delivery_latency_msec",
    "get_timeout_msec",
)
"""The per-queue metrics, by Kestrel's names (``PersistentQueue``: ``q/<name>/<metric>``)."""


class Histogram:
    """Counts of values in :data:`BOUNDS` buckets, with their count and sum.

    Percentiles, minimum and maximum are read from the buckets (a bucket's upper bound), as
    ostrich's own ``Histogram`` does: within a fifth of the true value, in constant memory.
    """

    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BOUNDS) + 1)
        self.count = 0
        self.sum = 0

    def add(self, value: int, times: int = 1) -> None:
        if value < 0:
            value = 0
        self.buckets[bisect_left(BOUNDS, value)] += times
        self.count += times
        self.sum += value * times

    def copy(self) -> Histogram:
        other = Histogram()
        other.buckets = list(self.buckets)
        other.count = self.count
        other.sum = self.sum
        return other

    def merge(self, other: Histogram) -> None:
        mine = self.buckets
        for index, value in enumerate(other.buckets):
            if value:
                mine[index] += value
        self.count += other.count
        self.sum += other.sum

    def minus(self, earlier: Histogram | None) -> Histogram:
        """What was recorded since ``earlier`` (a copy of this histogram taken before)."""
        result = self.copy()
        if earlier is not None:
            result.buckets = [a - b for a, b in zip(self.buckets, earlier.buckets)]
            result.count -= earlier.count
            result.sum -= earlier.sum
        return result

    def percentile(self, fraction: float) -> int:
        """The upper bound of the bucket holding the value at ``fraction`` of the count."""
        if not self.count:
            return 0
        target = max(1, int(fraction * self.count + 0.5))
        seen = 0
        for index, value in enumerate(self.buckets):
            seen += value
            if seen >= target:
                return _bound(index)
        return _bound(len(BOUNDS))

    def minimum(self) -> int:
        for index, value in enumerate(self.buckets):
            if value:
                return 0 if index == 0 and self.sum == 0 else _bound(index)
        return 0

    def maximum(self) -> int:
        for index in range(len(self.buckets) - 1, -1, -1):
            if self.buckets[index]:
                return _bound(index)
        return 0

    def cumulative(self, bounds: tuple[int, ...]) -> list[int]:
        """Counts of values at most each of ``bounds`` (each one of :data:`BOUNDS`)."""
        result = []
        seen = 0
        index = 0
        for bound in bounds:
            limit = bisect_left(BOUNDS, bound)
            while index <= limit:
                seen += self.buckets[index]
                index += 1
            result.append(seen)
        return result


def _bound(index: int) -> int:
    return BOUNDS[index] if index < len(BOUNDS) else 2**31


class QueueMetrics:
    """One queue's latency histograms and hit/miss counters (ostrich-only figures).

    Histograms are made on their first value: most queues never see most of them.
    """

    __slots__ = ("histograms", "get_items_hit", "get_items_miss")

    def __init__(self) -> None:
        self.histograms: dict[str, Histogram] = {}
        self.get_items_hit = 0
        self.get_items_miss = 0

    def histogram(self, name: str) -> Histogram:
        histogram = self.histograms.get(name)
        if histogram is None:
            histogram = self.histograms[name] = Histogram()
        return histogram

    def merge(self, other: QueueMetrics) -> None:
        for name, histogram in other.histograms.items():
            self.histogram(name).merge(histogram)
        self.get_items_hit += other.get_items_hit
        self.get_items_miss += other.get_items_miss

    def copy(self) -> QueueMetrics:
        other = QueueMetrics()
        other.merge(self)
        return other


class ServerStats:
    __slots__ = (
        "start_time",
        "total_items",
        "curr_connections",
        "total_connections",
        "cmd_get",
        "cmd_set",
        "cmd_peek",
        "get_hits",
        "get_misses",
        "bytes_read",
        "bytes_written",
        "queue_creates",
        "queue_deletes",
        "queue_expires",
        # ostrich-only counters (KestrelHandler): not in the memcache STATS reply
        "cmd_monitor",
        "cmd_monitor_get",
        "cmd_get_open_dropped",
        "waiters_aborted",
        "queues",
        "retired",
    )
    COUNTERS = __slots__[1:-2]
    """The plain integer counters, in STATS order then the ostrich-only ones."""

    def __init__(self) -> None:
        self.start_time = time.time()
        for name in self.COUNTERS:
            setattr(self, name, 0)
        self.queues: dict[str, QueueMetrics] = {}
        """Live queues' metrics, by name: entries come and go with the queues."""
        self.retired = QueueMetrics()
        """What deleted queues recorded: still part of the server-wide figures."""

    def open_queue(self, name: str) -> None:
        if name not in self.queues:
            self.queues[name] = QueueMetrics()

    def forget_queue(self, name: str) -> None:
        metrics = self.queues.pop(name, None)
        if metrics is not None:
            self.retired.merge(metrics)


def record_batch(stats: ServerStats, queue: str, batch: Any, results: list[Any], started: float) -> None:
    """Record one answered :class:`QueueBatch`: its latency since ``started`` (``perf_counter``
    seconds, when the session sent it), the queue's hits and misses, and delivery times.

    As in Kestrel, a fetch's hit or miss latency counts only a fetch answered at once; a
    fetch that waited in the queue's wait-list (``batch.parked``) adds to ``get_timeout_msec``
    if it found nothing. A waiting fetch is always its batch's last operation.
    """
    metrics = stats.queues.get(queue)
    if metrics is None:
        return
    usec = int((time.perf_counter() - started) * 1e6)
    parked = batch.parked
    now_ms = 0
    for op, result in zip(batch.ops, results):
        code = op[0]
        if code == OP_ADD:
            metrics.histogram("set_latency_usec").add(usec)
            continue
        if code not in FETCH_OPS:
            continue
        items = result if code == OP_OPEN_MANY else () if result is None or code == OP_PEEK else (result,)
        if items:
            now_ms = now_ms or int(time.time() * 1000)
            delivery = metrics.histogram("delivery_latency_msec")
            for item in items:
                delivery.add(now_ms - item.add_time)
        if code == OP_OPEN_MANY:  # a monitor's fetch: counted, not timed
            metrics.get_items_hit += len(result)
        elif result is None:
            metrics.get_items_miss += 1
            if parked:
                metrics.histogram("get_timeout_msec").add(usec // 1000)
            else:
                metrics.histogram("get_miss_latency_usec").add(usec)
        else:
            metrics.get_items_hit += 1
            if not parked:
                metrics.histogram("get_hit_latency_usec").add(usec)
