"""``/metrics``: the snapshot's figures in the Prometheus text format, through prometheus_client.

Collectors read one :class:`~kestrel_actors.snapshot.StatsSnapshot` (the numbers
``/stats.json`` and memcache ``stats`` show), so there is one source of truth. Kestrel's names
become ``kestrel_<name>``; a queue's figures are ``kestrel_queue_<name>`` with a ``queue``
label (an alias's: ``kestrel_alias_<name>`` with ``alias``; a name's bytes that are not UTF-8
written ``\\xNN``, as the format must be UTF-8); metrics are histograms whose buckets are a
subset of the histogram's own, so their counts are exact: durations in seconds
(``kestrel_set_latency_seconds``, ``kestrel_fsync_delay_seconds``). ``fsync_error_<class>`` is
``kestrel_fsync_error_total{exception="<class>"}``. The process metrics prometheus_client
offers (CPU, memory, file descriptors, Python's GC and version) come along.

Each queue costs series, and a scrape's build runs on the hub the queues share: by default a
queue has only the series an operator watches (:data:`QUEUE_COUNTERS`, :data:`QUEUE_GAUGES`;
an alias :data:`ALIAS_COUNTERS`), and the latency histograms are server-wide.
``every_series`` (``/metrics?queue_series=all``) adds the rest of Kestrel's per-queue figures
and every per-queue histogram (:data:`~kestrel_actors.stats.QUEUE_METRICS`): 177 series a
queue instead of 16. The per-queue families are built :data:`~kestrel_actors.snapshot.CHUNK`
queues at a time, with a ``pause`` between chunks.
``oldest_item_age_msec`` is ``kestrel_queue_oldest_item_age_seconds``.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.utils import floatToGoString

from .._names import name_text
from ..snapshot import StatsSnapshot
from ..stats import LATENCIES, QUEUE_METRICS, SERVER_METRICS, Histogram

__all__ = ["ALIAS_COUNTERS", "CONTENT_TYPE", "QUEUE_COUNTERS", "QUEUE_GAUGES", "SnapshotCollector", "exposition"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text format every Prometheus reads (our names need none of format 1.0.0's escaping)."""

QUEUE_COUNTERS = (
    "put_items", "put_bytes", "get_items_hit", "get_items_miss", "expired_items", "discarded",
    "canceled_transactions",
)
"""A queue's counters in a default scrape: what came in, what went out or was missed, what was
lost to expiry or a full queue, and the reads given back."""
QUEUE_GAUGES = ("items", "bytes", "mem_bytes", "age_msec", "oldest_item_age_msec", "waiters",
                "open_transactions", "journal_size", "journal_failing")
"""A queue's gauges in a default scrape: its backlog (items, bytes; ``mem_bytes`` below
``bytes``: it reads behind), Kestrel's age (of the last item read) and how long the head
item has waited (the backlog's age, in seconds), who waits on it, its journal's size, and
whether its journal writes are failing (the alert for a full disk)."""
ALIAS_COUNTERS = ("put_items", "put_bytes")
SERIES_PER_QUEUE = len(QUEUE_COUNTERS) + len(QUEUE_GAUGES)
EVERY_SERIES_PER_QUEUE = 177
"""12 counters, 13 gauges, 8 histograms of 19 series each."""

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


def _nothing() -> None:
    pass


class SnapshotCollector:
    """Yields the server-wide metric families of one snapshot."""

    def __init__(self, snapshot: StatsSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[object]:
        snapshot = self.snapshot
        yield InfoMetricFamily("kestrel", "Server version and status", value=snapshot.labels())
        errors = CounterMetricFamily("kestrel_fsync_error", "Kestrel counters fsync_error_<class>",
                                     labels=["exception"])
        for name, value in (snapshot.counters_of(None) or {}).items():
            if name.startswith(FSYNC_ERROR):
                errors.add_metric([name[len(FSYNC_ERROR):]], value)
                continue
            yield CounterMetricFamily(f"kestrel_{_name(name)}", f"Kestrel counter {name}", value=value)
        yield errors
        for name, value in (snapshot.gauges_of(None) or {}).items():
            yield GaugeMetricFamily(f"kestrel_{_name(name)}", f"Kestrel gauge {name}", value=value)
        server = snapshot.histograms_of(None)
        if server is not None:
            for metric in LATENCIES + SERVER_METRICS:
                name, scale = _PROMETHEUS_NAMES[metric]
                family = HistogramMetricFamily(f"kestrel_{name}", f"Kestrel metric {metric}")
                _add_histogram(family, [], server[metric], scale)
                yield family



def _add_histogram(family: HistogramMetricFamily, labels: list[str], histogram: Histogram, scale: float) -> None:
    counts = histogram.cumulative(PROMETHEUS_BOUNDS)
    buckets = [(repr(bound * scale), count) for bound, count in zip(PROMETHEUS_BOUNDS, counts)]
    buckets.append(("+Inf", histogram.count))
    family.add_metric(labels, buckets, sum_value=histogram.sum * scale)


class _ScopeFamilies:
    """The per-queue (and per-alias) families, written a chunk of queues at a time.

    A family's samples must follow its one ``# HELP``/``# TYPE`` header, so each family's
    lines are kept apart until the end. The lines are written here, as prometheus_client
    writes them (its number format and label escaping; a test holds the two equal), at a
    fifth of its cost per sample."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.parts: dict[str, list[bytes]] = {}
        """Each family's samples, one piece per chunk."""
        self.lines: dict[str, list[str]] = {}
        """Each family's samples of the chunk being written."""

    def family(self, name: str, kind: str, help_text: str) -> list[str]:
        lines = self.lines.get(name)
        if lines is None:
            if name not in self.headers:
                self.headers[name] = f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
                self.parts[name] = []
            lines = self.lines[name] = []
        return lines

    def add(self, snapshot: StatsSnapshot, scopes: list[str | None], every_series: bool) -> None:
        """Write the samples of ``scopes``' queues and aliases."""
        histograms = QUEUE_METRICS if every_series else ()
        for metric in histograms:  # a histogram family is there even without queues, as before
            name, _scale = _PROMETHEUS_NAMES[metric]
            self.family(f"kestrel_queue_{name}", "histogram", f"Kestrel metric q/<queue>/{metric}")
        for scope in scopes:
            alias = snapshot.is_alias(scope)
            label = "alias" if alias else "queue"
            labels = f'{label}="{_escape(name_text(scope))}"'  # type: ignore[arg-type]
            counters = snapshot.counters_of(scope) or {}
            gauges = snapshot.gauges_of(scope) or {}
            if not every_series:
                counters = {name: counters[name] for name in (ALIAS_COUNTERS if alias else QUEUE_COUNTERS)}
                gauges = {} if alias else {name: gauges[name] for name in QUEUE_GAUGES}
            for name, value in counters.items():
                family = f"kestrel_{label}_{_name(name)}_total"
                self.family(family, "counter", f"Kestrel counter q/<{label}>/{name}").append(
                    f"{family}{{{labels}}} {floatToGoString(value)}\n")
            for name, value in gauges.items():
                if name == OLDEST_ITEM_AGE:  # ours, so in Prometheus's base unit
                    name, value = "oldest_item_age_seconds", value / 1000
                family = f"kestrel_{label}_{_name(name)}"
                self.family(family, "gauge", f"Kestrel gauge q/<{label}>/{name}").append(
                    f"{family}{{{labels}}} {floatToGoString(value)}\n")
            by_metric = snapshot.histograms_of(scope) if histograms else None
            if by_metric is not None:
                for metric in histograms:
                    name, scale = _PROMETHEUS_NAMES[metric]
                    family = f"kestrel_queue_{name}"
                    _histogram_lines(self.lines[family], family, labels, by_metric[metric], scale)
        for name, lines in self.lines.items():
            self.parts[name].append("".join(lines).encode())
        self.lines.clear()

    def text(self) -> Iterator[bytes]:
        """Counters, then gauges, then histograms (as prometheus_client's families came)."""
        order = {"counter": 0, "gauge": 1, "histogram": 2}
        names = sorted(self.headers, key=lambda name: order[self.headers[name].rsplit(" ", 1)[1].strip()])
        for name in names:
            yield self.headers[name].encode()
            yield from self.parts[name]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _histogram_lines(lines: list[str], family: str, labels: str, histogram: Histogram, scale: float) -> None:
    counts = histogram.cumulative(PROMETHEUS_BOUNDS)
    for bound, count in zip(PROMETHEUS_BOUNDS, counts):
        lines.append(f'{family}_bucket{{le="{bound * scale!r}",{labels}}} {floatToGoString(count)}\n')
    count = floatToGoString(histogram.count)
    lines.append(f'{family}_bucket{{le="+Inf",{labels}}} {count}\n')
    lines.append(f"{family}_count{{{labels}}} {count}\n")
    lines.append(f"{family}_sum{{{labels}}} {floatToGoString(histogram.sum * scale)}\n")


SERIES_PER_PAUSE = 1500
"""About the samples written between two pauses (a few milliseconds)."""


def exposition(snapshot: StatsSnapshot, every_series: bool = False,
               pause: Callable[[], None] = _nothing) -> list[bytes]:
    """The Prometheus text exposition of ``snapshot`` and of this process, in pieces;
    ``pause`` is called after each chunk of queues."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(SnapshotCollector(snapshot))  # type: ignore[arg-type]
    parts = [generate_latest(registry)]
    pause()
    scopes = snapshot.scopes()[1:]
    per_scope = _ScopeFamilies()
    chunk = SERIES_PER_PAUSE // (EVERY_SERIES_PER_QUEUE if every_series else SERIES_PER_QUEUE)
    for start in range(0, max(len(scopes), 1), chunk):
        per_scope.add(snapshot, scopes[start:start + chunk], every_series)
        pause()
    parts.extend(per_scope.text())
    return parts
