"""Opening a queue's journal at startup: replay, then back out the open reads (behaviour §6.4, §7.1).

:func:`open_file_journal` is the whole of Kestrel's ``PersistentQueue.setup``: it replays the
files (on gevent's threadpool when called from a greenlet, since a replay reads the whole
journal), opens the current file for appending, and backs out every transaction still open:
in descending xid order it writes ``UNREMOVE(xid)`` and pushes the item back at the head, so
the items end up at the head in ascending xid order.

:class:`FileOpener` (:func:`make_file_opener`) wraps it in the ``opener(name, config) ->
QueueCore`` the queue collection takes; its :meth:`~FileOpener.open_many` replays the queues
found at start-up in one threadpool job, from one listing of the data directory.
"""

from __future__ import annotations

import functools

from ..config import QueueConfig
from ..queue import QueueCore
from ._file import CHECKPOINT_BYTES, FileJournal
from ._files import erase_files, files_by_queue, total_size
from ._memory import MemoryJournal
from ._replay import ReplayResult, replay_queue
from ._writer import run_blocking

__all__ = ["FileOpener", "largest_item", "make_file_opener", "open_file_journal"]


def open_file_journal(data_dir: str, name: str, config: QueueConfig, *, read_behind: bool = False,
                      now_ms: int | None = None, max_item_bytes: int | None = None
                      ) -> tuple[FileJournal, ReplayResult]:
    """Replay queue ``name`` and open its journal; returns the journal and the queue state.

    With ``read_behind`` the replay keeps at most about ``max_memory_size`` bytes of items in
    memory and the journal resumes reading behind where replay left off (the queue must then
    refill its memory with :meth:`FileJournal.read_behind`). After this call
    ``state.open_items`` is empty and ``state.items`` starts with the backed-out items.
    ``max_item_bytes``: the server's ``max_item_bytes``; a record holding more data is damage
    (:func:`largest_item`).
    """
    replay = functools.partial(_replay, data_dir, name, config, read_behind, None, now_ms, max_item_bytes)
    state: ReplayResult = run_blocking(replay)
    return _open_replayed(data_dir, name, config, state), state


def largest_item(config: QueueConfig, max_item_bytes: int | None) -> int:
    """The longest item a journal record of queue ``config`` may hold: the server's
    ``max_item_bytes`` (the most a SET may send), or the queue's ``max_item_size`` when no server
    limit is given. A record holding more was not written by a server with this setting: replay
    treats it as damage rather than read the gigabytes a corrupt size field claims. Not the
    queue's ``max_item_size`` as well: it is reloadable, and lowering it to refuse new large items
    must not turn the large items already stored into damage at the next start."""
    return config.max_item_size if max_item_bytes is None else max_item_bytes


def _replay(data_dir: str, name: str, config: QueueConfig, read_behind: bool, listing: list[str] | None,
            now_ms: int | None = None, max_item_bytes: int | None = None) -> ReplayResult:
    return replay_queue(data_dir, name, now_ms=now_ms, listing=listing,
                        max_memory_size=config.max_memory_size if read_behind else None,
                        max_item_size=largest_item(config, max_item_bytes))


def _open_replayed(data_dir: str, name: str, config: QueueConfig, state: ReplayResult) -> FileJournal:
    """The journal of a replayed queue, its open reads backed out (see the module docstring)."""
    journal = FileJournal(data_dir, name, config, archived_size=state.archived_size,
                          max_timestamp=state.max_timestamp, read_behind=state.read_behind,
                          sequence=state.sequence, xid=state.xid,
                          # a long replay is not repeated: the first change writes a checkpoint
                          checkpoint_due=CHECKPOINT_BYTES if state.replayed_bytes < CHECKPOINT_BYTES else 0)
    for xid in sorted(state.open_items, reverse=True):
        item = state.open_items.pop(xid)
        journal.unremove(xid)
        item.xid = 0
        state.items.appendleft(item)
        state.length += 1
        state.bytes += len(item.data)
        state.mem_bytes += len(item.data)
    return journal


BATCH_BYTES = 16 * 1024 * 1024
"""Journal bytes replayed in one start-up batch (about a tenth of a second of replay)."""
BATCH_QUEUES = 500
"""Queues replayed in one start-up batch (a threadpool round trip per queue made 5,000 small
queues take 30 s; one per 500 is nothing)."""


def _journal_sizes(data_dir: str) -> dict[str, int]:
    """Bytes of each queue's journal files in ``data_dir``, by queue name."""
    return {name: total_size(data_dir, files) for name, files in files_by_queue(data_dir).items()}


def _replay_each(data_dir: str, requests: list[tuple[str, QueueConfig]],
                 read_behind: bool, max_item_bytes: int | None) -> list[ReplayResult | Exception]:
    """Replay every queue of ``requests`` from one listing of ``data_dir``: a queue that
    fails gives its exception, the others are replayed all the same."""
    listings = files_by_queue(data_dir)
    results: list[ReplayResult | Exception] = []
    for name, config in requests:
        try:
            results.append(_replay(data_dir, name, config, read_behind, listings.get(name, []),
                                   max_item_bytes=max_item_bytes))
        except Exception as exc:  # noqa: BLE001 - raised again where that queue is opened
            results.append(exc)
    return results


class FileOpener:
    """An ``opener(name, config) -> QueueCore`` for ``QueueCollection``, journaling in
    ``data_dir``; :meth:`open_many` opens the queues found at start-up all at once.

    ``keep_journal = false`` erases any files of the queue and uses a :class:`MemoryJournal`
    (Kestrel erases them when such a queue is created). Leave ``read_behind`` false until
    ``QueueCore`` handles items that are only on disk. ``max_item_bytes``: the server's (see
    :func:`largest_item`).
    """

    def __init__(self, data_dir: str, read_behind: bool = False, max_item_bytes: int | None = None) -> None:
        self.data_dir = data_dir
        self.read_behind = read_behind
        self.max_item_bytes = max_item_bytes

    def __call__(self, name: str, config: QueueConfig) -> QueueCore:
        if not config.keep_journal:
            return self._memory_core(name, config)
        journal, state = open_file_journal(self.data_dir, name, config, read_behind=self.read_behind,
                                           max_item_bytes=self.max_item_bytes)
        return self._core(name, config, journal, state)

    def open_many(self, requests: list[tuple[str, QueueConfig]]) -> dict[str, QueueCore | Exception]:
        """Each queue's core, or the exception opening it raised (to be raised where that
        queue is created).

        Every journal is replayed in one job on the threadpool from one listing of the data
        directory: start-up with 5,000 queues took 30 s with a listing and a threadpool round
        trip per queue.
        """
        journaled = [(name, config) for name, config in requests if config.keep_journal]
        states = run_blocking(_replay_each, self.data_dir, journaled, self.read_behind, self.max_item_bytes)
        opened: dict[str, QueueCore | Exception] = {}
        for (name, config), state in zip(journaled, states, strict=True):
            try:
                if isinstance(state, Exception):
                    raise state
                opened[name] = self._core(name, config, _open_replayed(self.data_dir, name, config, state), state)
            except Exception as exc:  # noqa: BLE001 - raised again where that queue is opened
                opened[name] = exc
        return opened

    def plan(self, requests: list[tuple[str, QueueConfig]]) -> list[list[tuple[str, QueueConfig]]]:
        """``requests`` in the batches start-up opens in turn (:meth:`open_many` each): smallest
        journals first, each batch up to :data:`BATCH_BYTES` of journal or :data:`BATCH_QUEUES`
        queues, so that small queues are served while a big backlog is still being replayed."""
        sizes = run_blocking(_journal_sizes, self.data_dir)
        ordered = sorted(requests, key=lambda request: sizes.get(request[0], 0))
        batches: list[list[tuple[str, QueueConfig]]] = []
        batch: list[tuple[str, QueueConfig]] = []
        batch_bytes = 0
        for request in ordered:
            size = sizes.get(request[0], 0)
            if batch and (batch_bytes + size > BATCH_BYTES or len(batch) >= BATCH_QUEUES):
                batches.append(batch)
                batch, batch_bytes = [], 0
            batch.append(request)
            batch_bytes += size
        if batch:
            batches.append(batch)
        return batches

    def _memory_core(self, name: str, config: QueueConfig) -> QueueCore:
        erase_files(self.data_dir, name)
        return QueueCore(name, config, MemoryJournal())

    @staticmethod
    def _core(name: str, config: QueueConfig, journal: FileJournal, state: ReplayResult) -> QueueCore:
        core = QueueCore(name, config, journal)
        core.restore(state)
        return core


def make_file_opener(data_dir: str, *, read_behind: bool = False, max_item_bytes: int | None = None) -> FileOpener:
    """A :class:`FileOpener` for ``QueueCollection``, journaling in ``data_dir``."""
    return FileOpener(data_dir, read_behind, max_item_bytes)
