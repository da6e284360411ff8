"""Packing: replacing a queue's older journal files by one file with the same effect (behaviour §6.6).

Kestrel packs the files up to a checkpoint from the queue's *current* in-memory state plus
empty placeholder items meant to absorb the REMOVE records of the later files. That is only
right when the later files pop items in a convenient order (a REMOVE followed by a
still-open REMOVE_TENTATIVE_XID, for one, pairs the xid with a placeholder and loses the
item). We pack so that correctness is by construction: the pack holds the exact state the
queue had at the end of the last packed file, so ``replay(pack + later files)`` equals
``replay(all files)`` whatever the later files contain. Items that the later records
(already written, made durable before the pack is committed) provably discard are written
as empty placeholders — Kestrel's space saving, where it is safe.

The state is computed by streaming the files twice, never holding the queue in memory:

1. **Plan.** Replay with items reduced to their add index. The live queue at any time is a
   stack of explicitly re-queued items (unremoved) on top of a *contiguous range* of add
   indices ``[lo, hi)``: adds append at ``hi``, pops take the stack first, then ``lo``. Only
   the open items and the stack are kept, as indices; then the later records are run on to
   mark the items they discard (one byte per item of the range).
2. **Write.** Stream again; keep the data of the few indices the plan named; on reaching add
   ``lo`` write the open items (ADDX + REMOVE_TENTATIVE_XID, descending xid, as Kestrel's
   rewrite does), then the stack, then every add from ``lo`` on as it streams past.

The output goes to a ``~~`` temp file, is fsynced, and is renamed to ``<last file>.pack``;
the next listing (:func:`archived_files`) deletes the packed files and moves it into place,
so a crash at any point leaves either the old files or the pack, never a mix.

At run time the packed files are archives the read-behind reader has already passed.
:func:`pack_queue` packs *all* files of a stopped queue (``kestrel-actors journal pack``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence

import structlog

from ..queue import Item, next_xid
from ._checkpoint import remove_checkpoint
from ._files import (
    PACK_SUFFIX,
    archived_files,
    check_regular,
    delete_temp_files,
    file_timestamp,
    fsync_dir,
    journal_files,
    open_regular,
    unique_file,
)
from ._format import (
    ADD_OPS,
    OP_CONFIRM_REMOVE,
    OP_CONTINUE,
    OP_REMOVE,
    OP_REMOVE_TENTATIVE,
    OP_REMOVE_TENTATIVE_XID,
    OP_SAVE_XID,
    OP_UNREMOVE,
    AddRecords,
    Record,
    RecordReader,
    encode_add,
    encode_remove_tentative,
    write_all,
)
from ._repair import repair_file

__all__ = [
    "OPEN_READ_RECORDS", "PackError", "commit_pack", "open_reads_bytes", "pack_archives", "pack_queue", "prepare_pack",
    "write_snapshot",
]

log = structlog.get_logger("kestrel_actors.journal")

WRITE_BUFFER = 1 << 20

ADD_RECORD = 21
"""Bytes of an ADDX record beside its item's data."""
OPEN_READ_RECORDS = ADD_RECORD + 5
"""Bytes beside its data that an open read takes in a snapshot: its ADDX and its
REMOVE_TENTATIVE_XID."""


class PackError(Exception):
    """A file to pack is broken (at run time we never cut a file while the queue is live)."""


def write_snapshot(path: str, open_items: list[tuple[int, Item]], items: list[Item]) -> int:
    """Write a rewrite's file: each open item as ADDX + REMOVE_TENTATIVE_XID, then the items.

    ``open_items`` are ``(xid, item)`` pairs in the order to write (descending xid). The file
    is fsynced before returning its size. May run on a worker thread: items are not mutated.
    Each record's header and the item's data go to ``writev`` as they are, a megabyte at a
    time: joined first, 50,000 open reads of 1 KiB were copied twice and held whole in memory.
    """
    adds = AddRecords()
    chunks: list[bytes] = []
    size = pending = 0
    with open(path, "wb") as out:
        fd = out.fileno()
        for xid, item in open_items:
            data = item.data
            chunks += (adds.header(item), data, encode_remove_tentative(xid))
            pending += OPEN_READ_RECORDS + len(data)
            if pending >= WRITE_BUFFER:
                write_all(fd, chunks, pending)
                size += pending
                chunks, pending = [], 0
        for item in items:
            data = item.data
            chunks += (adds.header(item), data)
            pending += ADD_RECORD + len(data)
            if pending >= WRITE_BUFFER:
                write_all(fd, chunks, pending)
                size += pending
                chunks, pending = [], 0
        write_all(fd, chunks, pending)
        size += pending
        os.fdatasync(fd)
    return size


def open_reads_bytes(open_items: Iterable[tuple[int, Item]]) -> int:
    """What ``open_items`` (``(xid, item)`` pairs) take in a snapshot (:func:`write_snapshot`)."""
    return sum(OPEN_READ_RECORDS + len(item.data) for _xid, item in open_items)


def _records(data_dir: str, name: str, files: list[str], repair: bool, now_ms: int,
             max_item_size: int | None = None) -> Iterator[Record]:
    for filename in files:
        path = os.path.join(data_dir, filename)
        start: int | None = 0
        while start is not None:
            try:
                fd = open_regular(path)
            except FileNotFoundError:
                break
            try:
                reader = RecordReader(fd, start, now_ms=now_ms, max_item_size=max_item_size)
                yield from reader
            finally:
                os.close(fd)
            problem = reader.problem
            if problem is None:
                break
            if not repair:
                raise PackError(f"{filename}: {problem.message} at offset {problem.offset}")
            start = repair_file(data_dir, name, filename, problem, now_ms, max_item_size)


class _Plan:
    """Pass 1: which add indices make up the state at the end of the packed files.

    After :meth:`freeze` (the end of the packed files) it goes on through the later records
    only to learn which of the packed items those records discard for good: a REMOVE pops
    it, or a CONFIRM or CONTINUE closes the xid it was opened under. Such an item may be
    written as an empty placeholder, since replay will drop it anyway — the trick Kestrel's
    packer uses, here applied only where the later records prove it safe.
    """

    def __init__(self) -> None:
        self.hi = 0
        self.lo = 0
        self.stack: list[int] = []
        self.open: dict[int, int] = {}
        self.xid = 0
        self.frozen: tuple[int, int, list[int], dict[int, int]] | None = None
        self._dead_range = bytearray()
        self._dead_other: set[int] = set()

    def freeze(self) -> None:
        self.frozen = (self.lo, self.hi, list(self.stack), dict(self.open))
        self._dead_range = bytearray(self.hi - self.lo)

    def is_dead(self, index: int) -> bool:
        if self.frozen is None:
            return False
        lo, hi = self.frozen[0], self.frozen[1]
        if lo <= index < hi:
            return bool(self._dead_range[index - lo])
        return index in self._dead_other

    def _kill(self, index: int | None) -> None:
        if self.frozen is None or index is None:
            return
        lo, hi = self.frozen[0], self.frozen[1]
        if lo <= index < hi:
            self._dead_range[index - lo] = 1
        elif index < lo:
            self._dead_other.add(index)

    def _pop(self) -> int | None:
        if self.stack:
            return self.stack.pop()
        if self.lo < self.hi:
            self.lo += 1
            return self.lo - 1
        return None

    def apply(self, record: Record) -> None:
        op = record.op
        if op in ADD_OPS:
            self.hi += 1
        elif op == OP_REMOVE:
            self._kill(self._pop())
        elif op in (OP_REMOVE_TENTATIVE_XID, OP_REMOVE_TENTATIVE):
            xid = record.xid
            if op == OP_REMOVE_TENTATIVE:
                xid = next_xid(self.xid, self.open)
            index = self._pop()
            if index is not None:
                self.open[xid] = index
            self.xid = xid
        elif op == OP_CONFIRM_REMOVE:
            self._kill(self.open.pop(record.xid, None))
        elif op == OP_UNREMOVE:
            index = self.open.pop(record.xid, None)
            if index is not None:
                self.stack.append(index)
        elif op == OP_SAVE_XID:
            self.xid = record.xid
        elif op == OP_CONTINUE:
            self._kill(self.open.pop(record.xid, None))
            self.hi += 1


LaterSource = tuple[int, int]
"""``(fd, end)``: records written after the packed files, up to ``end`` (durable by commit)."""


def _later_records(later: list[LaterSource], now_ms: int) -> Iterator[Record]:
    for fd, end in later:
        reader = RecordReader(fd, 0, end, now_ms=now_ms)
        yield from reader
        if reader.problem is not None:
            return  # knowing fewer discarded items is always safe


def _pack_files(data_dir: str, name: str, files: list[str], out_path: str, repair: bool,
                later: Sequence[LaterSource] = (), later_budget: int = 1 << 62,
                max_item_size: int | None = None) -> tuple[int, int, int]:
    """Write the state at the end of ``files`` to ``out_path``.

    At most ``later_budget`` bytes of the ``later`` records are read (knowing fewer discarded
    items only makes the pack bigger). Returns (items, placeholders, bytes written).
    """
    now_ms = int(time.time() * 1000)
    plan = _Plan()
    for record in _records(data_dir, name, files, repair, now_ms, max_item_size):
        plan.apply(record)
    plan.freeze()
    lo, hi, stack, open_ = plan.frozen  # type: ignore[misc]
    scanned = 0
    for record in _later_records(list(later), now_ms):
        plan.apply(record)
        scanned += record.size
        if plan.lo >= hi or scanned > later_budget:
            break  # the packed range is consumed (or enough was read): stop looking
    wanted = set(open_.values()) | set(stack)
    kept: dict[int, Item] = {}
    written = count = empty = 0
    with open(out_path, "wb") as out:
        buffer: list[bytes] = []
        buffered = 0

        def emit(index: int, item: Item, xid: int = 0) -> None:
            nonlocal written, buffered, count, empty
            if plan.is_dead(index):
                data = encode_add(Item(b"", item.add_time))
                empty += 1
            else:
                data = encode_add(item)
                count += not xid
            if xid:
                data += encode_remove_tentative(xid)
            buffer.append(data)
            written += len(data)
            buffered += len(data)
            if buffered >= WRITE_BUFFER:
                out.write(b"".join(buffer))
                buffer.clear()
                buffered = 0

        def emit_prefix() -> None:
            for xid in sorted(open_, reverse=True):
                emit(open_[xid], kept[open_[xid]], xid)
            for index in reversed(stack):
                emit(index, kept[index])

        index = 0
        prefix_done = False
        for record in _records(data_dir, name, files, False, now_ms, max_item_size):
            if record.op in ADD_OPS or record.op == OP_CONTINUE:
                item = record.item
                assert item is not None
                if index == lo and not prefix_done:
                    emit_prefix()
                    prefix_done = True
                if index >= lo:
                    emit(index, item)
                elif index in wanted:
                    kept[index] = item
                index += 1
        if not prefix_done:
            emit_prefix()
        out.write(b"".join(buffer))
        out.flush()
        os.fdatasync(out.fileno())
    return count, empty, written


def _files_upto(data_dir: str, name: str, upto: str) -> list[str]:
    limit = file_timestamp(upto, name)
    if limit is None:
        raise ValueError(f"{upto!r} is not an archive of {name!r}")
    return [f for f in archived_files(data_dir, name) if (file_timestamp(f, name) or 0) <= limit]


def prepare_pack(data_dir: str, name: str, upto: str, later: Sequence[LaterSource] = (),
                 later_budget: int = 1 << 62) -> str | None:
    """Write the pack of the archives up to ``upto`` to a temp file; returns its path.

    ``later`` are the records written after ``upto`` (later archives, the current file up to
    what is written); items they discard become empty placeholders. Each of them must be
    durable before :func:`commit_pack`. Blocking: run it on a worker thread.
    """
    files = _files_upto(data_dir, name, upto)
    if not files:
        return None
    started = time.monotonic()
    temp_path = os.path.join(data_dir, unique_file(data_dir, name, "~~"))
    try:
        count, empty, size = _pack_files(data_dir, name, files, temp_path, repair=False, later=later,
                                         later_budget=later_budget)
    except BaseException:
        try:
            os.unlink(temp_path)
        except FileNotFoundError:
            pass
        raise
    log.info("packed journal files", queue=name, files=files, into=upto, items=count, placeholders=empty,
             bytes=size, seconds=round(time.monotonic() - started, 3))
    return temp_path


def commit_pack(data_dir: str, name: str, temp_path: str, upto: str) -> None:
    """Rename a prepared pack to ``<upto>.pack`` (the commit point) and move it into place.
    The queue's checkpoint goes first: it names the files the pack replaces."""
    remove_checkpoint(data_dir, name)
    os.replace(temp_path, os.path.join(data_dir, upto + PACK_SUFFIX))
    fsync_dir(data_dir)
    archived_files(data_dir, name)


def pack_archives(data_dir: str, name: str, upto: str, later: Sequence[LaterSource] = ()) -> str | None:
    """Pack the archived files of ``name`` up to and including ``upto`` into ``<upto>.pack``,
    then move it into place. Returns the packed file's name (None if nothing to pack).

    Safe while the queue is live, as long as the read-behind reader is past ``upto``: only the
    current file is written meanwhile. Blocking: run it on a worker thread.
    """
    temp_path = prepare_pack(data_dir, name, upto, later)
    if temp_path is None:
        return None
    commit_pack(data_dir, name, temp_path, upto)
    return upto


def pack_queue(data_dir: str, name: str, max_item_size: int | None = None) -> tuple[int, int]:
    """Compact every file of a *stopped* queue into one ``<name>``; returns (items, bytes).

    Broken files are repaired first, as replay would (a record holding more than
    ``max_item_size`` bytes of data is damage). Open reads are kept as open (ADDX +
    REMOVE_TENTATIVE_XID); the server backs them out when it starts. If one of the queue's
    files is not a regular file (a symbolic link, a named pipe, ...) it raises
    :class:`~._files.NotRegularFile` before anything is changed.
    """
    check_regular(data_dir, name)
    delete_temp_files(data_dir, name)
    files = journal_files(data_dir, name)
    current = os.path.join(data_dir, name)
    archives = files[:-1]
    newest = max((file_timestamp(f, name) or 0 for f in archives), default=0)
    # Make the current file an archive too, so one pack covers everything (crash-safe: at
    # every step the files on disk replay to the same queue).
    rotated = unique_file(data_dir, name, ".", min_ts=newest + 1)
    if os.path.exists(current):
        os.replace(current, os.path.join(data_dir, rotated))
    temp = unique_file(data_dir, name, "~~")
    temp_path = os.path.join(data_dir, temp)
    count, _empty, size = _pack_files(data_dir, name, [*archives, rotated], temp_path, repair=True,
                                      max_item_size=max_item_size)
    remove_checkpoint(data_dir, name)
    os.replace(temp_path, os.path.join(data_dir, rotated + ".pack"))
    fsync_dir(data_dir)
    archived_files(data_dir, name)
    os.replace(os.path.join(data_dir, rotated), current)
    fsync_dir(data_dir)
    log.info("packed queue journal", queue=name, files=len(files), items=count, bytes=size)
    return count, size
