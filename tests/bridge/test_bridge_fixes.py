"""Bridge fixes of issue 15: keep-alive past ``--client-timeout``, ``--job-timeout``, the
dead-letter queue after ``--max-failures``, and job code shipped to a standalone cluster."""

from __future__ import annotations

import json
import sys
import threading
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from kestrel_actors.spark_bridge import BridgeConfig, ServerAddress, run_bridge, ship_job_code

from ._spark_jobs import (
    drain,
    kill_group,
    load,
    output_values,
    queue_stats,
    start_bridge,
)

pytestmark = pytest.mark.spark


def config(server, tmp_path, **changes) -> BridgeConfig:
    settings = {
        "queue": "work", "job": "kestrel_actors.spark_bridge.jobs:identity",
        "servers": (ServerAddress(server.host, server.port),), "batch_size": 100, "batch_wait": 1.0,
        "partitions": 2, "state_dir": str(tmp_path / "state"), "until_empty": True,
        "retry_initial": 0.1, "retry_max": 0.3,
    }
    settings.update(changes)
    return BridgeConfig(**settings)


def test_client_timeout_shorter_than_the_job_finishes_without_a_repeated_batch(
        make_server, spark, tmp_path):
    """The server closes connections idle for 2 s; each job runs ~4 s. The keep-alive pings
    the connection meanwhile, so every batch is confirmed once (before the fix each batch was
    written, its confirm failed, and it came back for ever)."""
    server = make_server("--client-timeout", "2")
    items = [f"t{i}".encode() for i in range(200)]
    load(server, "slow", items)
    out = tmp_path / "out"
    report = run_bridge(config(server, tmp_path, queue="slow", job="tests.bridge._spark_jobs:slow_identity",
                               job_args={"sleep": "4"}, output_path=str(out)), spark=spark)
    assert report.ok and report.failures == 0
    assert report.batches == 2 and report.items == 200
    assert sorted(output_values(out)) == sorted(i.decode() for i in items)  # exactly once
    assert queue_stats(server, "slow") == (0, 0)


def test_poison_batch_goes_to_the_dead_letter_queue_and_the_bridge_goes_on(
        server, spark, tmp_path):
    bad = [f"bad-{i}".encode() for i in range(50)]
    good = [f"good-{i}".encode() for i in range(100)]
    last = [f"bad-last-{i}".encode() for i in range(50)]
    # The first batch of 50 is all poison, then two good batches, then poison again: the
    # last batch given up has no good batch after it to take (and overwrite) its batch id.
    load(server, "orders", bad + good + last)
    out = tmp_path / "out"
    seen = []

    def fussy(rdd, meta):
        seen.append((meta.batch_id, meta.attempt))
        # A DataFrame with its schema given fails while Spark writes batch=<id>/ (an RDD of
        # rows would fail earlier, inferring its schema, before any directory exists).
        return meta.spark.createDataFrame(rdd.map(_refuse_bad).map(lambda v: (v,)),
                                          "value string")

    report = run_bridge(config(server, tmp_path, queue="orders", job=fussy, batch_size=50,
                               output_path=str(out), max_failures=2), spark=spark)

    ids = [f"orders-127.0.0.1-{server.port}-{n:08d}" for n in range(3)]
    assert report.parked == [ids[0], ids[2]] and not report.ok
    # each poison batch failed once, was retried, and was parked at its second failure
    assert report.failures == 2 and report.items == 100 and report.batches == 2
    # the id is reused by the next batch, and attempts start again from 0
    assert seen == [(ids[0], 0), (ids[0], 1), (ids[0], 0), (ids[1], 0), (ids[2], 0),
                    (ids[2], 1)]
    assert sorted(drain(server, "orders_failed")) == sorted(bad + last)
    assert sorted(output_values(out)) == sorted(g.decode() for g in good)
    assert queue_stats(server, "orders") == (0, 0)
    # no directory of a batch given up is left behind (not even an empty batch=<id>/)
    assert sorted(p.name for p in out.glob("batch=*")) == [f"batch={i}" for i in ids[:2]]


def _refuse_bad(item: bytes) -> str:
    if item.startswith(b"bad"):
        raise ValueError(f"poison item {item!r}")
    return item.decode()


def test_job_timeout_cancels_the_job_and_returns_the_batch(server, spark, tmp_path):
    items = [f"j{i}".encode() for i in range(60)]
    load(server, "stuck", items)
    out = tmp_path / "out"
    calls = []
    opened_during_first = []

    def hangs_once(rdd, meta):
        calls.append(meta.attempt)
        if len(calls) == 1:
            opened_during_first.append(queue_stats(server, "stuck"))
            return rdd.mapPartitions(_sleep_forever)
        return rdd.map(lambda b: b.decode())

    stop = threading.Event()
    report = run_bridge(config(server, tmp_path, queue="stuck", job=hangs_once,
                               output_path=str(out), job_timeout=30.0), spark=spark,
                        stop_event=stop)
    assert opened_during_first == [(0, 60)]
    # the hung attempt timed out; so may a sound one that load held back past job_timeout
    assert report.ok and report.failures >= 1 and report.items == 60
    assert calls == [0] * (report.failures + 1)  # a timeout is not the job's failure: no attempt counted
    assert sorted(output_values(out)) == sorted(i.decode() for i in items)
    assert queue_stats(server, "stuck") == (0, 0)


def _sleep_forever(items):
    import time

    time.sleep(600)
    yield from items


HELPER_JOB = '''
"""A user's job in its own file, with a module-level helper and a helper from a library of
its own: Spark pickles ``shout`` and ``textlib.words`` by reference, so every executor must
be able to import this module (shipped by the bridge) and ``textlib`` (``--py-files``)."""

import textlib


def shout(word):
    return word.upper()


def run(rdd, meta):
    return (rdd.flatMap(textlib.words).map(shout)
            .map(lambda w: (w, 1)).reduceByKey(lambda a, b: a + b)
            .map(lambda pair: {"word": pair[0], "count": pair[1]}))
'''

TEXTLIB = '''
def words(data):
    return data.decode().split()
'''


@pytest.mark.slow
def test_module_level_helper_job_on_a_standalone_cluster(server, standalone_cluster, tmp_path):
    jobs, libs = tmp_path / "userjobs", tmp_path / "libs"
    jobs.mkdir()
    libs.mkdir()
    (jobs / "wordjob.py").write_text(HELPER_JOB)  # not on the workers' PYTHONPATH
    textlib = libs / "textlib.zip"  # on nobody's path: --py-files serves driver and workers
    with zipfile.ZipFile(textlib, "w") as archive:
        archive.writestr("textlib.py", TEXTLIB)
    texts = [f"alpha beta w{i % 7}" for i in range(2000)]
    load(server, "cluster", [t.encode() for t in texts])
    log = tmp_path / "bridge.log"
    bridge = start_bridge(
        "--servers", f"127.0.0.1:{server.port}", "--queue", "cluster",
        "--job", "wordjob:run", "--py-files", str(textlib), "--output-queue", "cluster_counts",
        "--once", "--master", standalone_cluster, "--partitions", "2", "--job-timeout", "150s",
        "--conf", "spark.executor.memory=512m", "--conf", "spark.driver.memory=512m",
        "--conf", "spark.cores.max=2", "--state-dir", str(tmp_path / "state"),
        log=log, cwd=jobs)
    try:
        assert bridge.wait(200) == 0, log.read_text()[-3000:]
    finally:
        kill_group(bridge)
    counts = {json.loads(i)["word"]: json.loads(i)["count"] for i in drain(server, "cluster_counts")}
    assert counts == Counter(w.upper() for t in texts for w in t.split())
    assert queue_stats(server, "cluster") == (0, 0)
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    [started] = [e for e in events if e.get("event") == "bridge_started"]
    assert started["shipped"] == [str(textlib), str(jobs / "wordjob.py")]


def test_a_changed_job_package_ships_again_in_the_same_session(spark, tmp_path, monkeypatch):
    """A second bridge run in one SparkSession after the job's package changed: Spark refuses
    a different file under a name it has shipped already, so the archive is named after its
    contents (the same package ships under the same name)."""
    package = tmp_path / "shipme"
    package.mkdir()
    (package / "__init__.py").write_text("def run(rdd, meta):\n    return rdd\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "shipme", raising=False)
    __import__("shipme")
    try:
        [first] = ship_job_code(spark, "shipme:run")
        [again] = ship_job_code(spark, "shipme:run")
        (package / "__init__.py").write_text("def run(rdd, meta):\n    return rdd.map(len)\n")
        [changed] = ship_job_code(spark, "shipme:run")
    finally:
        sys.modules.pop("shipme", None)
    assert Path(first).name == Path(again).name != Path(changed).name
    assert Path(changed).name.startswith("shipme-") and Path(changed).suffix == ".zip"
