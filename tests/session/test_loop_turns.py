"""Issue 24: a lone request on an idle session and queue costs the event loop one turn.

A real server runs in this process on its own thread, with an event loop that counts what the
request path asks of it (``kestrel_actors.loadtests.loop_bench``); one client sends requests one
at a time over a real socket. Counted by instrumentation, not by time.
"""

from __future__ import annotations

import pytest

from kestrel_actors.loadtests.loop_bench import measure

REQUESTS = 400
SLACK = 0.05
"""Per request: room for what runs beside the requests (the bench turns the expiry sweep off)."""


@pytest.mark.parametrize("scenario", ["set", "get"])
def test_a_lone_request_costs_one_loop_turn_and_nothing_scheduled(scenario: str) -> None:
    counts = measure(scenario, REQUESTS).loop
    # the socket's read readiness is the one watcher callback; nothing else is scheduled
    assert counts["iterations"] <= 1 + SLACK, counts
    assert counts["callbacks"] <= SLACK, counts
    assert counts["timer_starts"] <= SLACK, counts
    assert counts["async_watchers"] <= SLACK, counts
    assert counts["threadpool"] <= SLACK, counts
    assert counts["switches"] <= SLACK, counts


def test_a_lone_durable_set_hands_its_fdatasync_off_once_and_switches_no_greenlet() -> None:
    counts = measure("set-always", REQUESTS).loop
    # the fdatasync leaves the hub: one threadpool job, whose async watcher brings its end
    # back as one callback, from which the reply goes; no writer greenlet, no journal kick
    assert counts["iterations"] <= 2 + SLACK, counts
    assert counts["threadpool"] <= 1 + SLACK, counts
    assert counts["async_watchers"] <= 1 + SLACK, counts
    assert counts["callbacks"] <= 1 + SLACK, counts
    assert counts["timer_starts"] <= SLACK, counts
    assert counts["switches"] <= SLACK, counts


def test_a_connection_stops_its_read_watcher_once_and_reads_no_clock_without_an_idle_timeout() -> None:
    # each a connection of its own: connect, a GET, close, closed by the server before the next
    counts = measure("connect", 200).loop
    # its FIN's read stops the watcher; gevent stops it once more after a callback that stopped
    # its own watcher; the close and the release find it stopped (it went on being stopped 4 times)
    assert counts["watcher_stops"] <= 2 + SLACK, counts
    # no client_timeout: when the client last sent is never asked (it was, once per connection)
    assert counts["clock_reads"] <= SLACK, counts
    assert counts["switches"] <= SLACK, counts
    assert counts["callbacks"] <= SLACK, counts
