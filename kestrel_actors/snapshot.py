"""One picture of the server's figures: what memcache ``stats``, ``/stats.json`` and ``/metrics``
all read (one source of truth).

:func:`take_snapshot` turns the per-queue answers the collection gathered (``ForAll("stats")``)
and the server's own counters into a :class:`StatsSnapshot`. It reads plain attributes only:
it runs on the hub and never waits. The snapshot then speaks each format's names:

* :meth:`StatsSnapshot.memcache_lines`: the memcache STATS lines (behaviour §7.3);
* :meth:`StatsSnapshot.counters`, :meth:`~StatsSnapshot.gauges`, :meth:`~StatsSnapshot.labels`
  and :meth:`~StatsSnapshot.histograms`: Kestrel's ostrich names (``q/<name>/items``, …), per
  queue (``queue``) or server-wide (``None``), from which the admin HTTP service builds
  ostrich's JSON and the Prometheus exposition.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._malloc import HELD
from .messages import QueueStats
from .stats import LATENCIES, QUEUE_METRICS, SERVER_METRICS, Histogram, QueueMetrics, ServerStats

__all__ = [
    "CHUNK", "QUEUE_COUNTERS", "QUEUE_GAUGES", "DiskSpace", "StatsSnapshot", "disk_space", "gather_snapshot",
    "take_snapshot",
]

CHUNK = 250
"""Queues a scrape handles between two pauses (a few milliseconds of the hub's time)."""

QUEUE_COUNTERS = (
    "total_items", "put_items", "put_bytes", "get_items_hit", "get_items_miss", "transactions",
    "canceled_transactions", "expired_items", "discarded", "total_flushes", "journal_rewrites",
    "journal_rotations",
)
"""Per-queue ostrich counters, as ``PersistentQueue`` names them."""

QUEUE_GAUGES = (
    "items", "max_items", "bytes", "max_bytes", "journal_size", "mem_items", "mem_bytes",
    "age_msec", "waiters", "open_transactions", "create_time", "journal_failing", "oldest_item_age_msec",
)
"""Per-queue ostrich gauges, as ``PersistentQueue`` names them, then ours: ``journal_failing``
is 1 while the queue's journal cannot write (a full disk), else 0; ``oldest_item_age_msec``
is how long the head item has waited (memcache ``oldest_item_age``)."""

ALIAS_COUNTERS = ("put_items", "put_bytes")

_ZOOKEEPER_COUNTERS = ("joins", "sessions_expired")

_MEMCACHE_GLOBALS = ServerStats.COUNTERS[: ServerStats.COUNTERS.index("queue_expires") + 1]


def _figures(queue: QueueStats) -> dict[str, int]:
    """A queue's stats lines that are numbers, by name (all but ``children``, a list of names)."""
    return {stat: value for stat, value in queue.lines if isinstance(value, int)}


class DiskSpace(NamedTuple):
    """The data directory's filesystem, from one ``statvfs``."""

    free_bytes: int
    """What the server may still write (the blocks free to an unprivileged user)."""
    size_bytes: int
    """The filesystem's whole size."""


def disk_space(path: str | os.PathLike[str]) -> DiskSpace | None:
    """The filesystem holding ``path``; ``None`` if it cannot be read (the directory is gone)."""
    try:
        found = os.statvfs(path)
    except OSError:
        return None
    return DiskSpace(found.f_bavail * found.f_frsize, found.f_blocks * found.f_frsize)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 30


@dataclass
class StatsSnapshot:
    """The server's figures at one moment."""

    time: float
    start_time: float
    version: str
    status: str
    """The reported status name (``Up``, ``ReadOnly``, …)."""
    readable: bool
    writeable: bool
    server_counters: dict[str, int]
    """Every :class:`ServerStats` counter, by name."""
    queues: list[QueueStats]
    """Queues then aliases, in the collection's order."""
    reserved_memory: int
    metrics: dict[str, QueueMetrics] = field(default_factory=dict)
    """Copies of each live queue's metrics; ``None`` key: the whole server's."""
    server_metrics: dict[str, Histogram] = field(default_factory=dict)
    """Copies of the server-wide only metrics (:data:`SERVER_METRICS`)."""
    zookeeper: Any = None
    """``cluster.MembershipFigures`` when the server joins ZooKeeper server sets, else None."""
    data_dir: DiskSpace | None = None
    """The data directory's free and whole bytes: read by :func:`gather_snapshot` (the admin
    port's scrapes) only, never by memcache ``stats``, whose snapshot is on the request path."""
    loading: list[str] = field(default_factory=list)
    """Queues found on disk whose journals are still being replayed (behaviour §7.1): not in
    :attr:`queues`; memcache ``stats`` shows each as ``queue_<name>_loading 1``."""
    _by_name: dict[str, QueueStats] | None = field(default=None, repr=False, compare=False)
    _totals: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    # -- memcache --------------------------------------------------------------------------

    def memcache_lines(self) -> list[tuple[str, object]]:
        """Global stats in Kestrel's order, then ``queue_<name>_<stat>`` for every queue and
        alias (behaviour §7.3).

        ``reserved_memory_ratio`` divides the queues' ``max_memory_size`` by physical memory,
        the nearest thing a Python process has to the JVM's max heap.
        """
        counters = self.server_counters
        lines: list[tuple[str, object]] = [
            ("uptime", int(self.time - self.start_time)),
            ("time", int(self.time)),
            ("version", self.version),
            ("curr_items", self.total("items")),
            ("total_items", counters["total_items"]),
            ("bytes", self.total("bytes")),
            ("reserved_memory_ratio", self.reserved_memory_ratio()),
        ]
        lines.extend((name, counters[name]) for name in _MEMCACHE_GLOBALS if name != "total_items")
        if self.zookeeper is not None:
            lines.append(("zookeeper_state", self.zookeeper.state))
            lines.extend((f"zookeeper_{name}", value) for name, value in self.zookeeper_figures().items())
        for queue in self.queues:
            lines.extend((f"queue_{queue.name}_{stat}", value) for stat, value in queue.lines)
        lines.extend((f"queue_{name}_loading", 1) for name in self.loading)
        return lines

    def total(self, stat: str) -> int:
        """``stat`` summed over the queues (not the aliases)."""
        totals = self._totals.get(stat)
        if totals is None:
            totals = self._totals[stat] = sum(_figures(queue)[stat] for queue in self.queues
                                              if queue.extra is not None)
        return totals

    def reserved_memory_ratio(self) -> str:
        return "%.3f" % (self.reserved_memory / _physical_memory())

    # -- ostrich's names -------------------------------------------------------------------

    def zookeeper_figures(self) -> dict[str, int]:
        """The membership's numbers (see docs/cluster.md); empty without ZooKeeper."""
        figures = self.zookeeper
        if figures is None:
            return {}
        return {
            "connected": int(figures.connected),
            "read_member": int(figures.read_member),
            "write_member": int(figures.write_member),
            "joins": figures.joins,
            "sessions_expired": figures.sessions_expired,
        }

    def failing_journals(self) -> list[str]:
        """The queues whose journal cannot write (a full disk), in :attr:`queues`' order."""
        return [queue.name for queue in self.queues if queue.extra is not None and _figures(queue)["journal_failing"]]

    def queue_names(self) -> list[str]:
        return [queue.name for queue in self.queues if queue.extra is not None]

    def scopes(self) -> list[str | None]:
        """``None`` (the server) then every queue and alias, in :attr:`queues`' order."""
        return [None] + [queue.name for queue in self.queues]

    def is_alias(self, scope: str | None) -> bool:
        queue = self._queue(scope)
        return queue is not None and queue.extra is None

    def _queue(self, scope: str | None) -> QueueStats | None:
        if scope is None:
            return None
        if self._by_name is None:
            self._by_name = {queue.name: queue for queue in self.queues}
        return self._by_name.get(scope)

    def counters(self) -> dict[str | None, dict[str, int]]:
        """Counters (values that only grow), server-wide (``None``) and per queue or alias."""
        return {scope: self.counters_of(scope) or {} for scope in self.scopes()}

    def counters_of(self, scope: str | None) -> dict[str, int] | None:
        """The counters of the server (``None``) or of one queue or alias (``None`` if there
        is no such queue in this snapshot)."""
        if scope is None:
            server = {name: value for name, value in self.server_counters.items() if name != "curr_connections"}
            # ``server_counters`` also holds the ``fsync_error_<class>`` counts, when there are any
            server["cmd_get_timeout_dropped"] = server["waiters_aborted"]  # Kestrel counts both
            for name, value in self.zookeeper_figures().items():
                if name in _ZOOKEEPER_COUNTERS:
                    server[f"zookeeper/{name}"] = value
            return server
        queue = self._queue(scope)
        if queue is None:
            return None
        values = _figures(queue)
        if queue.extra is None:
            return {name: values[name] for name in ALIAS_COUNTERS}
        metrics = self.metrics.get(queue.name) or _NO_METRICS
        values["put_items"] = values["total_items"]
        values["put_bytes"] = queue.extra["put_bytes"]
        values["get_items_hit"] = metrics.get_items_hit
        values["get_items_miss"] = metrics.get_items_miss
        return {name: values[name] for name in QUEUE_COUNTERS}

    def gauges(self) -> dict[str | None, dict[str, float]]:
        """Gauges (values at this moment), server-wide (``None``) and per queue (an alias:
        its ``create_time`` only, as Kestrel's ``AliasedQueue``)."""
        result = {}
        for scope in self.scopes():
            gauges = self.gauges_of(scope)
            if gauges is not None:
                result[scope] = gauges
        return result

    def gauges_of(self, scope: str | None) -> dict[str, float] | None:
        if scope is None:
            return {
                "items": self.total("items"),
                "bytes": self.total("bytes"),
                "reserved_memory_ratio": float(self.reserved_memory_ratio()),
                "connections": self.server_counters["curr_connections"],
                "uptime": int(self.time - self.start_time),
                "status/readable": 1.0 if self.readable else 0.0,
                "status/writeable": 1.0 if self.writeable else 0.0,
                **{f"zookeeper/{name}": float(value) for name, value in self.zookeeper_figures().items()
                   if name not in _ZOOKEEPER_COUNTERS},
                **self.data_dir_figures(),
            }
        queue = self._queue(scope)
        if queue is None:
            return None
        if queue.extra is None:
            return None if queue.alias_created is None else {"create_time": queue.alias_created}
        values = _figures(queue)
        values.update(queue.extra)
        values["age_msec"] = values["age"]
        values["oldest_item_age_msec"] = values["oldest_item_age"]
        return {name: values[name] for name in QUEUE_GAUGES}

    def data_dir_figures(self) -> dict[str, float]:
        """``data_dir_free_bytes`` and ``data_dir_size_bytes``, when the snapshot read them."""
        space = self.data_dir
        if space is None:
            return {}
        return {"data_dir_free_bytes": float(space.free_bytes), "data_dir_size_bytes": float(space.size_bytes)}

    def labels(self) -> dict[str, str]:
        labels = {"version": self.version, "status": self.status}
        if self.zookeeper is not None:
            labels["zookeeper_state"] = self.zookeeper.state
        return labels

    def histograms(self) -> dict[str | None, dict[str, Histogram]]:
        """Every metric, server-wide (``None``: the latencies summed over the queues, and the
        fsync figures) and per queue (:data:`QUEUE_METRICS`), empty ones too."""
        return {name: self.histograms_of(name) for name in self.metrics}  # type: ignore[misc]

    def histograms_of(self, scope: str | None) -> dict[str, Histogram] | None:
        """The metrics of the server (``None``) or of a queue; ``None`` for an alias, or when
        the snapshot was taken without metrics."""
        metrics = self.metrics.get(scope)  # type: ignore[arg-type]
        if metrics is None:
            return None
        if scope is None:
            whole = {metric: metrics.histograms.get(metric, _EMPTY) for metric in LATENCIES}
            whole.update((metric, self.server_metrics.get(metric, _EMPTY)) for metric in SERVER_METRICS)
            return whole
        return {metric: metrics.histograms.get(metric, _EMPTY) for metric in QUEUE_METRICS}


_EMPTY = Histogram()
"""A metric no value was recorded in (read only)."""
_NO_METRICS = QueueMetrics()


def take_snapshot(server: Any, queues: list[QueueStats], with_metrics: bool = True,
                  pause: Callable[[], None] | None = None) -> StatsSnapshot:
    """The figures of ``server`` now, with the per-queue ``queues`` the collection gathered.

    ``pause``, if given, is called after every :data:`CHUNK` queues (the admin port's: let
    the hub serve clients); the copies are then of nearly one moment."""
    stats: ServerStats = server.stats
    status = server.status
    snapshot = StatsSnapshot(
        time=time.time(),
        start_time=stats.start_time,
        version=server.version,
        status=status.status.value,
        readable=not status.blocks_reads(),
        writeable=not status.blocks_writes(),
        server_counters={
            **{name: getattr(stats, name) for name in ServerStats.COUNTERS},
            **{f"fsync_error_{name}": count for name, count in stats.fsync_errors.items()},
            "heap_trims": HELD.trims,
        },
        queues=[queue for queue in queues if not queue.loading],
        reserved_memory=0,
        loading=[queue.name for queue in queues if queue.loading],
        zookeeper=server.membership.figures() if getattr(server, "membership", None) is not None else None,
    )
    whole = stats.retired.copy()
    items = size = reserved = 0
    config = server.config
    for done, queue in enumerate(snapshot.queues, 1):
        if queue.extra is not None:
            lines = _figures(queue)
            items += lines["items"]
            size += lines["bytes"]
            reserved += config.queue_config(queue.name).max_memory_size
            metrics = stats.queues.get(queue.name) if with_metrics else None
            if metrics is not None:
                snapshot.metrics[queue.name] = metrics.copy()
                whole.merge(metrics)
        if pause is not None and done % CHUNK == 0:
            pause()
    snapshot.reserved_memory = reserved
    snapshot._totals.update(items=items, bytes=size)
    if with_metrics:
        snapshot.metrics[None] = whole  # type: ignore[index]
        snapshot.server_metrics = {name: histogram.copy() for name, histogram in stats.histograms.items()}
    return snapshot


def gather_snapshot(server: Any, timeout: float = 10.0, pause: Callable[[], None] | None = None) -> StatsSnapshot:
    """Ask the collection for every queue's figures and wait for them (a greenlet's wait: the
    hub goes on serving). For callers outside the actors: the admin HTTP service."""
    from .messages import ForAll, ForAllKind
    from .runtime import ReplyFuture

    answers: ReplyFuture[list[QueueStats]] = ReplyFuture()
    server.collection.tell(ForAll(ForAllKind.STATS, answers))
    snapshot = take_snapshot(server, answers.get(timeout=timeout), pause=pause)
    # one statvfs a scrape, on the hub: a local filesystem answers from memory (a hung network
    # filesystem under a data directory would hang the journals' writes first)
    snapshot.data_dir = disk_space(server.config.data_dir)
    return snapshot
