"""Spark test helpers of the bridge room (tests/bridge/): the jobs Spark's workers import, and
helpers for servers and subprocesses.

Two kinds of things live here, both importable by Spark's Python workers (``PYTHONPATH`` holds
the repository, so ``tests.*`` imports on executors):

* bridge jobs for tests that run the bridge (``slow_identity``);
* helpers that talk to servers and subprocesses (``load``, ``drain``, ``queue_stats``,
  ``start_bridge``, ``wait_for``...), and ``python -m tests.bridge._spark_jobs stream ...``, a
  streaming query in its own driver process (for killing a driver mid-query).

``slow_identity`` is ``jobs.identity`` with two hooks driven by ``--job-arg``:
``markers=DIR`` — touch ``DIR/<batch_id>.<attempt>`` when a batch's job starts (the test
waits for it before killing the bridge mid-job); ``sleep=S`` — each partition sleeps S
seconds inside the Spark tasks, so the job is really running when the kill lands.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

__all__ = [
    "REPO", "batch_dir_values", "client", "drain", "file_sink_values", "kill_group", "listening", "load",
    "output_values",
    "queue_stats", "read_json_output", "slow_identity", "spark_env", "start_bridge",
    "wait_for",
]

REPO = Path(__file__).resolve().parents[2]


# -- bridge jobs -----------------------------------------------------------------------------


def slow_identity(rdd, meta):
    markers = meta.args.get("markers")
    if markers:
        Path(markers, f"{meta.batch_id}.{meta.attempt}").touch()
    delay = float(meta.args.get("sleep", "0"))
    return rdd.mapPartitions(partial(_slow, delay)).map(_text)


def _slow(delay, items):
    if delay:
        time.sleep(delay)
    yield from items


def _text(data: bytes) -> str:
    return data.decode("utf-8")


# -- servers ---------------------------------------------------------------------------------


def client(server):
    """The project's client (``kestrel_actors.client``) for one test server."""
    from kestrel_actors.client import Client, ServerAddress

    return Client(ServerAddress(server.host, server.port))


def load(server, queue: str, items: list[bytes]) -> None:
    with client(server) as c:
        assert c.put_many(queue, items) == len(items)


def drain(server, queue: str) -> list[bytes]:
    out = []
    with client(server) as c:
        while (item := c.get(queue)) is not None:
            out.append(item)
    return out


def queue_stats(server, queue: str) -> tuple[int, int]:
    """(items waiting, items open) on ``queue``."""
    with client(server) as c:
        stats = c.queue_stats(queue)
    return stats.get("items", 0), stats.get("open_transactions", 0)


# -- bridge output ---------------------------------------------------------------------------


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


# -- subprocesses ----------------------------------------------------------------------------


def spark_env() -> dict[str, str]:
    """Environment for Spark workers and subprocesses: the repo importable (tests.*), and
    ``SPARK_HOME`` at :func:`compiled_spark_home`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["SPARK_HOME"] = compiled_spark_home()
    return env


def compiled_spark_home() -> str:
    """The installed pyspark's Spark home, but with a ``python/lib/pyspark.zip`` that holds
    compiled ``.pyc`` files beside the sources.

    Spark starts each planner and worker process with pyspark imported from that zip, which
    ships only sources: every start compiles pyspark again (~1.6 s of CPU), and Spark waits a
    fixed 10 s for a new Python process to connect back. On 2 cores shared by several test
    runs that start misses the 10 s ("Python worker failed to connect back"); compiled, it
    costs ~0.9 s. Built once per pyspark version under the temporary directory.
    """
    import compileall
    import shutil
    import tempfile
    import zipfile

    import pyspark

    home = Path(pyspark.__file__).parent
    source = home / "python" / "lib" / "pyspark.zip"
    key = f"{pyspark.__version__}-{int(source.stat().st_mtime)}-{os.getuid()}"
    farm = Path(tempfile.gettempdir()) / f"kestrel-tests-spark-home-{key}"
    if (farm / "python" / "lib" / "pyspark.zip").exists():
        return str(farm)
    building = Path(tempfile.mkdtemp(prefix="kestrel-tests-spark-home-"))
    for name in ("bin", "jars", "sbin"):
        (building / name).symlink_to(home / name)
    lib = building / "python" / "lib"
    lib.mkdir(parents=True)
    for py4j in (home / "python" / "lib").glob("py4j-*.zip"):
        (lib / py4j.name).symlink_to(py4j)
    tree = building / "tree"
    with zipfile.ZipFile(source) as archive:
        archive.extractall(tree)
    compileall.compile_dir(str(tree), quiet=1, legacy=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(tree.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(tree))
    shutil.rmtree(tree)
    try:
        building.rename(farm)
    except OSError:  # another run built it meanwhile
        shutil.rmtree(building, ignore_errors=True)
    return str(farm)


SHORT_LIVED_JVM = {f"spark.{side}.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
                   for side in ("driver", "executor")}
"""Java options for the drivers the tests start in a subprocess (and a cluster's executors),
which live a minute or less: the C1 compiler only and a single-threaded collector. C2's
compiler threads and the parallel collector's threads warm up a JVM that never lives to gain
from them; the stream job killed at its third batch took 34 s of CPU with Spark's defaults and
21-23 s with these (2 cores, loaded). The session of the ``spark`` fixture keeps the defaults:
it lives for the whole room."""


def start_bridge(*args: str, log: Path, cwd: Path = REPO) -> subprocess.Popen:
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "kestrel_actors.cli", "bridge", "run", "--log-format", "json",
             *(f"--conf={name}={value}" for name, value in SHORT_LIVED_JVM.items()), *args],
            stdout=sink, stderr=subprocess.STDOUT, env=spark_env(), cwd=cwd,
            start_new_session=True,
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


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


# -- a streaming query in its own driver process ---------------------------------------------


def _stream_main(argv: list[str]) -> None:
    """Copy ``--queue`` to ``--out`` through a streaming query (kestrel source → a slow map →
    a sink) with ``--checkpoint`` (and its write-ahead log beside it), until killed or
    ``--seconds`` pass. ``--sink``: ``kestrel`` (the queue ``--out``), ``parquet`` (Spark's
    file sink into the directory ``--out``) or ``foreachBatch`` (each batch overwrites
    ``--out/batch=<id>``: idempotent by batch id). ``--wal`` puts the write-ahead log
    elsewhere (an ``s3a://`` prefix), ``--option NAME=VALUE`` adds a source option."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sink", choices=("kestrel", "parquet", "foreachBatch"),
                        default="kestrel")
    parser.add_argument("--max-items", type=int, default=500)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--wal", help="walLocation (default: <checkpoint>/kestrel-wal)")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)

    from kestrel_actors.spark_bridge import KestrelDataSource, create_spark_session

    spark = create_spark_session(args.master, {"spark.driver.memory": "512m",
                                               "spark.executor.memory": "512m",
                                               "spark.python.authenticate.socketTimeout": "120s",
                                               **SHORT_LIVED_JVM},
                                 "kestrel-stream-test", partitions=2)
    spark.dataSource.register(KestrelDataSource)
    source = (spark.readStream.format("kestrel").option("servers", args.servers)
              .option("queue", args.queue).option("maxItemsPerBatch", args.max_items)
              .option("walLocation", args.wal or f"{args.checkpoint}/kestrel-wal")
              .option("itemsPerPartition", max(1, args.max_items // 2))
              .options(**dict(o.split("=", 1) for o in args.option)).load())
    slow = source.select("value").mapInArrow(partial(_slow_arrow, args.sleep), "value binary")
    writer = slow.writeStream.option("checkpointLocation", args.checkpoint)
    if args.sink == "kestrel":
        writer = (writer.format("kestrel").option("servers", args.servers)
                  .option("queue", args.out))
    elif args.sink == "parquet":
        writer = writer.format("parquet").option("path", args.out)
    else:
        writer = writer.foreachBatch(partial(_write_batch, args.out))
    query = writer.trigger(processingTime="200 milliseconds").start()
    print("query started", flush=True)
    query.awaitTermination(args.seconds)
    query.stop()
    spark.stop()


def _write_batch(out: str, batch, batch_id: int) -> None:
    batch.write.mode("overwrite").parquet(f"{out}/batch={batch_id}")


def file_sink_values(path: Path) -> list[bytes]:
    """The ``value`` of every row Spark's file sink committed under ``path`` (the files its
    ``_spark_metadata`` log lists: what ``spark.read.parquet(path)`` reads)."""
    import pyarrow.parquet as pq

    files = set()
    for entry in sorted((path / "_spark_metadata").iterdir()):
        if entry.name.startswith("."):
            continue
        for line in entry.read_text().splitlines()[1:]:
            record = json.loads(line)
            if record.get("action", "add") == "add":
                files.add(record["path"].removeprefix("file://").removeprefix("file:"))
            else:
                files.discard(record["path"].removeprefix("file://").removeprefix("file:"))
    return [v for f in sorted(files) for v in pq.read_table(f, columns=["value"])["value"]
            .to_pylist()]


def batch_dir_values(path: Path) -> list[bytes]:
    """The ``value`` of every row in the complete ``path/batch=<id>`` directories."""
    import pyarrow.parquet as pq

    values = []
    for directory in sorted(path.glob("batch=*")):
        if (directory / "_SUCCESS").exists():
            for part in sorted(directory.glob("part-*.parquet")):
                values.extend(pq.read_table(part, columns=["value"])["value"].to_pylist())
    return values


def _slow_arrow(delay, batches):
    for batch in batches:
        if delay:
            time.sleep(delay)
        yield batch


if __name__ == "__main__":
    if sys.argv[1:2] == ["stream"]:
        _stream_main(sys.argv[2:])
    else:
        raise SystemExit("usage: python -m tests.bridge._spark_jobs stream --servers ... --queue ...")
