"""The bridge actor: one pykka ThreadingActor per server, looping batch after batch.

Why a ThreadingActor: py4j calls into the JVM block, and Spark jobs run for seconds; they
need a real OS thread, never a gevent hub (the bridge process does not import gevent). Each
actor owns its :class:`~._batch.BatchRunner` (connection, ledger) so no state is shared between
servers except the thread-safe SparkContext and the :class:`Tally`.

The loop is message-driven: each ``_NEXT`` message runs one batch attempt, then the actor
tells itself ``_NEXT`` again, so a ``stop()`` queued meanwhile is handled between batches.
On a failure the connection is dropped (the server puts the open items back) and the next
attempt waits an exponential backoff with jitter, cut short by the shared stop event. A batch
whose *job* failed ``max_failures`` times in a row is parked instead: its items are stored in
the dead-letter queue and confirmed, and the loop goes on with the next batch. Failures that
are not the job's (a server that cannot be reached, a job timeout, which more often means a
cluster without free executors than a poison item) are retried for ever.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pykka
import structlog

from ..client import KestrelError
from ._batch import BatchRunner, JobFailed
from ._config import BridgeConfig
from ._meta import BatchResult
from ._progress import Tally

__all__ = ["BridgeActor", "backoff_delay"]

_NEXT = "next-batch"

log = structlog.get_logger("kestrel_actors.spark_bridge")


def backoff_delay(failures: int, initial: float, maximum: float) -> float:
    """Seconds before retry number ``failures`` (1-based): doubling, capped, 50–100 % jitter."""
    base = min(maximum, initial * (2 ** max(0, failures - 1)))
    return base * (0.5 + random.random() / 2)


class BridgeActor(pykka.ThreadingActor):
    """Runs :meth:`BatchRunner.run_batch` until told to stop or a stop condition is met."""

    def __init__(self, runner: BatchRunner, config: BridgeConfig, stop_event: threading.Event,
                 tally: Tally) -> None:
        super().__init__()
        self.runner = runner
        self.config = config
        self.stop_event = stop_event
        self.tally = tally
        self.batches = 0
        self.failures = 0
        self.server = str(runner.server)
        self.halting = False

    def on_start(self) -> None:
        self.actor_ref.tell(_NEXT)

    def on_stop(self) -> None:
        self.runner.close()

    def halt(self) -> None:
        """Stop after this message (no further batch is started)."""
        self.halting = True
        self.stop()

    def on_receive(self, message: Any) -> Any:
        if message == _NEXT:
            self._cycle()
        return None

    def _cycle(self) -> None:
        if self.halting:
            return
        if self.stop_event.is_set():
            self.halt()
            return
        try:
            result = self.runner.run_batch()
        except Exception as exc:  # noqa: BLE001 - every failure means: drop, back off, retry
            self._failed(exc)
        else:
            self._succeeded(result)
        if not self.halting:
            self.actor_ref.tell(_NEXT)

    def _succeeded(self, result: BatchResult) -> None:
        self.failures = 0
        config = self.config
        if not result.items:
            log.debug("batch_empty", queue=config.queue, server=self.server,
                      waited_seconds=round(result.fetch_seconds, 3))
            self.tally.empty(self.server)
            if config.until_empty:
                self.halt()
            return
        self.batches += 1
        self.tally.batch(result, lambda: log.info(
            "batch",
            queue=result.queue,
            server=result.server,
            batch_id=result.batch_id,
            items=result.items,
            partitions=result.partitions,
            rows=result.rows,
            output=result.output,
            fetch_seconds=round(result.fetch_seconds, 3),
            job_seconds=round(result.job_seconds, 3),
            commit_seconds=round(result.commit_seconds, 3),
            confirm_seconds=round(result.confirm_seconds, 3),
            items_per_second=round(result.items / max(result.total_seconds, 1e-9)),
        ))
        if config.max_batches and self.batches >= config.max_batches:
            self.halt()

    def _failed(self, exc: Exception) -> None:
        runner, config = self.runner, self.config
        job_failed = isinstance(exc, JobFailed)
        self.failures += 1
        if job_failed and config.max_failures and runner.attempt + 1 >= config.max_failures and self._park(exc):
            return
        runner.abandon(job_failed)
        delay = backoff_delay(self.failures, config.retry_initial, config.retry_max)
        self.tally.failure(lambda: log.error(
            "batch_failed",
            queue=config.queue,
            server=self.server,
            batch_id=runner.ledger.current_id,
            error=_describe(exc),
            attempt=runner.attempt,
            consecutive_failures=self.failures,
            retry_in_seconds=round(delay, 2),
        ))
        if self.stop_event.wait(delay):
            self.halt()

    def _park(self, exc: Exception) -> bool:
        """Move the failing batch to the dead-letter queue; False if that failed too."""
        runner, config = self.runner, self.config
        dead_letter_queue = config.dead_letter_queue
        assert dead_letter_queue is not None  # BridgeConfig fills in <queue>_failed
        try:
            batch_id, items = runner.park(dead_letter_queue)
        except KestrelError as park_error:
            log.error("park_failed", queue=config.queue, server=self.server,
                      dead_letter_queue=config.dead_letter_queue, error=_describe(park_error))
            return False
        self.failures = 0
        self.tally.parked(batch_id, lambda: log.error(
            "batch_parked",
            queue=config.queue,
            server=self.server,
            batch_id=batch_id,
            items=items,
            dead_letter_queue=config.dead_letter_queue,
            attempts=config.max_failures,
            error=_describe(exc),
        ))
        return True


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]
