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

import itertools
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import structlog

from ..queue_name import name_text
from ..snapshot import CHUNK, StatsSnapshot
from ..stats import Histogram

__all__ = [
    "MAX_PERIODS", "NamedListeners", "PeriodLatches", "distribution", "json_bytes", "ostrich_json", "ostrich_stats",
    "ostrich_text", "server_info",
]

log = structlog.get_logger("kestrel_actors.admin")

MAX_PERIODS = 8
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999), ("p9999", 0.9999))


def distribution(histogram: Histogram) -> dict[str, int]:
    count = histogram.count
    if not count:
        return dict(_NOTHING)
    result = {
        "count": count,
        "sum": histogram.sum,
        "average": histogram.sum // count,
        "minimum": histogram.minimum(),
        "maximum": histogram.maximum(),
    }
    for name, fraction in PERCENTILES:
        result[name] = histogram.percentile(fraction)
    return result


_NOTHING = {"count": 0, "sum": 0, "average": 0, "minimum": 0, "maximum": 0, **{name: 0 for name, _ in PERCENTILES}}
"""The distribution of a metric with no values (most of a quiet queue's)."""


def _scoped(scope: str | None, name: str) -> str:
    return name if scope is None else f"q/{scope}/{name}"


STATS_CHUNK = 100
"""Queues whose counters and metrics /stats.json works out between two pauses."""


def _nothing() -> None:
    pass


def ostrich_stats(current: StatsSnapshot, earlier: StatsSnapshot | None = None,
                  later: StatsSnapshot | None = None,
                  pause: Callable[[], None] = _nothing) -> dict[str, dict[str, Any]]:
    """ostrich's stats document. With ``earlier``, counters and metrics are what was added
    from ``earlier`` to ``later`` (default: ``current``); gauges and labels are ``current``'s.
    ``pause`` is called after every :data:`STATS_CHUNK` queues (and every
    :data:`~kestrel_actors.snapshot.CHUNK` for the gauges)."""
    later = later or current
    counters: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    for done, scope in enumerate(later.scopes()):
        values = later.counters_of(scope) or {}
        before = (earlier.counters_of(scope) if earlier is not None else None) or {}
        for name, value in values.items():
            counters[_scoped(scope, name)] = value - before.get(name, 0)
        histograms = later.histograms_of(scope)
        if histograms is not None:
            old = (earlier.histograms_of(scope) if earlier is not None else None) or {}
            for name, histogram in histograms.items():
                if name in old:
                    histogram = histogram.minus(old[name])
                metrics[_scoped(scope, name)] = distribution(histogram)
        if done % STATS_CHUNK == 0:
            pause()
    gauges: dict[str, Any] = {}
    for done, scope in enumerate(current.scopes()):
        for name, gauge in (current.gauges_of(scope) or {}).items():
            gauges[_scoped(scope, name)] = gauge
        if done % CHUNK == 0:
            pause()
    for name in current.loading:  # a queue still replaying its journal (behaviour §7.1)
        gauges[_scoped(name, "loading")] = 1
    return {"counters": counters, "gauges": gauges, "labels": current.labels(), "metrics": metrics}


def ostrich_text(stats: dict[str, dict[str, Any]], pause: Callable[[], None] = _nothing) -> list[bytes]:
    """``/stats.txt``: ostrich's plain-text layout, one section per kind; in each, the
    server's names sorted, then the queues' in blocks of whole queues, each block sorted."""
    parts = []
    for section in ("counters", "gauges", "labels", "metrics"):
        parts.append(f"{section}:\n".encode())
        for block in _scope_blocks(stats[section], pause):
            lines = []
            for name in block:
                value = stats[section][name]
                if isinstance(value, dict):
                    value = "(" + ", ".join(f"{key}={value[key]}" for key in sorted(value)) + ")"
                lines.append(f"  {name}: {value}\n")
            parts.append(name_text("".join(lines)).encode())
    return parts


def _scope_blocks(values: dict[str, Any], pause: Callable[[], None]) -> Iterator[list[str]]:
    """The names of ``values`` (as :func:`ostrich_stats` made them: the server's, then each
    queue's together) in blocks of about :data:`JSON_CHUNK`, each block sorted by scope;
    ``pause`` after each. A sort of every name would hold the hub: 5,000 queues, 60,000 names."""
    names = iter(values)
    server = sorted(name for name in itertools.takewhile(lambda name: not name.startswith("q/"), values))
    yield server
    pause()
    block: list[str] = []
    for name in itertools.islice(names, len(server), None):
        block.append(name)
        if len(block) >= JSON_CHUNK and _scope(name) != _scope(block[-2]):
            last = block.pop()
            yield sorted(block)
            pause()
            block = [last]
    yield sorted(block)


def _scope(name: str) -> str:
    return name[: name.rfind("/")]


def ostrich_json(stats: dict[str, dict[str, Any]], pause: Callable[[], None] = _nothing) -> list[bytes]:
    """``/stats.json``'s body, as :func:`json_bytes` writes it, :data:`JSON_CHUNK` names at
    a time (``pause`` after each): one ``json.dumps`` of 5,000 queues' figures held the hub
    for a tenth of a second."""
    parts = [b"{"]
    for index, section in enumerate(sorted(stats)):
        values = stats[section]
        parts.append(b'%s"%s":{' % (b"," if index else b"", section.encode()))
        first = True
        for block in _scope_blocks(values, pause):
            if block:
                members = json_bytes({name: values[name] for name in block})[1:-1]
                parts.append(b"%s%s" % (b"" if first else b",", members))
                first = False
        parts.append(b"}")
    parts.append(b"}")
    return parts


JSON_CHUNK = 500
"""Names /stats.json and /stats.txt write between two pauses."""


def json_bytes(document: Any) -> bytes:
    """``document`` as compact JSON in UTF-8, keys sorted; a name that is not UTF-8 is
    written as ``\\xNN`` (:func:`~kestrel_actors.queue_name.name_text`)."""
    text = json.dumps(document, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a name that is not UTF-8: the rule of /stats.txt, \xNN
        return json_bytes(_name_texts(document))


def _name_texts(value: Any) -> Any:
    if isinstance(value, str):
        return name_text(value)
    if isinstance(value, dict):
        return {name_text(key): _name_texts(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_name_texts(item) for item in value]
    return value


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

    def stats(self, period: int, current: StatsSnapshot,
              pause: Callable[[], None] = _nothing) -> dict[str, dict[str, Any]]:
        latch = self.latches.get(period)
        if latch is None:
            latch = self.latches[period] = _Latch(period, self.take, current)
            while len(self.latches) > MAX_PERIODS:
                _, dropped = self.latches.popitem(last=False)
                dropped.greenlet.kill(block=False)
        self.latches.move_to_end(period)
        if latch.report is None:
            return ostrich_stats(current, latch.base, pause=pause)
        earlier, later = latch.report
        return ostrich_stats(current, earlier, later, pause)

    def close(self) -> None:
        for latch in self.latches.values():
            latch.greenlet.kill(block=False)
        self.latches.clear()


class NamedListeners:
    """The names asked for with ``?namespace=``: each keeps the snapshot of its last read."""

    def __init__(self) -> None:
        self.last: OrderedDict[str, StatsSnapshot] = OrderedDict()

    def stats(self, name: str, current: StatsSnapshot,
              pause: Callable[[], None] = _nothing) -> dict[str, dict[str, Any]]:
        earlier = self.last.pop(name, current)
        self.last[name] = current
        while len(self.last) > MAX_PERIODS:
            self.last.popitem(last=False)
        return ostrich_stats(current, earlier, pause=pause)


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
