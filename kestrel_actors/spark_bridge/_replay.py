"""The ``kestrel`` source's confirm record and the take-back that closes ADR 0013's window.

A batch is durable in the write-ahead log *before* its items are confirmed on their servers
(never lost), so a planner killed between the two leaves some of the batch's items back in
their queues while the file still holds them. Those items are not lost anywhere: a server
gives back a dead connection's open items at the head of the queue (behaviour §5.1, in reverse
order). So:

* the planner appends one line per part to ``batch-<seq>.wal.confirms`` once that part's
  confirm is answered (no ``fsync``: a line lost costs a restart one look at the queue, never
  an item);
* a planner that loads a batch from its file (a restart re-planning or replaying it) takes
  back, before it opens anything new, each part without a line: if the head of the part's
  queue is that part's first or last item, it opens the part's count, and confirms them if
  they are the part's items (in either order), else gives them back; a head that is not the
  part's means its confirm had landed. Then every part is recorded.

A kill inside the take-back is the same case again: the items go back to the head and the next
restart takes them back. See docs/adr/0013-spark-exactly-once.md.

Test-only: ``KESTREL_SPARK_KILL_AT=<point>@<seq>`` makes the planner process SIGKILL itself
at that step of micro-batch ``seq`` (after logging ``kill_point``), so a test kills the
driver side at an exact step instead of racing a timer. The points, in protocol order:

* ``after-wal``: the batch is durable in the write-ahead log, no confirm is sent;
* ``between-confirms``: the first part's confirm is answered, the others are not sent;
* ``after-confirms``: every confirm is answered, Spark has not logged the batch's offset;
* ``planned``: Spark has logged the batch's offset and asks for its partitions;
* ``during-replay``: a restart has opened a part's returned items again, not confirmed them.

Nothing sets the variable outside the tests; unset, a kill point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from ..client import KestrelError
from ._kestrel import Connection
from ._log import lazy_logger
from ._wal import BatchPart

__all__ = ["KILL_AT", "ConfirmRecord", "kill_point", "take_back_returned"]

log = lazy_logger("kestrel_actors.spark_bridge.source")

KILL_AT = "KESTREL_SPARK_KILL_AT"
_RECORD = re.compile(r"^batch-(\d{12})\.wal\.confirms$")


def kill_point(point: str, seq: int) -> None:
    """Test-only: SIGKILL this process here if ``KESTREL_SPARK_KILL_AT`` is ``point@seq``."""
    if os.environ.get(KILL_AT) == f"{point}@{seq}":
        log.warning("kill_point", point=point, seq=seq)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _key(part: BatchPart) -> str:
    # read_at round-trips exactly through the file's JSON header
    return f"{part.server} {part.read_at!r} {part.count}"


class ConfirmRecord:
    """``<batch file>.confirms``: the parts of one batch whose confirm was answered."""

    def __init__(self, batch_file: Path) -> None:
        self.path = batch_file.with_name(batch_file.name + ".confirms")

    def add(self, part: BatchPart) -> None:
        with open(self.path, "a") as out:
            out.write(_key(part) + "\n")

    def confirmed(self) -> set[str]:
        try:
            return set(self.path.read_text().splitlines())
        except FileNotFoundError:
            return set()

    @staticmethod
    def remove_through(directory: Path, seq: int) -> None:
        """Forget the records of batches ``<= seq`` (Spark has committed them)."""
        for name in os.listdir(directory):
            if (m := _RECORD.match(name)) and int(m.group(1)) <= seq:
                (directory / name).unlink(missing_ok=True)


def take_back_returned(seq: int, parts: list[BatchPart], record: ConfirmRecord, queue: str,
                       connect: Callable[[str], Connection]) -> None:
    """Take back off their queues the items of batch ``seq`` (loaded from its file) that a
    kill returned before their confirm was answered; ``connect(server)`` makes a connection
    to the server a part names."""
    done = record.confirmed()
    pending: dict[str, list[BatchPart]] = {}
    for part in parts:
        if _key(part) not in done:
            pending.setdefault(part.server, []).append(part)
    for server, its in pending.items():
        connection = connect(server)
        try:
            taken = _take_back(connection, queue, its, seq)
        except KestrelError as exc:
            # unknown whether they came back: left unrecorded, the next restart looks again
            log.warning("replay_take_back_failed", queue=queue, server=server, seq=seq,
                        error=str(exc)[:300])
            continue
        finally:
            connection.close()
        if taken:
            log.warning("replay_took_back_returned_items", queue=queue, server=server, seq=seq,
                        items=taken)
        for part in its:
            record.add(part)


def _take_back(connection: Connection, queue: str, parts: list[BatchPart], seq: int) -> int:
    left = {id(p): (p, p.items.values()) for p in parts if p.count}
    taken = 0
    while left:
        head = connection.peek(queue)
        found = next((id_ for id_, (_, values) in left.items()
                      if head is not None and head in (values[0], values[-1])), None)
        if found is None:
            break  # the others' confirms had landed
        part, expected = left.pop(found)
        got = connection.open_waiting(queue, part.count).values()
        kill_point("during-replay", seq)
        if got != expected and got != expected[::-1]:
            connection.close()  # not this part's items: they go back
            log.warning("replay_items_differ", queue=queue, server=part.server, seq=seq,
                        items=part.count)
            break
        connection.confirm(queue, part.count)
        taken += part.count
    return taken

