"""A connection's open reads of one queue, oldest first, as runs of consecutive xids: :class:`OpenXids`.

A queue gives out xids one after another, so a ``monitor`` step opens a run of consecutive xids,
and the Spark source's ``confirm`` of as many takes the run back. The connection keeps such a step
as one :class:`~kestrel_actors.messages.XidRun` and hands it to its ``Confirm`` as it is, which the
queue takes in one step (``QueueCore.confirm_runs``): no xid boxed, kept and sent back per item
(ADR 0022). A ``/open`` read goes on the newest run when its xid follows it, else starts a run of
one, so the order of the reads is the order they were opened, as Kestrel's list of them.

``confirm n`` takes the oldest ``n`` open reads (behaviour §2.7), a run cut where ``n`` ends inside
it; a ``/close`` or ``/abort`` takes the oldest one. Aborts name each xid (``Unremove.each``).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..messages import XidRun
from ..queue import Item

__all__ = ["OpenXids"]


class OpenXids:
    """The xids one connection holds open on one queue, oldest first, in runs."""

    __slots__ = ("_runs", "count")

    def __init__(self) -> None:
        self._runs: list[XidRun] = []
        """Oldest first; none is handed out (a run taken leaves the list, a cut one is new)."""
        self.count = 0
        """The reads held open (``len``)."""

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count != 0

    def __iter__(self) -> Iterator[int]:
        """The open xids, oldest first."""
        for run in list(self._runs):
            yield from range(run.first, run.first + run.count)

    def __repr__(self) -> str:
        return f"OpenXids({self._runs!r})"

    def add(self, xid: int) -> None:
        """One read opened under ``xid`` (a ``/open`` GET's)."""
        self._add_run(xid, 1)

    def add_items(self, items: list[Item]) -> None:
        """The reads of ``items`` opened, in order (a ``monitor`` step's): one run while their xids
        follow one another, as they do until the queue's xids wrap."""
        count = len(items)
        if not count:
            return
        first = items[0].xid
        expected = first
        item: Item
        for item in items:  # typed: each xid read and compared natively, none boxed
            if item.xid != expected:
                break
            expected += 1
        if expected - first == count:
            self._add_run(first, count)
            return
        for item in items:  # the xids wrapped within the step
            self._add_run(item.xid, 1)

    def _add_run(self, first: int, count: int) -> None:
        """``count`` reads opened under the xids from ``first``: on the newest run if they follow it."""
        runs = self._runs
        self.count += count
        if runs:
            last = runs[-1]
            if last.first + last.count == first:
                last.count += count
                return
        runs.append(XidRun(first, count))

    def take(self, count: int) -> list[XidRun] | None:
        """The ``count`` oldest reads, no longer held, as runs oldest first, if that many are open;
        else ``None``, and none is taken (the confirm guard of both protocols)."""
        if count <= 0 or count > self.count:
            return None
        self.count -= count
        runs = self._runs
        whole = 0
        left = count
        while whole < len(runs) and runs[whole].count <= left:
            left -= runs[whole].count
            whole += 1
        taken = runs[:whole]
        del runs[:whole]
        if left:  # ``count`` ends inside this run: its oldest go, the rest stay open
            run = runs[0]
            taken.append(XidRun(run.first, left))
            run.first += left
            run.count -= left
        return taken

    def take_all(self) -> list[XidRun]:
        """Every read held, oldest first, no longer held."""
        taken = self._runs
        self._runs = []
        self.count = 0
        return taken
