"""ostrich's ``/stats.json`` and ``/stats.txt``: counters, gauges, labels and metrics.

Names are Kestrel's: server-wide ones bare (``cmd_get``, ``set_latency_usec``), a queue's under
``q/<name>/`` (``q/jobs/items``), as ``PersistentQueue.statNamed`` built them. A metric is
ostrich's distribution summary: ``count``, ``sum``, ``average``, ``minimum``, ``maximum`` and
the percentiles ``p50`` … ``p9999``.

``?period=N`` is ostrich's latched view: counters and metrics are what the last whole period
of N seconds added (until one has passed: what was added since the period was first asked
for); gauges and labels are current. Each period asked for keeps one greenlet that takes a
snapshot every N seconds; at most :data:`MAX_PERIODS` are kept (the least recently asked
for is dropped), so asking for many periods cannot grow the server's memory.

``?namespace=NAME`` is ostrich's older named listener: counters and metrics are what was
added since the last read of that name (nothing, the first time). At most
:data:`MAX_PERIODS` names are kept, as for periods.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable

import gevent
import structlog

from ..stats import Histogram
from ..snapshot import StatsSnapshot

__all__ = ["MAX_PERIODS", "NamedListeners", "PeriodLatches", "distribution", "ostrich_stats", "ostrich_text", "server_info"]

log = structlog.get_logger("kestrel_actors.admin")

MAX_PERIODS = 8
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999), ("p9999", 0.9999))


def distribution(histogram: Histogram) -> dict[str, int]:
    count = histogram.count
    result = {
        "count": count,
        "sum": histogram.sum,
        "average": histogram.sum // count if count else 0,
        "minimum": histogram.minimum(),
        "maximum": histogram.maximum(),
    }
    for name, fraction in PERCENTILES:
        result[name] = histogram.percentile(fraction)
    return result


def _scoped(scope: str | None, name: str) -> str:
    return name if scope is None else f"q/{scope}/{name}"


def ostrich_stats(current: StatsSnapshot, earlier: StatsSnapshot | None = None,
                  later: StatsSnapshot | None = None) -> dict[str, dict[str, Any]]:
    """ostrich's stats document. With ``earlier``, counters and metrics are what was added
    from ``earlier`` to ``later`` (default: ``current``); gauges and labels are ``current``'s."""
    later = later or current
    old_counters = earlier.counters() if earlier is not None else {}
    old_histograms = earlier.histograms() if earlier is not None else {}
    counters = {}
    for scope, values in later.counters().items():
        before = old_counters.get(scope, {})
        for name, value in values.items():
            counters[_scoped(scope, name)] = value - before.get(name, 0)
    gauges = {}
    for scope, values in current.gauges().items():
        for name, value in values.items():
            gauges[_scoped(scope, name)] = value
    metrics = {}
    for scope, histograms in later.histograms().items():
        before = old_histograms.get(scope, {})
        for name, histogram in histograms.items():
            metrics[_scoped(scope, name)] = distribution(histogram.minus(before.get(name)))
    return {"counters": counters, "gauges": gauges, "labels": current.labels(), "metrics": metrics}


def ostrich_text(stats: dict[str, dict[str, Any]]) -> str:
    """``/stats.txt``: ostrich's plain-text layout, one section per kind, names sorted."""
    lines = []
    for section in ("counters", "gauges", "labels", "metrics"):
        lines.append(f"{section}:")
        for name in sorted(stats[section]):
            value = stats[section][name]
            if isinstance(value, dict):
                value = "(" + ", ".join(f"{key}={value[key]}" for key in sorted(value)) + ")"
            lines.append(f"  {name}: {value}")
    return "\n".join(lines) + "\n"


class _Latch:
    """One period: the snapshot at its last boundary, and the last whole period's pair."""

    def __init__(self, period: int, take: Callable[[], StatsSnapshot], base: StatsSnapshot) -> None:
        self.period = period
        self.take = take
        self.base = base
        self.report: tuple[StatsSnapshot, StatsSnapshot] | None = None
        self.greenlet = gevent.spawn(self._run)

    def _run(self) -> None:
        while True:
            gevent.sleep(self.period)
            try:
                new = self.take()
            except Exception:  # noqa: BLE001 - shutting down, or a queue slow to answer
                log.warning("stats period snapshot failed", period=self.period)
                continue
            self.report = (self.base, new)
            self.base = new


class PeriodLatches:
    """The periods asked for with ``?period=``, at most :data:`MAX_PERIODS` of them."""

    def __init__(self, take: Callable[[], StatsSnapshot]) -> None:
        self.take = take
        self.latches: OrderedDict[int, _Latch] = OrderedDict()

    def stats(self, period: int, current: StatsSnapshot) -> dict[str, dict[str, Any]]:
        latch = self.latches.get(period)
        if latch is None:
            latch = self.latches[period] = _Latch(period, self.take, current)
            while len(self.latches) > MAX_PERIODS:
                _, dropped = self.latches.popitem(last=False)
                dropped.greenlet.kill(block=False)
        self.latches.move_to_end(period)
        if latch.report is None:
            return ostrich_stats(current, latch.base)
        earlier, later = latch.report
        return ostrich_stats(current, earlier, later)

    def close(self) -> None:
        for latch in self.latches.values():
            latch.greenlet.kill(block=False)
        self.latches.clear()


class NamedListeners:
    """The names asked for with ``?namespace=``: each keeps the snapshot of its last read."""

    def __init__(self) -> None:
        self.last: OrderedDict[str, StatsSnapshot] = OrderedDict()

    def stats(self, name: str, current: StatsSnapshot) -> dict[str, dict[str, Any]]:
        earlier = self.last.pop(name, current)
        self.last[name] = current
        while len(self.last) > MAX_PERIODS:
            self.last.popitem(last=False)
        return ostrich_stats(current, earlier)


def server_info(server: Any) -> dict[str, Any]:
    """ostrich's ``/server_info``: name, version, start time, uptime (ms) and status."""
    start = server.stats.start_time
    return {
        "name": "kestrel-actors",
        "version": server.version,
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
        "uptime": int((time.time() - start) * 1000),
        "status": server.status.status.value,
    }
