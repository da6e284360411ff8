"""A queue's open (tentatively removed) reads, held as runs of consecutive xids: :class:`OpenReads`.

A queue gives out xids one after another, so the reads open at any time are mostly a few runs of
consecutive xids: a ``monitor`` step opens thousands at once, and its ``confirm`` takes the same
run back. A dict held one entry per xid (a boxed key, a hash, an insert and a delete per item
opened and confirmed: ~450 instructions, ADR 0022). Here a run is one list of items, slot ``k``
holding the read of xid ``first + k``: opening a run extends a list, confirming the run a session
opened takes one slice.

Reads confirmed or put back out of order leave their slot empty (``None``) until the slots before
them go too; a run that is mostly empty slots is split into the runs of its live reads, so that a
read kept open for long behind many confirmed ones holds no memory for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ._journal import Item

__all__ = ["OpenReads"]

_TRIM_AT: Final = 64
"""Empty slots at a run's front that are let go together, once they are half its list or more."""
_SPLIT_AT: Final = 128
"""A run this long (from its first live read) is split once fewer than a quarter of its slots are
live."""


class _Run:
    """Open reads of consecutive xids: ``items[k]`` is the read of xid ``first + k`` (``None``
    once confirmed or put back); the slots before ``start`` are all ``None``."""

    __slots__ = ("first", "items", "start", "live")

    def __init__(self, first: int, items: list[Item | None]) -> None:
        self.first = first
        self.items = items
        self.start = 0
        self.live = len(items)
        """The slots not ``None``."""


class OpenReads:
    """The open reads of one queue by xid, oldest first: a dict's ``get``, ``pop``, ``in``,
    ``len``, item assignment and iteration (of the xids, in the order they were opened), with
    :meth:`add_run` and :meth:`pop_run` for a run of consecutive xids at once."""

    __slots__ = ("_runs", "count", "_ordered")

    def __init__(self) -> None:
        self._runs: list[_Run] = []
        """Oldest first."""
        self.count = 0
        """The reads open (``len``)."""
        self._ordered = True
        """Each run's xids are above the run's before it (xids have not wrapped past an open
        one): a look-up bisects the runs instead of scanning them."""

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count != 0

    def __repr__(self) -> str:
        return f"OpenReads({self.count} open, {len(self._runs)} runs)"

    def __contains__(self, xid: object) -> bool:
        return isinstance(xid, int) and self.get(xid) is not None

    def __iter__(self) -> Iterator[int]:
        """The open xids, oldest first."""
        for run in list(self._runs):
            first = run.first
            items = run.items
            for index in range(run.start, len(items)):
                if items[index] is not None:
                    yield first + index

    def __getitem__(self, xid: int) -> Item:
        item = self.get(xid)
        if item is None:
            raise KeyError(xid)
        return item

    def __setitem__(self, xid: int, item: Item) -> None:
        """Open ``item`` under ``xid``, which is not open."""
        self.add_run(xid, [item])

    def __delitem__(self, xid: int) -> None:
        if self.pop(xid) is None:
            raise KeyError(xid)

    def items(self) -> list[tuple[int, Item]]:
        """``(xid, item)`` of every open read, oldest first."""
        pairs: list[tuple[int, Item]] = []
        for run in self._runs:
            first = run.first
            items = run.items
            for index in range(run.start, len(items)):
                item = items[index]
                if item is not None:
                    pairs.append((first + index, item))
        return pairs

    def oldest(self) -> tuple[int, Item] | None:
        """The read opened first (its xid and item), or ``None``."""
        if not self._runs:
            return None
        run = self._runs[0]
        item = run.items[run.start]
        assert item is not None
        return run.first + run.start, item

    def add_run(self, first: int, items: list[Item]) -> None:
        """Open ``items`` under the xids ``first``, ``first + 1``, ... (none of them open): the
        run goes on the newest one when it follows it, else the list is kept as a run of its
        own (the caller hands over a list it no longer uses)."""
        count = len(items)
        if not count:
            return
        self.count += count
        runs = self._runs
        if runs:
            last = runs[-1]
            end = last.first + len(last.items)
            if end == first:
                last.items.extend(items)
                last.live += count
                return
            if first < end:
                self._ordered = False  # wrapped
        runs.append(_Run(first, items))  # type: ignore[arg-type]  # list is invariant: kept as is

    def get(self, xid: int) -> Item | None:
        """The read open under ``xid``, or ``None``."""
        index = self._find(xid)
        if index < 0:
            return None
        run = self._runs[index]
        return run.items[xid - run.first]

    def pop(self, xid: int, default: None = None) -> Item | None:
        """Remove and answer the read open under ``xid`` (``None`` if there is none)."""
        index = self._find(xid)
        if index < 0:
            return None
        run = self._runs[index]
        items = run.items
        slot = xid - run.first
        item = items[slot]
        if item is None:
            return None
        items[slot] = None
        run.live -= 1
        self.count -= 1
        if not run.live:
            self._drop(index)
            return item
        if slot == run.start:
            start = slot + 1
            while items[start] is None:
                start += 1
            run.start = start
        self._tidy(index, run)
        return item

    def pop_run(self, xids: tuple[int, ...]) -> list[Item] | None:
        """Remove and answer the reads open under ``xids`` if they are consecutive xids, in
        order, all open in one run (a ``confirm`` of what a ``monitor`` opened); else ``None``,
        and nothing is removed (the caller pops them one by one)."""
        count = len(xids)
        if not count:
            return None
        low: int = xids[0]
        expected = low
        for xid in xids:  # typed: each unboxed and compared natively
            if xid != expected:
                return None
            expected += 1
        return self.pop_span(low, count)

    def pop_span(self, low: int, count: int) -> list[Item] | None:
        """Remove and answer the reads open under the ``count`` xids from ``low`` if all are open
        in one run (a session's ``XidRun``); else ``None``, and nothing is removed."""
        if count <= 0:
            return None
        index = self._find(low)
        if index < 0:
            return None
        run = self._runs[index]
        items = run.items
        slot = low - run.first
        end = slot + count
        if slot < run.start or end > len(items):
            return None
        if run.live != len(items) - run.start:  # some slots are empty: are any of these?
            for at in range(slot, end):
                if items[at] is None:
                    return None
        taken: list[Item] = items[slot:end]  # type: ignore[assignment]  # none is None (checked)
        run.live -= count
        self.count -= count
        if not run.live:
            self._drop(index)
        elif slot == run.start:
            start = end
            while items[start] is None:
                start += 1
            run.start = start
            self._tidy(index, run)
        elif end == len(items):
            del items[slot:]  # the run ends before them: xids after are a run of their own
            self._tidy(index, run)
        else:
            items[slot:end] = [None] * count
            self._tidy(index, run)
        return taken

    def clear(self) -> None:
        self._runs.clear()
        self.count = 0
        self._ordered = True

    # -- internals ----------------------------------------------------------------------------

    def _find(self, xid: int) -> int:
        """The index of the run whose slots cover ``xid``, or -1."""
        runs = self._runs
        if not runs:
            return -1
        ordered = self._ordered
        run = runs[0]
        slot = xid - run.first
        # the oldest run first: a confirm's usual one
        if 0 <= slot < len(run.items) and (ordered or run.items[slot] is not None):
            return 0
        if not ordered:
            # past a wrap an xid given out again may lie in an older run's span, on an empty
            # slot there: the run that holds it open is the one
            for index in range(1, len(runs)):
                run = runs[index]
                slot = xid - run.first
                if 0 <= slot < len(run.items) and run.items[slot] is not None:
                    return index
            return -1
        low = 1
        high = len(runs)
        while low < high:  # the first run starting above ``xid``
            middle = (low + high) // 2
            if runs[middle].first <= xid:
                low = middle + 1
            else:
                high = middle
        index = low - 1
        if not index:
            return -1
        run = runs[index]
        return index if xid < run.first + len(run.items) else -1

    def _drop(self, index: int) -> None:
        """The run at ``index`` holds no open read any more."""
        runs = self._runs
        del runs[index]
        if not runs:
            self._ordered = True

    def _tidy(self, index: int, run: _Run) -> None:
        """Let go of the empty slots of ``run`` (at ``index``) that cost more than they save:
        those at its front once they are many, every one once a run is mostly empty slots."""
        items = run.items
        start = run.start
        if start >= _TRIM_AT and start + start >= len(items):
            del items[:start]
            run.first += start
            run.start = start = 0
        span = len(items) - start
        if span < _SPLIT_AT or run.live * 4 >= span:
            return
        parts: list[_Run] = []
        first = run.first
        at = start
        end = len(items)
        while at < end:
            if items[at] is None:
                at += 1
                continue
            stop = at + 1
            while stop < end and items[stop] is not None:
                stop += 1
            parts.append(_Run(first + at, items[at:stop]))
            at = stop
        self._runs[index:index + 1] = parts
