"""Server-wide counters (the global part of STATS, behaviour §7.3) and the latency figures.

Actors of one server all run on the same gevent hub thread, and a greenlet switches only at
an I/O or inbox wait, so ``stats.cmd_get += 1`` from any actor is atomic. Sharing these plain
integers avoids a message per request just to count it.

Latencies (Kestrel's ostrich metrics ``set_latency_usec``, ``get_hit_latency_usec``,
``get_miss_latency_usec``, ``delivery_latency_msec``, ``get_timeout_msec``) go into
:class:`Histogram`\\ s of fixed log-scale buckets: recording one value is its bucket worked out
from the value (:func:`bucket_index`, no search) and two additions, and a histogram's memory
never grows (Kestrel's sample-keeping collectors leaked: its issues 95/96). They are kept per
queue, in :class:`QueueMetrics`, created when the collection creates the queue and dropped
when it deletes it; the server-wide figure is the
sum of the live queues' and of those retired (:meth:`ServerStats.forget_queue`).

Kestrel's other per-queue metrics (:data:`QUEUE_METRICS`) are per queue only, as Kestrel had
them: the journal's rewrite and rotation times, read-behind fills, and samples of the queue's
own sizes taken after each add and remove (``PersistentQueue.addInternalsMetrics``). The
journal's fsync figures (:data:`SERVER_METRICS`, Kestrel's ``PeriodicSyncStorage``) are
server-wide only: :class:`ServerStats` keeps them, with the ``fsync_error_<class>`` counts.
"""

from __future__ import annotations

import time
from operator import add
from typing import Any, ClassVar, Final

from mypy_extensions import i64

from ..messages import MANY_FETCHES, Add, Open, Peek, QueueBatch, Remove
from ..queue import Item

__all__ = [
    "BOUNDS", "BUCKETS", "LATENCIES", "QUEUE_METRICS", "SERVER_METRICS", "Histogram", "QueueMetrics", "ServerStats",
    "bucket_index", "record_batch",
]


def _bounds() -> tuple[int, ...]:
    """1..8 exactly, then four buckets per power of two up to 2**31 (about 19% apart)."""
    bounds = list(range(1, 9))
    base = 8
    while base < 2**31:
        step = base // 4
        bounds.extend(base + step * i for i in range(1, 5))
        base *= 2
    return tuple(bounds)


BOUNDS: Final = _bounds()
"""Upper bounds (inclusive) of a histogram's buckets; one overflow bucket follows."""


def bucket_index(value: int) -> int:
    """The bucket of ``value``: ``bisect_left(BOUNDS, value)``, read from a table below
    :data:`_TABLED` (most latencies), else worked out from the bounds' rule rather than
    searched (a search compares boxed integers: two or three per answered GET)."""
    if 0 <= value < _TABLED:
        return _BUCKET_OF[value]
    return _bucket_by_rule(value)


def _bucket_by_rule(value: int) -> int:
    if value <= 8:
        return value - 1 if value > 0 else 0
    if value > 2**31:
        return len(BOUNDS)  # the overflow bucket
    # in native 64-bit integers, the step (a quarter of the power of two) a shift: the boxed
    # arithmetic of a floor division cost a durable SET's latency ~150 instructions (callgrind)
    top: i64 = (value - 1).bit_length() - 1  # the largest power of two below value: 2**top
    rest: i64 = value - 1 - (i64(1) << top)
    return 4 * top - 4 + (rest >> (top - 2))


_TABLED: Final = 1 << 16
_BUCKET_OF: Final = bytes(_bucket_by_rule(value) for value in range(_TABLED))
"""The bucket of each value below :data:`_TABLED`, one byte each: a byte read costs a request
less than the rule's arithmetic (~75 instructions). Most latencies, in µs or ms, are below it,
a durable SET's 1-10 ms in µs included (64 KiB, of which a run touches a few lines)."""


LATENCIES = (
    "set_latency_usec",
    "get_hit_latency_usec",
    "get_miss_latency_usec",
    "delivery_latency_msec",
    "get_timeout_msec",
)
"""The latency metrics, by Kestrel's names: per queue (``PersistentQueue``: ``q/<name>/<metric>``)
and server-wide (their sum over the queues, as Kestrel recorded each under both names)."""

QUEUE_METRICS = (*LATENCIES, "journal_rewrite_usec", "journal_rotation_usec", "fill_readbehind_usec")
"""Every per-queue metric (``q/<name>/<metric>``); those after :data:`LATENCIES` Kestrel kept
per queue only."""

SERVER_METRICS = ("fsync_delay_usec", "item_fsync_delay_usec")
"""Server-wide only metrics: each fdatasync's duration, and how long a write waited for its
fdatasync beyond the ``sync_journal`` period (Kestrel's ``PeriodicSyncStorage``)."""

MAX_FSYNC_ERROR_NAMES = 16
"""Distinct ``fsync_error_<class>`` counters kept; further classes count as ``Exception``."""


BUCKETS: Final = len(BOUNDS) + 1
"""A histogram's buckets: one per bound, then the overflow bucket."""


class Histogram:
    """Counts of values in :data:`BOUNDS` buckets, and their sum.

    ``buckets`` is a list of :data:`BUCKETS` counts, ``total`` the sum of the values. The
    request path records a value (:meth:`add`) with native additions only while it lands in the
    bucket of the value before (a run: a round of durable SETs answered by one ``fdatasync``
    lands in a few buckets, in order); the run's count goes into the list when another bucket
    comes, or when ``buckets`` is read. A count in the list is a boxed integer, made anew for
    every value (~130 instructions: ADR 0018). The count is the sum of the buckets, worked out
    when read. Percentiles, minimum and maximum are read from the buckets (a bucket's upper
    bound), as ostrich's own ``Histogram`` does: within a fifth of the true value, in constant
    memory.
    """

    __slots__ = ("_buckets", "total", "_run_index", "_run_count")

    def __init__(self) -> None:
        self._buckets = [0] * BUCKETS
        self.total = 0
        self._run_index: i64 = 0
        """The bucket of the run being counted, whose ``_run_count`` values are not in ``_buckets``."""
        self._run_count: i64 = 0

    @property
    def buckets(self) -> list[int]:
        self._settle()
        return self._buckets

    @buckets.setter
    def buckets(self, counts: list[int]) -> None:
        self._buckets = counts
        self._run_count = 0

    def _settle(self) -> None:
        """Put the run's count into ``_buckets``."""
        if self._run_count:
            buckets = self._buckets
            index = self._run_index
            buckets[index] = buckets[index] + self._run_count
            self._run_count = 0

    @property
    def count(self) -> int:
        return sum(self.buckets)

    @property
    def sum(self) -> int:
        return self.total

    def add(self, value: int, times: int = 1) -> None:
        """Count ``value`` (a negative one as 0: a clock step backwards) ``times``.

        ``total`` written as ``x = x + n``: mypyc compiles ``x += n`` on an attribute to a
        generic addition of boxed integers, and this to a native one."""
        if value < 0:
            value = 0
        index: i64 = bucket_index(value)
        if index != self._run_index:
            self._settle()
            self._run_index = index
        self._run_count = self._run_count + times
        self.total = self.total + value * times

    def copy(self) -> Histogram:
        other = Histogram()
        other.buckets = list(self.buckets)
        other.total = self.total
        return other

    def merge(self, other: Histogram) -> None:
        self.buckets[:] = map(add, self.buckets, other.buckets)
        self.total = self.total + other.total

    def minus(self, earlier: Histogram | None) -> Histogram:
        """What was recorded since ``earlier`` (a copy of this histogram taken before)."""
        result = self.copy()
        if earlier is not None:
            result.buckets = [a - b for a, b in zip(self.buckets, earlier.buckets, strict=False)]
            result.total = self.total - earlier.total
        return result

    def percentile(self, fraction: float) -> int:
        """The upper bound of the bucket holding the value at ``fraction`` of the count."""
        count = self.count
        if not count:
            return 0
        target = max(1, int(fraction * count + 0.5))
        seen = 0
        for index in range(BUCKETS):
            seen += self.buckets[index]
            if seen >= target:
                return _bound(index)
        return _bound(len(BOUNDS))

    def minimum(self) -> int:
        for index in range(BUCKETS):
            if self.buckets[index]:
                return _bound(index)
        return 0

    def maximum(self) -> int:
        for index in range(BUCKETS - 1, -1, -1):
            if self.buckets[index]:
                return _bound(index)
        return 0

    def cumulative(self, bounds: tuple[int, ...]) -> list[int]:
        """Counts of values at most each of ``bounds`` (each one of :data:`BOUNDS`)."""
        result = []
        seen = 0
        index = 0
        for bound in bounds:
            limit = bucket_index(bound)
            while index <= limit:
                seen += self.buckets[index]
                index += 1
            result.append(seen)
        return result


# Final: compiled code reads it from a C static, not from the module's dict, on every batch
_time: Final = time.time


def _bound(index: int) -> int:
    return BOUNDS[index] if index < len(BOUNDS) else 2**31


class QueueMetrics:
    """One queue's histograms and hit/miss counters (ostrich-only figures).

    Histograms are made on their first value: most queues never see most of them. The
    request path reaches those it records most through slots.
    """

    __slots__ = ("histograms", "get_items_hit", "get_items_miss", "set_latency", "hit_latency", "miss_latency",
                 "delivery_latency")

    def __init__(self) -> None:
        self.histograms: dict[str, Histogram] = {}
        self.get_items_hit = 0
        self.get_items_miss = 0
        self.set_latency: Histogram | None = None
        self.hit_latency: Histogram | None = None
        self.miss_latency: Histogram | None = None
        self.delivery_latency: Histogram | None = None

    def histogram(self, name: str) -> Histogram:
        histogram = self.histograms.get(name)
        if histogram is None:
            histogram = self.histograms[name] = Histogram()
            slot = _SLOTS.get(name)
            if slot is not None:
                setattr(self, slot, histogram)
        return histogram

    def merge(self, other: QueueMetrics) -> None:
        for name, histogram in other.histograms.items():
            self.histogram(name).merge(histogram)
        self.get_items_hit += other.get_items_hit
        self.get_items_miss += other.get_items_miss

    def copy(self) -> QueueMetrics:
        other = QueueMetrics()
        for name, histogram in self.histograms.items():
            other.histogram(name).merge(histogram)
        other.get_items_hit = self.get_items_hit
        other.get_items_miss = self.get_items_miss
        return other


_SLOTS = {
    "set_latency_usec": "set_latency",
    "get_hit_latency_usec": "hit_latency",
    "get_miss_latency_usec": "miss_latency",
    "delivery_latency_msec": "delivery_latency",
}


class ServerStats:
    COUNTERS: ClassVar[tuple[str, ...]] = (
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
        "finished_but_add",
    )
    """The plain integer counters, in STATS order then the ostrich-only ones."""
    __slots__ = ("start_time", *COUNTERS, "queues", "retired", "histograms", "fsync_errors")

    def __init__(self) -> None:
        self.start_time = time.time()
        # each counter by name (not a setattr loop): a compiled class has only the attributes
        # it assigns, and the request path reads these
        self.total_items = 0
        self.curr_connections = 0
        self.total_connections = 0
        self.cmd_get = 0
        self.cmd_set = 0
        self.cmd_peek = 0
        self.get_hits = 0
        self.get_misses = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.queue_creates = 0
        self.queue_deletes = 0
        self.queue_expires = 0
        self.cmd_monitor = 0
        self.cmd_monitor_get = 0
        self.cmd_get_open_dropped = 0
        self.waiters_aborted = 0
        self.finished_but_add = 0
        self.queues: dict[str, QueueMetrics] = {}
        """Live queues' metrics, by name: entries come and go with the queues."""
        self.retired = QueueMetrics()
        """What deleted queues recorded: still part of the server-wide figures."""
        self.histograms = {name: Histogram() for name in SERVER_METRICS}
        """The server-wide only metrics (the journals' fsyncs), by name."""
        self.fsync_errors: dict[str, int] = {}
        """Failed fdatasyncs by exception class name (``fsync_error_<class>``), bounded."""

    def open_queue(self, name: str) -> QueueMetrics:
        """The metrics of queue ``name``, made if it has none yet."""
        metrics = self.queues.get(name)
        if metrics is None:
            metrics = self.queues[name] = QueueMetrics()
        return metrics

    def forget_queue(self, name: str) -> None:
        metrics = self.queues.pop(name, None)
        if metrics is not None:
            self.retired.merge(metrics)


    # -- the journal writers' fsyncs (``journal.SyncStats``) -------------------------------

    def fsync_done(self, usec: int) -> None:
        self.histograms["fsync_delay_usec"].add(usec)

    def fsync_waited(self, usec: int, records: int) -> None:
        self.histograms["item_fsync_delay_usec"].add(usec, records)

    def fsync_failed(self, exc: BaseException) -> None:
        name = type(exc).__name__
        errors = self.fsync_errors
        if name not in errors and len(errors) >= MAX_FSYNC_ERROR_NAMES:
            name = "Exception"
        errors[name] = errors.get(name, 0) + 1


def record_batch(metrics: QueueMetrics | None, batch: QueueBatch, results: list[Any], started: float,
                 answered: float = 0.0) -> None:
    """Record one answered :class:`QueueBatch` in its queue's ``metrics`` (``None``: the queue's
    metrics have gone, nothing is recorded): its latency since ``started`` (epoch seconds, when
    the session sent it: ``_clock.epoch_seconds``), the queue's hits and misses, and delivery
    times, all from one reading of the clock (a step backwards counts as 0): ``answered``, the one
    the answers of an fdatasync share (``BatchDone.answered_at``), else the clock's now.

    As in Kestrel, a fetch's hit or miss latency counts only a fetch answered at once; a
    batch that waited in the queue's wait-list (``batch.parked``) adds its misses to
    ``get_timeout_msec`` instead. This runs once per batch on the request path: a batch of
    one SET or one GET (the common case, a GET that waited included) takes a short way;
    otherwise the operations are counted first, and each histogram gets one update per batch.
    """
    if metrics is None:
        return
    now = answered or _time()  # read once: the latency and the delivery times alike
    usec = int((now - started) * 1e6)
    ops = batch.ops
    if len(ops) == 1 and len(results) == 1:
        kind = type(ops[0])
        if kind is Add:
            (metrics.set_latency or metrics.histogram("set_latency_usec")).add(usec)
            return
        if kind is Remove or kind is Open:
            item: Item | None = results[0]  # typed: the compiled build reads add_time natively
            if item is None:
                metrics.get_items_miss += 1
                if batch.parked:  # waited out its timeout
                    metrics.histogram("get_timeout_msec").add(usec // 1000)
                    return
                (metrics.miss_latency or metrics.histogram("get_miss_latency_usec")).add(usec)
                return
            metrics.get_items_hit += 1
            msec = int(now * 1000) - item.add_time  # add counts a clock step backwards as 0
            (metrics.delivery_latency or metrics.histogram("delivery_latency_msec")).add(msec)
            if not batch.parked:  # a GET that waited counts no hit latency
                (metrics.hit_latency or metrics.histogram("get_hit_latency_usec")).add(usec)
            return
    sets = hits = misses = 0
    delivered: list[Item] | None = None
    many: list[list[Item]] | None = None
    for op, result in zip(ops, results):  # noqa: B905 - results may stop early (a part)
        kind = type(op)
        if kind is Add:
            sets += 1
        elif kind is Remove or kind is Open or kind is Peek:
            if result is None:
                misses += 1
            else:
                hits += 1
                if kind is not Peek:  # a peek delivers nothing
                    if delivered is None:
                        delivered = []
                    delivered.append(result)
        elif kind in MANY_FETCHES:  # a monitor's or thrift get's fetch: items counted, not timed
            metrics.get_items_hit += len(result)
            if result:
                if many is None:
                    many = []
                many.append(result)
    if sets:
        metrics.histogram("set_latency_usec").add(usec, sets)
    if hits:
        metrics.get_items_hit += hits
        if not batch.parked:
            metrics.histogram("get_hit_latency_usec").add(usec, hits)
    if misses:
        metrics.get_items_miss += misses
        if batch.parked:
            metrics.histogram("get_timeout_msec").add(usec // 1000, misses)
        else:
            metrics.histogram("get_miss_latency_usec").add(usec, misses)
    if delivered or many:
        now_ms = int(now * 1000)
        delivery = metrics.delivery_latency or metrics.histogram("delivery_latency_msec")
        if delivered:
            _tally_delivery(delivery, delivered, now_ms)
        if many:
            for items in many:
                _tally_delivery(delivery, items, now_ms)


def _tally_delivery(delivery: Histogram, items: list[Item], now_ms: int) -> None:
    """Count each item's time in the queue (``delivery_latency_msec``), once per run of items
    added in the same millisecond (a burst of SETs is read back as one): a monitor's thousand
    items cost a tally per run, not a call per item."""
    run_time = 0
    run = 0
    for item in items:  # typed: the compiled build reads add_time natively, not by name (boxed)
        add_time: int = item.add_time
        if add_time != run_time or not run:
            if run:
                delivery.add(now_ms - run_time, run)
            run_time = add_time
            run = 0
        run += 1
    if run:
        delivery.add(now_ms - run_time, run)
