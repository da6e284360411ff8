"""The queue's add records counted as the journal writes or replays them (a checkpoint's
bookkeeping, behaviour §6.8).

Its own compiled module: the journal counts every add and removal on the request path, and a
class in an interpreted module is called by name from compiled code (ADR 0015).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

__all__ = ["MARK_EVERY", "AddSequence"]

MARK_EVERY: Final = 4096
"""Every this many add records, the journal notes where one is (file and offset), so that a
checkpoint can name the head's record without keeping the place of every add."""


class AddSequence:
    """The queue's add records, counted as the journal writes or replays them."""

    __slots__ = ("added", "consumed", "front", "marks")

    def __init__(self, added: int = 0, consumed: int = 0, front: int = 0,
                 marks: deque[list[Any]] | None = None) -> None:
        self.added = added
        """Add records in the journal files (the next one's index)."""
        self.consumed = consumed
        """Add records removed from the queue's head (the head's index in the run)."""
        self.front = front
        """Items at the head that an UNREMOVE put back (not in the run)."""
        self.marks: deque[list[Any]] = deque() if marks is None else marks
        """``[index, file name, offset]`` of every MARK_EVERY-th add record still needed, oldest first."""

    def __repr__(self) -> str:
        return (f"AddSequence(added={self.added}, consumed={self.consumed}, front={self.front}, "
                f"marks={list(self.marks)!r})")

    def add(self, filename: str, offset: int) -> None:
        index = self.added
        if index % MARK_EVERY == 0:
            self.marks.append([index, filename, offset])
        self.added = index + 1

    def pop(self) -> None:
        if self.front:
            self.front -= 1
        else:
            self.consumed += 1

    def pop_many(self, count: int) -> None:
        """:meth:`pop`, ``count`` times."""
        front = self.front
        if front >= count:
            self.front = front - count
        else:
            self.front = 0
            self.consumed += count - front

    def head_mark(self) -> list[Any] | None:
        """The last mark at or before the head (older ones are dropped), or None."""
        marks = self.marks
        while len(marks) > 1 and marks[1][0] <= self.consumed:
            marks.popleft()
        if not marks or marks[0][0] > self.consumed:
            return None
        return marks[0]

    def renamed(self, old: str, new: str) -> None:
        for mark in self.marks:
            if mark[1] == old:
                mark[1] = new
