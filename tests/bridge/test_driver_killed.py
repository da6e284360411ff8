"""A streaming query's driver SIGKILLed mid-query and restarted from its checkpoint."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..helpers import ServerProcess
from ._spark_jobs import REPO, drain, kill_group, load, queue_stats, spark_env, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def start_stream(server: ServerProcess, checkpoint, log) -> subprocess.Popen:
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.bridge._spark_jobs", "stream",
             "--servers", f"127.0.0.1:{server.port}", "--queue", "feed", "--out", "feed_out",
             "--checkpoint", str(checkpoint), "--max-items", "500", "--sleep", "0.3"],
            stdout=sink, stderr=subprocess.STDOUT, env=spark_env(), cwd=REPO,
            start_new_session=True)


def test_driver_sigkill_mid_query_then_restart_from_checkpoint_loses_nothing(server, tmp_path):
    items = [f"f{i}".encode() for i in range(4000)]
    load(server, "feed", items)
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"

    first = start_stream(server, checkpoint, log)
    try:
        wait_for(lambda: queue_stats(server, "feed_out")[0] >= 1000, 180,
                 "a few micro-batches", first, log)
        wait_for(lambda: queue_stats(server, "feed")[1] > 0, 30, "a batch open", first, log)
    finally:
        # SIGKILL to the driver's whole process group: the Python driver, its JVM, and the
        # planner process that holds the source's connections.
        kill_group(first)
    # The dead driver's connections are gone: its open items are back in the queue.
    wait_for(lambda: queue_stats(server, "feed")[1] == 0, 60, "the open items back")
    assert queue_stats(server, "feed")[0] > 0

    second = start_stream(server, checkpoint, log)
    wal = checkpoint / "kestrel-wal"
    try:
        # The source confirms a micro-batch when it plans it (ADR 0013), so an empty queue no
        # longer means the sink has written the last batch; its write-ahead file goes only
        # when Spark commits it: no file left means every batch read is in the output.
        wait_for(lambda: queue_stats(server, "feed") == (0, 0)
                 and queue_stats(server, "feed_out")[0] >= len(items)
                 and wal.exists() and not any(wal.glob("batch-*.wal")), 240,
                 "the restarted query to drain the queue and commit its last batch", second,
                 log)
    finally:
        kill_group(second)
    out = drain(server, "feed_out")
    assert set(out) == set(items)  # nothing missing
    assert len(out) - len(items) <= 500  # duplicates bounded by one micro-batch
