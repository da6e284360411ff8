"""Measurements: a latency histogram, a per-process recorder, and figures merged across processes.

Why a histogram rather than a list of samples: Kestrel keeps only the first 100k timings per
client, which skews percentiles of long runs. A log-linear histogram (exact below 1024 usec,
then 512 sub-buckets per power of two, i.e. within 0.2%) has a fixed size whatever the run
length, costs a couple of integer operations per request, and merges by addition, so figures
from ``--procs N`` worker processes combine exactly.

``Recorder`` is what the client loops call (``done`` after each request, ``miss`` for an
empty GET). It also keeps a throughput timeline in 100 ms buckets counted from a common
``epoch`` (CLOCK_MONOTONIC is system-wide on Linux, so buckets from different processes line
up) and publishes its item count into a shared progress slot for the progress bar and for
scenarios whose clients stop when the whole run has seen ``n`` items.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BUCKET_NS", "PERCENTILES", "Figures", "Recorder", "bucket_of", "bucket_value"]

_EXACT = 1024          # usec values below this get their own bucket
_SUB_BITS = 9          # 512 sub-buckets per power of two above that
_SUB = 1 << _SUB_BITS
_NBUCKETS = _EXACT + 48 * _SUB
BUCKET_NS = 100_000_000  # throughput timeline resolution: 100 ms
PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p999", 0.999))


def bucket_of(usec: int) -> int:
    """Histogram bucket of a latency in microseconds."""
    if usec < _EXACT:
        return usec if usec > 0 else 0
    shift = usec.bit_length() - (_SUB_BITS + 1)
    return min(_EXACT + (shift - 1) * _SUB + ((usec >> shift) - _SUB), _NBUCKETS - 1)


def bucket_value(index: int) -> int:
    """The smallest latency (usec) that falls in bucket ``index``."""
    if index < _EXACT:
        return index
    shift, sub = divmod(index - _EXACT, _SUB)
    return (sub + _SUB) << (shift + 1)


class Recorder:
    """Counts, latencies and a timeline for one kind of request in one process."""

    __slots__ = ("name", "epoch", "items", "misses", "dups", "hist", "timeline", "first_ns",
                 "last_ns", "progress", "slot", "counters")

    def __init__(self, name: str, epoch: int, progress: Any = None, slot: int = 0) -> None:
        self.name = name
        self.epoch = epoch
        self.items = 0
        self.misses = 0
        self.dups = 0
        self.hist = [0] * _NBUCKETS
        self.timeline: list[int] = []
        self.first_ns = 0
        self.last_ns = 0
        self.progress = progress  # a shared array (one slot per process) or None
        self.slot = slot
        self.counters: dict[str, int] = {}

    def done(self, t0: int, items: int = 1) -> int:
        """A request started at ``t0`` (``time.monotonic_ns``) completed ``items`` items."""
        t1 = time.monotonic_ns()
        usec = (t1 - t0) // 1000
        if usec < _EXACT:
            self.hist[usec] += 1
        else:
            self.hist[bucket_of(usec)] += 1
        self._count(t1, items)
        return t1

    def _count(self, t1: int, items: int) -> None:
        if items:
            self.items += items
            self.last_ns = t1
            if not self.first_ns:
                self.first_ns = t1
            index = (t1 - self.epoch) // BUCKET_NS
            timeline = self.timeline
            if index >= len(timeline):
                timeline.extend([0] * (index + 1 - len(timeline)))
            timeline[index] += items
            if self.progress is not None:
                self.progress[self.slot] = self.items

    def count(self, items: int = 1) -> None:
        """Items completed without a latency sample (e.g. the tail of a monitor stream)."""
        self._count(time.monotonic_ns(), items)

    def miss(self) -> None:
        """An empty GET (``END``): counted, but kept out of the latency distribution."""
        self.misses += 1

    def bump(self, counter: str, by: int = 1) -> None:
        """A scenario-specific counter (kills, drops, reconnects …)."""
        self.counters[counter] = self.counters.get(counter, 0) + by

    def figures(self, go_ns: int) -> Figures:
        return Figures(
            name=self.name, items=self.items, misses=self.misses, dups=self.dups,
            hist={i: c for i, c in enumerate(self.hist) if c}, timeline=list(self.timeline),
            epoch=self.epoch, go_ns=go_ns, first_ns=self.first_ns, last_ns=self.last_ns,
            counters=dict(self.counters),
        )


@dataclass
class Figures:
    """Picklable, mergeable results of one recorder (or of many, after ``merge``)."""

    name: str
    items: int = 0
    misses: int = 0
    dups: int = 0
    hist: dict[int, int] = field(default_factory=dict)
    timeline: list[int] = field(default_factory=list)
    epoch: int = 0
    go_ns: int = 0
    first_ns: int = 0
    last_ns: int = 0
    end_ns: int = 0
    counters: dict[str, int] = field(default_factory=dict)

    def merge(self, other: Figures) -> Figures:
        """Add ``other`` (same epoch) into this one and return self."""
        self.items += other.items
        self.misses += other.misses
        self.dups += other.dups
        for index, count in other.hist.items():
            self.hist[index] = self.hist.get(index, 0) + count
        if len(other.timeline) > len(self.timeline):
            self.timeline.extend([0] * (len(other.timeline) - len(self.timeline)))
        for index, count in enumerate(other.timeline):
            self.timeline[index] += count
        self.epoch = self.epoch or other.epoch
        starts = [x for x in (self.go_ns, other.go_ns) if x]
        self.go_ns = min(starts) if starts else 0
        firsts = [x for x in (self.first_ns, other.first_ns) if x]
        self.first_ns = min(firsts) if firsts else 0
        self.last_ns = max(self.last_ns, other.last_ns)
        self.end_ns = max(self.end_ns, other.end_ns)
        for key, value in other.counters.items():
            self.counters[key] = self.counters.get(key, 0) + value
        return self

    @property
    def samples(self) -> int:
        return sum(self.hist.values())

    @property
    def seconds(self) -> float:
        """From the start signal to the last completed item."""
        if not self.go_ns or not self.last_ns:
            return 0.0
        return max(self.last_ns - self.go_ns, 1) / 1e9

    @property
    def rate(self) -> float:
        seconds = self.seconds
        return self.items / seconds if seconds else 0.0

    def percentile(self, fraction: float) -> int:
        """The latency (usec) at ``fraction`` of the samples (Kestrel's ``sorted(size * r)``)."""
        total = self.samples
        if not total:
            return 0
        rank = min(int(total * fraction), total - 1)
        seen = 0
        for index in sorted(self.hist):
            seen += self.hist[index]
            if seen > rank:
                return bucket_value(index)
        return 0  # pragma: no cover

    def mean_usec(self) -> float:
        """The average latency (usec), from the histogram (each sample at its bucket's value)."""
        total = self.samples
        return sum(bucket_value(index) * count for index, count in self.hist.items()) / total if total else 0.0

    def max_usec(self) -> int:
        return bucket_value(max(self.hist)) if self.hist else 0

    def latency(self) -> dict[str, int]:
        return {label: self.percentile(fraction) for label, fraction in PERCENTILES}

    def distribution_line(self) -> str:
        """Kestrel's ``Distribution in usec: min=.. max=.. p50=.. … p9999=..`` line."""
        if not self.hist:
            return "Distribution in usec: (no samples)"
        keys = sorted(self.hist)
        parts = [f"min={bucket_value(keys[0])}", f"max={bucket_value(keys[-1])}"]
        for label, fraction in (("p50", .5), ("p75", .75), ("p90", .9), ("p95", .95), ("p99", .99),
                                ("p999", .999), ("p9999", .9999)):
            parts.append(f"{label}={self.percentile(fraction)}")
        return "Distribution in usec: " + " ".join(parts)

    def summary(self) -> dict[str, Any]:
        """The figures that go in the final JSON line."""
        return {
            "items": self.items, "seconds": round(self.seconds, 4), "rate": round(self.rate, 1),
            "latency_usec": self.latency(), "misses": self.misses,
        }
