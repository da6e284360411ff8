"""One log line per change of state for journal file work that fails again and again.

A full disk (``ENOSPC``), an I/O error (``EIO``), a read-only file system (``EROFS``), a quota
(``EDQUOT``): each makes every attempt at a write, rotation, rewrite or pack of a queue fail
the same way until an operator (or a freed file) ends it, and the attempts come several a
second. Logging each one would bury the news in noise; so a :class:`FailureLog` per queue and
kind of work logs a warning when that work starts failing, with the reason and errno, and one
when it works again, with how long it failed. An ``OSError`` is what a disk is expected to
raise, so it is logged without a traceback; any other exception is a bug, logged with one.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from ..logs import error_fields

__all__ = ["FailureLog", "error_fields"]

log = structlog.get_logger("kestrel_actors.journal")


class FailureLog:
    """Whether one kind of journal work (``work``: "rotation", "pack", ...) of one queue is
    failing; :meth:`failed` and :meth:`succeeded` log only when that changes."""

    __slots__ = ("queue", "work", "error", "since")

    def __init__(self, queue: str, work: str) -> None:
        self.queue = queue
        self.work = work
        self.error: BaseException | None = None
        """The latest failure while failing; ``None`` while the work succeeds."""
        self.since = 0.0

    @property
    def failing(self) -> bool:
        return self.error is not None

    def failed(self, exc: BaseException, **fields: Any) -> None:
        """An attempt failed with ``exc``: logged if the work was not already failing."""
        if self.error is None:
            self.since = time.monotonic()
            event = f"journal {self.work} failing"
            if isinstance(exc, OSError):
                log.warning(event, queue=self.queue, **error_fields(exc), **fields)
            else:
                log.error(event, queue=self.queue, **error_fields(exc), exc_info=exc, **fields)
        self.error = exc

    def succeeded(self) -> None:
        """An attempt succeeded: logged if the work was failing."""
        if self.error is not None:
            self.error = None
            log.warning(f"journal {self.work} recovered", queue=self.queue,
                        failed_seconds=round(time.monotonic() - self.since, 3))
