"""The ``kestrel`` source's confirm record, and the test-only kill points of its protocol.

Test-only: ``KESTREL_SPARK_KILL_AT=<point>@<seq>`` makes the planner process SIGKILL itself
at that step of micro-batch ``seq`` (after logging ``kill_point``), so a test kills the
driver side at an exact step instead of racing a timer. The points, in protocol order
(docs/adr/0013-spark-exactly-once.md):

* ``after-wal``: the batch is durable in the write-ahead log, no confirm is sent;
* ``between-confirms``: the first part's confirm is answered, the others are not sent;
* ``after-confirms``: every confirm is answered, Spark has not logged the batch's offset;
* ``planned``: Spark has logged the batch's offset and asks for its partitions;
* ``during-replay``: a restart has opened a batch's returned items again, not confirmed them.

Nothing sets the variable outside the tests; unset, a kill point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys

from ._log import lazy_logger

__all__ = ["KILL_AT", "kill_point"]

log = lazy_logger("kestrel_actors.spark_bridge.source")

KILL_AT = "KESTREL_SPARK_KILL_AT"


def kill_point(point: str, seq: int) -> None:
    """Test-only: SIGKILL this process here if ``KESTREL_SPARK_KILL_AT`` is ``point@seq``."""
    if os.environ.get(KILL_AT) == f"{point}@{seq}":
        log.warning("kill_point", point=point, seq=seq)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
