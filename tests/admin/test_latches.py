"""The latched views of /stats.json (``?period=``, ``?namespace=``) keep at most MAX_PERIODS
entries, whatever is asked for: asking cannot grow the server's memory."""

from __future__ import annotations

import time

import gevent

from kestrel_actors.admin._ostrich import MAX_PERIODS, NamedListeners, PeriodLatches
from kestrel_actors.snapshot import StatsSnapshot
from kestrel_actors.stats import ServerStats


def snapshot(cmd_set: int = 0) -> StatsSnapshot:
    counters = dict.fromkeys(ServerStats.COUNTERS, 0)
    counters["cmd_set"] = cmd_set
    return StatsSnapshot(time=time.time(), start_time=time.time(), version="test", status="Up", readable=True,
                         writeable=True, server_counters=counters, queues=[], reserved_memory=0)


def test_periods_asked_for_are_bounded_and_dropped_ones_stop():
    latches = PeriodLatches(snapshot)
    greenlets = []
    try:
        for period in range(1, 4 * MAX_PERIODS):
            latches.stats(period, snapshot())
            greenlets.append(latches.latches[period].greenlet)
        assert len(latches.latches) == MAX_PERIODS
        assert sorted(latches.latches) == list(range(3 * MAX_PERIODS, 4 * MAX_PERIODS))
        gevent.sleep(0)
        assert [greenlet.dead for greenlet in greenlets] == [True] * (3 * MAX_PERIODS - 1) + [False] * MAX_PERIODS
    finally:
        latches.close()
    gevent.sleep(0)
    assert all(greenlet.dead for greenlet in greenlets)


def test_namespaces_are_bounded_and_each_reads_what_was_added_since_its_last_read():
    names = NamedListeners()
    assert names.stats("a", snapshot(5))["counters"]["cmd_set"] == 0
    assert names.stats("a", snapshot(8))["counters"]["cmd_set"] == 3
    for number in range(4 * MAX_PERIODS):
        names.stats(f"n{number}", snapshot(8))
    assert len(names.last) == MAX_PERIODS
    assert "a" not in names.last  # the least recently read went first
    assert names.stats("a", snapshot(9))["counters"]["cmd_set"] == 0  # begins again
