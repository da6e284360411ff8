"""Memory per queued item (issue 56 point 4): 100 B items held in memory cost at most 150 B of the
server's resident memory each, measured as ``make bench``'s ``memory_bench`` does.

Memory is not wall-clock: the growth of VmRSS over 200,000 items does not depend on the
machine's load. With each item an ``Item`` in a deque it was 210-234 B; packed, 116-121 B.
"""

from __future__ import annotations

from kestrel_actors.loadtests import memory_bench

ITEMS = 200_000
LIMIT = 150


def test_a_backlog_of_100_byte_items_costs_at_most_150_bytes_of_rss_each(make_server, tmp_path):
    config = tmp_path / "memory.toml"
    config.write_text(memory_bench.config_text(ITEMS, 100))
    server = make_server("--config", str(config))
    figures = memory_bench.measure(server.port, server.proc.pid, ITEMS, 100)  # every item checked back
    assert figures["rss_bytes_per_item"] <= LIMIT, figures
