"""``/metrics``: the snapshot's figures in the Prometheus text format, through prometheus_client.

Collectors read one :class:`~kestrel_actors.snapshot.StatsSnapshot` (the numbers
``/stats.json`` and memcache ``stats`` show), so there is one source of truth. Kestrel's names
become ``kestrel_<name>``; a queue's figures are ``kestrel_queue_<name>`` with a ``queue``
label (an alias's: ``kestrel_alias_<name>`` with ``alias``; a name's bytes that are not UTF-8
written ``\\xNN``, as the format must be UTF-8), renamed by Prometheus's rules (issue 26 point
4; docs/admin.md lists every family): base units in the name (durations in ``_seconds``, sizes
in ``_bytes``, times as ``_timestamp_seconds``), a counter's ``_total`` once, and no sentinel
value (an unlimited ``max_items``/``max_bytes``, Kestrel's ``age`` of a queue nothing was read
from: the series is left out). Metrics are histograms whose buckets are a subset of the
histogram's own, so their counts are exact: durations in seconds
(``kestrel_set_latency_seconds``, ``kestrel_fsync_delay_seconds``). ``fsync_error_<class>`` is
``kestrel_fsync_error_total{exception="<class>"}``. The process metrics prometheus_client
offers (CPU, memory, file descriptors, Python's GC and version) come along.

Each queue costs series, and a scrape's build runs on the hub the queues share: by default a
queue has only the series an operator watches (:data:`QUEUE_COUNTERS`, :data:`QUEUE_GAUGES`;
an alias :data:`ALIAS_COUNTERS`), and the latency histograms are server-wide.
``every_series`` (``/metrics?queue_series=all``) adds the rest of Kestrel's per-queue figures
and every per-queue histogram (:data:`~kestrel_actors.stats.QUEUE_METRICS`): up to
:data:`EVERY_SERIES_PER_QUEUE` series a queue instead of 16. The per-queue families are built a
chunk of queues at a time, with a ``pause`` between chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.utils import floatToGoString

from ..config import INT_MAX, LONG_MAX
from ..queue_name import name_text
from ..snapshot import StatsSnapshot
from ..stats import BOUNDS, LATENCIES, QUEUE_METRICS, SERVER_METRICS, Histogram

__all__ = [
    "ALIAS_COUNTERS", "CONTENT_TYPE", "PROMETHEUS_BOUNDS", "QUEUE_COUNTERS", "QUEUE_GAUGES", "ScopeSample",
    "SnapshotCollector", "exposition", "scope_samples",
]

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

PROMETHEUS_BOUNDS = tuple(bound for bound in BOUNDS if bound <= 2**30)
"""Every bound of the histogram's own buckets up to 2**30 (18 minutes in µs, 12 days in ms):
1 to 8, then four a power of two, at most 1.25 times apart, so a quantile Prometheus
interpolates inside a bucket (``histogram_quantile``) is within 25% of the true value."""

HISTOGRAM_SERIES = len(PROMETHEUS_BOUNDS) + 3
"""A bucket a bound, ``+Inf``, ``_count`` and ``_sum``: 119."""
EVERY_SERIES_PER_QUEUE = 11 + 13 + len(QUEUE_METRICS) * HISTOGRAM_SERIES
"""At most: 11 counters (Kestrel's 12 but ``total_items``, which is ``put_items``), 13 gauges
(fewer when a limit is unlimited or nothing was read), 8 histograms (each left out while it
holds no value: a queue that saw no traffic has 24 series or fewer): 976."""

_PROMETHEUS_NAMES = {
    "set_latency_usec": ("set_latency_seconds", 1e6),
    "get_hit_latency_usec": ("get_hit_latency_seconds", 1e6),
    "get_miss_latency_usec": ("get_miss_latency_seconds", 1e6),
    "delivery_latency_msec": ("delivery_latency_seconds", 1e3),
    "get_timeout_msec": ("get_timeout_seconds", 1e3),
    "journal_rewrite_usec": ("journal_rewrite_seconds", 1e6),
    "journal_rotation_usec": ("journal_rotation_seconds", 1e6),
    "fill_readbehind_usec": ("fill_readbehind_seconds", 1e6),
    "fsync_delay_usec": ("fsync_delay_seconds", 1e6),
    "item_fsync_delay_usec": ("item_fsync_delay_seconds", 1e6),
}
"""Each metric's Prometheus name (in seconds, as Prometheus names units) and its units a second."""
FSYNC_ERROR = "fsync_error_"

_SERVER_NAMES = {
    "total_items": "put_items",  # not ``items_total``: ``kestrel_items`` is the gauge of items held
    "total_connections": "connections_accepted",  # ``kestrel_connections`` is the gauge
    "bytes_read": "read_bytes",
    "bytes_written": "written_bytes",
    "uptime": "uptime_seconds",
}
"""Server-wide names Prometheus's rules change (the unit last, then ``_total``); a ``/`` is ``_``."""

_SCOPE_NAMES: dict[str, tuple[str, float] | None] = {
    "total_items": None,  # a queue's ``put_items`` is the same count
    "total_flushes": ("flushes", 1),
    "age_msec": ("age_seconds", 1e3),
    "oldest_item_age_msec": ("oldest_item_age_seconds", 1e3),
    "journal_size": ("journal_size_bytes", 1),
    "create_time": ("create_timestamp_seconds", 1),
}
"""A queue's or alias's renamed figures: name and its units a base unit (``None``: left out)."""

_UNLIMITED = {"max_items": INT_MAX, "max_bytes": LONG_MAX}
"""The value a queue's limit has when the configuration sets none (Kestrel's Int/Long.MaxValue)."""

_EPOCH_DAY_MSEC = 86_400_000
"""Kestrel's ``age`` is now minus the add time of the last item read, 0 when nothing was: an
``age`` that dates that item before this (1970-01-02) is of a queue never read since start."""


def _name(name: str) -> str:
    return _SERVER_NAMES.get(name, name).replace("/", "_")


class ScopeSample(NamedTuple):
    """One series of a queue or alias, under its Prometheus name."""

    family: str
    """``kestrel_<queue|alias>_<name>``, a counter's with its ``_total``."""
    kind: str
    """``counter`` or ``gauge``."""
    kestrel_name: str
    value: float


def scope_samples(snapshot: StatsSnapshot, scope: str, every_series: bool) -> Iterator[ScopeSample]:
    """The counters and gauges ``/metrics`` gives queue (or alias) ``scope``: renamed and scaled
    by Prometheus's rules, sentinel values left out."""
    alias = snapshot.is_alias(scope)
    label = "alias" if alias else "queue"
    counters = snapshot.counters_of(scope) or {}
    gauges = snapshot.gauges_of(scope) or {}
    if not every_series:
        counters = {name: counters[name] for name in (ALIAS_COUNTERS if alias else QUEUE_COUNTERS)}
        gauges = {} if alias else {name: gauges[name] for name in QUEUE_GAUGES}
    never_read = snapshot.time * 1000 - _EPOCH_DAY_MSEC
    for kind, values in (("counter", counters), ("gauge", gauges)):
        for kestrel_name, value in values.items():
            series = _SCOPE_SERIES.get((label, kind, kestrel_name))
            if series is None:
                series = _SCOPE_SERIES[(label, kind, kestrel_name)] = _scope_series(label, kind, kestrel_name)
            family, per_unit = series
            if not family or _UNLIMITED.get(kestrel_name) == value:
                continue
            if kestrel_name == "age_msec" and value > never_read:
                continue
            yield ScopeSample(family, kind, kestrel_name, value / per_unit if per_unit != 1 else value)


_SCOPE_SERIES: dict[tuple[str, str, str], tuple[str, float]] = {}
""":func:`_scope_series` by label, kind and Kestrel's name."""


def _scope_series(label: str, kind: str, kestrel_name: str) -> tuple[str, float]:
    """The family of a queue's or alias's figure and its units a base unit; ``""``: left out."""
    name, per_unit = kestrel_name, 1.0
    if kestrel_name in _SCOPE_NAMES:
        renamed = _SCOPE_NAMES[kestrel_name]
        if renamed is None:
            return "", 1.0
        name, per_unit = renamed
    return (f"kestrel_{label}_{name}_total" if kind == "counter" else f"kestrel_{label}_{name}"), per_unit


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
        for name, gauge in (snapshot.gauges_of(None) or {}).items():
            yield GaugeMetricFamily(f"kestrel_{_name(name)}", f"Kestrel gauge {name}", value=gauge)
        server = snapshot.histograms_of(None)
        if server is not None:
            for metric in LATENCIES + SERVER_METRICS:
                name, per_second = _PROMETHEUS_NAMES[metric]
                family = HistogramMetricFamily(f"kestrel_{name}", f"Kestrel metric {metric}")
                _add_histogram(family, [], server[metric], per_second)
                yield family



def _add_histogram(family: HistogramMetricFamily, labels: list[str], histogram: Histogram, per_second: float) -> None:
    counts = histogram.cumulative(PROMETHEUS_BOUNDS)
    buckets = [(le, count) for le, count in zip(_le_labels(per_second), counts, strict=True)]
    buckets.append(("+Inf", histogram.count))
    family.add_metric(labels, buckets, sum_value=histogram.sum / per_second)


_LE_LABELS: dict[float, list[str]] = {}


def _le_labels(per_second: float) -> list[str]:
    """The ``le`` labels of :data:`PROMETHEUS_BOUNDS` in seconds (a division by a power of ten
    gives the shortest decimal: ``1.2e-05``, not ``1.1999999999999999e-05``)."""
    labels = _LE_LABELS.get(per_second)
    if labels is None:
        labels = _LE_LABELS[per_second] = [repr(bound / per_second) for bound in PROMETHEUS_BOUNDS]
    return labels


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

    def add(self, snapshot: StatsSnapshot, scopes: list[str | None], start: int, every_series: bool) -> int:
        """Write the samples of ``scopes``' queues and aliases from ``start`` on, until about
        :data:`SERIES_PER_PAUSE` series are written (a queue's histograms are there only when
        they hold values, so the series a queue has vary); the index of the next queue."""
        histograms = QUEUE_METRICS if every_series else ()
        for metric in histograms:  # a histogram family is there even without queues, as before
            name, _per_second = _PROMETHEUS_NAMES[metric]
            self.family(f"kestrel_queue_{name}", "histogram", f"Kestrel metric q/<queue>/{metric}")
        written = 0
        index = start
        while index < len(scopes) and written < SERIES_PER_PAUSE:
            scope = scopes[index]
            index += 1
            label = "alias" if snapshot.is_alias(scope) else "queue"
            labels = f'{label}="{_escape(name_text(scope))}"'  # type: ignore[arg-type]
            for sample in scope_samples(snapshot, scope, every_series):  # type: ignore[arg-type]
                family = sample.family
                self.family(family, sample.kind, f"Kestrel {sample.kind} q/<{label}>/{sample.kestrel_name}").append(
                    f"{family}{{{labels}}} {floatToGoString(sample.value)}\n")
                written += 1
            by_metric = snapshot.histograms_of(scope) if histograms else None
            if by_metric is not None:
                for metric in histograms:
                    histogram = by_metric[metric]
                    if not histogram.count:  # 119 series of zeros: left out until a value comes
                        continue
                    name, per_second = _PROMETHEUS_NAMES[metric]
                    family = f"kestrel_queue_{name}"
                    _histogram_lines(self.lines[family], family, labels, histogram, per_second)
                    written += HISTOGRAM_SERIES
        for name, lines in self.lines.items():
            self.parts[name].append("".join(lines).encode())
        self.lines.clear()
        return index

    def text(self) -> Iterator[bytes]:
        """Counters, then gauges, then histograms (as prometheus_client's families came)."""
        order = {"counter": 0, "gauge": 1, "histogram": 2}
        names = sorted(self.headers, key=lambda name: order[self.headers[name].rsplit(" ", 1)[1].strip()])
        for name in names:
            yield self.headers[name].encode()
            yield from self.parts[name]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _histogram_lines(lines: list[str], family: str, labels: str, histogram: Histogram, per_second: float) -> None:
    counts = histogram.cumulative(PROMETHEUS_BOUNDS)
    for le, count in zip(_le_labels(per_second), counts, strict=True):
        lines.append(f'{family}_bucket{{le="{le}",{labels}}} {floatToGoString(count)}\n')
    count = floatToGoString(histogram.count)
    lines.append(f'{family}_bucket{{le="+Inf",{labels}}} {count}\n')
    lines.append(f"{family}_count{{{labels}}} {count}\n")
    lines.append(f"{family}_sum{{{labels}}} {floatToGoString(histogram.sum / per_second)}\n")


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
    start = per_scope.add(snapshot, scopes, 0, every_series)
    pause()
    while start < len(scopes):
        start = per_scope.add(snapshot, scopes, start, every_series)
        pause()
    parts.extend(per_scope.text())
    return parts
