"""The records a batch produces: what a job learns (:class:`BatchMeta`) and what an attempt
did (:class:`BatchResult`).

They live apart from ``_batch`` (which runs a batch) so that ``_output`` can name them without
importing the runner that imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BatchMeta", "BatchResult"]


@dataclass(frozen=True)
class BatchMeta:
    """What a job learns about its batch (picklable, so a job may close over it).

    ``batch_id`` is the same on every retry of the batch, so a job that writes its own output
    can key it by ``batch_id`` and overwrite. ``attempt`` counts the earlier attempts of this
    batch whose job (or output) failed; it starts at 0 for every new batch and does not count
    attempts that never got items (a server that refused the connection).
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
    """What one attempt did; ``items == 0`` means the queue stayed empty for the batch wait.

    ``job_seconds`` is the Spark work: the job call *and* writing its result, because a job
    that returns an RDD or DataFrame only builds a plan, which runs while the sink writes.
    ``commit_seconds`` is the liveness check of the connection plus the ledger's fsync.
    """

    server: str
    queue: str
    batch_id: str | None
    items: int
    partitions: int
    rows: int | None
    fetch_seconds: float
    job_seconds: float
    commit_seconds: float
    confirm_seconds: float
    output: str

    @property
    def total_seconds(self) -> float:
        return self.fetch_seconds + self.job_seconds + self.commit_seconds + self.confirm_seconds
