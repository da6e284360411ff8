"""``/metrics``: the snapshot's figures in the Prometheus text format, through prometheus_client.

A custom collector reads one :class:`~kestrel_actors.snapshot.StatsSnapshot` (the numbers
``/stats.json`` and memcache ``stats`` show), so there is one source of truth. Kestrel's names
become ``kestrel_<name>``; a queue's figures are ``kestrel_queue_<name>`` with a ``queue``
label (an alias's: ``kestrel_alias_<name>`` with ``alias``; a name's bytes that are not UTF-8
written ``\\xNN``, as the format must be UTF-8); metrics are histograms whose buckets are a
subset of the histogram's own, so their counts are exact: durations in seconds
(``kestrel_queue_set_latency_seconds``, ``kestrel_fsync_delay_seconds``). Per-queue latencies are
not repeated server-wide (sum the queues); the fsync figures are server-wide only, and
``fsync_error_<class>`` is ``kestrel_fsync_error_total{exception="<class>"}``;
``oldest_item_age_msec`` is ``kestrel_queue_oldest_item_age_seconds``. The process
metrics prometheus_client offers (CPU, memory, file descriptors, Python's GC and version)
come along.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from .._names import name_text
from ..stats import QUEUE_METRICS, SERVER_METRICS, Histogram
from ..snapshot import StatsSnapshot

__all__ = ["CONTENT_TYPE", "SnapshotCollector", "exposition"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text format every Prometheus reads (our names need none of format 1.0.0's escaping)."""

PROMETHEUS_BOUNDS = tuple(4**power for power in range(0, 16))
"""1, 4, 16, … 4**15 (about 18 minutes in µs): each is a bound of the histogram's buckets."""

_PROMETHEUS_NAMES = {
    "set_latency_usec": ("set_latency_seconds", 1e-6),
    "get_hit_latency_usec": ("get_hit_latency_seconds", 1e-6),
    "get_miss_latency_usec": ("get_miss_latency_seconds", 1e-6),
    "delivery_latency_msec": ("delivery_latency_seconds", 1e-3),
    "get_timeout_msec": ("get_timeout_seconds", 1e-3),
    "journal_rewrite_usec": ("journal_rewrite_seconds", 1e-6),
    "journal_rotation_usec": ("journal_rotation_seconds", 1e-6),
    "fill_readbehind_usec": ("fill_readbehind_seconds", 1e-6),
    "fsync_delay_usec": ("fsync_delay_seconds", 1e-6),
    "item_fsync_delay_usec": ("item_fsync_delay_seconds", 1e-6),
}
"""Each metric's Prometheus name (in seconds, as Prometheus names units) and scale."""
FSYNC_ERROR = "fsync_error_"
OLDEST_ITEM_AGE = "oldest_item_age_msec"
_RENAMED = {"uptime": "uptime_seconds", "status/readable": "status_readable", "status/writeable": "status_writeable"}


def _name(name: str) -> str:
    return _RENAMED.get(name, name).replace("/", "_")


class SnapshotCollector:
    """Yields the metric families of one snapshot."""

    def __init__(self, snapshot: StatsSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[object]:
        snapshot = self.snapshot
        yield InfoMetricFamily("kestrel", "Server version and status", value=snapshot.labels())
        counters = snapshot.counters()
        aliases = {queue.name for queue in snapshot.queues if queue.extra is None}
        errors = CounterMetricFamily("kestrel_fsync_error", "Kestrel counters fsync_error_<class>",
                                     labels=["exception"])
        for name, value in counters.pop(None).items():
            if name.startswith(FSYNC_ERROR):
                errors.add_metric([name[len(FSYNC_ERROR):]], value)
                continue
            yield CounterMetricFamily(f"kestrel_{_name(name)}", f"Kestrel counter {name}", value=value)
        yield errors
        yield from _per_scope(counters, aliases, CounterMetricFamily, "counter")
        gauges = snapshot.gauges()
        for name, value in gauges.pop(None).items():
            yield GaugeMetricFamily(f"kestrel_{_name(name)}", f"Kestrel gauge {name}", value=value)
        yield _oldest_item_ages(gauges)
        yield from _per_scope(gauges, aliases, GaugeMetricFamily, "gauge")
        histograms = snapshot.histograms()
        server = histograms.pop(None, None)
        if server is not None:
            for metric in SERVER_METRICS:
                name, scale = _PROMETHEUS_NAMES[metric]
                family = HistogramMetricFamily(f"kestrel_{name}", f"Kestrel metric {metric}")
                _add_histogram(family, [], server[metric], scale)
                yield family
        for metric in QUEUE_METRICS:
            name, scale = _PROMETHEUS_NAMES[metric]
            family = HistogramMetricFamily(f"kestrel_queue_{name}", f"Kestrel metric q/<queue>/{metric}",
                                           labels=["queue"])
            for queue, by_metric in histograms.items():
                _add_histogram(family, [name_text(queue)], by_metric[metric], scale)
            yield family


def _oldest_item_ages(gauges: dict) -> GaugeMetricFamily:
    """``q/<name>/oldest_item_age_msec``, taken out of ``gauges``, in Prometheus's base unit."""
    family = GaugeMetricFamily("kestrel_queue_oldest_item_age_seconds",
                               "Seconds the queue's head item has waited (0: empty)", labels=["queue"])
    for scope, figures in gauges.items():
        msec = figures.pop(OLDEST_ITEM_AGE, None)
        if msec is not None:
            family.add_metric([name_text(scope)], msec / 1000)
    return family


def _add_histogram(family: HistogramMetricFamily, labels: list[str], histogram: Histogram, scale: float) -> None:
    counts = histogram.cumulative(PROMETHEUS_BOUNDS)
    buckets = [(repr(bound * scale), count) for bound, count in zip(PROMETHEUS_BOUNDS, counts)]
    buckets.append(("+Inf", histogram.count))
    family.add_metric(labels, buckets, sum_value=histogram.sum * scale)


def _per_scope(values: dict, aliases: set[str], family_class: type, kind: str) -> Iterator[object]:
    """One family per figure name, with a sample per queue (or alias)."""
    families: dict[tuple[str, str], object] = {}
    for scope, figures in values.items():
        label = "alias" if scope in aliases else "queue"
        for name, value in figures.items():
            key = (label, name)
            family = families.get(key)
            if family is None:
                family = families[key] = family_class(
                    f"kestrel_{label}_{_name(name)}", f"Kestrel {kind} q/<{label}>/{name}", labels=[label]
                )
            family.add_metric([name_text(scope)], value)
    yield from families.values()


def exposition(snapshot: StatsSnapshot) -> bytes:
    """The Prometheus text exposition of ``snapshot`` and of this process."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(SnapshotCollector(snapshot))
    return generate_latest(registry)
