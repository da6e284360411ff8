"""The ``serverSet`` option (issue 23): the source and the sink find their servers in a
ZooKeeper server set, looked up again at each micro-batch plan and each write task, so a query
follows the cluster. A real ZooKeeper (Debian's) and real servers."""

from __future__ import annotations

import pytest

from ..helpers import ZooKeeperProcess, stats_of, wait_for
from ._spark_jobs import drain, load, queue_stats
from ._spark_jobs import wait_for as spark_wait_for

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    zk = ZooKeeperProcess(tmp_path_factory.mktemp("zookeeper")).start()
    yield zk
    zk.stop()


def joined(make_server, zookeeper, prefix: str):
    return make_server("--zookeeper", zookeeper.hosts, "--zookeeper-path-prefix", prefix)


def members(zookeeper, path: str) -> int:
    zk = zookeeper.kazoo()
    try:
        return len(zk.get_children(path)) if zk.exists(path) else 0
    finally:
        zk.stop()
        zk.close()


def test_the_source_follows_members_that_join(make_server, spark, zookeeper, tmp_path):
    prefix = "/kestrel/spark-source"
    first, second = joined(make_server, zookeeper, prefix), joined(make_server, zookeeper, prefix)
    assert wait_for(lambda: members(zookeeper, f"{prefix}/read") == 2, timeout=15)
    for n, server in enumerate((first, second)):
        load(server, "followed", [f"s{n}-{i}".encode() for i in range(200)])
    rows = (spark.readStream.format("kestrel").option("serverSet", f"zk://{zookeeper.hosts}{prefix}/read")
            .option("queue", "followed").option("walLocation", str(tmp_path / "checkpoint" / "kestrel-wal"))
            .load().selectExpr("cast(value as string) as text", "server"))
    query = (rows.writeStream.format("memory").queryName("followed_rows")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        def count() -> int:
            return spark.sql("select count(*) from followed_rows").first()[0]

        spark_wait_for(lambda: count() >= 400, 120, "both members read")
        third = joined(make_server, zookeeper, prefix)
        load(third, "followed", [f"s2-{i}".encode() for i in range(200)])
        spark_wait_for(lambda: count() >= 600, 120, "the member that joined is read")
        spark_wait_for(lambda: all(queue_stats(s, "followed") == (0, 0) for s in (first, second, third)),
                       30, "nothing left open")
        got = sorted(r["text"] for r in spark.sql("select * from followed_rows").collect())
        servers = {r["server"] for r in spark.sql("select server from followed_rows").collect()}
    finally:
        query.stop()
    assert got == sorted(f"s{n}-{i}" for n in range(3) for i in range(200))
    assert servers == {s.address for s in (first, second, third)}


def test_the_sink_writes_only_to_the_write_set(make_server, spark, zookeeper):
    prefix = "/kestrel/spark-sink"
    servers = [joined(make_server, zookeeper, prefix) for _ in range(3)]
    assert wait_for(lambda: members(zookeeper, f"{prefix}/write") == 3, timeout=15)
    conn = servers[0].client()
    assert conn.call(b"status readonly") == b"END"
    conn.close()
    assert wait_for(lambda: members(zookeeper, f"{prefix}/write") == 2, timeout=10)
    (spark.range(600).selectExpr("cast(id as string) as value").repartition(6).write.format("kestrel")
     .option("serverSet", f"zk://{zookeeper.hosts}{prefix}/write").option("queue", "sunk")
     .mode("append").save())
    assert stats_of(servers[0]).get("queue_sunk_total_items", "0") == "0"
    sunk = drain(servers[1], "sunk") + drain(servers[2], "sunk")
    assert sorted(sunk) == sorted(str(i).encode() for i in range(600))


def test_a_bad_server_set_fails_the_query_at_once(spark, tmp_path):
    # the source's options are checked when the stream is loaded (its schema is asked for), so a
    # bad server set fails ``load()``, before any query starts, naming the form it wants
    with pytest.raises(Exception, match="zk://host:port/path"):
        (spark.readStream.format("kestrel").option("serverSet", "zk://nowhere").option("queue", "q")
         .option("walLocation", str(tmp_path / "kestrel-wal")).load()
         .writeStream.format("memory").queryName("never").start())
    assert not any(query.name == "never" for query in spark.streams.active)
