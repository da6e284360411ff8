"""``/metrics`` by Prometheus's naming rules (issue 26 point 4): base units in the names, a
counter's ``_total`` once, no sentinel values, buckets fine enough for a p99 within 25%, and
docs/admin.md's list of every family matching a real scrape. ``/stats.json`` keeps Kestrel's
names and values."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from kestrel_actors.admin import _prometheus
from kestrel_actors.admin._prometheus import PROMETHEUS_BOUNDS
from kestrel_actors.stats import BOUNDS, Histogram

from ..helpers import get_json, request

DOCS = Path(__file__).resolve().parents[2] / "docs" / "admin.md"
INT_MAX = 2**31 - 1
TIME_WORDS = {"age", "latency", "delay", "timeout", "uptime", "time", "duration", "rewrite", "rotation", "readbehind"}
SMALLER_UNITS = {"msec", "usec", "ms", "us", "millis", "micros", "milliseconds", "microseconds", "kb", "mb"}


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory, make_server_factory):
    """A server with a limited queue, a read one, one with a backlog nothing read, an empty one
    and an alias: its default and ``queue_series=all`` scrapes, and its ``/stats.json``."""
    config = tmp_path_factory.mktemp("names") / "kestrel.toml"
    config.write_text('[queues."limited"]\nmax_items = 10\nmax_size = "1MiB"\n\n'
                      '[aliases]\neverywhere = ["jobs"]\n')
    server = make_server_factory("--config", str(config))
    client = server.client()
    for queue in ("jobs", "backlog", "limited"):
        assert client.set(queue, b"item") == b"STORED"
    assert client.get("jobs") == b"item"
    assert client.get("empty") is None
    assert client.set("everywhere", b"four") == b"STORED"
    default = request(server.admin_url + "/metrics").body.decode()
    every = request(server.admin_url + "/metrics?queue_series=all").body.decode()
    stats = get_json(server.admin_url + "/stats.json")
    client.close()
    return default, every, stats


@pytest.fixture(scope="module")
def make_server_factory(tmp_path_factory):
    from ..helpers import ServerProcess

    servers = []

    def make(*args: str) -> ServerProcess:
        server = ServerProcess(tmp_path_factory.mktemp("data"), args, admin_port=True).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def _families(body: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(body)}


def _sample(body: str, name: str, queue: str) -> float | None:
    found = re.search(rf'^{name}\{{queue="{queue}"\}} (\S+)$', body, re.M)
    return None if found is None else float(found.group(1))


def test_names_carry_base_units_and_total_once(scrapes):
    for body in scrapes[:2]:
        for family in text_string_to_metric_families(body):
            parts = family.name.split("_")
            assert not SMALLER_UNITS & set(parts), family.name
            if family.type == "counter":
                for sample in family.samples:
                    assert sample.name.endswith("_total") and sample.name.count("_total") == 1, sample.name
                assert not family.name.endswith("_total")  # the parser took the one _total off
                continue
            assert "total" not in parts, family.name
            if family.name.startswith("kestrel_") and TIME_WORDS & set(parts):
                assert family.name.endswith("_seconds"), family.name
            if "timestamp" in parts or "time" in parts:
                assert family.name.endswith("_timestamp_seconds") or family.name.endswith("_time_seconds"), \
                    family.name
            if "size" in parts:
                assert family.name.endswith("_bytes"), family.name
            if family.type == "histogram":
                assert family.name.endswith("_seconds"), family.name


def test_no_sentinel_values(scrapes):
    default, every, stats = scrapes
    for body in (default, every):
        for family in text_string_to_metric_families(body):
            # a disk's bytes are real figures past 2**31, not a sentinel
            if family.name.startswith("kestrel_") and not family.name.startswith("kestrel_data_dir_"):
                for sample in family.samples:
                    assert sample.value < INT_MAX, (sample.name, sample.labels, sample.value)
    # a limit the configuration sets is there; an unlimited one is left out
    assert _sample(every, "kestrel_queue_max_items", "limited") == 10
    assert _sample(every, "kestrel_queue_max_bytes", "limited") == 1024 * 1024
    assert _sample(every, "kestrel_queue_max_items", "jobs") is None
    assert _sample(every, "kestrel_queue_max_bytes", "jobs") is None
    # Kestrel's age of a queue nothing was read from (now - 0) is left out; 0 when it holds no bytes
    for body in (default, every):
        assert _sample(body, "kestrel_queue_age_seconds", "backlog") is None
        assert _sample(body, "kestrel_queue_age_seconds", "empty") == 0
        assert 0 <= _sample(body, "kestrel_queue_age_seconds", "jobs") < 60  # seconds, not ms
        assert _sample(body, "kestrel_queue_oldest_item_age_seconds", "backlog") < 60
    # /stats.json keeps Kestrel's names and values, sentinels included
    gauges, counters = stats["gauges"], stats["counters"]
    assert gauges["q/backlog/age_msec"] > 1e12
    assert gauges["q/jobs/max_items"] == INT_MAX and gauges["q/jobs/max_bytes"] == 2**63 - 1
    assert {"q/jobs/journal_size", "q/jobs/create_time"} <= set(gauges)
    assert {"total_items", "total_connections", "bytes_read", "q/jobs/total_items", "q/jobs/total_flushes"} <= \
        set(counters)


def _documented() -> dict[str, str]:
    """The families docs/admin.md's tables list, with their rows."""
    text = DOCS.read_text()
    section = text[text.index("## `/metrics`: every family"):text.index("Renamed by issue 26")]
    return {found.group(1): found.group(0) for found in re.finditer(r"^\| `([a-z_]+)` \|.*$", section, re.M)}


def _scraped_names(body: str) -> set[str]:
    return {family.name + "_total" if family.type == "counter" else family.name
            for family in text_string_to_metric_families(body)}


def test_docs_list_every_family_of_a_scrape_and_nothing_else(scrapes):
    default, every, _stats = scrapes
    documented = _documented()
    scraped = _scraped_names(default) | _scraped_names(every)
    assert scraped - set(documented) == set(), "families /metrics gives that docs/admin.md does not list"
    missing = {name for name in set(documented) - scraped if "ZooKeeper only" not in documented[name]}
    assert missing == set(), "families docs/admin.md lists that /metrics does not give"
    defaults = {name for name, row in documented.items() if "*default*" in row}
    per_scope = {name for name in _scraped_names(default) if name.startswith(("kestrel_queue_", "kestrel_alias_"))}
    assert per_scope - {"kestrel_queue_creates_total", "kestrel_queue_deletes_total",
                        "kestrel_queue_expires_total"} == defaults


def _prometheus_quantile(quantile: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's ``histogram_quantile``: linear inside the bucket holding the rank (the
    first bucket starts at 0)."""
    total = buckets[-1][1]
    rank = quantile * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


@pytest.mark.parametrize("spread", ["uniform-1ms", "lognormal", "bimodal", "narrow-100us"])
def test_p99_from_the_prometheus_buckets_is_within_25_percent(spread):
    rng = random.Random(spread)
    values = {
        "uniform-1ms": lambda: rng.randint(1000, 1100),
        "lognormal": lambda: int(rng.lognormvariate(6, 1.5)),
        "bimodal": lambda: rng.choice((rng.randint(40, 80), rng.randint(20_000, 90_000))),
        "narrow-100us": lambda: rng.randint(95, 105),
    }[spread]
    latencies = [values() for _ in range(20_000)]
    histogram = Histogram()
    for usec in latencies:
        histogram.add(usec)
    family = HistogramMetricFamily("kestrel_set_latency_seconds", "test")
    _prometheus._add_histogram(family, [], histogram, 1e6)

    class Collector:
        def collect(self):
            yield family

    parsed = next(text_string_to_metric_families(generate_latest(Collector()).decode()))
    buckets = sorted((float(sample.labels["le"]), sample.value) for sample in parsed.samples
                     if sample.name.endswith("_bucket"))
    true_p99 = sorted(latencies)[int(0.99 * len(latencies)) - 1] / 1e6
    estimate = _prometheus_quantile(0.99, buckets)
    assert abs(estimate - true_p99) <= 0.25 * true_p99, (estimate, true_p99)


def test_bounds_are_the_histograms_own_and_at_most_a_quarter_apart():
    assert set(PROMETHEUS_BOUNDS) <= set(BOUNDS)  # so a bucket's count is exact
    above_eight = [bound for bound in PROMETHEUS_BOUNDS if bound >= 8]
    assert all(upper / lower <= 1.25 for lower, upper in itertools.pairwise(above_eight))
    assert PROMETHEUS_BOUNDS[0] == 1 and PROMETHEUS_BOUNDS[-1] == 2**30
