"""The log: one line per failure with the reason and errno; tracebacks only at debug."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import logging, sys, structlog
from kestrel_actors.logs import configure_logging
configure_logging(sys.argv[1], sys.argv[2])
log = structlog.get_logger("kestrel_actors.test")
try:
    open("/nonexistent-dir/journal")
except OSError:
    log.exception("replay failed", queue="jobs")
try:
    {}["missing"]
except KeyError as exc:
    log.error("handler failed", exc_info=exc)
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("pykka").exception("actor crashed")
"""


def run(log_format: str, level: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", SCRIPT, log_format, level],
                            capture_output=True, text=True, timeout=60, check=True)
    return result.stderr.splitlines()


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_a_failure_is_one_line_with_its_errno(log_format):
    lines = run(log_format, "info")
    assert len(lines) == 3, lines
    assert not any("Traceback" in line for line in lines)
    if log_format == "json":
        events = [json.loads(line) for line in lines]
        assert events[0]["errno"] == "ENOENT" and events[0]["error_type"] == "FileNotFoundError"
        assert events[1]["error_type"] == "KeyError" and "exception" not in events[1]
        assert events[2]["logger"] == "pykka" and events[2]["error"] == "division by zero"
    else:
        assert "errno=ENOENT" in lines[0] and "error_type=FileNotFoundError" in lines[0]


def test_debug_prints_the_traceback_without_local_variables():
    lines = run("console", "debug")
    assert sum("Traceback (most recent call last)" in line for line in lines) == 3
    assert len(lines) < 40  # plain tracebacks: no frame's local variables
