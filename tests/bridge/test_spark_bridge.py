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
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from kestrel_actors.spark_bridge import (
    BatchLedger,
    BridgeConfig,
    KestrelClient,
    KestrelReplyError,
    LedgerLockedError,
    ServerAddress,
    parse_duration,
    run_bridge,
)

from ..helpers import REPO, free_port

JOBS = "kestrel_actors.spark_bridge.jobs"
VOCAB = [f"w{i}" for i in range(50)] + ["kestrel", "queue", "spark", "actor"]


# -- helpers ---------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    """Environment for Spark workers and bridge subprocesses: the repo importable (tests.*)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def client(server) -> KestrelClient:
    return KestrelClient(ServerAddress(server.host, server.port)).connect()


def load(server, queue: str, items: list[bytes]) -> None:
    with client(server) as c:
        assert c.set_many(queue, items) == len(items)


def drain(server, queue: str) -> list[bytes]:
    out = []
    with client(server) as c:
        while (item := c.get(queue)) is not None:
            out.append(item)
    return out


def queue_stats(server, queue: str) -> tuple[int, int]:
    """(items waiting, items open) on ``queue``."""
    with client(server) as c:
        stats = c.stats()
    return (int(stats.get(f"queue_{queue}_items", 0)),
            int(stats.get(f"queue_{queue}_open_transactions", 0)))


def config(server, tmp_path, **changes) -> BridgeConfig:
    settings = dict(
        queue="work", job=f"{JOBS}:identity", servers=(ServerAddress(server.host, server.port),),
        batch_size=10_000, batch_wait=1.0, partitions=2, state_dir=str(tmp_path / "state"),
        until_empty=True, retry_initial=0.1, retry_max=0.5,
    )
    settings.update(changes)
    return BridgeConfig(**settings)


def read_json_output(path: Path) -> dict[str, list[dict]]:
    """Rows of every complete (``_SUCCESS``) batch directory under ``path``."""
    batches = {}
    for directory in sorted(path.glob("batch=*")):
        assert (directory / "_SUCCESS").exists(), f"incomplete batch {directory}"
        rows = []
        for part in sorted(directory.glob("part-*")):
            rows.extend(json.loads(line) for line in part.read_text().splitlines() if line)
        batches[directory.name.removeprefix("batch=")] = rows
    return batches


def output_values(path: Path) -> list[str]:
    return [row["value"] for rows in read_json_output(path).values() for row in rows]


def start_bridge(*args: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "kestrel_actors.cli", "bridge", "run", "--log-format", "json",
             *args],
            stdout=sink, stderr=subprocess.STDOUT, env=_env(), cwd=REPO, start_new_session=True,
        )


def kill_group(proc: subprocess.Popen) -> None:
    """Kill what is left of a subprocess's session (JVM, Python workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None,
             log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    detail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{detail}")


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for every in-process bridge test of the session."""
    from kestrel_actors.spark_bridge import create_spark_session

    os.environ["PYTHONPATH"] = _env()["PYTHONPATH"]  # Python workers import tests.* jobs
    session = create_spark_session("local[2]", {"spark.driver.memory": "768m"},
                                   "kestrel-bridge-tests", partitions=2)
    yield session
    session.stop()


# -- fast checks: no Spark -------------------------------------------------------------------


def test_cli_help_does_not_import_pyspark_or_gevent():
    code = (
        "import sys; from click.testing import CliRunner; from kestrel_actors.cli import main\n"
        "r = CliRunner().invoke(main, ['bridge', 'run', '--help'])\n"
        "assert r.exit_code == 0 and '--output-path' in r.output, r.output\n"
        "import kestrel_actors.spark_bridge, kestrel_actors.spark_bridge._runner\n"
        "import kestrel_actors.spark_bridge.jobs\n"
        "print(sorted(m for m in ('pyspark', 'gevent') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(), check=True).stdout
    assert out.strip() == "[]"


def test_durations_and_servers():
    assert parse_duration("1s") == 1.0 and parse_duration("250ms") == 0.25
    assert parse_duration("2m") == 120.0 and parse_duration("1.5") == 1.5
    with pytest.raises(ValueError):
        parse_duration("soon")
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


def test_client_monitor_and_confirm(server):
    load(server, "mon", [b"a", b"", b"c\r\nd"])
    with client(server) as c:
        items = c.fetch_batch("mon", 10, 0.2)  # sub-second wait: one whole second on the wire
        assert items == [b"a", b"", b"c\r\nd"]
        with pytest.raises(KestrelReplyError):
            c.confirm("mon", 4)  # more than are open: ERROR, nothing confirmed
        c.connect()
        # The close gave them back, at the head in reverse opening order (reference §2.6).
        assert c.fetch_batch("mon", 10, 0.2) == [b"c\r\nd", b"", b"a"]
        c.confirm("mon", 3)
        assert c.fetch_batch("mon", 10, 0.2) == []
    assert queue_stats(server, "mon") == (0, 0)


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
def test_failing_job_confirms_nothing_and_a_later_run_processes(server, spark, tmp_path):
    items = [f"item-{i}".encode() for i in range(300)]
    load(server, "flaky", items)
    out = tmp_path / "out"
    seen = []

    def broken(rdd, meta):
        seen.append((meta.batch_id, meta.attempt))
        return rdd.map(_explode)  # fails inside the Spark tasks, while the sink writes

    report = run_bridge(config(server, tmp_path, queue="flaky", job=broken, output_path=str(out),
                               max_failures=2), spark=spark)
    assert not report.ok and report.failures == 2 and report.items == 0
    assert seen[0][0] == seen[1][0] and [a for _, a in seen] == [0, 1]  # same batch id
    assert queue_stats(server, "flaky") == (300, 0)  # nothing confirmed, all given back

    report = run_bridge(config(server, tmp_path, queue="flaky", output_path=str(out)), spark=spark)
    assert report.ok and report.items == 300
    batches = read_json_output(out)
    assert list(batches) == [seen[0][0]]  # the retry overwrote the failed attempt's directory
    assert sorted(output_values(out)) == sorted(i.decode() for i in items)
    assert queue_stats(server, "flaky") == (0, 0)


def _explode(item):
    raise RuntimeError(f"job failed on {item!r}")


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
    """SIGTERM restart while a batch's job runs: its items come back and are processed."""
    items = [f"r{i}".encode() for i in range(2000)]
    load(server, "restart", items)
    out = tmp_path / "out"
    started, proceed = threading.Event(), threading.Event()

    def blocking_identity(rdd, meta):
        if not started.is_set():
            started.set()
            assert proceed.wait(60)
        return rdd.map(lambda b: b.decode())

    stop = threading.Event()
    cfg = config(server, tmp_path, queue="restart", job=blocking_identity, batch_size=500,
                 output_path=str(out))
    reports = []
    thread = threading.Thread(target=lambda: reports.append(
        run_bridge(cfg, spark=spark, stop_event=stop)))
    thread.start()
    try:
        assert started.wait(60), "first batch never started"
        assert queue_stats(server, "restart") == (1500, 500)
        server.restart()  # SIGTERM: graceful shutdown with 500 items open
        survived = sum(queue_stats(server, "restart"))
        proceed.set()
        assert survived == 2000  # every item was journaled: the restart lost none
        thread.join(120)
    finally:
        proceed.set()
        stop.set()
        thread.join(60)
    assert reports and reports[0].ok and reports[0].failures >= 1
    values = output_values(out)
    assert set(values) == {i.decode() for i in items}  # none lost (duplicates allowed)
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


@pytest.fixture
def standalone_cluster(tmp_path):
    """A Spark standalone master and one worker from the installed pyspark, on loopback."""
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    env = _env()
    env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_MASTER_HOST="127.0.0.1",
               SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOG_DIR=str(tmp_path / "logs"))
    procs, log = [], tmp_path / "cluster.log"

    def spawn(*args: str) -> subprocess.Popen:
        with open(log, "ab") as sink:
            proc = subprocess.Popen([str(spark_class), *args], stdout=sink,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append(proc)
        return proc

    def alive_workers() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
                return int(json.load(r).get("aliveworkers", 0))
        except OSError:
            return 0

    try:
        master = spawn("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                       "--port", str(port), "--webui-port", str(ui_port))
        wait_for(lambda: _listening(port), 60, "the master", master, log)
        worker = spawn("org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                       "--host", "127.0.0.1", "--webui-port", str(worker_ui),
                       "--cores", "2", "--memory", "1g", "--work-dir", str(tmp_path / "work"))
        wait_for(lambda: alive_workers() >= 1, 60, "a registered worker", worker, log)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                kill_group(proc)


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


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
