"""The ``kestrel`` source's planner calls made directly (as Spark's planner process makes them,
without Spark): the first micro-batch is small, and a partition read on an executor gives
the planned items, in order, as one Arrow record batch built from the packed buffers."""

from __future__ import annotations

import pickle

from kestrel_actors.spark_bridge._source import (
    FIRST_BATCH_ITEMS,
    KestrelDataSource,
    KestrelStreamReader,
)
from kestrel_actors.spark_bridge._wal import WriteAheadLog

from ._spark_jobs import load, queue_stats


def reader(server, tmp_path, **options) -> KestrelStreamReader:
    source = KestrelDataSource({"servers": f"127.0.0.1:{server.port}", "queue": "plan",
                                "walLocation": str(tmp_path / "wal"),
                                **{k: str(v) for k, v in options.items()}})
    return source.streamReader(None)


def rows_of(stream: KestrelStreamReader, start: dict, end: dict) -> list[bytes]:
    """What the executors would return: each partition pickled (as Spark ships it) and read."""
    values: list[bytes] = []
    for partition in stream.partitions(start, end):
        shipped = pickle.loads(pickle.dumps(partition))
        for batch in pickle.loads(pickle.dumps(stream)).read(shipped):
            assert batch.schema.names == ["value", "queue", "server", "timestamp"]
            assert set(batch.column("queue").to_pylist()) == {"plan"}
            values.extend(batch.column("value").to_pylist())
    return values


def test_the_first_batch_is_small_and_the_next_ones_full(server, tmp_path):
    items = [f"item-{i:05d}-".encode() * (i % 7) for i in range(12_000)]
    load(server, "plan", items)
    stream = reader(server, tmp_path, maxItemsPerBatch=5000, itemsPerPartition=1500)
    try:
        start = stream.initialOffset()
        first = stream.latestOffset(start)
        assert sum(first["items"].values()) == FIRST_BATCH_ITEMS < 5000
        got = rows_of(stream, start, first)
        stream.commit(first)
        second = stream.latestOffset(first)  # read ahead while the first batch ran
        assert sum(second["items"].values()) == 5000
        got += rows_of(stream, first, second)
        stream.commit(second)
        third = stream.latestOffset(second)
        got += rows_of(stream, second, third)
        stream.commit(third)
    finally:
        stream.stop()
    assert sum(third["items"].values()) == 12_000 - 5000 - FIRST_BATCH_ITEMS
    assert got == items  # empty items included, in queue order
    assert queue_stats(server, "plan") == (0, 0)


def test_a_replayed_batch_reads_the_same_rows_from_the_write_ahead_log(server, tmp_path):
    items = [bytes([i % 256]) * (i % 300) for i in range(1500)]
    load(server, "plan", items)
    planner = reader(server, tmp_path, itemsPerPartition=400)
    start = planner.initialOffset()
    end = planner.latestOffset(start)
    planned = rows_of(planner, start, end)
    planner.stop()  # the planner dies before Spark committed the batch
    restarted = reader(server, tmp_path, itemsPerPartition=400)
    try:
        assert rows_of(restarted, start, end) == planned == items
        assert WriteAheadLog(str(tmp_path / "wal")).sequences() == [1]
    finally:
        restarted.stop()
