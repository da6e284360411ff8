"""Exactly once into idempotent sinks (issue 22, ADR 0013): 8,000 items with unique ids,
2,000 per micro-batch, through a streaming query in its own driver process into Spark's
parquet file sink and into ``foreachBatch`` writing by batch id; the driver or the server is
SIGKILLed mid-stream (after the 2nd batch, with the 3rd planned and running) and the query
restarted from its checkpoint: nothing lost, nothing duplicated. A kill inside the window
that remains (a batch durable in the write-ahead log, its confirm not yet sent or not yet
answered) duplicates exactly that batch and loses nothing. (The issue's table used 20,000
items, ten batches; the six batches after the fourth add minutes to the suite and nothing to
what a kill in the middle shows.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ..helpers import ServerProcess
from ._spark_jobs import (
    REPO,
    batch_dir_values,
    file_sink_values,
    kill_group,
    load,
    queue_stats,
    spark_env,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1500)]

ITEMS = 8_000
PER_BATCH = 2_000


def start_stream(server: ServerProcess, sink: str, out: Path, checkpoint: Path, log: Path,
                 *, master: str = "local[2]", sleep: float = 1.0,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "ab") as sink_log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.bridge._spark_jobs", "stream",
             "--servers", f"127.0.0.1:{server.port}", "--queue", "feed", "--out", str(out),
             "--sink", sink, "--checkpoint", str(checkpoint), "--max-items", str(PER_BATCH),
             "--sleep", str(sleep), "--master", master],
            stdout=sink_log, stderr=subprocess.STDOUT, env={**spark_env(), **(env or {})},
            cwd=REPO, start_new_session=True)


def committed(checkpoint: Path, batch_id: int) -> bool:
    return (checkpoint / "commits" / str(batch_id)).exists()


def planned(checkpoint: Path, batch_id: int) -> bool:
    return (checkpoint / "offsets" / str(batch_id)).exists()


def sink_values(sink: str, out: Path) -> list[bytes]:
    if not out.exists():
        return []
    return file_sink_values(out) if sink == "parquet" else batch_dir_values(out)


def lost_and_duplicated(values: list[bytes], items: list[bytes]) -> tuple[int, int]:
    counts = Counter(values)
    return (len(set(items) - set(counts)), sum(n - 1 for n in counts.values() if n > 1))


class Run:
    """One scenario's files: the items loaded, the output, checkpoint and log paths."""

    def __init__(self, server: ServerProcess, sink: str, tmp_path: Path) -> None:
        self.server, self.sink = server, sink
        self.items = [f"id-{i:05d}".encode() for i in range(ITEMS)]
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.out, self.checkpoint = tmp_path / "out", tmp_path / "checkpoint"
        self.log = tmp_path / "driver.log"
        load(server, "feed", self.items)

    def start(self, **kwargs) -> subprocess.Popen:
        return start_stream(self.server, self.sink, self.out, self.checkpoint, self.log,
                            **kwargs)

    def until_drained(self, proc: subprocess.Popen) -> tuple[int, int]:
        """Wait until every item is in the output and the queue is empty; (lost, duplicated)."""
        try:
            wait_for(lambda: queue_stats(self.server, "feed") == (0, 0)
                     and len(set(sink_values(self.sink, self.out))) >= ITEMS, 900,
                     "the query to drain the queue", proc, self.log)
            # a batch still running would add rows: wait for the trigger after the last one
            wait_for(lambda: not any(Path(self.checkpoint, "kestrel-wal").glob("batch-*")),
                     60, "the last batch committed", proc, self.log)
        finally:
            kill_group(proc)
        return lost_and_duplicated(sink_values(self.sink, self.out), self.items)


@pytest.mark.parametrize("sink", ["parquet", "foreachBatch"])
def test_driver_sigkill_mid_stream_then_restart_is_exactly_once(server, tmp_path, sink):
    run = Run(server, sink, tmp_path)
    first = run.start()
    try:
        wait_for(lambda: committed(run.checkpoint, 1) and planned(run.checkpoint, 2), 900,
                 "two batches committed and the third planned", first, run.log)
    finally:
        kill_group(first)  # the Python driver, its JVM and the planner holding the source
    assert not committed(run.checkpoint, 2), "the kill was meant to land inside batch 2"
    assert run.until_drained(run.start()) == (0, 0)
    assert "batch_replayed_from_wal" in run.log.read_text()


@pytest.mark.parametrize("sink", ["parquet", "foreachBatch"])
def test_server_sigkill_mid_stream_and_restart_is_exactly_once(server, tmp_path, sink):
    run = Run(server, sink, tmp_path)
    proc = run.start()
    try:
        wait_for(lambda: committed(run.checkpoint, 1), 900, "two batches committed", proc,
                 run.log)
        server.kill()
        server.start()
    except BaseException:
        kill_group(proc)
        raise
    lost, duplicated = run.until_drained(proc)
    assert lost == 0
    uncertain = run.log.read_text(errors="replace").count("confirm_uncertain")
    # A kill that lands while a batch's confirm is on the wire leaves it unknown whether the
    # server applied it (ADR 0013's window, logged as confirm_uncertain): at most that batch
    # comes again. Any other kill duplicates nothing.
    assert duplicated == 0 if not uncertain else duplicated <= PER_BATCH * uncertain, (duplicated, uncertain)


def test_driver_sigkill_between_the_write_ahead_file_and_the_confirm(server, tmp_path):
    """ADR 0013's window: batch 3 (Spark's batch id 2) is durable in the write-ahead log but
    its items are not yet confirmed when the driver dies (kill point ``after-wal``), so the
    server puts them back. The restart replays the batch from the file and takes the returned
    items back off the queue: nothing lost, nothing duplicated."""
    run = Run(server, "parquet", tmp_path)
    first = run.start(env={"KESTREL_SPARK_KILL_AT": "after-wal@3"})
    try:
        wait_for(lambda: "kill_point" in run.log.read_text(errors="replace")
                 or first.poll() is not None, 900, "the kill at after-wal@3", None, run.log)
    finally:
        kill_group(first)
    wait_for(lambda: queue_stats(server, "feed")[1] == 0, 60, "the open items back")
    assert queue_stats(server, "feed")[0] == ITEMS - 2 * PER_BATCH
    assert run.until_drained(run.start()) == (0, 0)


def executor_pids(work_dir: Path) -> list[int]:
    """Executor JVMs the standalone worker (work dir ``work_dir``) runs."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        # an executor runs in <work dir>/<app id>/<executor id>
        if b"CoarseGrainedExecutorBackend" in cmdline and cwd.startswith(str(work_dir)):
            pids.append(int(entry.name))
    return pids


def test_executor_sigkill_mid_stream_on_a_standalone_cluster_is_exactly_once(
        server, standalone, tmp_path):
    run = Run(server, "parquet", tmp_path / "run")
    proc = run.start(master=standalone.master)
    work = standalone.work
    try:
        wait_for(lambda: committed(run.checkpoint, 1) and planned(run.checkpoint, 2)
                 and executor_pids(work), 900, "batch 2 running on an executor", proc, run.log)
        for pid in executor_pids(work):
            os.kill(pid, 9)
    except BaseException:
        kill_group(proc)
        raise
    assert run.until_drained(proc) == (0, 0)
