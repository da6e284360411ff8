"""The Spark bridge against real servers and real Spark (local mode, and a standalone cluster).

One SparkSession (``local[2]``) is shared by every in-process test; only the tests that kill a
bridge or need another master start ``kestrel-actors bridge run`` subprocesses.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from kestrel_actors.client import ClientError, ServerError
from kestrel_actors.spark_bridge import (
    BatchLedger,
    BridgeConfig,
    Connection,
    ConnectionLost,
    KeepAlive,
    LedgerLockedError,
    ServerAddress,
    _ledger,
    parse_duration,
    run_bridge,
)

from ._spark_jobs import (
    drain,
    kill_group,
    load,
    output_values,
    queue_stats,
    spark_env,
    start_bridge,
    wait_for,
)

JOBS = "kestrel_actors.spark_bridge.jobs"
VOCAB = [f"w{i}" for i in range(50)] + ["kestrel", "queue", "spark", "actor"]


def config(server, tmp_path, **changes) -> BridgeConfig:
    settings = {
        "queue": "work", "job": f"{JOBS}:identity", "servers": (ServerAddress(server.host, server.port),),
        "batch_size": 10_000, "batch_wait": 1.0, "partitions": 2, "state_dir": str(tmp_path / "state"),
        "until_empty": True, "retry_initial": 0.1, "retry_max": 0.5,
    }
    settings.update(changes)
    return BridgeConfig(**settings)


# -- fast checks: no Spark -------------------------------------------------------------------


def test_cli_help_does_not_import_pyspark_or_gevent():
    code = (
        "import sys; from click.testing import CliRunner; from kestrel_actors.cli import main\n"
        "r = CliRunner().invoke(main, ['bridge', 'run', '--help'])\n"
        "assert r.exit_code == 0 and '--output-path' in r.output, r.output\n"
        "import kestrel_actors.spark_bridge, kestrel_actors.spark_bridge._runner\n"
        "import kestrel_actors.spark_bridge.jobs\n"
        # Using the seam (a connection attempt to a closed port) does not load gevent either.
        "from kestrel_actors.spark_bridge import Connection, ConnectionLost, ServerAddress\n"
        "try:\n"
        "    Connection(ServerAddress('127.0.0.1', 1), 0.5).stats()\n"
        "except ConnectionLost:\n"
        "    pass\n"
        "print(sorted(m for m in ('pyspark', 'gevent') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=spark_env(), check=True).stdout
    assert out.strip() == "[]"


def test_durations_and_servers():
    assert parse_duration("1s") == 1.0 and parse_duration("250ms") == 0.25
    assert parse_duration("2m") == 120.0 and parse_duration("1.5") == 1.5
    with pytest.raises(ValueError):
        parse_duration("soon")
    # one rule with the config file's durations (docs/configuration.md), "1d" and any case too
    assert parse_duration("1d") == 86400.0 and parse_duration(" 10 MS ") == pytest.approx(0.01)
    assert ServerAddress.parse("h1") == ServerAddress("h1", 22133)
    assert str(ServerAddress.parse("[::1]:9")) == "[::1]:9"
    cfg = BridgeConfig(queue="q", job="m:f", servers="a:1,b:2,a:1", job_args=["k=v=w"])
    assert [str(s) for s in cfg.servers] == ["a:1", "b:2"] and cfg.job_args == {"k": "v=w"}
    with pytest.raises(ValueError):
        BridgeConfig(queue="q", job="m:f", output_queue="r", output_path="/tmp/x")


def test_ledger_is_exclusive_and_durable(tmp_path):
    server = ServerAddress("127.0.0.1", 22133)
    ledger = BatchLedger(tmp_path, "q", server).open()
    first = ledger.current_id
    assert first == "q-127.0.0.1-22133-00000000"
    assert ledger.current_id == first  # stable until commit
    with pytest.raises(LedgerLockedError):
        BatchLedger(tmp_path, "q", server).open()
    ledger.commit()
    ledger.close()
    again = BatchLedger(tmp_path, "q", server).open()
    assert again.current_id == "q-127.0.0.1-22133-00000001"
    again.close()


def test_two_threads_closing_a_ledger_at_once_close_its_lock_once(tmp_path, monkeypatch):
    # run_bridge's clean-up and a bridge actor's on_stop both close their runner's ledger, and
    # pykka marks an actor stopped before its on_stop runs: they may close it at the same moment
    ledger = BatchLedger(tmp_path, "q", ServerAddress("127.0.0.1", 22133)).open()
    closed: list[int] = []

    class SlowClose:  # os, with a close slow enough for the other thread to arrive meanwhile
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def close(fd):
            time.sleep(0.1)
            os.close(fd)
            closed.append(fd)

    monkeypatch.setattr(_ledger, "os", SlowClose())
    failures: list[BaseException] = []

    def close():
        try:
            ledger.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=close) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(closed) == 1
    BatchLedger(tmp_path, "q", ServerAddress("127.0.0.1", 22133)).open().close()  # the lock is free


def test_seam_opens_confirms_and_never_reconnects_while_holding(server):
    load(server, "mon", [b"a", b"", b"c\r\nd"])
    conn = Connection(ServerAddress(server.host, server.port))
    try:
        items = conn.open_items("mon", 10, 0.2)  # sub-second wait: one whole second on the wire
        assert items == [b"a", b"", b"c\r\nd"] and conn.holding == 3
        conn.check()
        with pytest.raises(ClientError):
            conn.confirm("mon", 4)  # more than are open: ERROR, nothing confirmed
        # The failure closed the connection, so the server took the items back: the seam says
        # so instead of reconnecting behind the caller's back.
        assert not conn.connected
        with pytest.raises(ConnectionLost):
            conn.check()
        with pytest.raises(ConnectionLost):
            conn.confirm("mon", 3)
        with pytest.raises(ConnectionLost):
            conn.put_many("elsewhere", [b"x"])
        # A new open starts afresh: the items are back at the head in reverse opening order
        # (behaviour §2.6).
        assert conn.open_items("mon", 10, 0.2) == [b"c\r\nd", b"", b"a"]
        conn.confirm("mon", 3)
        assert conn.holding == 0 and conn.open_items("mon", 10, 0.2) == []
        assert conn.put_many("mon2", [b"p", b"q"]) == 2 and conn.depth("mon2") == 2
        assert conn.open_available("mon2", 10) == [b"p", b"q"]
        conn.confirm("mon2", 2)
    finally:
        conn.close()
    assert queue_stats(server, "mon") == (0, 0) and queue_stats(server, "mon2") == (0, 0)


def test_seam_raises_when_a_queue_refuses_an_item(make_server, tmp_path):
    config = tmp_path / "full.toml"
    config.write_text("[queues.full]\nmax_items = 2\n")
    server = make_server("--config", str(config))
    conn = Connection(ServerAddress(server.host, server.port))
    try:
        with pytest.raises(ServerError, match="refused 1 of 3"):
            conn.put_many("full", [b"1", b"2", b"3"])
    finally:
        conn.close()
    assert queue_stats(server, "full") == (2, 0)


def test_seam_pings_from_another_thread_between_commands(server):
    load(server, "ka", [b"x"])
    conn = Connection(ServerAddress(server.host, server.port))
    try:
        assert conn.open_items("ka", 1, 1) == [b"x"]
        pinger = KeepAlive(0.05)
        pinger.add(conn)
        for _ in range(20):
            conn.check()
            time.sleep(0.01)
        pinger.stop()
        conn.confirm("ka", 1)
    finally:
        conn.close()
    assert queue_stats(server, "ka") == (0, 0)


# -- in-process bridge on the shared SparkSession --------------------------------------------


@pytest.mark.spark
def test_word_count_10k_items(server, spark, tmp_path):
    rng = random.Random(5)
    texts = [" ".join(rng.choices(VOCAB, k=rng.randint(1, 12))) for _ in range(10_000)]
    load(server, "words", [t.encode() for t in texts])

    report = run_bridge(config(server, tmp_path, queue="words", job=f"{JOBS}:word_count",
                               output_queue="counts", partitions=4), spark=spark)

    assert report.ok and report.items == 10_000
    counts = {}
    for item in drain(server, "counts"):
        row = json.loads(item)
        assert row["word"] not in counts
        counts[row["word"]] = row["count"]
    assert counts == Counter(word for text in texts for word in text.split())
    assert queue_stats(server, "words") == (0, 0)


@pytest.mark.spark
def test_json_field_sum_to_parquet_in_batches(server, spark, tmp_path):
    rng = random.Random(7)
    items, expected = [], Counter()
    for i in range(500):
        group = rng.choice(["eu", "us", "ap"])
        amount = rng.randint(1, 100)
        expected[group] += amount
        items.append(json.dumps({"order": i, "region": group, "price": {"amount": amount}}).encode())
    items.append(b"not json")
    load(server, "orders", items)
    out = tmp_path / "out"

    report = run_bridge(config(server, tmp_path, queue="orders", job=f"{JOBS}:json_field_sum",
                               job_args={"field": "price.amount", "group_by": "region"},
                               batch_size=200, output_path=str(out), output_format="parquet",
                               state_dir=None), spark=spark)

    assert report.ok and report.batches == 3 and report.items == 501
    dirs = sorted(p.name for p in out.glob("batch=*"))
    assert dirs == [f"batch=orders-127.0.0.1-{server.port}-{n:08d}" for n in range(3)]
    assert all((out / d / "_SUCCESS").exists() for d in dirs)
    rows = spark.read.parquet(str(out)).collect()
    totals = Counter()
    for row in rows:
        totals[row["group"]] += row["sum"]
    assert {g: s for g, s in totals.items() if g} == dict(expected)
    assert sum(row["skipped"] for row in rows) == 1
    assert json.loads((out / "_kestrel_bridge" / f"orders@127.0.0.1_{server.port}.json")
                      .read_text())["next_batch"] == 3
    assert queue_stats(server, "orders") == (0, 0)


@pytest.mark.spark
def test_job_failure_is_retried_with_the_same_batch_id(server, spark, tmp_path):
    load(server, "retry", [b"x%d" % i for i in range(50)])
    out = tmp_path / "out"
    seen = []

    def fails_once(rdd, meta):
        seen.append((meta.batch_id, meta.attempt, meta.items, meta.queue, meta.server))
        if meta.attempt == 0:
            raise ValueError("first attempt fails")
        return rdd.map(lambda b: b.decode())

    report = run_bridge(config(server, tmp_path, queue="retry", job=fails_once,
                               output_path=str(out)), spark=spark)
    assert report.ok and report.failures == 1 and report.items == 50
    batch_id = f"retry-127.0.0.1-{server.port}-00000000"
    server_name = f"127.0.0.1:{server.port}"
    assert seen == [(batch_id, 0, 50, "retry", server_name), (batch_id, 1, 50, "retry", server_name)]
    assert sorted(output_values(out)) == sorted(f"x{i}" for i in range(50))


@pytest.mark.spark
def test_empty_result_leaves_only_success(server, spark, tmp_path):
    load(server, "blank", [b"   ", b"\t"])  # no words at all
    out = tmp_path / "out"
    report = run_bridge(config(server, tmp_path, queue="blank", job=f"{JOBS}:word_count",
                               output_path=str(out), output_format="parquet"), spark=spark)
    assert report.ok and report.items == 2
    [batch] = out.glob("batch=*")
    assert sorted(p.name for p in batch.iterdir()) == ["_SUCCESS"]
    assert queue_stats(server, "blank") == (0, 0)


@pytest.mark.spark
def test_two_servers_and_a_dataframe_job(make_server, spark, tmp_path):
    servers = [make_server(), make_server()]
    for n, srv in enumerate(servers):
        load(srv, "multi", [json.dumps({"n": i, "server": n}).encode() for i in range(400)])
    out = tmp_path / "out"

    def to_frame(rdd, meta):  # a job that returns a DataFrame, built with meta.spark
        return meta.spark.read.json(rdd.map(lambda b: b.decode()))

    cfg = config(servers[0], tmp_path, queue="multi", job=to_frame, output_path=str(out),
                 output_format="parquet", batch_size=300,
                 servers=tuple(ServerAddress(s.host, s.port) for s in servers))
    report = run_bridge(cfg, spark=spark)

    assert report.ok and report.items == 800 and report.batches == 4
    assert {r.server for r in report.results} == {f"127.0.0.1:{s.port}" for s in servers}
    rows = spark.read.parquet(str(out)).collect()
    assert sorted((r["server"], r["n"]) for r in rows) == [(s, i) for s in (0, 1) for i in range(400)]
    for n, srv in enumerate(servers):  # each server's batches are numbered on their own
        assert {r["batch"] for r in rows if r["server"] == n} == {
            f"multi-127.0.0.1-{srv.port}-{k:08d}" for k in range(2)}
        assert queue_stats(srv, "multi") == (0, 0)


@pytest.mark.spark
@pytest.mark.slow
def test_server_restart_mid_batch(server, spark, tmp_path):
    """SIGTERM restart while a batch's job runs: the items survive the restart (journal), the
    bridge sees its connection is gone *before* committing the batch, and the retry rewrites
    the same batch id — no item lost and, with a path output, none duplicated.

    Deterministic: the first attempt's job blocks until the restart is over, so the restart
    always lands between opening the items and the commit."""
    items = [f"r{i}".encode() for i in range(2000)]
    load(server, "restart", items)
    out = tmp_path / "out"
    started, proceed = threading.Event(), threading.Event()
    attempts = []

    def blocking_identity(rdd, meta):
        attempts.append((meta.batch_id, meta.attempt))
        if not started.is_set():
            started.set()
            assert proceed.wait(60)
        return rdd.map(lambda b: b.decode())

    stop = threading.Event()
    cfg = config(server, tmp_path, queue="restart", job=blocking_identity, batch_size=500,
                 output_path=str(out), keep_alive=0)
    reports = []
    thread = threading.Thread(target=lambda: reports.append(
        run_bridge(cfg, spark=spark, stop_event=stop)))
    thread.start()
    try:
        assert started.wait(60), "first batch never started"
        assert queue_stats(server, "restart") == (1500, 500)
        server.restart()  # SIGTERM: graceful shutdown with 500 items open
        assert queue_stats(server, "restart") == (2000, 0)  # the open ones came back
        proceed.set()
        thread.join(120)
        assert not thread.is_alive()
    finally:
        proceed.set()
        stop.set()
        thread.join(60)
    assert reports and reports[0].ok and reports[0].failures == 1 and reports[0].items == 2000
    first = f"restart-127.0.0.1-{server.port}-00000000"
    # Not committed: retried under the same id. A lost connection is not the job's failure,
    # so the retry's meta.attempt is 0 again.
    assert attempts[:2] == [(first, 0), (first, 0)]
    values = output_values(out)
    assert sorted(values) == sorted(i.decode() for i in items)  # none lost, none duplicated
    assert queue_stats(server, "restart") == (0, 0)


# -- bridge subprocesses ---------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_bridge_sigkill_mid_job_loses_nothing(server, tmp_path):
    items = [f"k{i}".encode() for i in range(3000)]
    load(server, "killme", items)
    out, markers, log = tmp_path / "out", tmp_path / "markers", tmp_path / "bridge.log"
    markers.mkdir()
    common = ["--servers", f"127.0.0.1:{server.port}", "--queue", "killme",
              "--job", "tests.bridge._spark_jobs:slow_identity", "--batch-size", "1000",
              "--partitions", "2", "--master", "local[2]", "--output-path", str(out),
              "--job-arg", f"markers={markers}", "--conf", "spark.driver.memory=512m"]
    first = start_bridge(*common, "--job-arg", "sleep=4", log=log)
    try:
        # Kill during the *second* batch: the first is written and confirmed by then.
        second = f"killme-127.0.0.1-{server.port}-00000001.0"
        wait_for(lambda: (markers / second).exists(), 90, "the second batch", first, log)
        time.sleep(1.5)  # inside the Spark tasks of batch 1
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        kill_group(first)
    # The dead connection's items go back to the queue.
    wait_for(lambda: queue_stats(server, "killme") == (2000, 0), 10, "the open items back")

    second_run = start_bridge(*common, "--until-empty", log=log)
    try:
        assert second_run.wait(120) == 0, log.read_text()[-3000:]
    finally:
        kill_group(second_run)
    values = output_values(out)
    assert set(values) == {i.decode() for i in items}  # none lost
    assert len(values) == len(items)  # and, killed before its commit, none duplicated either
    assert queue_stats(server, "killme") == (0, 0)
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert sum(e["items"] for e in events if e.get("event") == "batch") >= 3000


@pytest.mark.spark
@pytest.mark.slow
def test_standalone_cluster_word_count(server, standalone_cluster, tmp_path):
    texts = [f"alpha beta {VOCAB[i % len(VOCAB)]}" for i in range(2000)]
    load(server, "cluster", [t.encode() for t in texts])
    log = tmp_path / "bridge.log"
    bridge = start_bridge(
        "--servers", f"127.0.0.1:{server.port}", "--queue", "cluster",
        "--job", f"{JOBS}:word_count", "--output-queue", "cluster_counts", "--once",
        "--master", standalone_cluster, "--partitions", "2",
        "--conf", "spark.executor.memory=512m", "--conf", "spark.driver.memory=512m",
        "--conf", "spark.cores.max=2", "--state-dir", str(tmp_path / "state"), log=log)
    try:
        assert bridge.wait(180) == 0, log.read_text()[-3000:]
    finally:
        kill_group(bridge)
    counts = {json.loads(i)["word"]: json.loads(i)["count"] for i in drain(server, "cluster_counts")}
    assert counts == Counter(w for t in texts for w in t.split())
    assert queue_stats(server, "cluster") == (0, 0)
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "spark_started" and e["master"] == standalone_cluster
               for e in events)
