"""The ``kestrel`` source's confirm record and the take-back that closes ADR 0013's window.

A batch is durable in the write-ahead log *before* its items are confirmed on their servers
(never lost), so a planner killed between the two leaves some of the batch's items back in
their queues while the file still holds them. Those items are not lost anywhere: a server
gives back a dead connection's open items at the head of the queue (behaviour §5.1, in reverse
order). So:

* the planner records each part once its confirm is answered, as an empty file (object)
  ``batch-<seq>.wal.confirmed-<digest>`` in the write-ahead log's store (no ``fsync``: a record
  lost costs a restart one look at the queue, never an item);
* a planner that loads a batch from its file (a restart re-planning or replaying it) takes
  back, before it opens anything new, each part without a record: if the head of the part's
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

import hashlib
import os
import re
import signal
import sys
from collections.abc import Callable

from ..client import KestrelError
from ._kestrel import Connection
from ._log import lazy_logger
from ._wal import BatchPart
from ._walstore import WalStore

__all__ = ["KILL_AT", "ConfirmRecord", "kill_point", "take_back_returned"]

log = lazy_logger("kestrel_actors.spark_bridge.source")

KILL_AT = "KESTREL_SPARK_KILL_AT"
_RECORD = re.compile(r"^batch-(\d{12})\.wal\.confirmed-[0-9a-f]+$")


def kill_point(point: str, seq: int) -> None:
    """Test-only: SIGKILL this process here if ``KESTREL_SPARK_KILL_AT`` is ``point@seq``."""
    if os.environ.get(KILL_AT) == f"{point}@{seq}":
        log.warning("kill_point", point=point, seq=seq)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _digest(part: BatchPart) -> str:
    """A part's name in the record: its queue, server, when it was read and its count, which
    round-trip exactly through the batch file's JSON header."""
    key = f"{part.queue} {part.server} {part.read_at!r} {part.count}"
    return hashlib.sha1(key.encode()).hexdigest()[:24]


class ConfirmRecord:
    """The parts of batch ``seq`` whose confirm was answered: one empty file (object) per part,
    ``batch-<seq>.wal.confirmed-<digest of the part>``, beside the batch's file in the
    write-ahead log's store. A file per part rather than lines appended to one: an object store
    has no append (ADR 0013 decision 9)."""

    def __init__(self, store: WalStore, seq: int) -> None:
        self.store = store
        self.prefix = f"batch-{seq:012d}.wal.confirmed-"

    def add(self, part: BatchPart) -> None:
        self.store.touch(self.prefix + _digest(part))

    def confirmed(self) -> set[str]:
        """The digests of the parts recorded (see :func:`_digest`)."""
        return {name[len(self.prefix):] for name in self.store.names()
                if name.startswith(self.prefix)}

    @staticmethod
    def remove_through(store: WalStore, seq: int) -> None:
        """Forget the records of batches ``<= seq`` (Spark has committed them)."""
        for name in store.names():
            if (m := _RECORD.match(name)) and int(m.group(1)) <= seq:
                store.delete(name)


def take_back_returned(seq: int, parts: list[BatchPart], record: ConfirmRecord,
                       connect: Callable[[str], Connection]) -> None:
    """Take back off their queues the items of batch ``seq`` (loaded from its file) that a
    kill returned before their confirm was answered; ``connect(server)`` makes a connection
    to the server a part names."""
    done = record.confirmed()
    pending: dict[tuple[str, str], list[BatchPart]] = {}
    for part in parts:
        if _digest(part) not in done:
            pending.setdefault((part.server, part.queue), []).append(part)
    for (server, queue), its in pending.items():
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

