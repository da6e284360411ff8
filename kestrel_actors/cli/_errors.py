"""How every ``kestrel-actors`` command reports an error: one line on stderr,
``kestrel-actors COMMAND: what went wrong``, in words (never an exception's repr), and an exit
code of the table in ``kestrel-actors --help``."""

from __future__ import annotations

import json
import re
import socket
import urllib.error
from typing import NoReturn

import click

__all__ = ["EXIT_DECLINED", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_PIPE", "CommandError", "describe", "fail"]

EXIT_FAILED = 3
EXIT_DECLINED = 5
"""``flush``/``delete`` answered no at their prompt: nothing was done, and nothing failed."""
EXIT_INTERRUPTED = 130
"""Ctrl-C, as a shell reports a command SIGINT ended."""
EXIT_PIPE = 141
"""The reader of stdout went away, as a shell reports a writer SIGPIPE ended (``| head``)."""


class CommandError(click.ClickException):
    """A command's failure that is not a usage error; it names the command that raised it
    (``command_path``) and exits with ``code``."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = exit_code
        ctx = click.get_current_context(silent=True)
        self.command_path = ctx.command_path if ctx is not None else None


def fail(message: str, exit_code: int = EXIT_FAILED) -> NoReturn:
    raise CommandError(message, exit_code)


_ERRNO = re.compile(r"\[Errno \d+\] (\w)")


def describe(exc: BaseException) -> str:
    """``exc`` in words: ``connection refused``, ``timed out``, ``HTTP 404 Not Found``."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return describe(exc.reason) if isinstance(exc.reason, BaseException) else str(exc.reason)
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})" if exc.strerror else "unknown host"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, json.JSONDecodeError):
        return f"the answer is not JSON ({exc.msg})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    # messages that quote an OSError, as the client's ``cannot connect to H:P: [Errno 111] …``
    return _ERRNO.sub(lambda match: match.group(1).lower(), str(exc)) or type(exc).__name__
