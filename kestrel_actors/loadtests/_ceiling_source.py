"""``python-ceiling``: the fastest a Python streaming data source can feed a query on this
machine, for :mod:`kestrel_actors.loadtests.spark_source_bench` (issue 22 point 6).

It reads nothing: each micro-batch is ``rowsPerBatch`` rows in partitions of
``rowsPerPartition``, and each partition's ``read`` yields one Arrow record batch with the
``kestrel`` source's columns (``value`` of ``itemBytes`` bytes, ``queue``, ``server``,
``timestamp``), its value buffer made once per worker process. What is left is Spark's Python
data source machinery alone: the planner's round trips, a Python worker per task, the Arrow
batch back to the JVM and into rows. The ``kestrel`` source cannot be faster than this.

With ``rows`` it plans no micro-batch past that many rows, as the ``kestrel`` source plans
none once its queue is drained: a query stopped then has no task running, and Spark kills
the Python worker of a task it interrupts, so the next query would pay for new workers (a
worker's start, pyspark and pyarrow imported: ~0.4 s of CPU each).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

__all__ = ["CeilingSource"]


class CeilingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "python-ceiling"

    def schema(self) -> str:
        return "value binary, queue string, server string, timestamp timestamp"

    def streamReader(self, schema) -> DataSourceStreamReader:
        rows = self.options.get("rows")
        return _CeilingReader(int(self.options.get("rowsPerBatch", 50_000)),
                              int(self.options.get("rowsPerPartition", 12_500)),
                              int(self.options.get("itemBytes", 1024)),
                              None if rows is None else int(rows))


@dataclass
class _Rows(InputPartition):
    count: int
    item_bytes: int


@cache
def _values(count: int, item_bytes: int) -> Any:
    return _column("binary", b"x" * item_bytes, count)


@cache
def _column(kind: str, value: bytes, count: int) -> Any:
    """``count`` times ``value``, made from its buffers: pa.array and pa.scalar import pandas
    (~0.5 s of CPU in each Python worker), which the ``kestrel`` source does not do either."""
    import pyarrow as pa

    offsets = array("i", range(0, (count + 1) * len(value), len(value)))
    return pa.Array.from_buffers(pa.binary() if kind == "binary" else pa.string(), count,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(value * count)])


class _CeilingReader(DataSourceStreamReader):
    def __init__(self, rows_per_batch: int, rows_per_partition: int, item_bytes: int,
                 rows: int | None = None) -> None:
        self.rows_per_batch = rows_per_batch
        self.rows_per_partition = rows_per_partition
        self.item_bytes = item_bytes
        self.rows = rows  # None: a micro-batch every trigger, forever

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        seq = int(start.get("seq", 0))
        if self.rows is not None and seq * self.rows_per_batch >= self.rows:
            return start
        return {"seq": seq + 1}

    def partitions(self, start: dict, end: dict) -> list[_Rows]:
        batches = int(end["seq"]) - int(start.get("seq", 0))
        rows = batches * self.rows_per_batch
        step = self.rows_per_partition
        return [_Rows(min(step, rows - first), self.item_bytes) for first in range(0, rows, step)]

    def read(self, partition: _Rows) -> Iterator[Any]:  # type: ignore[override]
        import pyarrow as pa

        n = partition.count
        stamps = array("q", [int(time.time() * 1_000_000)]) * n
        yield pa.RecordBatch.from_arrays(
            [_values(n, partition.item_bytes), _column("string", b"q", n), _column("string", b"s", n),
             pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(stamps)])],
            names=["value", "queue", "server", "timestamp"])

    def commit(self, end: dict) -> None:
        pass
