"""The bridge's loggers, structlog imported at their first message.

Spark starts a Python process for every streaming query's planner and its reader (and one
per executor worker); each one imports the ``kestrel`` source. structlog's import (with the
asyncio and rich it brings) is ~0.2 s of that, and on a healthy query the source logs nothing:
so the logger is made when something is logged.
"""

from __future__ import annotations

from typing import Any

__all__ = ["lazy_logger"]


class _LazyLogger:
    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, method: str) -> Any:
        if self._logger is None:
            import structlog

            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, method)


def lazy_logger(name: str) -> Any:
    """``structlog.get_logger(name)``, imported and made at the first call of one of its
    methods (``log.warning(...)``)."""
    return _LazyLogger(name)
