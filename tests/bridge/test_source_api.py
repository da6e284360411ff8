"""What a PySpark user meets with the ``kestrel`` source on the shared local SparkSession
(issue 22): the columns, the options as Spark hands them over, every trigger, the backlog in
the query's progress, and the batch read."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest

from ._spark_jobs import load, queue_stats, wait_for
from .test_source import end_offsets, stream

pytestmark = pytest.mark.spark


def memory_query(frame, name: str, tmp_path, **trigger):
    writer = (frame.writeStream.format("memory").queryName(name)
              .option("checkpointLocation", str(tmp_path / "checkpoint")))
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()


def available_now(frame, collect, tmp_path):
    """Run ``frame`` with ``trigger(availableNow=True)``, each micro-batch to ``collect``, to
    its end (without an error)."""
    query = (frame.writeStream.foreachBatch(collect).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    assert query.awaitTermination(180), "AvailableNow did not stop"
    assert query.exception() is None
    return query


def test_columns_are_value_queue_server_and_the_enqueue_time(server, spark, tmp_path):
    before = datetime.now(UTC)
    load(server, "cols", [b"alpha", b"beta"])
    loaded = datetime.now(UTC)
    time.sleep(0.05)  # read after this: a read time would be later than ``loaded``
    frame = stream(spark, [server], "cols", tmp_path)
    assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
        ("value", "binary"), ("queue", "string"), ("server", "string"),
        ("timestamp", "timestamp")]
    query = memory_query(frame.selectExpr("CAST(value AS STRING) AS text", "queue", "server",
                                          "timestamp"), "cols_rows", tmp_path)
    try:
        wait_for(lambda: spark.sql("select count(*) from cols_rows").first()[0] >= 2, 120,
                 "the rows")
        rows = spark.sql("select text, queue, server, "
                         "cast(unix_micros(timestamp) as long) as micros from cols_rows").collect()
    finally:
        query.stop()
    assert sorted((r["text"], r["queue"], r["server"]) for r in rows) == [
        ("alpha", "cols", f"127.0.0.1:{server.port}"), ("beta", "cols", f"127.0.0.1:{server.port}")]
    for row in rows:  # the time the server enqueued the item (milliseconds)
        enqueued = datetime.fromtimestamp(row["micros"] / 1e6, UTC)
        assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= enqueued <= loaded


def test_a_stream_without_wal_location_fails_at_start_naming_the_option(server, spark, tmp_path):
    frame = (spark.readStream.format("kestrel").option("servers", f"127.0.0.1:{server.port}")
             .option("queue", "nowal").load())
    query = memory_query(frame, "nowal_rows", tmp_path)
    with pytest.raises(Exception, match="option walLocation is required"):
        query.awaitTermination(120)
    assert not query.isActive


def test_unknown_and_kafka_options_fail_load(server, spark, tmp_path):
    for option, message in (("maxItemPerBatch", "unknown option 'maxitemperbatch'.*walLocation"),
                            ("startingOffsets", "Kafka's; a queue has no offsets")):
        with pytest.raises(Exception, match=f"(?i){message}"):  # at load(), before start()
            stream(spark, [server], "opts", tmp_path / option, **{option: "5"})


def test_a_batch_read_is_refused_with_the_reason_and_available_now_instead(server, spark):
    """Spark's batch reader is never told that the job's output was committed, so it could
    not confirm the items safely: refused, naming why and what to use."""
    load(server, "b", [b"kept"])
    with pytest.raises(Exception) as refused:
        (spark.read.format("kestrel").option("servers", f"127.0.0.1:{server.port}")
         .option("queue", "b").load().collect())
    message = str(refused.value)
    for part in ("cannot be read as a batch", "has no commit", "lost if the job fails",
                 "spark.readStream.format('kestrel')", "trigger(availableNow=True)"):
        assert part in message
    assert queue_stats(server, "b") == (1, 0)  # nothing was taken from the queue


def test_available_now_drains_confirms_and_stops_and_a_second_run_finds_nothing(server, spark,
                                                                             tmp_path):
    """The same scheduled job run twice (same checkpoint): the first run reads every item in
    micro-batches of at most maxItemsPerBatch, confirms them and stops; the second reads
    nothing."""
    items = [f"a{i}".encode() for i in range(2500)]
    load(server, "avail", items)

    def run() -> tuple[list[bytes], list[int]]:
        rows, sizes = [], []

        def collect(batch, batch_id):
            got = [bytes(r["value"]) for r in batch.select("value").collect()]
            rows.extend(got)
            sizes.append(len(got))

        available_now(stream(spark, [server], "avail", tmp_path, maxItemsPerBatch=1000),
                      collect, tmp_path)
        return rows, sizes

    first, sizes = run()
    assert sorted(first) == sorted(items) and sizes == [1000, 1000, 500]
    assert queue_stats(server, "avail") == (0, 0)  # confirmed, not left open or waiting
    assert run() == ([], [])


def test_available_now_reads_only_what_was_waiting_at_the_start(server, spark, tmp_path):
    load(server, "later", [f"l{i}".encode() for i in range(300)])
    seen = []

    def add_more(batch, batch_id):
        seen.append(batch.count())
        load(server, "later", [f"n{batch_id}-{i}".encode() for i in range(100)])

    frame = stream(spark, [server], "later", tmp_path, maxItemsPerBatch=100)
    query = (frame.writeStream.foreachBatch(add_more).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    assert query.awaitTermination(180)
    assert seen == [100, 100, 100]
    assert queue_stats(server, "later") == (300, 0)


def test_trigger_once_reads_one_batch_and_confirms_it(server, spark, tmp_path):
    load(server, "once", [f"o{i}".encode() for i in range(500)])
    frame = stream(spark, [server], "once", tmp_path, maxItemsPerBatch=200)
    query = memory_query(frame, "once_rows", tmp_path, once=True)
    assert query.awaitTermination(180)
    assert spark.sql("select count(*) from once_rows").first()[0] == 200
    assert queue_stats(server, "once") == (300, 0)


def test_continuous_trigger_names_the_supported_ones(server, spark, tmp_path):
    frame = stream(spark, [server], "cont", tmp_path)
    with pytest.raises(Exception) as refused:
        query = memory_query(frame, "cont_rows", tmp_path, continuous="1 second")
        query.awaitTermination(60)
    print(refused.value)
    assert "continuous" in str(refused.value).lower()


def test_max_items_per_trigger_bounds_a_micro_batch_across_servers(make_server, spark,
                                                                   tmp_path):
    first, second = make_server(), make_server()
    for n, srv in enumerate((first, second)):
        load(srv, "capt", [f"s{n}-{i}".encode() for i in range(400)])
    frame = stream(spark, [first, second], "capt", tmp_path, maxItemsPerTrigger=300)
    query = memory_query(frame, "capt_rows", tmp_path)
    try:
        wait_for(lambda: spark.sql("select count(*) from capt_rows").first()[0] >= 800, 180,
                 "every item")
    finally:
        query.stop()
    sizes = [sum(o["items"].values()) for o in end_offsets(query) if o["items"]]
    assert sum(sizes) == 800 and max(sizes) == 300 and all(n <= 300 for n in sizes)


def test_min_partitions_splits_a_small_batch(server, spark, tmp_path):
    load(server, "minp", [f"p{i}".encode() for i in range(90)])
    counts = []

    def partitions(batch, batch_id):
        counts.append(batch.rdd.getNumPartitions())

    frame = stream(spark, [server], "minp", tmp_path, minPartitions=3)
    query = (frame.writeStream.foreachBatch(partitions).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    assert query.awaitTermination(180)
    assert counts == [3]


def test_progress_shows_the_backlog_per_server(server, spark, tmp_path):
    load(server, "lag", [f"g{i}".encode() for i in range(1000)])

    def slow(batch, batch_id):
        time.sleep(0.5)

    frame = stream(spark, [server], "lag", tmp_path, maxItemsPerBatch=200, readAhead="false")
    query = (frame.writeStream.foreachBatch(slow)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    name = f"127.0.0.1:{server.port}"
    try:
        wait_for(lambda: len(query.recentProgress) >= 2, 120, "two progress reports")
        latest = [p["sources"][0]["latestOffset"] for p in query.recentProgress]
    finally:
        query.stop()
    latest = [json.loads(o) if isinstance(o, str) else o for o in latest if o]
    assert latest, "no latestOffset in the progress"
    backlogs = [o["backlog"][name] for o in latest]
    # 1000 waiting, 200 per batch: the first report shows 800 left
    assert backlogs[0] == 800 and backlogs == sorted(backlogs, reverse=True)
    assert all(o["backlogTotal"] == o["backlog"][name] for o in latest)


def test_several_queues_in_one_stream_each_row_names_its_queue_exactly_once(make_server, spark,
                                                                            tmp_path):
    """``queue`` takes a comma-separated list, as Kafka's ``subscribe``: one query drains
    every queue of every server, each row's ``queue`` column names its queue, each item once;
    offsets and the backlog count per queue per server; a second run finds nothing."""
    first, second = make_server(), make_server()
    loaded = []
    for n, srv in enumerate((first, second)):
        for queue, count in (("ka", 700), ("kb", 400)):
            items = [f"{queue}-s{n}-{i}".encode() for i in range(count)]
            load(srv, queue, items)
            loaded += [(queue, f"127.0.0.1:{srv.port}", item) for item in items]

    def run():
        rows = []

        def collect(batch, batch_id):
            rows.extend((r["queue"], r["server"], bytes(r["value"]))
                        for r in batch.select("queue", "server", "value").collect())

        frame = stream(spark, [first, second], "ka,kb", tmp_path, maxItemsPerBatch=500)
        return rows, available_now(frame, collect, tmp_path)

    rows, query = run()
    assert sorted(rows) == sorted(loaded)
    offsets = [o for o in end_offsets(query) if o.get("items")]
    assert offsets and all(set(o["items"]) <= {"ka", "kb"} for o in offsets)
    per_queue_server: dict[tuple[str, str], int] = {}
    for o in offsets:
        for queue, per_server in o["items"].items():
            for where, count in per_server.items():
                per_queue_server[(queue, where)] = per_queue_server.get((queue, where), 0) + count
    assert per_queue_server == {(q, f"127.0.0.1:{s.port}"): c for s in (first, second)
                                for q, c in (("ka", 700), ("kb", 400))}
    latest = json.loads(query.recentProgress[-1]["sources"][0]["latestOffset"])
    assert set(latest["backlog"]) == {"ka", "kb"} and latest["backlogTotal"] == 0
    for srv in (first, second):
        assert queue_stats(srv, "ka") == (0, 0) and queue_stats(srv, "kb") == (0, 0)
    assert run()[0] == []
