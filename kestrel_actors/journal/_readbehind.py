"""The read-behind cursor (behaviour §5.8): re-reading a queue's items from its journal.

When a queue's bytes reach ``max_memory_size``, later items are only in the journal files.
The cursor starts where that happened and, as the queue's head is consumed, reads forward
through the files, handing back the items of add records (and CONTINUE) in order and skipping
every other record. It reads behind a *leader*, the one that is ahead of it in the files, and
read-behind ends once it reaches the leader's position. There are two leaders, and one cursor
serves both:

* the live queue's :class:`~kestrel_actors.journal.FileJournal`, whose writer appends to the
  current file ``<name>``: the cursor never reads past what the writer has written, and if
  records are still pending it flushes them first. A rotation renames the file under it, which
  changes nothing but the name it remembers (it holds its own descriptor). Reads run on
  gevent's threadpool (the journal passes its ``read``), so the hub never waits for the disk,
  and the chunk after the one being read is read ahead meanwhile (``read_ahead``), so the
  queue seldom waits either (issue 56).
* a replay at startup (``_replay``), which reads the files in order: the cursor keeps memory
  bounded while the replay goes on, and where it stands at the end (:attr:`position`) is where
  the live journal's cursor begins.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Protocol

import structlog

from ..queue import Item
from ._files import NotRegularFile, open_regular
from ._format import ReadAheadFn, ReadFn, RecordReader

__all__ = ["Leader", "ReadBehindPosition", "ReadBehindReader"]

log = structlog.get_logger("kestrel_actors.journal")


class ReadBehindPosition(NamedTuple):
    """Where a queue in read-behind continues reading: a journal file and an offset in it."""

    filename: str
    offset: int


class Leader(Protocol):
    """What the cursor reads behind: a ``FileJournal`` (its writer), or a replay."""

    name: str
    """The queue (for the logs)."""
    data_dir: str

    @property
    def current_file(self) -> str:
        """The file the leader is in; the cursor reads no further than the leader there."""

    def size(self) -> int:
        """The leader's position in :attr:`current_file` (records still pending included)."""

    def written_size(self) -> int:
        """How much of :attr:`current_file` is on disk (readable)."""

    def flush(self) -> bool:
        """Write what is pending; ``False`` if it could not be written."""

    def file_after(self, filename: str) -> str:
        """The file that follows ``filename``, which the leader has left."""

    def reader_moved(self, filename: str) -> None:
        """The cursor went on to ``filename`` (the files behind it may be packed)."""


class ReadBehindReader:
    """A forward cursor over a queue's journal files: ``(filename, offset)``."""

    def __init__(self, leader: Leader, filename: str, offset: int, *, read: ReadFn | None = None,
                 now_ms: int | None = None, read_ahead: ReadAheadFn | None = None) -> None:
        self.leader = leader
        self.filename = filename
        self.offset = offset
        self._read = read
        self._read_ahead = read_ahead
        self._now_ms = now_ms
        self._fd: int | None = None
        self._reader: RecordReader | None = None
        self._in_leaders_file = False
        """Whether the open file is the leader's (:attr:`in_current_file` when it was opened,
        until :meth:`file_finished`): its end moves as the leader writes."""
        self.stalled = False
        """Set when the next record could not be written (a failing writer, a hold): the
        reader returns ``None`` without having caught up, and read-behind goes on."""

    @property
    def position(self) -> ReadBehindPosition:
        return ReadBehindPosition(self.filename, self.offset)

    @property
    def in_current_file(self) -> bool:
        return self.filename == self.leader.current_file

    def next_item(self) -> Item | None:
        """The next item the leader has gone past, or ``None`` once caught up with it.

        The leader is asked where it is only when the cursor reaches the end it last learnt
        (what was written then): the records before that end are whole and stay as they are,
        so a run of them is read with no call to the leader per record, nor a comparison of
        file names (``_in_leaders_file`` is known since the file was opened)."""
        leader = self.leader
        while True:
            reader = self._reader
            if reader is None:
                if not self._open():
                    if not self._advance():
                        return None
                    continue
                reader = self._reader
                assert reader is not None
            current = self._in_leaders_file
            if current and reader.position >= reader.end:
                if self.offset >= leader.size():
                    return None
                # what is left to read may still be pending (not every read: a remove just
                # journaled is always pending, and a write per read would undo batching)
                if self.offset >= leader.written_size() and not leader.flush() and self.offset >= leader.written_size():
                    self.stalled = True
                    return None
                reader.set_end(leader.written_size())
            item = reader.next_item()
            self.offset = reader.position
            if item is not None:
                return item
            if reader.problem is not None:
                log.error("read-behind found a broken record; leaving read-behind early",
                          queue=leader.name, file=self.filename, offset=reader.problem.offset,
                          reason=reader.problem.message)
                return None
            if current:
                continue  # at the end it knew: the leader says how far it has gone since
            if not self._advance():
                return None

    def file_finished(self, filename: str, final_size: int) -> None:
        """The leader left its current file, which is now named ``filename`` (a rotation
        renames it) and ends at ``final_size`` (a replay may have cut a torn tail)."""
        if self.in_current_file:
            self.filename = filename
            self._in_leaders_file = False
            if self._reader is not None:
                self._reader.set_end(final_size)

    def close(self) -> None:
        """Close the file; the next read opens it again at :attr:`offset`."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._reader = None

    # -- internals ----------------------------------------------------------------------------

    def _open(self) -> bool:
        path = os.path.join(self.leader.data_dir, self.filename)
        try:
            self._fd = open_regular(path)
        except (FileNotFoundError, NotRegularFile) as exc:
            log.error("read-behind cannot open a journal file", queue=self.leader.name, file=self.filename,
                      error=str(exc))
            return False
        # in the leader's file, only what the leader has written is read (the file's size may
        # end inside a record being written)
        self._in_leaders_file = current = self.in_current_file
        end = self.leader.written_size() if current else None
        self._reader = RecordReader(self._fd, self.offset, end, now_ms=self._now_ms, read=self._read,
                                    read_ahead=self._read_ahead)
        return True

    def _advance(self) -> bool:
        """Move to the file after this one; False if there is none (the reader is lost)."""
        if self.in_current_file:
            return False
        leader = self.leader
        old = self.filename
        self.close()
        self.filename = leader.file_after(old)
        self.offset = 0
        log.info("read-behind moving to the next journal file", queue=leader.name, old=old, new=self.filename)
        leader.reader_moved(self.filename)
        return True
