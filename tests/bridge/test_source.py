"""The ``kestrel`` data source on the shared local SparkSession: streaming reads (one and two
servers, a server restarted mid-query) and the batch and streaming sink."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter

import pytest

from ._spark_jobs import drain, load, queue_stats, wait_for

pytestmark = pytest.mark.spark

VOCAB = [f"w{i}" for i in range(40)] + ["kestrel", "queue", "spark"]


def servers_option(*servers) -> str:
    return ",".join(f"{s.host}:{s.port}" for s in servers)


def stream(spark, servers, queue: str, tmp_path, **options):
    """A ``kestrel`` stream; its write-ahead log beside ``tmp_path/checkpoint``."""
    reader = (spark.readStream.format("kestrel").option("servers", servers_option(*servers))
              .option("queue", queue)
              .option("walLocation", str(tmp_path / "checkpoint" / "kestrel-wal")))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def end_offsets(query) -> list[dict]:
    offsets = []
    for progress in query.recentProgress:
        for source in progress["sources"]:
            end = source["endOffset"]
            offsets.append(json.loads(end) if isinstance(end, str) else end)
    return offsets


def test_streaming_word_count_20k_lines_exact_and_nothing_left_open(server, spark, tmp_path):
    rng = random.Random(11)
    lines = [" ".join(rng.choices(VOCAB, k=rng.randint(1, 8))) for _ in range(20_000)]
    load(server, "lines", [line.encode() for line in lines])
    expected = Counter(word for line in lines for word in line.split())

    words = (stream(spark, [server], "lines", tmp_path, maxItemsPerBatch=5000)
             .selectExpr("explode(split(cast(value as string), ' ')) as word")
             .groupBy("word").count())
    query = (words.writeStream.format("memory").queryName("word_counts").outputMode("complete")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        def counted() -> int:
            return spark.sql("select coalesce(sum(`count`), 0) from word_counts").first()[0]

        wait_for(lambda: counted() >= sum(expected.values()), 180, "every word counted")
        # Drained: the batch that held the last lines is confirmed on the next trigger, while
        # the query is still running (stopping it would hand open items back instead).
        wait_for(lambda: queue_stats(server, "lines") == (0, 0), 30, "nothing left open")
        counts = {row["word"]: row["count"] for row in spark.sql("select * from word_counts").collect()}
    finally:
        query.stop()
    assert counts == dict(expected)
    assert queue_stats(server, "lines") == (0, 0)
    assert all(o["items"] and max(o["items"].values()) <= 5000 for o in end_offsets(query))


def test_two_servers_are_read_in_one_micro_batch(make_server, spark, tmp_path):
    first, second = make_server(), make_server()
    for n, srv in enumerate((first, second)):
        load(srv, "pair", [f"s{n}-{i}".encode() for i in range(300)])

    rows = stream(spark, [first, second], "pair", tmp_path).selectExpr(
        "cast(value as string) as text", "queue", "server")
    query = (rows.writeStream.format("memory").queryName("pair_rows")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        wait_for(lambda: spark.sql("select count(*) from pair_rows").first()[0] >= 600, 120,
                 "both servers read")
        wait_for(lambda: queue_stats(first, "pair") == queue_stats(second, "pair") == (0, 0),
                 30, "nothing left open")
        got = sorted((r["server"], r["queue"], r["text"])
                     for r in spark.sql("select * from pair_rows").collect())
    finally:
        query.stop()
    names = [f"127.0.0.1:{s.port}" for s in (first, second)]
    assert got == sorted((names[n], "pair", f"s{n}-{i}") for n in (0, 1) for i in range(300))
    # Both servers' items were in one micro-batch (the offset records each server's count).
    assert any(o["items"] == {names[0]: 300, names[1]: 300} for o in end_offsets(query))


def test_server_restarted_mid_query_loses_and_duplicates_nothing(server, spark, tmp_path):
    """The first micro-batch is held in foreachBatch while the server restarts. That batch was
    confirmed when it was planned (it is in the write-ahead log), so the restart does not put
    it back; the next batch, opened ahead on other connections meanwhile, goes back with the
    restart and is never handed to Spark (its connections are checked first): each item once."""
    items = [f"m{i}".encode() for i in range(1000)]
    load(server, "midq", items)
    started, proceed = threading.Event(), threading.Event()
    target = f"127.0.0.1:{server.port}"

    def copy_out(batch, batch_id):
        if not started.is_set():
            started.set()
            assert proceed.wait(60)
        (batch.select("value").write.format("kestrel").option("servers", target)
         .option("queue", "midq_out").mode("append").save())

    query = (stream(spark, [server], "midq", tmp_path, maxItemsPerBatch=400).writeStream
             .foreachBatch(copy_out).option("checkpointLocation", str(tmp_path / "checkpoint"))
             .start())
    try:
        assert started.wait(120), "no micro-batch started"
        # The held batch's 400 are confirmed; the next 400 are open, read ahead.
        wait_for(lambda: queue_stats(server, "midq") == (200, 400), 30, "the read-ahead")
        server.restart()
        assert queue_stats(server, "midq") == (600, 0)
        proceed.set()
        wait_for(lambda: queue_stats(server, "midq") == (0, 0)
                 and queue_stats(server, "midq_out")[0] >= 1000, 120, "the queue drained")
        time.sleep(1)  # a duplicate would arrive with the next trigger
    finally:
        proceed.set()
        query.stop()
    assert sorted(drain(server, "midq_out")) == sorted(items)


def test_keep_alive_holds_micro_batches_longer_than_the_client_timeout(make_server, spark,
                                                                       tmp_path):
    """The server closes connections idle for 2 s; each micro-batch's sink takes ~5 s. The
    source pings the connections holding the running batch (and the one read ahead) every
    ``keepAliveInterval`` (1 s by default), so the server never takes a batch back: every item
    comes exactly once and nothing is left open. Without the pings both batches' connections
    are closed mid-batch, their items go back to the head of the queue and come again."""
    server = make_server("--client-timeout", "2")
    items = [f"k{i}".encode() for i in range(300)]
    load(server, "held", items)
    received: list[bytes] = []

    def slow_sink(batch, batch_id):
        rows = [bytes(r["value"]) for r in batch.select("value").collect()]
        time.sleep(5)  # longer than --client-timeout: only the keep-alive keeps the batch
        received.extend(rows)

    query = (stream(spark, [server], "held", tmp_path, maxItemsPerBatch=100).writeStream
             .foreachBatch(slow_sink).option("checkpointLocation", str(tmp_path / "checkpoint"))
             .start())
    try:
        def settled() -> bool:
            duplicated = len(received) > len(set(received))
            return duplicated or (len(received) >= len(items)
                                  and queue_stats(server, "held") == (0, 0))

        # a duplicate ends the wait at once, and the assertion after it says which items
        wait_for(settled, 50, "every item received and nothing left open")
        repeated = sorted(item for item, n in Counter(received).items() if n > 1)
        assert not repeated, f"{len(repeated)} items delivered more than once: {repeated[:5]}"
        wait_for(lambda: not query.status["isDataAvailable"]
                 and not query.status["isTriggerActive"], 10, "the query idle")
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted(received) == sorted(items)  # idle: no batch came again meanwhile
    assert queue_stats(server, "held") == (0, 0)  # queue_held_open_transactions is 0


def test_batches_larger_than_one_connections_monitor_cap(make_server, spark, tmp_path):
    """A server opens at most --monitor-max-items per connection; maxItemsPerBatch above it
    is served by several connections per server, each confirmed after Spark's commit."""
    server = make_server("--monitor-max-items", "100")
    items = [f"c{i}".encode() for i in range(1000)]
    load(server, "capped", items)
    rows = stream(spark, [server], "capped", tmp_path, maxItemsPerBatch=300,
                  itemsPerConnection=100)
    query = (rows.selectExpr("cast(value as string) as text").writeStream.format("memory")
             .queryName("capped_rows").option("checkpointLocation", str(tmp_path / "checkpoint"))
             .start())
    try:
        wait_for(lambda: spark.sql("select count(*) from capped_rows").first()[0] >= 1000, 120,
                 "every item read")
        wait_for(lambda: queue_stats(server, "capped") == (0, 0), 30, "nothing left open")
        got = [r["text"].encode() for r in spark.sql("select * from capped_rows").collect()]
    finally:
        query.stop()
    assert sorted(got) == sorted(items)
    sizes = [sum(o["items"].values()) for o in end_offsets(query) if o["items"]]
    assert max(sizes) == 300 and all(n <= 300 for n in sizes)


def test_sink_batch_and_streaming(make_server, spark, tmp_path):
    first, second = make_server(), make_server()
    both = servers_option(first, second)
    (spark.range(1000).selectExpr("cast(id as string) as value").repartition(4).write
     .format("kestrel").option("servers", both).option("queue", "sunk").mode("append").save())
    sunk = drain(first, "sunk") + drain(second, "sunk")
    assert sorted(sunk) == sorted(str(i).encode() for i in range(1000))
    assert drain(first, "sunk") == [] and len(sunk) == 1000

    binary = [b"\x00\r\nEND\r\n", b"", b"\xff" * 3000]
    (spark.createDataFrame([(b,) for b in binary], "value binary").write.format("kestrel")
     .option("servers", servers_option(first)).option("queue", "raw").mode("append").save())
    assert sorted(drain(first, "raw")) == sorted(binary)
    with pytest.raises(Exception, match="no column 'value'"):
        (spark.range(3).write.format("kestrel").option("servers", both)
         .option("queue", "x").mode("append").save())

    # Streaming: copy a queue from one server to another, column chosen by option.
    load(first, "src", [f"c{i}".encode() for i in range(500)])
    query = (stream(spark, [first], "src", tmp_path)
             .selectExpr("upper(cast(value as string)) as line")
             .writeStream.format("kestrel").option("servers", servers_option(second))
             .option("queue", "copied").option("column", "line")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        wait_for(lambda: queue_stats(second, "copied")[0] >= 500, 120, "the copy")
        wait_for(lambda: queue_stats(first, "src") == (0, 0), 30, "nothing left open")
    finally:
        query.stop()
    assert sorted(drain(second, "copied")) == sorted(f"C{i}".encode() for i in range(500))
