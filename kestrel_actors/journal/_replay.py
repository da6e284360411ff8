"""Replaying a queue's journal files into its state at startup (behaviour §6.4, §6.5, §5.8).

:func:`replay_queue` reads the queue's files in replay order and applies every record to an
empty queue, exactly as Kestrel's ``PersistentQueue.replayJournal`` does:

* add records (0, 2, 7) append at the tail; CONTINUE (8) closes its xid and appends;
* REMOVE pops the head (a no-op on an empty queue);
* REMOVE_TENTATIVE_XID (9) pops the head into the open table and sets the xid counter; the
  legacy REMOVE_TENTATIVE (3) takes the next free xid, as Kestrel's offline tools do;
* SAVE_XID sets the counter; UNREMOVE puts an open item back at the head; CONFIRM drops it;
* no expiry sweep runs during replay.

A file that ends inside a record (torn tail) is cut at its last whole record — the file that
is actually broken, not the current one as Kestrel does. Damage in the middle of a file (an
impossible opcode, a size that runs past the records after it, an item longer than the
largest the queue allows) is copied to
``<data_dir>/.corrupt/`` (bounded) and cut out, and replay goes on with the whole records
after it: see :mod:`._repair`, which tells the two apart. Anything in a file's place that is
not a regular file is skipped with a warning, never opened (a named pipe would block).

With ``max_memory_size`` set, replay keeps memory bounded the way Kestrel does (behaviour §5.8): once
the queue's bytes reach the limit, later items are only counted, and a second cursor re-reads
them from the files as the head is consumed. If that cursor has not caught up at the end,
:attr:`ReplayResult.read_behind` says where the live queue must continue reading.

A queue with a checkpoint that still matches its files (:mod:`._checkpoint`) starts from the
state it holds and replays only the records after its position; the items before that stay on
disk, and the read-behind cursor starts at the head the checkpoint names (filling memory only
as the queue is read). One that does not match is deleted and the whole journal replayed.

Open transactions are left in :attr:`ReplayResult.open_items`; the journal that opens the
queue backs them out (writing UNREMOVE records) — see :func:`open_file_journal`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

import structlog

from ..queue import Item, PackedItems, next_xid, take_head
from ._checkpoint import Checkpoint, read_checkpoint, remove_checkpoint, tail_crc
from ._files import NotRegularFile, delete_temp_files, file_size, file_timestamp, journal_files, open_regular
from ._format import (
    ADD_OPS,
    OP_CONFIRM_REMOVE,
    OP_CONTINUE,
    OP_REMOVE,
    OP_REMOVE_TENTATIVE,
    OP_REMOVE_TENTATIVE_XID,
    OP_SAVE_XID,
    OP_UNREMOVE,
    Record,
    RecordReader,
)
from ._readbehind import ReadBehindPosition, ReadBehindReader
from ._repair import repair_file
from ._sequence import AddSequence

__all__ = ["ReplayResult", "replay_queue"]

log = structlog.get_logger("kestrel_actors.journal")

PROGRESS_BYTES = 10 * 1024 * 1024


@dataclass
class ReplayResult:
    """The state of a queue after replaying its journal (before open reads are backed out)."""

    items: PackedItems = field(default_factory=PackedItems)
    """The in-memory items, head first (all of them unless the queue is in read-behind)."""
    open_items: dict = field(default_factory=dict)
    """xid → item still open at the end of the journal."""
    length: int = 0
    """Items in the queue, including those only on disk (read-behind); open ones excluded."""
    bytes: int = 0
    mem_bytes: int = 0
    xid: int = 0
    total_items: int = 0
    """Number of add records replayed (Kestrel's per-queue ``total_items`` after a restart)."""
    current_size: int = 0
    """Bytes of the current file ``<name>`` after any truncation."""
    archived_size: int = 0
    files: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    """``(file name, Problem)`` for each place a file was cut or repaired."""
    read_behind: ReadBehindPosition | None = None
    max_timestamp: int = 0
    """The newest archive's timestamp (new archive names must sort after it)."""
    sequence: AddSequence = field(default_factory=AddSequence)
    """The add records counted, for the live journal's checkpoints."""
    from_checkpoint: bool = False
    """Only the journal after the queue's checkpoint was replayed."""
    replayed_bytes: int = 0
    """Bytes of journal replayed (all of it, or what follows the checkpoint)."""


class _Replay:
    """The queue being rebuilt: Kestrel's replay rules, with bounded memory.

    It is also the leader its read-behind cursor follows (:class:`._readbehind.Leader`): the
    replayer is at ``position`` in ``files[index]``, and everything before that is read.
    """

    def __init__(self, result: ReplayResult, max_memory: int | None, data_dir: str, name: str,
                 now_ms: int) -> None:
        self.r = result
        self.max_memory = max_memory
        self.fill_limit = max_memory
        """Memory the read-behind cursor fills up to (0 after a checkpoint: only the head)."""
        self.sequence = result.sequence
        self.data_dir = data_dir
        self.name = name
        self.files: list[str] = result.files
        self.now_ms = now_ms
        self.behind: ReadBehindReader | None = None
        self.index = 0
        self.position = 0

    # -- the leader of the read-behind cursor ---------------------------------------------

    @property
    def current_file(self) -> str:
        return self.files[self.index]

    def size(self) -> int:
        return self.position

    written_size = size  # a replay only reads: all it has gone past is on disk

    def flush(self) -> bool:
        return True

    def file_after(self, filename: str) -> str:
        return self.files[self.files.index(filename) + 1]

    def reader_moved(self, filename: str) -> None:
        pass  # nothing is packed during a replay

    # -- Kestrel's replay rules -----------------------------------------------------------

    def apply(self, record: Record) -> None:
        op = record.op
        r = self.r
        if op in ADD_OPS:
            self.sequence.add(self.current_file, record.offset)
            self.add(record.item)  # type: ignore[arg-type]
        elif op == OP_REMOVE:
            self.pop()
        elif op in (OP_REMOVE_TENTATIVE_XID, OP_REMOVE_TENTATIVE):
            xid = next_xid(r.xid, r.open_items) if op == OP_REMOVE_TENTATIVE else record.xid
            item = self.pop()
            if item is not None:
                item.xid = xid
                r.open_items[xid] = item
            r.xid = xid
        elif op == OP_CONFIRM_REMOVE:
            r.open_items.pop(record.xid, None)
        elif op == OP_UNREMOVE:
            item = r.open_items.pop(record.xid, None)
            if item is not None:
                item.xid = 0
                self.sequence.front += 1
                r.items.appendleft(item)
                r.length += 1
                r.bytes += len(item.data)
                r.mem_bytes += len(item.data)
        elif op == OP_SAVE_XID:
            r.xid = record.xid
        elif op == OP_CONTINUE:
            r.open_items.pop(record.xid, None)
            self.sequence.add(self.current_file, record.offset)
            self.add(record.item)  # type: ignore[arg-type]

    def add(self, item: Item) -> None:
        r = self.r
        n = len(item.data)
        r.total_items += 1
        r.length += 1
        r.bytes += n
        if self.behind is None:
            r.items.append(item)
            r.mem_bytes += n
            if self.max_memory is not None and r.bytes >= self.max_memory:
                self.behind = ReadBehindReader(self, self.current_file, self.position, now_ms=self.now_ms)

    def pop(self) -> Item | None:
        r = self.r
        if not r.items:
            self.fill()
            if not r.items:
                return None
        item = take_head(r)
        self.sequence.pop()
        self.fill()
        return item

    def fill(self) -> None:
        r = self.r
        while self.behind is not None and (r.mem_bytes < self.fill_limit or not r.items):  # type: ignore[operator]
            item = self.behind.next_item()
            if item is None:
                self.behind.close()
                self.behind = None
                return
            r.items.append(item)
            r.mem_bytes += len(item.data)


def replay_queue(data_dir: str, name: str, *, max_memory_size: int | None = None,
                 now_ms: int | None = None, listing: list[str] | None = None,
                 max_item_size: int | None = None) -> ReplayResult:
    """Replay every journal file of queue ``name`` (see the module docstring).

    Side effects, as in Kestrel: temporary ``~~`` files are deleted, a finished pack is moved
    into place, and broken files are truncated. Nothing else is written. ``listing``: the
    queue's files in ``data_dir`` as :func:`._files.files_by_queue` found them (else the
    directory is listed). ``max_item_size``: the largest item the queue allows; a record
    holding more is damage, set aside as other damage is (see :mod:`._repair`).
    """
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    delete_temp_files(data_dir, name, listing)
    files = journal_files(data_dir, name, listing)
    started = time.monotonic()
    checkpoint = read_checkpoint(data_dir, name)
    result, replay, start_index, start_offset = None, None, 0, 0
    if checkpoint is not None:
        restored = _restore(data_dir, name, files, checkpoint, max_memory_size, now_ms)
        if restored is None:
            log.warning("stale checkpoint (its journal files changed); replaying the whole journal", queue=name)
            remove_checkpoint(data_dir, name)
        else:
            replay, start_index, start_offset = restored
            result = replay.r
    if result is None or replay is None:
        result = ReplayResult(files=files)
        replay = _Replay(result, max_memory_size, data_dir, name, now_ms)
    for index, filename in enumerate(files):
        if index < start_index:  # before the checkpoint: counted, not read
            result.archived_size += file_size(os.path.join(data_dir, filename))
            result.max_timestamp = max(result.max_timestamp, file_timestamp(filename, name) or 0)
            continue
        replay.index = index
        replay.position = start = start_offset if index == start_index else 0
        size = _replay_file(data_dir, name, filename, replay, now_ms, result, max_item_size, start)
        result.replayed_bytes += max(0, size - start)
        if replay.behind is not None:
            replay.behind.file_finished(filename, size)  # where a torn tail was cut, if it was
        if filename == name:
            result.current_size = size
        else:
            result.archived_size += size
            result.max_timestamp = max(result.max_timestamp, file_timestamp(filename, name) or 0)
    if replay.behind is not None:
        result.read_behind = replay.behind.position
        replay.behind.close()
    log.info("replayed journal", queue=name, items=result.length, bytes=result.bytes,
             open=len(result.open_items), xid=result.xid, files=len(files),
             read_behind=result.read_behind is not None, from_checkpoint=result.from_checkpoint,
             replayed_bytes=result.replayed_bytes, seconds=round(time.monotonic() - started, 3))
    return result


def _restore(data_dir: str, name: str, files: list[str], ck: Checkpoint, max_memory: int | None,
             now_ms: int) -> tuple[_Replay, int, int] | None:
    """The queue as ``ck`` left it, ready to replay what follows it: the replay, and the file
    (index in ``files``) and offset to go on from; None if ``ck`` no longer matches the files."""
    if not ck.files:
        return None
    found: list[tuple[int, int]] = []
    for filename in files:
        try:
            st = os.lstat(os.path.join(data_dir, filename))
            found.append((st.st_ino, st.st_size))
        except OSError:
            found.append((-1, 0))
    first = next((i for i, (inode, _size) in enumerate(found) if inode == ck.files[0].inode), None)
    if first is None or first + len(ck.files) > len(files):
        return None
    last = first + len(ck.files) - 1
    for i, recorded in enumerate(ck.files, start=first):
        inode, size = found[i]
        if inode != recorded.inode or (size < recorded.size if i == last else size != recorded.size):
            return None
    try:
        if tail_crc(os.path.join(data_dir, files[last]), ck.files[-1].size) != ck.tail_crc:
            return None
    except OSError:
        return None
    result = ReplayResult(files=files, from_checkpoint=True)
    result.items = PackedItems()
    for item in ck.front:
        result.items.append(item)
    result.open_items = dict(ck.open_items)
    result.length, result.bytes, result.xid, result.total_items = ck.length, ck.bytes, ck.xid, ck.added
    result.mem_bytes = sum(len(item.data) for item in ck.front)
    head_index = ck.consumed - ck.head_skip
    result.sequence = AddSequence(
        added=ck.added, consumed=ck.consumed, front=len(ck.front),
        marks=deque([[head_index, files[first], ck.head_offset]]
                    + [[index, files[first + number], offset] for index, number, offset in ck.marks]))
    replay = _Replay(result, max_memory, data_dir, name, now_ms)
    replay.index, replay.position = last, ck.files[-1].size
    if ck.length > len(ck.front):
        # the items after the front are on disk from the head on; memory fills as they are read
        replay.fill_limit = 0
        replay.behind = ReadBehindReader(replay, files[first], ck.head_offset, now_ms=now_ms)
        for _ in range(ck.head_skip):
            if replay.behind.next_item() is None:
                replay.behind.close()
                return None
    return replay, last, ck.files[-1].size


def _replay_file(data_dir: str, name: str, filename: str, replay: _Replay, now_ms: int,
                 result: ReplayResult, max_item_size: int | None, start: int = 0) -> int:
    path = os.path.join(data_dir, filename)
    while True:
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            return 0
        except NotRegularFile:
            log.warning("a queue's journal is not a regular file; not read", queue=name, file=filename)
            return 0
        try:
            reader = RecordReader(fd, start, now_ms=now_ms, max_item_size=max_item_size)
            next_report = start + PROGRESS_BYTES
            read, apply = reader.next, replay.apply
            replay.position = start
            while (record := read()) is not None:
                position = replay.position = reader.position
                apply(record)
                if position > next_report:
                    log.info("still replaying journal", queue=name, file=filename, bytes_so_far=position)
                    next_report += PROGRESS_BYTES
            problem = reader.problem
            position = reader.position
        except OSError as exc:
            log.error("cannot read journal file; DATA MAY HAVE BEEN LOST!", queue=name, file=filename, error=str(exc))
            return file_size(path)
        finally:
            os.close(fd)
        if problem is None:
            return position
        result.problems.append((filename, problem))
        resume = repair_file(data_dir, name, filename, problem, now_ms, max_item_size)
        if resume is None:
            return position
        start = resume
        behind = replay.behind
        if behind is not None and behind.in_current_file:
            behind.close()  # it holds the old file open; offsets before the damage are unchanged
