"""The bridge room's fixtures: one shared SparkSession and a standalone Spark cluster
(pyspark imported on use)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from ..helpers import free_port

# Spark waits 15 s for a Python worker to connect back; 2 cores shared by many test runs can
# take longer to start one.
LOADED_MACHINE = {"spark.python.authenticate.socketTimeout": "120s"}


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for every in-process Spark test of the run (a JVM costs
    5–9 s and up to 1 GiB). The ``kestrel`` data source is registered on it."""
    from kestrel_actors.spark_bridge import KestrelDataSource, create_spark_session

    from ._spark_jobs import spark_env

    env = spark_env()
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # Python workers import tests.* jobs
    os.environ["SPARK_HOME"] = env["SPARK_HOME"]  # pyspark.zip with compiled files
    session = create_spark_session("local[2]", {"spark.driver.memory": "768m", **LOADED_MACHINE},
                                   "kestrel-spark-tests", partitions=2)
    session.dataSource.register(KestrelDataSource)
    yield session
    session.stop()


class Standalone(NamedTuple):
    """A running standalone cluster: its master's URL and its worker's work directory (where
    each application's executors run, in ``<work>/<app id>/<executor id>``)."""

    master: str
    work: Path


@pytest.fixture(scope="package")
def standalone(tmp_path_factory) -> Iterator[Standalone]:
    """One standalone master and worker for every cluster test of the room, started when the
    first one needs it and stopped after the room's last test (a master and a worker are two
    JVM starts; the room's tests run one after another, each application with executors of
    its own)."""
    root = tmp_path_factory.mktemp("standalone")
    with spark_standalone(root) as master:
        yield Standalone(master, root / "work")


@pytest.fixture
def standalone_cluster(standalone) -> str:
    """The shared standalone cluster's master URL (:func:`standalone`)."""
    return standalone.master


@contextlib.contextmanager
def spark_standalone(tmp_path: Path) -> Iterator[str]:
    """Start a standalone master and one worker (files under ``tmp_path``); yield the
    master's URL; stop them. The room's tests share one (:func:`standalone`)."""
    import pyspark

    from ._spark_jobs import kill_group, listening, spark_env, wait_for

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    env = spark_env()
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
        except (OSError, ValueError):  # not listening yet, or a page still empty at start-up
            return 0

    try:
        master = spawn("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                       "--port", str(port), "--webui-port", str(ui_port))
        wait_for(lambda: listening(port), 180, "the master", master, log)
        worker = spawn("org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                       "--host", "127.0.0.1", "--webui-port", str(worker_ui),
                       "--cores", "2", "--memory", "1g", "--work-dir", str(tmp_path / "work"))
        wait_for(lambda: alive_workers() >= 1, 180, "a registered worker", worker, log)
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
