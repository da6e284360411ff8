"""``/metrics``: the snapshot's figures in the Prometheus text format, through prometheus_client.

A custom collector reads one :class:`~kestrel_actors.snapshot.StatsSnapshot` (the numbers
``/stats.json`` and memcache ``stats`` show), so there is one source of truth. Kestrel's names
become ``kestrel_<name>``; a queue's figures are ``kestrel_queue_<name>`` with a ``queue``
label (an alias's: ``kestrel_alias_<name>`` with ``alias``; a name's bytes that are not UTF-8
written ``\\xNN``, as the format must be UTF-8); latencies are histograms in
seconds (``kestrel_queue_set_latency_seconds``) whose buckets are a subset of the
histogram's own, so their counts are exact. The process metrics prometheus_client offers
(CPU, memory, file descriptors, Python's GC and version) come along.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from .._names import name_text
from ..actors._stats import LATENCIES
from ..snapshot import StatsSnapshot

__all__ = ["CONTENT_TYPE", "SnapshotCollector", "exposition"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text format every Prometheus reads (our names need none of format 1.0.0's escaping)."""

PROMETHEUS_BOUNDS = tuple(4**power for power in range(0, 16))
"""1, 4, 16, … 4**15 (about 18 minutes in µs): each is a bound of the histogram's buckets."""

_SECONDS = {
    "set_latency_usec": ("set_latency_seconds", 1e-6),
    "get_hit_latency_usec": ("get_hit_latency_seconds", 1e-6),
    "get_miss_latency_usec": ("get_miss_latency_seconds", 1e-6),
    "delivery_latency_msec": ("delivery_latency_seconds", 1e-3),
    "get_timeout_msec": ("get_timeout_seconds", 1e-3),
}
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
        for name, value in counters.pop(None).items():
            yield CounterMetricFamily(f"kestrel_{_name(name)}", f"Kestrel counter {name}", value=value)
        yield from _per_scope(counters, aliases, CounterMetricFamily, "counter")
        gauges = snapshot.gauges()
        for name, value in gauges.pop(None).items():
            yield GaugeMetricFamily(f"kestrel_{_name(name)}", f"Kestrel gauge {name}", value=value)
        yield from _per_scope(gauges, aliases, GaugeMetricFamily, "gauge")
        histograms = snapshot.histograms()
        histograms.pop(None, None)
        for metric in LATENCIES:
            name, scale = _SECONDS[metric]
            family = HistogramMetricFamily(
                f"kestrel_queue_{name}", f"Kestrel metric q/<queue>/{metric}, in seconds", labels=["queue"]
            )
            for queue, by_metric in histograms.items():
                histogram = by_metric[metric]
                counts = histogram.cumulative(PROMETHEUS_BOUNDS)
                buckets = [(repr(bound * scale), count) for bound, count in zip(PROMETHEUS_BOUNDS, counts)]
                buckets.append(("+Inf", histogram.count))
                family.add_metric([name_text(queue)], buckets, sum_value=histogram.sum * scale)
            yield family


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
