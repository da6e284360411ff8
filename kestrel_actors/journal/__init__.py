"""Queue journals: the interface a queue writes through, and its implementations.

* :class:`MemoryJournal` — no files (``keep_journal = false``).
* :class:`FileJournal` — Kestrel's journal files, written by a per-queue writer greenlet with
  the ``sync_journal`` policy, rotated, rewritten and packed as Kestrel does (behaviour §6).
* :func:`open_file_journal` / :func:`make_file_opener` — replay a queue at startup.
* :func:`queue_names` — the queues found in a data directory (behaviour §7.1).
* :func:`open_regular`, :func:`check_regular` — journal files are only ever regular files,
  never opened through a symbolic link (:class:`NotRegularFile`).
* :func:`lock_data_dir` — one process at a time in a data directory (:class:`DataDirLocked`).
* The record format (:class:`RecordReader`, ``encode_*``, the ``OP_*`` opcodes) for tools such as the CLI.

The parts that need gevent are imported on first use, so offline tools stay light.
"""

from typing import Any

from ..queue import Item, Journal
from ._files import (
    NotRegularFile,
    archived_files,
    check_regular,
    erase_files,
    fsync_dir,
    journal_files,
    open_regular,
    queue_names,
)
from ._format import (
    ADD_OPS,
    CORRUPT,
    OP_CONFIRM_REMOVE,
    OP_CONTINUE,
    OP_REMOVE,
    OP_REMOVE_TENTATIVE,
    OP_REMOVE_TENTATIVE_XID,
    OP_SAVE_XID,
    OP_UNREMOVE,
    TORN,
    Problem,
    Record,
    RecordReader,
    encode_add,
    encode_confirm_remove,
    encode_continue,
    encode_remove,
    encode_remove_tentative,
    encode_unremove,
)
from ._lock import LOCK_FILE, DataDirLocked, lock_data_dir
from ._memory import MemoryJournal
from ._pack import pack_archives, pack_queue
from ._readbehind import ReadBehindPosition
from ._replay import ReplayResult, replay_queue

_LAZY = {
    "FileJournal": "._file",
    "JournalWriter": "._writer",
    "run_blocking": "._writer",
    "FileOpener": "._open",
    "make_file_opener": "._open",
    "open_file_journal": "._open",
}

__all__ = [
    "ADD_OPS",
    "CORRUPT",
    "LOCK_FILE",
    "OP_CONFIRM_REMOVE",
    "OP_CONTINUE",
    "OP_REMOVE",
    "OP_REMOVE_TENTATIVE",
    "OP_REMOVE_TENTATIVE_XID",
    "OP_SAVE_XID",
    "OP_UNREMOVE",
    "TORN",
    "DataDirLocked",
    "FileJournal",
    "FileOpener",
    "Item",
    "Journal",
    "JournalWriter",
    "MemoryJournal",
    "NotRegularFile",
    "Problem",
    "ReadBehindPosition",
    "Record",
    "RecordReader",
    "ReplayResult",
    "archived_files",
    "check_regular",
    "encode_add",
    "encode_confirm_remove",
    "encode_continue",
    "encode_remove",
    "encode_remove_tentative",
    "encode_unremove",
    "erase_files",
    "fsync_dir",
    "journal_files",
    "lock_data_dir",
    "make_file_opener",
    "open_file_journal",
    "open_regular",
    "pack_archives",
    "pack_queue",
    "queue_names",
    "replay_queue",
    "run_blocking",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
