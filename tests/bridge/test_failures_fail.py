"""Failures fail the query (issue 57, point 3): a queue server that cannot be reached, a bad
option, and a bridge run on a queue that was never loaded each say so, instead of looking
like an empty queue."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ..helpers import default_ports_held, free_port, stop_process_group
from ._spark_jobs import REPO, client, load, spark_env, wait_for
from .test_source_api import memory_query

pytestmark = pytest.mark.spark

DOC = REPO / "docs" / "spark-bridge.md"


def test_a_stream_whose_server_cannot_be_reached_fails_naming_it(spark, tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    frame = (spark.readStream.format("kestrel").option("servers", dead).option("queue", "gone")
             .option("walLocation", str(tmp_path / "wal")).option("connectTimeout", "1s")
             .option("serverRetryTimeout", "2s").load())
    query = memory_query(frame, "gone_rows", tmp_path)
    with pytest.raises(Exception) as failed:
        query.awaitTermination(240)  # fails after 1 s + 2 s; the deadline is for a busy machine
    message = str(failed.value)
    assert f"cannot reach {dead}" in message and "serverRetryTimeout" in message, message
    assert not query.isActive


def test_with_one_server_reachable_the_stream_goes_on_and_progress_names_both(
        server, spark, tmp_path):
    live, dead = f"127.0.0.1:{server.port}", f"127.0.0.1:{free_port()}"
    load(server, "half", [f"h{i}".encode() for i in range(50)])
    frame = (spark.readStream.format("kestrel").option("servers", f"{live},{dead}")
             .option("queue", "half").option("walLocation", str(tmp_path / "wal"))
             .option("connectTimeout", "1s").option("serverRetryTimeout", "1s").load())
    query = memory_query(frame, "half_rows", tmp_path)

    def rows(count: int):
        def arrived() -> bool:
            assert query.isActive, query.exception()
            return spark.sql("select count(*) from half_rows").first()[0] >= count
        return arrived

    try:
        wait_for(rows(50), 240, "the reachable server's items")
        load(server, "half", [b"later"])  # a second batch, after serverRetryTimeout has passed
        wait_for(rows(51), 240, "an item loaded later")
        assert query.isActive and query.exception() is None
        latest = [json.loads(p["sources"][0]["latestOffset"]) for p in query.recentProgress
                  if p["sources"][0]["latestOffset"]]
    finally:
        query.stop()
    assert latest, "no latestOffset in the progress"
    assert all(o["reachable"] == [live] and o["unreachable"] == [dead] for o in latest), latest


def test_available_now_with_a_server_that_cannot_be_reached_fails(server, spark, tmp_path):
    dead = free_port()
    load(server, "drain", [b"x"] * 10)
    frame = (spark.readStream.format("kestrel")
             .option("servers", f"127.0.0.1:{server.port},127.0.0.1:{dead}")
             .option("queue", "drain").option("walLocation", str(tmp_path / "wal"))
             .option("connectTimeout", "1s").option("serverRetryTimeout", "1s").load())
    query = (frame.writeStream.format("memory").queryName("drain_rows").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    with pytest.raises(Exception, match=f"cannot reach 127.0.0.1:{dead}"):
        query.awaitTermination(240)


HIDE_TRACEBACK = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"


def error_line(error: Exception) -> str:
    """The line of a Python worker's error that says what was raised: the first one after
    Spark's header and the worker's traceback frames (which are indented)."""
    lines = str(error).splitlines()
    return next(line for line in lines[1:] if line and not line[0].isspace())


@pytest.mark.parametrize("option, value, fix", [
    ("maxItemsPerBatch", "lots", "must be a whole number >= 1, got 'lots'"),
    ("connectTimeout", "5 seconds", "must be a duration such as 500ms, 5s or 2m"),
])
def test_a_bad_option_fails_load_naming_the_option_and_the_fix(spark, option, value, fix):
    """load() fails, before start(); the worker's error line is the option's, and with
    Spark's tracebacks hidden it is the first line."""
    said = f"kestrel source: option {option} {fix}"

    def refused() -> Exception:
        with pytest.raises(Exception) as caught:
            (spark.readStream.format("kestrel").option("queue", "q")
             .option("walLocation", "/tmp/w").option(option, value).load())
        return caught.value

    assert said in error_line(refused()), str(refused())
    spark.conf.set(HIDE_TRACEBACK, "true")
    try:
        error = refused()
    finally:
        spark.conf.unset(HIDE_TRACEBACK)
    assert said in str(error).splitlines()[0], str(error)


def test_a_bad_option_with_a_given_schema_fails_the_query_without_unbound_local_error(
        spark, tmp_path):
    frame = (spark.readStream.format("kestrel").schema("value binary").option("queue", "q")
             .option("walLocation", str(tmp_path / "wal")).option("readAhead", "maybe").load())
    query = memory_query(frame, "badopt_rows", tmp_path)
    with pytest.raises(Exception) as refused:
        query.awaitTermination(240)
    message = str(refused.value)
    assert "kestrel source: option readAhead must be true or false" in message, message
    assert "UnboundLocalError" not in message, message


def test_until_empty_on_a_queue_that_never_had_items_says_so(server, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kestrel_actors.cli", "bridge", "run",
         "--servers", f"127.0.0.1:{server.port}", "--queue", "never_loaded",
         "--job", "kestrel_actors.spark_bridge.jobs:count", "--until-empty",
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, env=spark_env(), timeout=300, check=False)
    assert done.returncode == 6, (done.returncode, done.stderr)
    line = (f"kestrel-actors bridge run: queue never_loaded has never held an item on "
            f"127.0.0.1:{server.port}: nothing to process (load it first; was the name or "
            f"--servers mistyped?)")
    assert done.stderr.splitlines() == [line], done.stderr


def test_a_queue_emptied_by_a_reader_has_held_items(server, tmp_path):
    from kestrel_actors.spark_bridge import BridgeConfig
    from kestrel_actors.spark_bridge._batch import BatchRunner

    load(server, "used", [b"a"])
    with client(server) as c:
        assert c.get("used") == b"a"
    config = BridgeConfig(queue="used", job="kestrel_actors.spark_bridge.jobs:count",
                          servers=f"127.0.0.1:{server.port}", state_dir=str(tmp_path))
    runner = BatchRunner(config, config.servers[0])
    try:
        assert not runner.never_had_items()
        runner.config = BridgeConfig(queue="unused", job=config.job, servers=config.servers,
                                     state_dir=str(tmp_path))
        assert runner.never_had_items()
    finally:
        runner.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_bridge_word_count_example_runs_as_written(tmp_path):
    """The bridge's end-to-end example, ``wordjob.py`` and its shell block as the doc gives
    them (only ``/tmp/kq`` is this test's): it starts a server on the default ports, loads
    it once it answers, and the bridge counts every word."""
    text = DOC.read_text()
    section = text[text.index("A runnable end-to-end example"):text.index("### One batch")]
    (job,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    (script,) = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    (tmp_path / "wordjob.py").write_text(job)
    env = spark_env()
    env = {k: v for k, v in env.items() if not k.startswith("PYSPARK_")}
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}"
    script = script.replace("/tmp/kq", str(tmp_path / "kq"))
    log = tmp_path / "example.log"
    with default_ports_held(), open(log, "wb") as sink:
        # (output to a file: the server the example starts with & keeps a pipe open)
        shell = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path,
                                 env=env, stdout=sink, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            shell.wait(600)
            output = log.read_text(errors="replace")
            assert shell.returncode == 0, output[-4000:]
            counted: dict[str, int] = {}
            with client_on_default_port() as c:
                while (item := c.get("counts")) is not None:
                    row = json.loads(item)
                    counted[row["word"]] = counted.get(row["word"], 0) + row["count"]
        finally:
            stop_process_group(shell)  # with the server the example started with &
    output = log.read_text(errors="replace")
    assert counted == {"A": 2000, "B": 1000}, output[-4000:]


def client_on_default_port():
    from kestrel_actors.client import Client

    return Client("127.0.0.1:22133")

