"""The admin port of a server with 5,000 queues (issue 21 point 5): a scrape never stalls
the queues, and a queue has the series an operator uses.

Before: one ``/metrics`` scrape took 8.6 s and 63 MB (175 series a queue) and stopped every
memcache request meanwhile; scrapes back to back made memcache requests take seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..helpers import ServerProcess, request, write_queue_journals

QUEUES = 5000

SCRAPER = """
import json, sys, time, urllib.request
base, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
windows = []
while time.monotonic() < end:
    for path in ("/metrics", "/stats.json"):
        started = time.monotonic()
        with urllib.request.urlopen(base + path, timeout=60) as reply:
            assert reply.status == 200 and len(reply.read()) > 1_000_000
        windows.append((started, time.monotonic()))
print(json.dumps(windows))
"""
"""Scrapes ``/metrics`` and ``/stats.json`` back to back (its own process, so that the probe
never waits for the scraper's share of this process) and prints each scrape's (start, end) on
the system's monotonic clock, which the probe's process reads too."""


@pytest.fixture(scope="module")
def big_server(tmp_path_factory):
    data = tmp_path_factory.mktemp("many") / "data"
    write_queue_journals(data, QUEUES)
    server = ServerProcess(data, admin_port=True).start(timeout=120)  # 48 s before
    yield server
    server.stop()


def _samples_of(body: bytes, label: str, value: str) -> list[str]:
    """The names of the samples (series) whose ``label`` is ``value``."""
    return [sample.name for family in text_string_to_metric_families(body.decode())
            for sample in family.samples if sample.labels.get(label) == value]


def test_metrics_has_16_series_a_queue_unless_asked_for_all(big_server):
    reply = request(big_server.admin_url + "/metrics", timeout=60)
    assert reply.status == 200
    # q17 holds an item nothing read: Kestrel's age (now - 0) is a sentinel, left out
    assert sorted(_samples_of(reply.body, "queue", "q17")) == sorted({
        "kestrel_queue_put_items_total", "kestrel_queue_put_bytes_total", "kestrel_queue_get_items_hit_total",
        "kestrel_queue_get_items_miss_total", "kestrel_queue_expired_items_total", "kestrel_queue_discarded_total",
        "kestrel_queue_canceled_transactions_total", "kestrel_queue_items", "kestrel_queue_bytes",
        "kestrel_queue_mem_bytes", "kestrel_queue_oldest_item_age_seconds", "kestrel_queue_waiters",
        "kestrel_queue_open_transactions", "kestrel_queue_journal_size_bytes", "kestrel_queue_journal_failing",
    })
    assert len(reply.body) < 5_000_000  # 63 MB before
    every = request(big_server.admin_url + "/metrics?queue_series=all", timeout=120)
    assert every.status == 200
    # 11 counters and 13 gauges less the sentinels (age, unlimited max_items and max_bytes); no
    # histogram, as q17 recorded no value (a line each; the label comes last)
    assert sum(1 for line in every.body.splitlines() if b'queue="q17"} ' in line) == 21
    assert request(big_server.admin_url + "/metrics?queue_series=some").status == 400


class _Probe:
    """memcache requests one after another on one connection, each timed, and when each was
    answered (``time.monotonic``)."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = server.client(timeout=60)
        self.latencies: list[float] = []
        self.answered: list[float] = []

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for request_bytes, ending in ((b"set probe 0 0 1\r\nx\r\n", b"STORED\r\n"), (b"get probe\r\n", b"END\r\n")):
                started = time.perf_counter()
                self.client.send(request_bytes)
                reply = b""
                while not reply.endswith(ending):
                    reply += self.client.sock.recv(4096)
                self.latencies.append(time.perf_counter() - started)
                self.answered.append(time.monotonic())
            time.sleep(0.005)

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


@pytest.mark.slow
def test_memcache_requests_are_answered_while_scrapes_are_served(big_server):
    """15 s of scrapes back to back: the scrapes are answered, and memcache requests keep being
    answered *during* them. A scrape that held the server's loop would let at most the request
    already in flight be answered inside its window; these are answered throughout (more than
    two per scrape), whatever the machine's load stretches both to. The latencies are printed,
    not asserted."""
    probe = _Probe(big_server)
    probe.run(1.0)  # the connection is set up and the probe queue made
    probe.latencies.clear()
    probe.answered.clear()
    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, big_server.admin_url, "15"],
                               stdout=subprocess.PIPE, text=True)
    try:
        probe.run(15.0)
    finally:
        out, _ = scraper.communicate(timeout=120)
    assert scraper.returncode == 0
    windows = json.loads(out)
    inside = sum(1 for at in probe.answered if any(start < at < end for start, end in windows))
    summary = (f"{len(windows)} scrapes; {inside} of {len(probe.answered)} memcache requests "
               f"answered during them; p99 {probe.percentile(0.99) * 1000:.1f} ms")
    print(summary)
    assert len(windows) >= 2, summary  # the scrapes were answered all along (2 in 30 s before)
    assert inside > 2 * len(windows), summary
