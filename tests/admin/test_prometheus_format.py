"""``/metrics`` writes a queue's samples itself (prometheus_client's per sample cost was most
of a scrape of 5,000 queues): they must be prometheus_client's very bytes, escaping and
number format included, and a scrape built in chunks must be the scrape built at once."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from kestrel_actors.admin import _prometheus
from kestrel_actors.admin._prometheus import PROMETHEUS_BOUNDS, QUEUE_COUNTERS, QUEUE_GAUGES, exposition
from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import MemoryJournal
from kestrel_actors.messages import QueueStats
from kestrel_actors.queue import QueueCore
from kestrel_actors.snapshot import take_snapshot
from kestrel_actors.stats import QUEUE_METRICS, ServerStats
from kestrel_actors.status import ServerStatus

NAMES = ("jobs", 'we"ird\\name', "caf\udce9")
"""A plain name, one the label must escape, one that is not UTF-8 (written ``\\xNN``)."""


def _snapshot(every_name: tuple[str, ...] = NAMES):
    stats = ServerStats()
    queues = []
    for index, name in enumerate(every_name):
        core = QueueCore(name, QueueConfig(), MemoryJournal())
        for number in range(index + 1):
            core.add(b"x" * (number + 1), 0, 1)
        metrics = stats.open_queue(name)
        metrics.get_items_hit = index
        metrics.histogram("set_latency_usec").add(37 * (index + 1))
        metrics.histogram("journal_rewrite_usec").add(5_000_000)
        extra = {"create_time": 1_700_000_000, "max_items": 10, "max_bytes": 2**40, "journal_size": 5,
                 "put_bytes": 3 * index}
        # as the queue actor answers
        lines = [*core.stats(2, index), ("oldest_item_age", 1500 * index), ("journal_failing", 0)]
        queues.append(QueueStats(name, lines, extra))
    queues.append(QueueStats("everywhere", [("put_items", 4), ("put_bytes", 8), ("children", "jobs")], None,
                             1_700_000_001))
    server = SimpleNamespace(stats=stats, status=ServerStatus(None), version="test",
                             config=SimpleNamespace(queue_config=lambda name: QueueConfig()))
    return take_snapshot(server, queues)


def _families_as_prometheus_client_writes_them(snapshot) -> bytes:
    """The per-queue part of the scrape, as the families the old collector yielded."""
    from kestrel_actors.admin._prometheus import _PROMETHEUS_NAMES, scope_samples
    from kestrel_actors.queue_name import name_text

    counters, gauges = {}, {}
    histograms = {metric: HistogramMetricFamily(f"kestrel_queue_{_PROMETHEUS_NAMES[metric][0]}",
                                                f"Kestrel metric q/<queue>/{metric}", labels=["queue"])
                  for metric in QUEUE_METRICS}
    for scope in snapshot.scopes()[1:]:
        label = "alias" if snapshot.is_alias(scope) else "queue"
        for sample in scope_samples(snapshot, scope, every_series=True):
            is_counter = sample.kind == "counter"
            families, kind = (counters, CounterMetricFamily) if is_counter else (gauges, GaugeMetricFamily)
            family = families.get(sample.family)
            if family is None:
                family = families[sample.family] = kind(sample.family, f"Kestrel {sample.kind} q/<{label}>/"
                                                        f"{sample.kestrel_name}", labels=[label])
            family.add_metric([name_text(scope)], sample.value)
        for metric, family in histograms.items():
            histograms_of = snapshot.histograms_of(scope)
            if histograms_of is not None and histograms_of[metric].count:
                _prometheus._add_histogram(family, [name_text(scope)], histograms_of[metric],
                                           _PROMETHEUS_NAMES[metric][1])

    class Collector:
        def collect(self):
            yield from counters.values()
            yield from gauges.values()
            yield from histograms.values()

    return generate_latest(Collector())


def _per_queue_part(parts: list[bytes]) -> bytes:
    """What follows the server's own families (the first piece: prometheus_client's)."""
    return b"".join(parts[1:])


def test_every_series_is_written_as_prometheus_client_writes_it():
    snapshot = _snapshot()
    ours = _per_queue_part(exposition(snapshot, every_series=True))
    assert ours == _families_as_prometheus_client_writes_them(snapshot)
    assert b'queue="we\\"ird\\\\name"' in ours and b'queue="caf\\\\xe9"' in ours
    assert PROMETHEUS_BOUNDS[-1] == 2**30


def test_the_default_series_are_the_ones_kept():
    snapshot = _snapshot()
    body = b"".join(exposition(snapshot)).decode()
    kept = {f"kestrel_queue_{name}_total" for name in QUEUE_COUNTERS} | {
        "kestrel_queue_items", "kestrel_queue_bytes", "kestrel_queue_mem_bytes", "kestrel_queue_age_seconds",
        "kestrel_queue_oldest_item_age_seconds", "kestrel_queue_waiters", "kestrel_queue_open_transactions",
        "kestrel_queue_journal_size_bytes", "kestrel_queue_journal_failing"}
    jobs = {line.split("{")[0] for line in body.splitlines() if 'queue="jobs"}' in line}
    assert jobs == kept and len(kept) == 16 == len(QUEUE_COUNTERS) + len(QUEUE_GAUGES)
    assert 'kestrel_alias_put_items_total{alias="everywhere"} 4.0' in body
    assert "kestrel_alias_create_timestamp_seconds" not in body
    assert "kestrel_set_latency_seconds_count 3.0" in body  # the queues' latencies, server-wide


def test_a_scrape_built_in_chunks_is_the_scrape_built_at_once(monkeypatch):
    names = tuple(f"q{number}" for number in range(40))
    snapshot = _snapshot(names)
    pauses = []
    monkeypatch.setattr(_prometheus, "SERIES_PER_PAUSE", 16 * 3)  # three queues a chunk
    chunked = b"".join(exposition(snapshot, pause=lambda: pauses.append(1)))
    monkeypatch.setattr(_prometheus, "SERIES_PER_PAUSE", 10**9)
    whole = b"".join(exposition(snapshot))
    process = (b"process_", b"python_gc_")  # the process's own figures move between two scrapes
    assert [line for line in chunked.splitlines() if not line.startswith(process) and b"process" not in line] == \
        [line for line in whole.splitlines() if not line.startswith(process) and b"process" not in line]
    assert len(pauses) >= 14


def test_slow_builds_are_reused_for_ten_times_their_build_time_and_shared_while_built():
    import gevent

    from kestrel_actors.admin._builds import SharedBuilds

    now = [100.0]
    builds = SharedBuilds(clock=lambda: now[0])
    made = []

    def build(took: float):
        def run():
            made.append(took)
            gevent.sleep(0.01)  # a second request comes meanwhile
            now[0] += took
            return len(made)
        return run

    first, second = gevent.spawn(builds.get, "slow", build(0.5)), gevent.spawn(builds.get, "slow", build(0.5))
    gevent.joinall([first, second])
    assert first.value == second.value == 1 and made == [0.5]  # shared while it was built
    now[0] += 4.9
    assert builds.get("slow", build(0.5)) == 1  # reused: 4.9 s < 10 × 0.5 s after it was built
    now[0] += 0.2
    assert builds.get("slow", build(0.5)) == 2  # built anew after 5 s
    assert builds.get("fast", build(0.01)) == 3
    assert builds.get("fast", build(0.01)) == 4  # a fast build is never reused
