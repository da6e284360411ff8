"""``python-ceiling``: the fastest a Python streaming data source can feed a query on this
machine, for :mod:`kestrel_actors.loadtests.spark_source_bench` (issue 22 point 6).

It reads nothing: each micro-batch is ``rowsPerBatch`` rows in partitions of
``rowsPerPartition``, and each partition's ``read`` yields one Arrow record batch with the
``kestrel`` source's columns (``value`` of ``itemBytes`` bytes, ``queue``, ``server``,
``timestamp``), its value buffer made once per worker process. What is left is Spark's Python
data source machinery alone: the planner's round trips, a Python worker per task, the Arrow
batch back to the JVM and into rows. The ``kestrel`` source cannot be faster than this.
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
        return _CeilingReader(int(self.options.get("rowsPerBatch", 50_000)),
                              int(self.options.get("rowsPerPartition", 12_500)),
                              int(self.options.get("itemBytes", 1024)))


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
    def __init__(self, rows_per_batch: int, rows_per_partition: int, item_bytes: int) -> None:
        self.rows_per_batch = rows_per_batch
        self.rows_per_partition = rows_per_partition
        self.item_bytes = item_bytes

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        return {"seq": int(start.get("seq", 0)) + 1}

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
