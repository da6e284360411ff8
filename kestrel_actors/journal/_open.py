"""Opening a queue's journal at startup: replay, then back out the open reads (behaviour §6.4, §7.1).

:func:`open_file_journal` is the whole of Kestrel's ``PersistentQueue.setup``: it replays the
files (on gevent's threadpool when called from a greenlet, since a replay reads the whole
journal), opens the current file for appending, and backs out every transaction still open:
in descending xid order it writes ``UNREMOVE(xid)`` and pushes the item back at the head, so
the items end up at the head in ascending xid order.

:func:`make_file_opener` wraps it in the ``opener(name, config) -> QueueCore`` the queue
collection takes.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ..config import QueueConfig
from ._file import FileJournal
from ._files import erase_files
from ..queue import QueueCore
from ._memory import MemoryJournal
from ._replay import ReplayResult, replay_queue
from ._writer import run_blocking

__all__ = ["open_file_journal", "make_file_opener"]


def open_file_journal(data_dir: str, name: str, config: QueueConfig, *, read_behind: bool = False,
                      now_ms: int | None = None) -> tuple[FileJournal, ReplayResult]:
    """Replay queue ``name`` and open its journal; returns the journal and the queue state.

    With ``read_behind`` the replay keeps at most about ``max_memory_size`` bytes of items in
    memory and the journal resumes reading behind where replay left off (the queue must then
    refill its memory with :meth:`FileJournal.read_behind`). After this call
    ``state.open_items`` is empty and ``state.items`` starts with the backed-out items.
    """
    replay = functools.partial(replay_queue, data_dir, name, now_ms=now_ms,
                               max_memory_size=config.max_memory_size if read_behind else None)
    state: ReplayResult = run_blocking(replay)
    journal = FileJournal(data_dir, name, config, archived_size=state.archived_size,
                          max_timestamp=state.max_timestamp, read_behind=state.read_behind)
    for xid in sorted(state.open_items, reverse=True):
        item = state.open_items.pop(xid)
        journal.unremove(xid)
        item.xid = 0
        state.items.appendleft(item)
        state.length += 1
        state.bytes += len(item.data)
        state.mem_bytes += len(item.data)
    return journal, state


def make_file_opener(data_dir: str, *, read_behind: bool = False) -> Callable[[str, QueueConfig], Any]:
    """An ``opener(name, config) -> QueueCore`` for ``QueueCollection``, journaling in ``data_dir``.

    ``keep_journal = false`` erases any files of the queue and uses a :class:`MemoryJournal`
    (Kestrel erases them when such a queue is created). Leave ``read_behind`` false until
    ``QueueCore`` handles items that are only on disk.
    """

    def opener(name: str, config: QueueConfig) -> Any:
        if not config.keep_journal:
            erase_files(data_dir, name)
            return QueueCore(name, config, MemoryJournal())
        journal, state = open_file_journal(data_dir, name, config, read_behind=read_behind)
        core = QueueCore(name, config, journal)
        core.restore(state)
        return core

    return opener
