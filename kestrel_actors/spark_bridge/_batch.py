"""One batch, start to finish, against one server: fetch → job → durable output → confirm.

:class:`BatchRunner` holds what a batch needs (connection, batch ledger, sink, job, Spark) and
:meth:`BatchRunner.run_batch` does exactly one attempt, raising on any failure. It does not
retry: the caller (the bridge actor) drops the connection — the server then puts the opened
items back at the head of the queue — and tries again later with the same batch id (see
``_ledger`` for why that id is stable and why confirmed output is never overwritten).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._client import KestrelClient, ServerAddress
from ._config import BridgeConfig, load_job
from ._ledger import BatchLedger
from ._output import Sink, make_sink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BatchMeta", "BatchResult", "BatchRunner"]


@dataclass(frozen=True)
class BatchMeta:
    """What a job learns about its batch (picklable, so a job may close over it).

    ``batch_id`` is the same on every retry of the batch, so a job that writes its own output
    can key it by ``batch_id`` and overwrite; ``attempt`` counts failed tries before this one.
    """

    queue: str
    batch_id: str
    server: str
    items: int
    partitions: int
    args: dict[str, str] = field(default_factory=dict)
    attempt: int = 0

    def __getitem__(self, key: str) -> Any:  # meta["queue"] works too
        return getattr(self, key)

    @property
    def spark(self) -> SparkSession:
        """The bridge's SparkSession, for jobs that build DataFrames. A property rather than
        a field so meta stays picklable (``getActiveSession`` may be empty on actor threads)."""
        from pyspark.sql import SparkSession

        return SparkSession.builder.getOrCreate()


@dataclass(frozen=True)
class BatchResult:
    """What one attempt did; ``items == 0`` means the queue stayed empty for the batch wait."""

    server: str
    queue: str
    batch_id: str | None
    items: int
    partitions: int
    rows: int | None
    fetch_seconds: float
    job_seconds: float
    write_seconds: float
    confirm_seconds: float
    output: str

    @property
    def total_seconds(self) -> float:
        return self.fetch_seconds + self.job_seconds + self.write_seconds + self.confirm_seconds


class BatchRunner:
    """Runs batches of ``config.queue`` from one server. Not thread-safe: one owner thread."""

    def __init__(self, config: BridgeConfig, server: ServerAddress,
                 spark: SparkSession | None = None, job: Callable[..., Any] | None = None,
                 sink: Sink | None = None) -> None:
        self.config = config
        self.server = server
        self.spark = spark
        self.job = job or load_job(config.job)
        self.sink = sink or make_sink(config)
        self.client = KestrelClient(server, config.connect_timeout, config.io_timeout)
        self.ledger = BatchLedger(config.resolved_state_dir, config.queue, server)
        self.attempt = 0

    def open(self) -> BatchRunner:
        self.ledger.open()
        return self

    def close(self) -> None:
        self.client.close()
        self.ledger.close()

    def abandon(self) -> None:
        """After a failure: drop the connection so the server returns the open items."""
        self.client.close()
        self.attempt += 1

    def run_batch(self) -> BatchResult:
        """One attempt. Never confirms before the sink has made the output durable."""
        config, server = self.config, str(self.server)
        started = time.perf_counter()
        items = self.client.fetch_batch(config.queue, config.batch_size, config.batch_wait)
        fetched = time.perf_counter()
        if not items:
            return BatchResult(server, config.queue, None, 0, 0, None, fetched - started,
                               0.0, 0.0, 0.0, self.sink.description)
        batch_id = self.ledger.current_id
        partitions = max(1, min(config.partitions, len(items)))
        meta = BatchMeta(config.queue, batch_id, server, len(items), partitions,
                         dict(config.job_args), self.attempt)
        sc = self.spark.sparkContext
        sc.setJobGroup(batch_id, f"kestrel bridge {config.queue}@{server} batch {batch_id}")
        try:
            rdd = sc.parallelize(items, numSlices=partitions)
            result = self.job(rdd, meta)
            ran = time.perf_counter()
            rows = self.sink.write(result, meta, self.spark, self.client)
        finally:
            for key in ("spark.jobGroup.id", "spark.job.description"):
                sc.setLocalProperty(key, None)
        written = time.perf_counter()
        # Output is durable. Advance the ledger first: a crash from here on can only cause a
        # duplicate (the items come back as the next batch), never an overwrite of this one.
        self.ledger.commit()
        self.client.confirm(config.queue, len(items))
        confirmed = time.perf_counter()
        self.attempt = 0
        return BatchResult(server, config.queue, batch_id, len(items), partitions, rows,
                           fetched - started, ran - fetched, written - ran, confirmed - written,
                           self.sink.description)
