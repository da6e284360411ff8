"""Bridge jobs for tests that run the bridge as a subprocess (so they must be importable).

``slow_identity`` is ``jobs.identity`` with two hooks driven by ``--job-arg``:
``markers=DIR`` — touch ``DIR/<batch_id>.<attempt>`` when a batch's job starts (the test
waits for it before killing the bridge mid-job); ``sleep=S`` — each partition sleeps S
seconds inside the Spark tasks, so the job is really running when the kill lands.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

__all__ = ["slow_identity"]


def slow_identity(rdd, meta):
    markers = meta.args.get("markers")
    if markers:
        Path(markers, f"{meta.batch_id}.{meta.attempt}").touch()
    delay = float(meta.args.get("sleep", "0"))
    return rdd.mapPartitions(partial(_slow, delay)).map(_text)


def _slow(delay, items):
    if delay:
        time.sleep(delay)
    yield from items


def _text(data: bytes) -> str:
    return data.decode("utf-8")
