"""structlog set-up: one event per line, console or JSON, to stderr (``serve``: to stdout).

``serve`` logs to stdout, where a service manager collects it (systemd's journal keeps a line
as an entry): one line per event, and colour only when the stream is a terminal. The client
commands log to stderr, since their stdout holds what they print (items, tables).

Records from the standard library's ``logging`` (pykka reports actor crashes there) go
through the same processors and renderer, so a JSON log stays one object per line.

A failure is one line: the exception an event carries becomes its fields (``error``,
``error_type`` and, for an ``OSError``, ``errno`` by name: :func:`error_fields`, the one rule
for saying why). Its traceback is printed only at ``--log-level debug`` (plain, without local
variables), since an operator reads the reason and a developer asks for the rest.

A log write that fails (the reader of a pipe gone: ``EPIPE``, since Python ignores SIGPIPE; a
full disk) never raises into the code that logged: the stream is given up, one line on stderr
says so if stderr still takes it, and the process carries on without that log
(:class:`_LogStream`). A log call sits in signal handlers, the shutdown and the actors' error
paths, where an exception would leave the server unable to stop or to serve.
"""

from __future__ import annotations

import errno
import logging
import sys
import threading
from typing import Any, TextIO, cast

import structlog
from structlog.typing import EventDict, Processor

__all__ = ["configure_logging", "error_fields"]


def error_fields(exc: BaseException) -> dict[str, Any]:
    """The log fields that say why: the error's text and, for an ``OSError``, its errno name."""
    fields: dict[str, Any] = {"error": str(exc) or type(exc).__name__}
    code = getattr(exc, "errno", None)
    if isinstance(exc, OSError) and code is not None:
        fields["errno"] = errno.errorcode.get(code, code)
    return fields


class _LogStream:
    """The stream the log is written to, which gives up at its first failed write or flush
    instead of raising it: structlog's ``PrintLogger`` and the stdlib handler both write
    through it, so neither ever raises ``OSError`` into the code that logged."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._given_up = False
        self._lock = threading.Lock()  # log calls come from the loop and the journals' threads

    def write(self, text: str) -> int:
        if not self._given_up:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._give_up(exc)
        return len(text)

    def flush(self) -> None:
        if not self._given_up:
            try:
                self._stream.flush()
            except OSError as exc:
                self._give_up(exc)

    def isatty(self) -> bool:
        return self._stream.isatty()

    def _give_up(self, exc: OSError) -> None:
        with self._lock:
            if self._given_up:
                return
            self._given_up = True
        if self._stream is sys.stderr:
            return
        reason = " ".join(f"{name}={value}" for name, value in error_fields(exc).items())
        try:  # one attempt: stderr may be the same broken pipe
            sys.stderr.write(f"the log stream failed ({reason}); no more log lines are written to it\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _failure_in_one_line(_logger: Any, _method: str, event: EventDict) -> EventDict:
    """Replace an event's ``exc_info`` by the fields that say why (no traceback)."""
    exc_info = event.pop("exc_info", None)
    if exc_info is True:
        exc_info = sys.exc_info()
    exc = exc_info if isinstance(exc_info, BaseException) else (
        exc_info[1] if isinstance(exc_info, tuple) else None)
    if exc is not None:
        for name, value in error_fields(exc).items():
            event.setdefault(name, value)
        event.setdefault("error_type", type(exc).__name__)
    return event


def _on_one_line(_logger: Any, _method: str, rendered: Any) -> Any:
    """A rendered event on one line (a value's newline written ``\\n``): a journal keeps a line as
    an entry, so a multi-line event (a traceback at debug) would be torn into several."""
    return rendered.replace("\n", "\\n") if isinstance(rendered, str) else rendered


def configure_logging(log_format: str = "console", level: str = "info", stream: TextIO | None = None) -> None:
    """Route structlog and the stdlib loggers to ``stream`` (stderr by default), one event
    per line, in colour only if ``stream`` is a terminal."""
    # what structlog and logging call of a stream (write, flush, isatty) is all it has
    stream = cast(TextIO, _LogStream(sys.stderr if stream is None else stream))
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    tracebacks = numeric <= logging.DEBUG
    renderer: Processor
    shared_tail: list[Processor]
    if log_format == "json":
        renderer = structlog.processors.JSONRenderer()
        shared_tail = [structlog.processors.format_exc_info] if tracebacks else [_failure_in_one_line]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty(),
                                                 exception_formatter=structlog.dev.plain_traceback)
        shared_tail = [] if tracebacks else [_failure_in_one_line]
    # a terminal's reader sees a traceback laid out; anything else gets one line per event
    finish: list[Processor] = [] if stream.isatty() else [_on_one_line]
    structlog.configure(
        processors=[*shared, *shared_tail, renderer, *finish],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *shared_tail, renderer, *finish],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.INFO))
