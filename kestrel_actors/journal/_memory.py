"""The journal of a queue that keeps nothing on disk (``keep_journal = false``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..queue import Item, Journal

__all__ = ["MemoryJournal"]


class MemoryJournal(Journal):
    """The journal of a queue that keeps nothing on disk (``keep_journal = false``); its
    ``failure`` stays ``None`` and ``maintenance_due`` False (set by ``Journal.__init__``)."""

    def add(self, item: Item) -> None:
        pass

    def remove(self) -> None:
        pass

    def remove_many(self, count: int) -> None:
        for _ in range(count):  # a subclass that records (the tests') sees each
            self.remove()

    def remove_tentative(self, xid: int) -> None:
        pass

    def remove_tentative_many(self, xids: list[int]) -> None:
        for xid in xids:  # a subclass that records (the tests') sees each
            self.remove_tentative(xid)

    def remove_tentative_run(self, first: int, count: int) -> None:
        self.remove_tentative_many(list(range(first, first + count)))

    def unremove(self, xid: int) -> None:
        pass

    def confirm_remove(self, xid: int) -> None:
        pass

    def confirm_remove_many(self, xids: list[int]) -> None:
        for xid in xids:
            self.confirm_remove(xid)

    def confirm_remove_run(self, first: int, count: int) -> None:
        self.confirm_remove_many(list(range(first, first + count)))

    def after_durable(self, callback: Callable[[], None],
                      on_error: Callable[[OSError], None] | None = None) -> None:
        callback()

    def durable_now(self) -> bool:
        return True

    def hold(self) -> int:
        return 0

    def release(self, token: int) -> None:
        pass

    def size(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def erase(self) -> None:
        pass

    def observe(self, metrics: Any, sync_stats: Any) -> None:
        pass  # no files: nothing to time

    @property
    def in_read_behind(self) -> bool:
        return False

    rewrites = 0
    rotations = 0

    def check_rotate(self, queue: Any) -> None:
        pass

    def rotation_due(self, queue: Any) -> bool:
        return False

    def rewrite(self, queue: Any) -> bool:
        return False

    def start_read_behind(self) -> None:
        pass

    def read_behind(self) -> Item | None:
        return None
