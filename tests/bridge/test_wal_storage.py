"""The write-ahead log where a cluster keeps its state (issue 57.2): ``walLocation`` takes a
local path, ``file://`` and an S3 prefix (``s3a://``/``s3://``), and refuses any other scheme
at ``load()``. The S3 server is moto's (``moto[server]``), started here on loopback; the
cluster is a standalone master and worker from pyspark's distribution, the room's shared one
(the ``file://`` run uses the suite's shared local session instead, to spare a driver).

On the cluster the driver plans each batch into S3 and the executors read their slices from
there (nothing of the log is on a local disk); a driver SIGKILL with a batch planned and not
committed is replayed from the S3 object: 0 items lost, 0 duplicated into the file sink."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ..helpers import ServerProcess, free_port
from ._spark_jobs import (
    REPO,
    file_sink_values,
    kill_group,
    load,
    queue_stats,
    spark_env,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1500)]

BUCKET = "checkpoints"
KEYS = {"walS3AccessKey": "moto-access", "walS3SecretKey": "moto-secret",
        "walS3Region": "us-east-1"}
HIDE_TRACEBACK = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"


class S3:
    """A moto S3 server on loopback, with one bucket; what lies under a prefix."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer
        from pyarrow import fs

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        self.port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.fs = fs.S3FileSystem(access_key=KEYS["walS3AccessKey"],
                                  secret_key=KEYS["walS3SecretKey"], region="us-east-1",
                                  scheme="http", endpoint_override=f"127.0.0.1:{self.port}",
                                  allow_bucket_creation=True)
        self.fs.create_dir(BUCKET)

    def options(self) -> dict[str, str]:
        return {"walS3Endpoint": self.endpoint, **KEYS}

    def names(self, prefix: str) -> list[str]:
        from pyarrow import fs

        return sorted(info.base_name for info in self.fs.get_file_info(
            fs.FileSelector(f"{BUCKET}/{prefix}", allow_not_found=True))
            if info.type == fs.FileType.File)


@pytest.fixture(scope="module")
def s3():
    store = S3()
    yield store
    store.server.stop()


def no_scheme_directory(*roots: Path) -> None:
    """Nothing was written to a local directory named after the scheme (as ``s3a:/...``)."""
    for root in roots:
        assert not list(root.glob("s3*:")), f"a local s3a: directory under {root}"


# -- the planner and an executor's read, without Spark ------------------------------------------


def test_a_batch_is_one_whole_s3_object_published_before_the_confirm_and_replayed(
        server, s3, tmp_path, monkeypatch):
    """The planner puts batch 1 into S3 as one object before confirming it; the read-ahead's
    batch 2 is not in S3 until it is planned (an object store has no rename: nothing is
    written before the batch is published); a pickled partition reads its slice from S3; a
    new planner replays the batch from the object; commit deletes it. The endpoint and keys
    come from the AWS SDK's environment variables here (the cluster test gives options)."""
    from kestrel_actors.spark_bridge._source import KestrelDataSource

    monkeypatch.chdir(tmp_path)
    for name, value in (("AWS_ENDPOINT_URL", s3.endpoint), ("AWS_REGION", "us-east-1"),
                        ("AWS_ACCESS_KEY_ID", KEYS["walS3AccessKey"]),
                        ("AWS_SECRET_ACCESS_KEY", KEYS["walS3SecretKey"])):
        monkeypatch.setenv(name, value)
    items = [f"s3-{i:04d}".encode() * (1 + i % 7) for i in range(1_500)]
    load(server, "s3plan", items)

    def reader():
        return KestrelDataSource({"servers": f"127.0.0.1:{server.port}", "queue": "s3plan",
                                  "walLocation": f"s3a://{BUCKET}/plan", "maxItemsPerBatch": "1000",
                                  "itemsPerPartition": "300"}).streamReader(None)

    def rows(stream, start, end) -> list[bytes]:
        values: list[bytes] = []
        for partition in stream.partitions(start, end):
            executor = pickle.loads(pickle.dumps(stream))  # as Spark ships it: options only
            for batch in executor.read(pickle.loads(pickle.dumps(partition))):
                values.extend(batch.column("value").to_pylist())
        return values

    planner = reader()
    start = planner.initialOffset()
    end = planner.latestOffset(start)
    planner.live.prefetch.wait()
    names = s3.names("plan")  # batch 2 only read ahead; batch 1's parts recorded as confirmed
    assert names[0] == "batch-000000000001.wal"
    assert names[1:] and all(n.startswith("batch-000000000001.wal.confirmed-") for n in names[1:])
    assert queue_stats(server, "s3plan") == (0, 500)  # batch 1 confirmed, batch 2 open
    first = rows(planner, start, end)
    assert first == items[:1_000]
    planner.stop()  # dies before Spark commits batch 1: batch 2's items go back
    wait_for(lambda: queue_stats(server, "s3plan") == (500, 0), 30, "the read-ahead given back")
    restarted = reader()
    try:
        assert restarted.latestOffset(start) == end
        assert rows(restarted, start, end) == first
        restarted.commit(end)
        assert s3.names("plan") == []
    finally:
        restarted.stop()
    no_scheme_directory(tmp_path, REPO)


# -- options at load() ------------------------------------------------------------------------


@pytest.mark.parametrize("location, scheme", [("hdfs://namenode:8020/ckpt/kestrel-wal", "hdfs"),
                                              ("foo://bar/wal", "foo")])
def test_an_unsupported_wal_scheme_fails_load_in_one_line_naming_it(spark, location, scheme):
    spark.conf.set(HIDE_TRACEBACK, "true")
    try:
        with pytest.raises(Exception) as refused:
            (spark.readStream.format("kestrel").option("queue", "q")
             .option("walLocation", location).load())
    finally:
        spark.conf.unset(HIDE_TRACEBACK)
    first = str(refused.value).splitlines()[0]
    assert (f"kestrel source: option walLocation {location!r}: scheme {scheme!r} is not "
            f"supported") in first, str(refused.value)
    assert "s3a://bucket/prefix" in first


# -- a standalone cluster ---------------------------------------------------------------------


ITEMS = 4_000
PER_BATCH = 1_000


def start_stream(server: ServerProcess, master: str, wal: str, options: dict[str, str],
                 out: Path, checkpoint: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as sink_log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.bridge._spark_jobs", "stream",
             "--servers", f"127.0.0.1:{server.port}", "--queue", "feed", "--out", str(out),
             "--sink", "parquet", "--checkpoint", str(checkpoint), "--max-items",
             str(PER_BATCH), "--sleep", "1", "--master", master, "--wal", wal,
             *(f"--option={name}={value}" for name, value in options.items())],
            stdout=sink_log, stderr=subprocess.STDOUT, env=spark_env(), cwd=REPO,
            start_new_session=True)


def drained(server: ServerProcess, proc: subprocess.Popen, out: Path, items: list[bytes],
            log: Path, wal_empty) -> tuple[int, int]:
    """Wait until the queue is empty, every item is in the sink and the log holds no batch;
    (lost, duplicated)."""
    try:
        wait_for(lambda: queue_stats(server, "feed") == (0, 0) and out.exists()
                 and len(set(file_sink_values(out))) >= len(items), 900,
                 "the query to drain the queue", proc, log)
        wait_for(wal_empty, 120, "the last batch committed", proc, log)
    finally:
        kill_group(proc)
    counts = Counter(file_sink_values(out))
    return (len(set(items) - set(counts)), sum(n - 1 for n in counts.values() if n > 1))


def test_driver_sigkill_on_a_cluster_replays_the_batch_from_the_s3_wal(server, s3,
                                                                        standalone_cluster,
                                                                        tmp_path):
    """Batch 2 (Spark's id) is planned into S3 and confirmed, batch 1 committed, when the
    driver is killed; the restarted query replays batch 2 from its S3 object on the
    executors: 0 lost, 0 duplicated, and the log's prefix is empty at the end."""
    items = [f"id-{i:05d}".encode() for i in range(ITEMS)]
    load(server, "feed", items)
    out, checkpoint, log = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "driver.log"
    wal = f"s3a://{BUCKET}/runs/kill"

    first = start_stream(server, standalone_cluster, wal, s3.options(), out, checkpoint, log)
    try:
        wait_for(lambda: (checkpoint / "commits" / "1").exists()
                 and (checkpoint / "offsets" / "2").exists(), 900,
                 "two batches committed and the third planned", first, log)
    finally:
        kill_group(first)
    assert not (checkpoint / "commits" / "2").exists(), "the kill was meant to land in batch 2"
    assert "batch-000000000003.wal" in s3.names("runs/kill")
    second = start_stream(server, standalone_cluster, wal, s3.options(), out, checkpoint, log)
    assert drained(server, second, out, items, log,
                   lambda: not s3.names("runs/kill")) == (0, 0)
    assert "batch_replayed_from_wal" in log.read_text(errors="replace")
    assert not (checkpoint / "kestrel-wal").exists()
    no_scheme_directory(REPO, tmp_path)


def test_a_file_uri_wal_in_a_query(server, spark, tmp_path):
    """``file://`` is a local directory: a query (the shared local session, availableNow,
    two batches into the parquet sink) plans into it and its Python workers read from it."""
    items = [f"file-{i:05d}".encode() for i in range(2 * PER_BATCH)]
    load(server, "fileuri", items)
    out, wal = tmp_path / "out", tmp_path / "wal"
    frame = (spark.readStream.format("kestrel").option("servers", f"127.0.0.1:{server.port}")
             .option("queue", "fileuri").option("walLocation", f"file://{wal}")
             .option("maxItemsPerBatch", str(PER_BATCH)).load())
    query = (frame.select("value").writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(600)
    assert sorted(file_sink_values(out)) == items
    assert wal.is_dir() and not list(wal.glob("batch-*"))
    assert queue_stats(server, "fileuri") == (0, 0)
    no_scheme_directory(REPO, tmp_path)


def test_wal_locations_parse_as_a_cluster_writes_them():
    """What each ``walLocation`` names (no Spark): local paths and file URIs (Hadoop's
    ``file:/p`` and ``file://localhost/p`` too) are directories, s3a:// and s3:// are a
    bucket and prefix; a file URI with another host, a bucket-less S3 URI and ``walS3*``
    options beside a local location are refused."""
    from kestrel_actors.spark_bridge._source import OptionError, SourceOptions

    def where(location: str, **extra: str) -> tuple[str, str]:
        wal = SourceOptions.parse({"queue": "q", "walLocation": location, **extra}).wal
        assert wal is not None
        return wal.scheme, wal.root

    assert where("/ckpt/kestrel-wal") == ("file", "/ckpt/kestrel-wal")
    assert where("file:///ckpt/a%20b") == ("file", "/ckpt/a b")
    assert where("file://localhost/ckpt/w") == where("file:/ckpt/w") == ("file", "/ckpt/w")
    assert where("s3a://bkt/ckpt/events/kestrel-wal/") == ("s3", "bkt/ckpt/events/kestrel-wal")
    assert where("s3://bkt", walS3Endpoint="http://127.0.0.1:9000") == ("s3", "bkt")
    for location, extra, said in (
            ("file://nfs1/ckpt", {}, "names host 'nfs1'"),
            ("s3a:///ckpt", {}, "names no bucket"),
            ("/ckpt/w", {"walS3Endpoint": "http://x:9000"}, "walS3Endpoint does not apply"),
            ("s3a://bkt/w", {"walS3Endpoint": "minio:9000"}, "http(s)://host[:port]")):
        with pytest.raises(OptionError, match=r"^kestrel source: option walLocation ") as refused:
            SourceOptions.parse({"queue": "q", "walLocation": location, **extra})
        assert said in str(refused.value)


def test_a_missing_bucket_fails_the_first_plan_naming_it(server, s3):
    from kestrel_actors.spark_bridge._source import KestrelDataSource

    stream = KestrelDataSource({"servers": f"127.0.0.1:{server.port}", "queue": "nobucket",
                                "walLocation": "s3a://no-such-bucket/wal",
                                **s3.options()}).streamReader(None)
    with pytest.raises(FileNotFoundError) as refused:
        stream.latestOffset(stream.initialOffset())
    assert f"bucket no-such-bucket does not exist at {s3.endpoint}" in str(refused.value)
