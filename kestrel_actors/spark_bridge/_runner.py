"""Start a bridge: lock the batch ledgers, start Spark, one actor per server, wait, clean up.

:func:`run_bridge` is what ``kestrel-actors bridge run`` calls, and what tests call in-process
with a shared SparkSession (``spark=``; it is then neither created nor stopped here).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

import structlog

from ..client import KestrelError
from ._actor import BridgeActor
from ._batch import BatchRunner
from ._config import BridgeConfig, load_job
from ._output import make_sink
from ._progress import BridgeReport, ProgressLine, Tally
from ._spark import create_spark_session, ship_job_code

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["run_bridge"]

log = structlog.get_logger("kestrel_actors.spark_bridge")

_MONITOR_CAP = 10_000  # the server's default --monitor-max-items


def run_bridge(config: BridgeConfig, *, spark: SparkSession | None = None,
               stop_event: threading.Event | None = None,
               progress: ProgressLine | None = None,
               handle_signals: bool = False) -> BridgeReport:
    """Run until every server's loop has stopped (``max_batches``, ``until_empty``,
    or ``stop_event`` is set; the batch in flight then finishes first.

    ``handle_signals`` (main thread only): SIGINT/SIGTERM set ``stop_event``, a second one
    exits at once. They are installed after Spark starts because SparkContext replaces the
    SIGINT handler with one that cancels jobs and raises KeyboardInterrupt.

    Raises before starting Spark if the job cannot be imported or another bridge holds a
    batch ledger (see ``_ledger``).
    """
    refuse_gevent()
    stop_event = stop_event or threading.Event()
    job = load_job(config.job, config.py_files)
    runners: list[BatchRunner] = []
    try:
        for server in config.servers:
            runners.append(BatchRunner(config, server, job=job, sink=make_sink(config)).open())
    except BaseException:
        for runner in runners:
            runner.close()
        raise
    if config.until_empty:
        never = _never_had_items(runners)
        if never:
            for runner in runners:
                runner.close()
            return BridgeReport(never_had_items=never)
    own_session = spark is None
    refs = []
    try:
        if spark is None:  # own_session
            started = time.perf_counter()
            spark = create_spark_session(config.master, config.spark_conf, config.app_name,
                                         config.partitions)
            log.info("spark_started", master=config.master,
                     seconds=round(time.perf_counter() - started, 2))
        shipped = ship_job_code(spark, config.job, config.py_files)
        if config.batch_size > _MONITOR_CAP:
            log.warning("batch_size_above_monitor_cap", queue=config.queue,
                        batch_size=config.batch_size, monitor_max_items=_MONITOR_CAP,
                        detail="a server opens at most --monitor-max-items (default 10,000) "
                               "items per connection; batches will be that size at most")
        log.info("bridge_started", queue=config.queue, servers=[str(s) for s in config.servers],
                 job=_job_name(config.job), output=runners[0].sink.description,
                 batch_size=config.batch_size, batch_wait=config.batch_wait,
                 partitions=config.partitions, state_dir=str(config.resolved_state_dir),
                 shipped=shipped, dead_letter_queue=config.dead_letter_queue,
                 max_failures=config.max_failures, job_timeout=config.job_timeout)
        tally = Tally(progress)  # rates count from here, not from the Spark start
        with _graceful_signals(stop_event, handle_signals):
            for runner in runners:
                runner.spark = spark
                refs.append(BridgeActor.start(runner, config, stop_event, tally))
            while not all(ref.actor_stopped.is_set() for ref in refs):
                time.sleep(0.05)
    finally:
        stop_event.set()
        for ref in refs:
            ref.stop(block=True)  # False for a stopped actor; otherwise waits for its batch
        for runner in runners:
            runner.close()  # idempotent; covers actors that never started
        if own_session and spark is not None:
            spark.stop()
    report = tally.finish()
    log.info("bridge_stopped", queue=config.queue, batches=report.batches, items=report.items,
             failures=report.failures, parked=report.parked, seconds=round(report.seconds, 2))
    return report


def _never_had_items(runners: list[BatchRunner]) -> list[str]:
    """The servers, if every one answers that the queue has never held an item; else []
    (a server that cannot be asked leaves the answer to the batches: they retry it)."""
    try:
        if all(runner.never_had_items() for runner in runners):
            return [str(runner.server) for runner in runners]
    except KestrelError:
        pass
    return []


@contextmanager
def _graceful_signals(stop_event: threading.Event, enabled: bool):
    """First SIGINT/SIGTERM: finish the batch in flight, then stop. Second: exit now (the
    server returns the unconfirmed items when the connection drops)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum, _frame):
        if stop_event.is_set():
            os._exit(128 + signum)
        log.warning("stopping", signal=signal.Signals(signum).name,
                    detail="finishing the batch in flight; signal again to exit at once")
        stop_event.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def refuse_gevent() -> None:
    """py4j must run on real threads; a gevent-patched process would hang or corrupt it."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_anything_patched():
        raise RuntimeError("the Spark bridge cannot run in a gevent-monkey-patched process")


def _job_name(job: object) -> str:
    if isinstance(job, str):
        return job
    return f"{getattr(job, '__module__', '?')}:{getattr(job, '__qualname__', repr(job))}"
