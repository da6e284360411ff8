"""One batch, start to finish, against one server: fetch → job → durable output → check →
commit → confirm.

:class:`BatchRunner` holds what a batch needs (connection, batch ledger, sink, job, Spark) and
:meth:`BatchRunner.run_batch` does exactly one attempt, raising on any failure. It does not
retry: the caller (the bridge actor) either parks the batch in the dead-letter queue
(:meth:`BatchRunner.park`) or drops the connection (:meth:`BatchRunner.abandon`) — the server
then puts the opened items back at the head of the queue — and tries again later with the
same batch id (see ``_ledger`` for why that id is stable and why confirmed output is never
overwritten).

While Spark works, a keep-alive thread pings the connection, so a server's ``--client-timeout``
shorter than the job cannot close it and take the items back; and the connection is checked
once more *before* the ledger commit, so a batch whose items the server took back anyway (a
restart, a network cut) is retried under the same id instead of committed and then
duplicated. The only duplicate window left is between that check and the confirm.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..client import KestrelError, ServerAddress
from ._config import BridgeConfig, load_job
from ._kestrel import Connection, keep_alive
from ._ledger import BatchLedger
from ._meta import BatchMeta, BatchResult
from ._output import Sink, make_sink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BatchRunner", "JobFailed", "JobTimedOut"]


class JobFailed(Exception):
    """The job or the writing of its result raised, with the batch's items still held."""


class JobTimedOut(Exception):
    """``job_timeout`` passed: the batch's Spark jobs were cancelled."""


class BatchRunner:
    """Runs batches of ``config.queue`` from one server. Not thread-safe: one owner thread."""

    def __init__(self, config: BridgeConfig, server: ServerAddress,
                 spark: SparkSession | None = None, job: Callable[..., Any] | None = None,
                 sink: Sink | None = None) -> None:
        self.config = config
        self.server = server
        self.spark = spark
        self.job = job or load_job(config.job, config.py_files)
        self.sink = sink or make_sink(config)
        self.connection = Connection(server, config.connect_timeout, config.io_timeout)
        self.ledger = BatchLedger(config.resolved_state_dir, config.queue, server)
        self.attempt = 0  # failed job attempts of the current batch id
        self.held: list[bytes] = []  # items of the attempt in progress or just failed

    def open(self) -> BatchRunner:
        self.ledger.open()
        return self

    def close(self) -> None:
        self.connection.close()
        self.ledger.close()

    def abandon(self, job_failed: bool) -> None:
        """After a failure: drop the connection so the server returns the open items; a failed
        job (not a refused connection or a timeout) counts as an attempt of this batch."""
        self.connection.close()
        self.held = []
        if job_failed:
            self.attempt += 1

    def park(self, dead_letter_queue: str) -> tuple[str, int]:
        """Move the held items to ``dead_letter_queue`` on the same server and confirm them
        here, so a batch that always fails stops blocking the queue. Returns (batch id, items).

        Order matters: the copies are stored before the originals are confirmed, so a crash in
        between leaves duplicates, never a loss. The batch id is not used up (the next batch
        takes it and overwrites a partial attempt); the failed attempt's output is removed.
        """
        items, batch_id = self.held, self.ledger.current_id
        self.connection.check()
        self.connection.put_many(dead_letter_queue, items)
        self.connection.confirm(self.config.queue, len(items))
        self.held = []
        self.attempt = 0
        self.sink.discard(batch_id)
        return batch_id, len(items)

    def never_had_items(self) -> bool:
        """Whether the server has never stored an item in the queue: none waiting or open,
        and none ever added (``total_items``, which a restart rebuilds from the journal).
        Raises :class:`KestrelError` if the server cannot be asked."""
        queue = self.config.queue
        stats = self.connection.stats()
        return not any(int(stats.get(f"queue_{queue}_{name}", 0))
                       for name in ("items", "open_transactions", "total_items"))

    @property
    def _session(self) -> SparkSession:
        assert self.spark is not None, "run_bridge gives each runner the session before it runs"
        return self.spark

    def run_batch(self) -> BatchResult:
        """One attempt. Never confirms before the sink has made the output durable, and never
        commits while the connection that holds the items is gone."""
        config, server = self.config, str(self.server)
        started = time.perf_counter()
        items = self.connection.open_items(config.queue, config.batch_size, config.batch_wait)
        fetched = time.perf_counter()
        if not items:
            return BatchResult(server, config.queue, None, 0, 0, None, fetched - started,
                               0.0, 0.0, 0.0, self.sink.description)
        self.held = items
        batch_id = self.ledger.current_id
        partitions = max(1, min(config.partitions, len(items)))
        meta = BatchMeta(config.queue, batch_id, server, len(items), partitions,
                         dict(config.job_args), self.attempt)
        with self._job_group(batch_id) as timed_out:
            try:
                with keep_alive(self.connection, config.keep_alive):
                    rdd = self._session.sparkContext.parallelize(items, numSlices=partitions)
                    result = self.job(rdd, meta)
                    rows = self.sink.write(result, meta, self._session, self.connection)
            except KestrelError:
                raise  # the connection failed (a queue sink): not the job's fault
            except Exception as exc:
                if timed_out.is_set():
                    raise JobTimedOut(f"batch {batch_id} ran longer than "
                                      f"{config.job_timeout:g}s; its Spark jobs were cancelled"
                                      ) from exc
                raise JobFailed(f"{type(exc).__name__}: {exc}") from exc
        ran = time.perf_counter()
        # Output is durable. If the server took the items back meanwhile, committing would
        # turn the retry into a second batch (a duplicate): check, then advance the ledger.
        self.connection.check()
        self.ledger.commit()
        committed = time.perf_counter()
        self.connection.confirm(config.queue, len(items))
        confirmed = time.perf_counter()
        self.held = []
        self.attempt = 0
        return BatchResult(server, config.queue, batch_id, len(items), partitions, rows,
                           fetched - started, ran - fetched, committed - ran,
                           confirmed - committed, self.sink.description)

    @contextmanager
    def _job_group(self, batch_id: str) -> Iterator[threading.Event]:
        """Run the batch's Spark jobs in a job group named after the batch, cancelled when
        ``job_timeout`` passes (a job waiting for executors that never come, a stuck task);
        the caller then drops the connection, which returns the batch to the queue."""
        sc = self._session.sparkContext
        timed_out = threading.Event()
        sc.setJobGroup(batch_id, f"kestrel bridge {self.config.queue}@{self.server} "
                                 f"batch {batch_id}", interruptOnCancel=True)
        timer = None
        if self.config.job_timeout:
            def cancel() -> None:
                timed_out.set()
                sc.cancelJobGroup(batch_id)

            timer = threading.Timer(self.config.job_timeout, cancel)
            timer.daemon = True
            timer.start()
        try:
            yield timed_out
        finally:
            if timer is not None:
                timer.cancel()
            for key in ("spark.jobGroup.id", "spark.job.description",
                        "spark.job.interruptOnCancel"):
                # None removes the property (pyspark's documented use; its annotation says str)
                sc.setLocalProperty(key, None)  # type: ignore[arg-type]
