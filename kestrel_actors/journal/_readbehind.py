"""The read-behind reader (reference §5.8): re-reading a queue's items from its journal.

When a queue's bytes reach ``max_memory_size``, new items are written to the journal only.
The reader starts at the writer's position at that moment and, as the queue's head is
consumed, reads forward through the journal files, handing back the items of add records
(and CONTINUE) in order and skipping every other record. It ends — the queue leaves
read-behind — once it reaches the writer's position again.

The reader holds its own descriptor, so a rotation that renames the file under it changes
nothing but the name it remembers. In the current file it never reads past what the writer
has written; if records are still pending in the writer it flushes them first. Reads are
done in 1 MiB chunks on gevent's threadpool, so the hub never waits for the disk.
"""

from __future__ import annotations

import os
from typing import Protocol

import structlog

from ._files import archived_files, file_timestamp
from ._format import ADD_OPS, OP_CONTINUE, RecordReader
from ..queue._journal import Item
from ._writer import run_blocking


class WrittenFile(Protocol):
    """What the reader needs of the journal it reads behind (a ``FileJournal``)."""

    name: str
    data_dir: str

    def size(self) -> int:
        """Bytes in the current file, pending ones included."""

    def written_size(self) -> int:
        """Bytes of the current file that are on disk (readable)."""

    def flush(self) -> bool:
        """Write what is pending; ``False`` if it could not be written."""

    def reader_moved(self, filename: str) -> None:
        """The reader went on to ``filename`` (the journal may pack what is behind it)."""

__all__ = ["ReadBehindReader"]

log = structlog.get_logger("kestrel_actors.journal")


def _pread(fd: int, length: int, offset: int) -> bytes:
    return run_blocking(os.pread, fd, length, offset)


class ReadBehindReader:
    """A forward cursor over a queue's journal files: ``(filename, offset)``."""

    def __init__(self, journal: WrittenFile, filename: str, offset: int) -> None:
        self.journal = journal
        self.filename = filename
        self.offset = offset
        self._fd: int | None = None
        self._reader: RecordReader | None = None
        self.stalled = False
        """Set when the next record could not be written (a failing writer, a hold): the
        reader returns ``None`` without having caught up, and read-behind goes on."""

    @property
    def in_current_file(self) -> bool:
        return self.filename == self.journal.name

    def next_item(self) -> Item | None:
        """The next item written since read-behind began, or ``None`` once caught up."""
        journal = self.journal
        while True:
            if self._reader is None and not self._open():
                if not self._advance():
                    return None
                continue
            reader = self._reader
            assert reader is not None
            current = self.in_current_file
            if current:
                end = journal.size()
                if self.offset >= end:
                    return None
                if self.offset >= journal.written_size():
                    # what is left to read is still pending (not every read: a remove just
                    # journaled is always pending, and a write per read would undo batching)
                    if not journal.flush() and self.offset >= journal.written_size():
                        self.stalled = True
                        return None
                reader.set_end(journal.written_size())
            record = reader.next()
            if record is not None:
                self.offset = reader.position
                if record.op in ADD_OPS or record.op == OP_CONTINUE:
                    return record.item
                continue
            if reader.problem is not None:
                log.error("read-behind found a broken record; leaving read-behind early",
                          queue=journal.name, file=self.filename, offset=reader.problem.offset,
                          reason=reader.problem.message)
                return None
            if current:
                written = journal.written_size()
                if written < journal.size():
                    # a record runs past what is written
                    if not journal.flush() and journal.written_size() == written:
                        self.stalled = True
                        return None
                continue
            if not self._advance():
                return None

    def file_rotated(self, new_filename: str, final_size: int) -> None:
        """The current file was renamed to ``new_filename`` and will not grow past ``final_size``."""
        if self.in_current_file:
            self.filename = new_filename
            if self._reader is not None:
                self._reader.set_end(final_size)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._reader = None

    # -- internals ----------------------------------------------------------------------------

    def _open(self) -> bool:
        path = os.path.join(self.journal.data_dir, self.filename)
        try:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            log.error("read-behind file vanished", queue=self.journal.name, file=self.filename)
            return False
        self._reader = RecordReader(self._fd, self.offset, read=_pread)
        return True

    def _advance(self) -> bool:
        """Move to the file after this one; False if there is none (the reader is lost)."""
        journal = self.journal
        if self.in_current_file:
            return False
        old = self.filename
        ts = file_timestamp(old, journal.name) or 0
        later = [f for f in archived_files(journal.data_dir, journal.name)
                 if (file_timestamp(f, journal.name) or 0) > ts]
        self.close()
        self.filename = later[0] if later else journal.name
        self.offset = 0
        log.info("read-behind moving to the next journal file", queue=journal.name, old=old, new=self.filename)
        journal.reader_moved(self.filename)
        return True
