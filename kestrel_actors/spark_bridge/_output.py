"""Where a batch's results go, and what "durable" means for each destination.

The bridge confirms a batch only after :meth:`Sink.write` has returned, so ``write`` must not
return before its output would survive a crash:

* :class:`PathSink` — Spark writes ``<dir>/batch=<id>/`` with ``mode("overwrite")`` (a retried
  batch replaces its earlier attempt). Spark's committer marks a finished directory with
  ``_SUCCESS`` but never fsyncs, so for a local path every file and directory is fsynced
  before returning. A directory without ``_SUCCESS`` is an interrupted attempt and will be
  overwritten by its retry.
* :class:`QueueSink` — each result becomes one item SET on the output queue of the same
  server; ``STORED`` is durable as far as the server's journal promises. SETs are not
  idempotent, so a retried batch may store its results twice (at-least-once).
* A batch parked in the dead-letter queue has its partial output removed (:meth:`Sink.discard`)
  for a local path, so giving up leaves no empty or half-written ``batch=<id>/`` behind.
* :class:`NullSink` — no destination: the job itself must make its effects durable before it
  returns; lazy results (RDD, DataFrame) are counted so that their work actually runs.

Result shapes accepted from a job: a DataFrame, an RDD, a list/tuple of rows, a scalar, or
``None`` (nothing to write). Rows may be dicts, ``Row``s, tuples, or scalars (column
``value``); for a queue, bytes go as they are, str as UTF-8 and anything else as JSON. An
empty RDD or list leaves an empty ``batch=<id>/`` holding only ``_SUCCESS``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..journal import fsync_dir
from ._config import BridgeConfig, is_local_path, local_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ._kestrel import Connection
    from ._meta import BatchMeta

__all__ = ["NullSink", "PathSink", "QueueSink", "Sink", "make_sink"]


class Sink:
    """Writes one batch's results; returns the number of rows written when it is known."""

    description = "none"

    def write(self, result: Any, meta: BatchMeta, spark: SparkSession,
              client: Connection) -> int | None:
        raise NotImplementedError

    def discard(self, batch_id: str) -> None:
        """A batch was parked in the dead-letter queue: remove what its attempts wrote
        where that is possible (nothing for a queue: SETs cannot be taken back)."""


class NullSink(Sink):
    def write(self, result, meta, spark, client):
        if _is_dataframe(result) or _is_rdd(result):
            return result.count()
        if isinstance(result, list | tuple):
            return len(result)
        return None


class QueueSink(Sink):
    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.description = f"queue:{queue}"

    def write(self, result, meta, spark, client):
        if result is None:
            return 0
        if _is_dataframe(result):
            records = [line.encode() for line in result.toJSON().collect()]
        elif _is_rdd(result):
            records = result.map(encode_record).collect()
        elif isinstance(result, list | tuple):
            records = [encode_record(row) for row in result]
        else:
            records = [encode_record(result)]
        return client.put_many(self.queue, records)


class PathSink(Sink):
    def __init__(self, path: str, fmt: str) -> None:
        self.path = path.rstrip("/") or "/"
        self.format = fmt
        self.local = is_local_path(path)
        self.description = f"{fmt}:{self.path}"

    def batch_path(self, batch_id: str) -> str:
        return f"{self.path}/batch={batch_id}"

    def discard(self, batch_id: str) -> None:
        if self.local:
            target = local_path(self.batch_path(batch_id))
            if target.exists():
                shutil.rmtree(target)
                fsync_dir(target.parent)

    def write(self, result, meta, spark, client):
        if result is None:
            return None
        frame = to_dataframe(spark, result)
        target = self.batch_path(meta.batch_id)
        if frame is None and self.local:
            _empty_batch_dir(local_path(target))  # no part file with a made-up schema
        else:
            if frame is None:
                frame = spark.createDataFrame([], "value string")
            frame.write.mode("overwrite").format(self.format).save(target)
        if self.local:
            fsync_tree(local_path(target))
            fsync_dir(local_path(self.path))
        return None


def _empty_batch_dir(target: Path) -> None:
    """What ``mode("overwrite")`` of nothing should leave: the directory with only
    ``_SUCCESS``, so readers of the whole output never see a schema that no job produced."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    (target / "_SUCCESS").touch()


def make_sink(config: BridgeConfig) -> Sink:
    if config.output_queue:
        return QueueSink(config.output_queue)
    if config.output_path:
        return PathSink(config.output_path, config.output_format)
    return NullSink()


def encode_record(row: Any) -> bytes:
    """One result row as the bytes of one queue item."""
    if isinstance(row, bytes | bytearray | memoryview):
        return bytes(row)
    if isinstance(row, str):
        return row.encode("utf-8")
    as_dict = getattr(row, "asDict", None)
    if as_dict is not None and isinstance(row, tuple):  # pyspark Row
        row = as_dict(recursive=True)
    return json.dumps(row, separators=(",", ":"), default=str).encode("utf-8")


def to_row(value: Any) -> Any:
    """A result element as something ``createDataFrame`` accepts with named columns."""
    from pyspark.sql import Row

    if isinstance(value, Row):
        return value
    if isinstance(value, dict):
        return Row(**value)
    if isinstance(value, tuple | list):
        return tuple(value)
    if isinstance(value, memoryview | bytearray):
        value = bytes(value)
    return Row(value=value)


def to_dataframe(spark: SparkSession, result: Any) -> DataFrame | None:
    """Turn a job's result into a DataFrame; ``None`` for an empty RDD or list (no rows to
    infer a schema from). A DataFrame is returned as it is, even when empty."""
    if _is_dataframe(result):
        return result
    if _is_rdd(result):
        rows = result.map(to_row)
        try:
            return spark.createDataFrame(rows)
        except ValueError:  # includes PySparkValueError: cannot infer a schema
            if rows.isEmpty():
                return None
            raise
    values = list(result) if isinstance(result, list | tuple) else [result]
    if not values:
        return None
    return spark.createDataFrame([to_row(value) for value in values])


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (Spark's local writer never does)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def _is_dataframe(value: Any) -> bool:
    try:
        from pyspark.sql import DataFrame
    except ImportError:  # pragma: no cover
        return False
    return isinstance(value, DataFrame)


def _is_rdd(value: Any) -> bool:
    try:
        from pyspark import RDD
    except ImportError:  # pragma: no cover
        return False
    return isinstance(value, RDD)
