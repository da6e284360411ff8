"""Issue 57.1 without Spark: the planner process killed at each named step of the source's
plan/confirm/replay protocol (``KESTREL_SPARK_KILL_AT``), then a new planner draining the
queues as Spark's calls would. Every item comes out once: a kill between the write-ahead file
and a confirm leaves items back in their queue, and the new planner takes them back off it
before it reads anything new. (tests/bridge/test_kill_points.py does the same through Spark.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from kestrel_actors.spark_bridge._source import KestrelDataSource
from kestrel_actors.spark_bridge._wal import WriteAheadLog
from kestrel_actors.spark_bridge._walstore import SHELF_VARIABLE

from ._spark_jobs import REPO, load, queue_stats, spark_env, wait_for
from .test_source_planner import _part, rows_of

PER_SERVER = 300


def options(servers, tmp_path) -> dict[str, str]:
    return {"servers": ",".join(f"127.0.0.1:{s.port}" for s in servers), "queue": "plan",
            "walLocation": str(tmp_path / "wal"), "maxItemsPerBatch": "100",
            "readAhead": "false"}


def plan_until_killed(servers, tmp_path, kill_at: str, **env: str) -> None:
    """A planner process planning and running batches as Spark would, until its kill point."""
    script = textwrap.dedent(f"""
        from kestrel_actors.spark_bridge._source import KestrelDataSource
        from tests.bridge.test_source_planner import rows_of
        stream = KestrelDataSource({options(servers, tmp_path)!r}).streamReader(None)
        start = stream.initialOffset()
        while (end := stream.latestOffset(start)) != start:  # drained: no such point
            rows_of(stream, start, end)
            stream.commit(end)
            start = end
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          env={**spark_env(), "KESTREL_SPARK_KILL_AT": kill_at, **env},
                          timeout=300)
    assert done.returncode == -9, done.stderr.decode(errors="replace")[-2000:]
    assert b"kill_point" in done.stdout + done.stderr
    for server in servers:
        wait_for(lambda s=server: queue_stats(s, "plan")[1] == 0, 60, "open items back")


def drain(servers, tmp_path, start: dict) -> list[bytes]:
    """A restarted planner: re-plan (or replay) from ``start`` until the queues are empty."""
    stream = KestrelDataSource(options(servers, tmp_path)).streamReader(None)
    got: list[bytes] = []
    try:
        while True:
            end = stream.latestOffset(start)
            if end == start:
                return got
            got += rows_of(stream, start, end)
            stream.commit(end)
            start = end
    finally:
        stream.stop()


@pytest.mark.parametrize("kill_at", ["after-wal@2", "between-confirms@2", "after-confirms@2",
                                     "planned@2"])
def test_planner_killed_at_a_named_point_then_restarted_is_exactly_once(make_server, tmp_path,
                                                                        kill_at):
    servers = [make_server(), make_server()]
    items = [f"s{n}-{i:04d}".encode() for n in range(2) for i in range(PER_SERVER)]
    for n, server in enumerate(servers):
        load(server, "plan", items[n * PER_SERVER:(n + 1) * PER_SERVER])
    plan_until_killed(servers, tmp_path, kill_at)
    # Spark's checkpoint holds batch 1 committed; batch 2 is logged only once planned
    got = drain(servers, tmp_path, {"seq": 1, "items": {}})
    # what batch 1 delivered before the kill is in the (lost) sink of the first planner
    counts = Counter(got)
    assert [v for v, n in counts.items() if n > 1] == []
    assert len(got) == len(items) - 200
    assert all(queue_stats(s, "plan") == (0, 0) for s in servers)


def test_planner_killed_during_the_take_back_then_restarted_is_exactly_once(make_server,
                                                                            tmp_path):
    servers = [make_server(), make_server()]
    items = [f"s{n}-{i:04d}".encode() for n in range(2) for i in range(PER_SERVER)]
    for n, server in enumerate(servers):
        load(server, "plan", items[n * PER_SERVER:(n + 1) * PER_SERVER])
    plan_until_killed(servers, tmp_path, "between-confirms@2")
    script = textwrap.dedent(f"""
        from kestrel_actors.spark_bridge._source import KestrelDataSource
        stream = KestrelDataSource({options(servers, tmp_path)!r}).streamReader(None)
        stream.latestOffset({{"seq": 1, "items": {{}}}})
    """)
    done = subprocess.run([sys.executable, "-c", script], env={**spark_env(),
                          "KESTREL_SPARK_KILL_AT": "during-replay@2"}, cwd=REPO,
                          capture_output=True, timeout=300)
    assert done.returncode == -9, done.stderr.decode(errors="replace")[-2000:]
    for server in servers:
        wait_for(lambda s=server: queue_stats(s, "plan")[1] == 0, 60, "open items back")
    got = drain(servers, tmp_path, {"seq": 1, "items": {}})
    assert [v for v, n in Counter(got).items() if n > 1] == []
    assert len(got) == len(items) - 200


@pytest.mark.parametrize("kill_at", ["after-wal@2", "planned@2"])
def test_batches_written_over_another_querys_shelved_files_are_exactly_once(make_server,
                                                                          tmp_path,
                                                                          monkeypatch, kill_at):
    """The shelf (``KESTREL_WAL_SPARES``) holds another query's batch files, whole and with
    a valid checksum. A planner writes its first batches over them, is killed, and the
    restart replays or re-plans its batch 2 from that file: every item once, none of the
    other query's."""
    shelf = tmp_path / "shelf"
    monkeypatch.setenv(SHELF_VARIABLE, str(shelf))
    made = WriteAheadLog(str(tmp_path / "made"))  # a whole batch 2, checksum and all
    made.write(2, [_part([b"other-%04d" % i for i in range(100)])])
    other = make_server()
    load(other, "plan", [b"other-%04d" % i for i in range(400)])
    assert len(drain([other], tmp_path / "other", {"seq": 0, "items": {}})) == 400
    shutil.copyfile(made.path(2), shelf / "copied")
    shelved = {p.stat().st_ino for p in shelf.glob("*")}
    assert len(shelved) == 2
    servers = [make_server(), make_server()]
    items = [f"s{n}-{i:04d}".encode() for n in range(2) for i in range(PER_SERVER)]
    for n, server in enumerate(servers):
        load(server, "plan", items[n * PER_SERVER:(n + 1) * PER_SERVER])
    plan_until_killed(servers, tmp_path, kill_at, **{SHELF_VARIABLE: str(shelf)})
    assert (tmp_path / "wal" / "batch-000000000002.wal").stat().st_ino in shelved
    got = drain(servers, tmp_path, {"seq": 1, "items": {}})
    assert [v for v, n in Counter(got).items() if n > 1] == []
    assert len(got) == len(items) - 200 and not any(v.startswith(b"other") for v in got)
    assert all(queue_stats(s, "plan") == (0, 0) for s in servers)
