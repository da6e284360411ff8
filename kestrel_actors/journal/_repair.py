"""Repairing a journal file a reader could not read to its end (replay, and the offline pack).

A reader stops at the first record it cannot read (:class:`~._format.Problem`). That is one
of two things, and they are told apart here by looking past the stop:

* **A torn tail**: the last record is incomplete, because a crash interrupted its append.
  Nothing follows it. The partial record is cut off with a warning, as Kestrel does; it
  was never acknowledged (an append is answered only after it is written).
* **Damage in the middle**: an impossible opcode, a size too small for its record, a size
  larger than the largest item the queue allows, or a size that runs past records that
  follow it (the reader sees the last as "the data ends
  inside a record", like a torn tail). Whole records follow the damage.

To tell them apart, :func:`find_resync` scans forward (skipping the holes of a sparse file)
for the next place a record chain starts again: an add record (ADDX, ADD_XID or CONTINUE)
whose header is plausible (a size that fits, an add time after 2000 and at most a year
ahead, an expiry of 0 or after 2000) and from which the records read cleanly to the end of
the file, or for at least :data:`MIN_CHAIN` records before the next damage. Found: the bytes from the stop to there
are damage: they are copied to ``.corrupt/`` (at most :data:`SAVE_LIMIT` bytes of them),
cut out of the file (a copy of the rest is renamed over it, so a crash leaves the old file
whole), and the records after them are replayed. Not found and the reader saw a torn tail:
it is one. Otherwise the rest of the file is damage: copied aside (bounded) and cut off.
Either way the damage is logged as an error with its offset and the count of the items
recovered after it.

Kestrel (``Journal.replayFile``) truncates the file at the first unreadable record and logs
"DATA MAY HAVE BEEN LOST!": the records after damage are deleted, and nothing is kept aside.
docs/behaviour.md lists the difference. A damaged record that still parses (a size changed to
another size that ends on a record boundary) cannot be noticed without checksums, which
Kestrel's format does not have.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import time
from typing import NamedTuple

import structlog

from ._files import TEMP_MARK, fsync_dir, open_regular, unique_file
from ._format import ADD_OPS, NO_LIMIT, OP_ADD_XID, OP_ADDX, OP_CONTINUE, TORN, Problem, RecordReader

__all__ = ["CORRUPT_DIR", "MIN_CHAIN", "SAVE_LIMIT", "Resync", "find_resync", "repair_file"]

log = structlog.get_logger("kestrel_actors.journal")

CORRUPT_DIR = ".corrupt"
SAVE_LIMIT = 16 * 1024 * 1024
"""Most bytes of one damaged stretch copied to ``.corrupt/``: a damaged tail of a gigabyte of
zeros must not cost a gigabyte of writes (and disk) at every start."""
MIN_CHAIN = 4
"""Whole records a resync point needs before further damage (to the end of the file, one will do)."""
SCAN_CHUNK = 1 << 20
MIN_TIME_MS = 946_684_800_000
"""2000-01-01: no journal record was written before it."""
FUTURE_MS = 366 * 86_400_000

_HEADS = {OP_ADDX: 5, OP_ADD_XID: 9, OP_CONTINUE: 9}
_LONGEST_HEAD = 9 + 16
_I32 = struct.Struct("<i")
_TIMES = struct.Struct("<qq")


class Resync(NamedTuple):
    """Where whole records start again after damage, and what follows from there."""

    offset: int
    records: int
    """Whole records from ``offset`` to the end of the file or the next damage."""
    items: int
    """Of them, the add records (items)."""


def _plausible_add(buf: bytes, i: int, offset: int, end: int, now_ms: int, max_item: int) -> bool:
    head = _HEADS[buf[i]]
    if i + head + 16 > len(buf):
        return False
    if head == 9 and _I32.unpack_from(buf, i + 1)[0] <= 0:
        return False
    (size,) = _I32.unpack_from(buf, i + head - 4)
    if size < 16 or offset + head + size > end or size - 16 > max_item:
        return False
    add_time, expiry = _TIMES.unpack_from(buf, i + head)
    if not MIN_TIME_MS <= add_time <= now_ms + FUTURE_MS:
        return False
    return expiry == 0 or expiry >= MIN_TIME_MS


def _chain(fd: int, offset: int, end: int, now_ms: int, max_item_size: int | None) -> Resync | None:
    reader = RecordReader(fd, offset, end, now_ms=now_ms, max_item_size=max_item_size)
    records = items = 0
    for record in reader:
        records += 1
        if record.op in ADD_OPS or record.op == OP_CONTINUE:
            items += 1
    if reader.problem is None or reader.problem.kind == TORN or records >= MIN_CHAIN:
        return Resync(offset, records, items)
    return None


def _candidates(chunk: bytes, limit: int) -> list[int]:
    """Offsets in ``chunk[:limit]`` of the opcodes a resync may start at, in order.

    ``bytes.find`` (memchr) rather than a regular expression: a long run of zeros (a common
    kind of damage) is skipped at memory speed."""
    found = []
    for op in _HEADS:
        i = chunk.find(op, 0, limit)
        while i >= 0:
            found.append(i)
            i = chunk.find(op, i + 1, limit)
    found.sort()
    return found


def _next_data(fd: int, pos: int, end: int) -> int:
    """The first offset at or after ``pos`` that is not in a hole of a sparse file (``end`` if
    none is). A hole reads as zeros, where no record chain can start: a file whose damaged
    size points gigabytes into a hole is scanned in milliseconds, not read zero by zero."""
    try:
        return min(os.lseek(fd, pos, os.SEEK_DATA), end)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # only a hole from ``pos`` to the end of the file
            return end
        return pos  # a file system that cannot tell: read it all


def find_resync(fd: int, start: int, end: int, now_ms: int | None = None,
                max_item_size: int | None = None) -> Resync | None:
    """The first place after ``start`` (the offset a reader stopped at) where records resume
    (no add record there holds more than ``max_item_size`` bytes of data)."""
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    max_item = NO_LIMIT if max_item_size is None else max_item_size
    pos = start + 1
    while (pos := _next_data(fd, pos, end)) < end:
        chunk = os.pread(fd, min(SCAN_CHUNK + _LONGEST_HEAD, end - pos), pos)
        if not chunk:
            return None
        limit = min(SCAN_CHUNK, len(chunk))
        for i in _candidates(chunk, limit):
            if _plausible_add(chunk, i, pos + i, end, now_ms, max_item):
                found = _chain(fd, pos + i, end, now_ms, max_item_size)
                if found is not None:
                    return found
        pos += limit
    return None


def repair_file(data_dir: str, name: str, filename: str, problem: Problem, now_ms: int | None = None,
                max_item_size: int | None = None) -> int | None:
    """Repair ``filename``, where a reader stopped with ``problem`` (see the module docstring);
    ``max_item_size`` is the reader's (a record holding more data is damage).

    Returns the offset to read on from in the repaired file (the records after the damage
    now start there), or None if the file was cut at ``problem.offset``.
    """
    path = os.path.join(data_dir, filename)
    offset = problem.offset
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        resync = find_resync(fd, offset, size, now_ms, max_item_size) if size > offset else None
    finally:
        os.close(fd)
    if resync is None and problem.kind == TORN:
        _truncate(path, offset)
        log.warning("journal ends inside a record (interrupted write); the partial record was cut",
                    queue=name, file=filename, offset=offset, dropped_bytes=size - offset, reason=problem.message)
        return None
    damage_end = size if resync is None else resync.offset
    saved, saved_bytes = _save_aside(data_dir, filename, path, offset, damage_end)
    if resync is None:
        _truncate(path, offset)
    else:
        _cut_out(data_dir, name, path, offset, resync.offset, size)
    log.error("damaged journal record; DATA MAY HAVE BEEN LOST! The damaged bytes were copied aside and cut out",
              queue=name, file=filename, offset=offset, damaged_bytes=damage_end - offset, reason=problem.message,
              saved_to=saved, saved_bytes=saved_bytes, save_limit=SAVE_LIMIT,
              resumed_at=None if resync is None else resync.offset,
              items_after=0 if resync is None else resync.items,
              records_after=0 if resync is None else resync.records)
    return None if resync is None else offset


def _truncate(path: str, size: int) -> None:
    """Cut the file at ``path`` to ``size`` bytes, never through a symbolic link."""
    fd = open_regular(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _copy_range(src: int, dst: int, start: int, stop: int) -> None:
    position = start
    while position < stop:
        chunk = os.pread(src, min(SCAN_CHUNK, stop - position), position)
        if not chunk:
            return
        os.write(dst, chunk)
        position += len(chunk)


def _save_aside(data_dir: str, filename: str, path: str, start: int, stop: int) -> tuple[str | None, int]:
    """Copy at most :data:`SAVE_LIMIT` bytes of ``[start, stop)`` to ``.corrupt/``."""
    target_dir = os.path.join(data_dir, CORRUPT_DIR)
    target = os.path.join(target_dir, f"{filename}@{start}.{int(time.time() * 1000)}")
    stop = min(stop, start + SAVE_LIMIT)
    try:
        os.makedirs(target_dir, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(target_dir).st_mode):  # a link to a directory elsewhere
            raise NotADirectoryError(f"{target_dir} is not a directory of the data directory")
        src = open_regular(path)
        try:
            dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                _copy_range(src, dst, start, stop)
                os.fsync(dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        return target, stop - start
    except OSError as exc:
        log.error("could not save the damaged part of a journal", file=filename, error=str(exc))
        return None, 0


def _cut_out(data_dir: str, name: str, path: str, start: int, stop: int, size: int) -> None:
    """Replace the file by itself without ``[start, stop)``: a new copy renamed over it."""
    temp = os.path.join(data_dir, unique_file(data_dir, name, TEMP_MARK))
    src = open_regular(path)
    try:
        dst = os.open(temp, os.O_WRONLY | os.O_TRUNC)
        try:
            _copy_range(src, dst, 0, start)
            _copy_range(src, dst, stop, size)
            os.fdatasync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    os.replace(temp, path)
    fsync_dir(data_dir)
