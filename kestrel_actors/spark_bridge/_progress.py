"""Totals across all bridge actors, and the one-line progress display on a terminal.

The actors report every batch and failure here (from their own threads, hence the lock). On
an interactive terminal the last line of stderr is a progress line redrawn in place; it is
erased before each log event is written so the two never share a line. Off a terminal only
the structlog events are written.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from ._meta import BatchResult

__all__ = ["BridgeReport", "ProgressLine", "Tally"]


@dataclass
class BridgeReport:
    """What a bridge run did, returned by :func:`~kestrel_actors.spark_bridge.run_bridge`."""

    batches: int = 0
    items: int = 0
    failures: int = 0
    parked: list[str] = field(default_factory=list)
    results: list[BatchResult] = field(default_factory=list)
    seconds: float = 0.0
    never_had_items: list[str] = field(default_factory=list)
    """``until_empty`` found the queue had never held an item on any server (these): the run
    stopped before starting Spark, having nothing to do. Usually the queue was never loaded
    (a load that failed, a misspelt name)."""

    @property
    def ok(self) -> bool:
        """False if some batch was moved to the dead-letter queue (``parked`` has their ids)."""
        return not self.parked


class ProgressLine:
    """A line redrawn with ``\\r`` on a TTY; does nothing elsewhere."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._shown = False

    def clear(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._shown = False

    def show(self, text: str) -> None:
        if self.enabled:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
            self._shown = True


class Tally:
    """Thread-safe totals; ``emit`` callbacks (log calls) run with the progress line erased."""

    _KEEP_RESULTS = 10_000

    def __init__(self, progress: ProgressLine | None = None) -> None:
        self.progress = progress or ProgressLine(enabled=False)
        self.report = BridgeReport()
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def batch(self, result: BatchResult, emit: Callable[[], None]) -> None:
        with self._lock:
            self.report.batches += 1
            self.report.items += result.items
            if len(self.report.results) < self._KEEP_RESULTS:
                self.report.results.append(result)
            self._emit(emit)

    def empty(self, server: str) -> None:
        with self._lock:
            self._redraw()

    def failure(self, emit: Callable[[], None]) -> None:
        with self._lock:
            self.report.failures += 1
            self._emit(emit)

    def parked(self, batch_id: str, emit: Callable[[], None]) -> None:
        with self._lock:
            self.report.parked.append(batch_id)
            self._emit(emit)

    def finish(self) -> BridgeReport:
        with self._lock:
            self.progress.clear()
            self.report.seconds = time.monotonic() - self._started
            return self.report

    def _emit(self, emit: Callable[[], None]) -> None:
        self.progress.clear()
        emit()
        self._redraw()

    def _redraw(self) -> None:
        report = self.report
        elapsed = max(time.monotonic() - self._started, 1e-9)
        self.progress.show(
            f"bridge: {report.items:,} items in {report.batches:,} batches, "
            f"{report.items / elapsed:,.0f} items/s, {report.failures} failures, "
            f"{len(report.parked)} parked, "
            f"{elapsed:,.0f}s"
        )
