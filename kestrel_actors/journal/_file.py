"""The journal of a queue on disk: Kestrel's records in ``<data_dir>/<name>`` (behaviour §6).

:class:`FileJournal` implements the :class:`~kestrel_actors.journal.Journal` base class. Each
call encodes its record and hands it to the queue's :class:`JournalWriter` greenlet, so the
queue actor never waits for the disk on an ordinary change; :meth:`after_durable` is how it
holds a reply until the ``sync_journal`` policy is met. :meth:`size` (``logsize``) counts
records handed over, written or not, so it is exact right after the call.

Rotation, rewrite and packing follow Kestrel's rules (behaviour §6.6). :meth:`check_rotate` applies them
after a change; a rotation or a rewrite runs in the calling greenlet (the queue actor), which
it suspends while the file operations and fsyncs run on the threadpool — as Kestrel does under
the queue's lock. Everything else (other queues, connections) keeps running.

A rewrite is crash-safe at every step: the current file is first renamed to an archive
``<name>.<ts>``, the snapshot is written to ``<name>~~<ms>`` and fsynced, renamed to
``<name>.<ts>.pack`` (the commit point: a listing now deletes every archive it replaces),
moved into place and finally renamed back to ``<name>``. Whatever moment a crash picks, the
files replay to the same queue.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import gevent
import structlog
from greenlet import getcurrent
from mypy_extensions import i64

from ..config import QueueConfig
from ..queue import Item, Journal, QueueCore, QueueLimits
from ._checkpoint import Checkpoint, CheckpointFile, remove_checkpoint, tail_crc, write_checkpoint
from ._failures import FailureLog
from ._files import (
    archived_files,
    delete_files,
    erase_files,
    file_size,
    file_timestamp,
    fsync_dir,
    open_regular,
    total_size,
    unique_file,
)
from ._format import (
    OP_CONFIRM_REMOVE,
    OP_REMOVE_TENTATIVE_XID,
    REMOVE_RECORD,
    AddRecords,
    encode_confirm_remove,
    encode_remove_tentative,
    encode_unremove,
    encode_xid_records,
    encode_xid_run,
)
from ._pack import commit_pack, open_reads_bytes, prepare_pack, write_snapshot
from ._readbehind import ReadBehindPosition, ReadBehindReader
from ._sequence import AddSequence
from ._writer import JournalWriter, Started, SyncStats, run_blocking, start_blocking

__all__ = ["FileJournal"]

log = structlog.get_logger("kestrel_actors.journal")

CHECKPOINT_BYTES = 4 * 1024 * 1024
"""Journal bytes written between two checkpoints (beside one at each rotation): what a restart
replays at most (about 35,000 records of 100 B)."""

DELETE_OFF_LOOP_FROM = 64 * 1024 * 1024
"""Bytes replaced by a rewrite from which they are deleted on the threadpool: below it they
are unlinked at once (a journal of up to ``max_journal_size``, 16 MiB by default, frees its
blocks in well under a millisecond), so the directory holds only the new file when the rewrite
answers, as in Kestrel."""

MAINTENANCE_RETRY = 1.0
"""Seconds a queue waits after a failed rotation or rewrite before it tries again (each try
fsyncs and renames; on a full or read-only disk every add would otherwise try)."""


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # a leftover empty archive or temp file: the next listing or replay deals with it


def _pread(fd: int, length: int, offset: int) -> bytes:
    """The read-behind reader's reads: on the threadpool, so the hub never waits for the disk."""
    return run_blocking(os.pread, fd, length, offset)


def _read_ahead(fd: int, length: int, offset: int) -> _ReadAhead | None:
    """The read-behind reader's next chunk, read on the threadpool while it reads the one it has
    (``None`` if no descriptor is left for it: the reader then reads the chunk itself)."""
    try:
        own = os.dup(fd)
    except OSError:
        return None
    return _ReadAhead(start_blocking(_pread_and_close, own, length, offset))


def _pread_and_close(fd: int, length: int, offset: int) -> bytes:
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


class _ReadAhead:
    """A chunk being read ahead (``journal._format.AheadRead``), through a descriptor of its
    own: the reader may close its file meanwhile (a rotation, the end of read-behind), and a
    read left running on a closed descriptor could read whatever file took its number."""

    __slots__ = ("_job", "_data")

    def __init__(self, job: Started) -> None:
        self._job = job
        self._data: bytes | None = None

    def result(self) -> bytes | None:
        data = self._data
        if data is None:
            job = self._job
            if not job.ready() and getcurrent() is gevent.get_hub():
                return None  # the hub waits for no file: the reader reads for itself
            try:
                data = job.get()
            except OSError:
                return None  # the reader's own read meets the error, where it is handled
            self._data = data
        return data


def _limits_of(queue: Any, fallback: QueueConfig) -> QueueLimits:
    """The limits of a queue that is not a ``QueueCore`` (a replay's, a test's): its ``config``
    if it has one, else the journal's."""
    return QueueLimits(getattr(queue, "config", None) or fallback)


def queue_length(queue: Any) -> int:
    """Items in ``queue`` including any only on disk: its ``length``, else ``len(items)``."""
    length = getattr(queue, "length", None)
    return len(queue.items) if length is None else length


class FileJournal(Journal):
    """One queue's journal files, written through a :class:`JournalWriter` greenlet.

    ``queue`` arguments (:meth:`check_rotate`, :meth:`rewrite`) need ``items`` (the in-memory
    items, head first), ``open_reads`` (xid → item), ``bytes`` (all of the queue's bytes) and
    optionally ``length`` (all items, including those only on disk); a ``QueueCore`` has them.
    """

    def __init__(self, data_dir: str, name: str, config: QueueConfig, *, archived_size: int | None = None,
                 max_timestamp: int = 0, read_behind: ReadBehindPosition | None = None,
                 clock: Callable[[], float] = time.monotonic, sequence: AddSequence | None = None,
                 xid: int = 0, checkpoint_due: int = CHECKPOINT_BYTES) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.name = name
        self.config = config
        self.path = os.path.join(data_dir, name)
        self._writer = JournalWriter(self.path, config.sync_journal, name, on_state=self._writer_state)
        self._adds = AddRecords()
        if archived_size is None:
            archives = archived_files(data_dir, name)
            archived_size = total_size(data_dir, archives)
            max_timestamp = max([max_timestamp] + [file_timestamp(f, name) or 0 for f in archives])
        self.archived_size = archived_size
        self._max_ts = max_timestamp
        self.rewrites = 0
        self.rotations = 0
        self.packs = 0
        self._clock = clock
        self._rewrites_blocked_until: float | None = None
        self._rewrite_from = 0
        """Rule (a) waits while the current file is below this many bytes: twice what the open
        reads take in a rewrite, when they were last counted (0: they are counted when it is due)."""
        self._rewrite_open = 0
        """The reads open when they were last counted: once fewer than half of them are left, the
        rest are counted again (a rewrite may be worth it now)."""
        self._maintenance_retry_at: float | None = None
        self._quiet_limits: QueueLimits | None = None
        """The live queue's limits that :attr:`_rotate_from` and :attr:`_rewrite_from_empty` were
        worked out from, with :attr:`_quiet_archived` (a reload makes new limits)."""
        self._quiet_archived = -1
        self._rotate_from: i64 = 0
        """The smallest size of the current file at which rule (b) or (c) may fire, for those
        limits and archived bytes."""
        self._rewrite_from_empty: i64 = 0
        """The smallest size at which rule (a) may fire (an empty queue)."""
        self.rotation_failures = FailureLog(name, "rotation")
        self.rewrite_failures = FailureLog(name, "rewrite")
        self.pack_failures = FailureLog(name, "pack")
        self._checkpoint = False
        self._sequence = sequence
        """The add records counted since the replay that gave it (None: no checkpoints)."""
        self._xid = xid
        self._checkpoint_due: i64 = checkpoint_due
        """Stream position (``writer.appended``) at which the next checkpoint is due."""
        self._checkpoint_at = 0
        """Stream position of the last checkpoint taken (0: none since this journal opened)."""
        self.checkpoints = 0
        self._pack_job: gevent.Greenlet[..., Any] | None = None
        self._checkpoint_job: gevent.Greenlet[..., Any] | None = None
        self._deleting: list[gevent.Greenlet[..., Any]] = []
        """The deletions of the files rewrites replaced (``<name>~~<ms>.gone``) still under way."""
        self._checkpoint_again: Any = None
        """The queue whose checkpoint was due while one was being written (a rotation's must
        not be skipped: the next one may be 4 MiB away)."""
        self._reader: ReadBehindReader | None = None
        if read_behind is not None:
            self._reader = self._read_behind_from(read_behind)
        self.closed = False
        self._hub = gevent.get_hub()
        self.metrics: Any = None
        """Where rotations and rewrites record their durations (``journal_rotation_usec``,
        ``journal_rewrite_usec``): anything with ``histogram(name).add(value)``."""

    def observe(self, metrics: Any, sync_stats: SyncStats | None) -> None:
        """Record this queue's rotation and rewrite times in ``metrics`` (per queue) and the
        writer's fdatasyncs in ``sync_stats`` (server-wide) from now on."""
        self.metrics = metrics
        self._writer.observe(sync_stats)

    def _timed(self, name: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.histogram(name).add(int((time.perf_counter() - started) * 1e6))

    # -- the Journal base class -------------------------------------------------------------

    def add(self, item: Item) -> None:
        sequence = self._sequence
        if sequence is not None:
            sequence.add(self.name, self.size())
        self._writer.append_record(self._adds.header(item), item.data)

    def remove(self) -> None:
        if self._sequence is not None:
            self._sequence.pop()
        self._writer.append(REMOVE_RECORD)

    def remove_many(self, count: int) -> None:
        # one chunk of ``count`` REMOVE records (one byte each): the same bytes as ``count``
        # removes, one append (a pipelined burst of GETs: QueueCore.remove_run)
        sequence = self._sequence
        if sequence is not None:
            sequence.pop_many(count)
        self._writer.append_many(REMOVE_RECORD * count, count)

    def remove_tentative(self, xid: int) -> None:
        if self._sequence is not None:
            self._sequence.pop()
        self._xid = xid
        self._writer.append(encode_remove_tentative(xid))

    def remove_tentative_many(self, xids: list[int]) -> None:
        """One chunk of records, not one per xid: encoded in one pass and written as one
        buffer (each record as :meth:`remove_tentative` writes it)."""
        if not xids:
            return
        sequence = self._sequence
        if sequence is not None:
            sequence.pop_many(len(xids))  # (a loop of pop() boxed its counter: ~90 an item)
        self._xid = xids[-1]
        self._writer.append_many(encode_xid_records(OP_REMOVE_TENTATIVE_XID, xids), len(xids))

    def remove_tentative_run(self, first: int, count: int) -> None:
        """:meth:`remove_tentative_many` of a run of xids: its records made from the run's
        ends, no xid converted one by one (``encode_xid_run``)."""
        if count <= 0:
            return
        sequence = self._sequence
        if sequence is not None:
            sequence.pop_many(count)
        self._xid = first + count - 1
        self._writer.append_many(encode_xid_run(OP_REMOVE_TENTATIVE_XID, first, count), count)

    def unremove(self, xid: int) -> None:
        if self._sequence is not None:
            self._sequence.front += 1
        self._writer.append(encode_unremove(xid))

    def confirm_remove(self, xid: int) -> None:
        self._writer.append(encode_confirm_remove(xid))

    def confirm_remove_many(self, xids: list[int]) -> None:
        if xids:
            self._writer.append_many(encode_xid_records(OP_CONFIRM_REMOVE, xids), len(xids))

    def confirm_remove_run(self, first: int, count: int) -> None:
        if count > 0:
            self._writer.append_many(encode_xid_run(OP_CONFIRM_REMOVE, first, count), count)

    def after_durable(self, callback: Callable[[], None],
                      on_error: Callable[[OSError], None] | None = None) -> None:
        self._writer.after_durable(callback, on_error)

    def durable_now(self) -> bool:
        return self._writer.durable_now()

    def hold(self) -> int:
        return self._writer.hold()

    def release(self, token: int) -> None:
        self._writer.release(token)

    def _writer_state(self, error: OSError | None) -> None:
        self.failure = error

    def size(self) -> int:
        """Bytes of the current file, counting records not yet written (``logsize``)."""
        writer = self._writer
        return writer.file_written + writer.appended - writer.written

    def close(self) -> None:
        """Write and fsync what is pending, close the file (waits for a running pack)."""
        if self.closed:
            return
        self.closed = True
        self._wait_for_checkpoint()
        self._wait_for_pack()
        self._wait_for_deletions()
        self._end_read_behind()
        self._writer.close(sync=True)

    def erase(self) -> None:
        """Close without syncing and delete every file of the queue."""
        self.closed = True
        self._wait_for_checkpoint()
        self._wait_for_pack()
        self._wait_for_deletions()
        self._end_read_behind()
        self._writer.close(sync=False)
        remove_checkpoint(self.data_dir, self.name)
        erase_files(self.data_dir, self.name)
        log.debug("journal erased", queue=self.name)

    # -- beyond the protocol ----------------------------------------------------------------

    @property
    def sync_journal(self) -> float | None:
        return self.config.sync_journal

    @property
    def writer(self) -> JournalWriter:
        return self._writer

    def written_size(self) -> int:
        """Bytes of the current file that have reached the OS."""
        return self._writer.file_written

    def total_size(self) -> int:
        """Current plus archived bytes (Kestrel's ``journal_size`` gauge)."""
        return self.size() + self.archived_size

    def flush(self) -> bool:
        """Write the pending records now (blocks the calling greenlet, not the hub).

        False if some are still unwritten (the writer is failing, or a hold keeps them).
        """
        if not self.closed:
            with self._writer.exclusive():
                pass
        return not self._writer.unwritten

    def check_rotate(self, queue: Any) -> None:
        """Kestrel's ``checkRotateJournal`` (behaviour §6.6): rewrite, rotate, or nothing.

        Call it in an add *before* journaling the item, and in a remove *after* journaling it
        (only when an item was removed). The limits come from ``queue.config`` when it has one,
        so a reload applies at once, as in Kestrel.
        """
        if not self.rotation_due(queue):
            return  # the common case, checked once per request
        if getcurrent() is self._hub:
            self.maintenance_due = True  # the hub may not wait for files: the queue's greenlet will
            return
        config = getattr(queue, "config", None) or self.config
        size = self.size()
        total = size + self.archived_size
        length = queue_length(queue)
        allowed = self._rewrites_allowed()
        if not config.disable_aggressive_rewrites:
            if size >= config.default_journal_size and length == 0 and self._rewrite_shrinks(queue, size):
                self.rewrite(queue)
            elif allowed and total > config.max_journal_size and queue.bytes < config.max_memory_size:
                self.rewrite(queue)
                self._block_rewrites(config)
            elif size > config.max_memory_size:
                self.rotate(checkpoint=total > config.max_journal_size)
        else:
            if allowed and size >= config.default_journal_size and length == 0:
                self.rewrite(queue)
                if self.size() >= config.default_journal_size // 2:
                    self._block_rewrites(config)
            elif allowed and total > config.max_journal_size and queue.bytes < config.max_memory_size:
                self.rewrite(queue)
                self._block_rewrites(config)
            elif size > config.max_memory_size:
                if length == 0:
                    self.rewrite(queue)
                if self.size() > config.max_memory_size:
                    self.rotate(checkpoint=self.size() + self.archived_size > config.max_journal_size)
        if self._writer.appended >= self._checkpoint_due:
            # a rotation's (and the first after a long replay) is waited for, as the rotation's
            # fsync is: under a stream of requests one left to its own greenlet may lag for
            # seconds; the one every 4 MiB is not
            self.checkpoint(queue, wait=self._checkpoint_due == 0, when_worth=True)

    def rotation_due(self, queue: Any) -> bool:
        """Whether :meth:`check_rotate` would rewrite or rotate now (or might: a rewrite may
        still be throttled). False while failing: nothing moves until the records are written."""
        if type(queue) is QueueCore:
            # a live queue, once per add or remove: nothing is due while the file stays below the
            # sizes the rules fire at (worked out again when the limits or the archived bytes
            # change) and no checkpoint is due. Every other condition below only says no, so the
            # rules fire at the same moments; native fields, not the rule's reads and the size()
            # call (check_rotate 189 -> 34 instructions an add, callgrind)
            # (chained reads, no locals: the compiled build borrows them, no reference counting)
            if queue.limits is not self._quiet_limits or self.archived_size != self._quiet_archived:
                self._quiet_for(queue.limits)
            appended = self._writer.appended
            size = self._writer.file_written + appended - self._writer.written
            if (appended < self._checkpoint_due and size < self._rotate_from
                    and (size < self._rewrite_from_empty or queue.length)):
                return False
        if self.closed or self._writer.error is not None:
            return False
        retry_at = self._maintenance_retry_at
        if retry_at is not None:
            if self._clock() < retry_at:
                return False
            self._maintenance_retry_at = None
        if type(queue) is QueueCore:
            # a live queue's compiled copy of its config: QueueConfig's fields are read by name,
            # and this runs for every request of a queue run on the hub (issue 24)
            limits = queue.limits
            length = queue.length
        else:
            limits = _limits_of(queue, self.config)
            length = queue_length(queue)
        size = self.size()
        return self._writer.appended >= self._checkpoint_due or not (
            size + self.archived_size <= limits.max_journal_size
            and size <= limits.max_memory_size
            and (length or size < limits.default_journal_size or self._open_reads_counted(queue, size))
        )

    def _quiet_for(self, limits: QueueLimits) -> None:
        """Work out the sizes :meth:`rotation_due` compares the current file with, from the rules
        below: (b) ``size + archived > max_journal_size``, (c) ``size > max_memory_size``, (a)
        ``size >= default_journal_size`` with an empty queue."""
        archived = self.archived_size
        self._quiet_limits = limits
        self._quiet_archived = archived
        self._rotate_from = min(limits.max_journal_size - archived, limits.max_memory_size) + 1
        self._rewrite_from_empty = limits.default_journal_size

    def _open_reads_counted(self, queue: Any, size: int) -> bool:
        """Whether the open reads, when last counted, would have taken more than half of a
        current file of ``size`` bytes, and at least half of them are still open: rule (a)
        waits (:meth:`_rewrite_shrinks`)."""
        return size < self._rewrite_from and 2 * len(queue.open_reads) >= self._rewrite_open

    def _rewrite_shrinks(self, queue: Any, size: int) -> bool:
        """Rule (a)'s last condition (behaviour §6.6): the rewrite of an empty queue writes its
        open reads (an ADDX and a REMOVE_TENTATIVE_XID each), and is worth it only if they take
        at most half of the current file's ``size``. A reader that holds thousands of reads open
        (the Spark source's read-ahead, ADR 0026) would otherwise have every read of its batch
        written again at each add or remove that finds the queue empty, to save little or
        nothing. Counted once, then again when the file has grown past twice what they took or
        fewer than half of them are left."""
        if self._open_reads_counted(queue, size):
            return False
        open_bytes = open_reads_bytes(queue.open_reads.items())
        if 2 * open_bytes <= size:
            return True
        self._rewrite_from = 2 * open_bytes
        self._rewrite_open = len(queue.open_reads)
        return False

    def _rewrites_allowed(self) -> bool:
        until = self._rewrites_blocked_until
        if until is None:
            return True
        if self._clock() >= until:
            self._rewrites_blocked_until = None
            return True
        return False

    def _block_rewrites(self, config: QueueConfig) -> None:
        delay = config.min_journal_compact_delay
        if delay is not None:
            self._rewrites_blocked_until = self._clock() + delay

    def rotate(self, checkpoint: bool = False) -> str | None:
        """Archive the current file as ``<name>.<ms>`` and start an empty one; returns the archive.

        A disk error leaves the files as they were (None; logged once per change of state,
        retried after :data:`MAINTENANCE_RETRY`); so does a writer that is failing, since its
        records must reach the current file first.
        """
        if self.closed:
            return None
        started = time.perf_counter()
        writer = self._writer
        dir_error: OSError | None = None
        try:
            with writer.exclusive():
                if writer.error is not None:
                    return None  # rotation_due says no until the writer writes again
                old_size = writer.file_written
                writer.sync_now()
                rotated = unique_file(self.data_dir, self.name, ".", min_ts=self._max_ts + 1)
                rotated_path = os.path.join(self.data_dir, rotated)
                try:
                    os.replace(self.path, rotated_path)
                except OSError:
                    _unlink_quietly(rotated_path)
                    raise
                try:
                    writer.switch_file(self.path)
                except OSError:
                    os.replace(rotated_path, self.path)  # back: the writer still appends to it
                    raise
                if self.config.sync_journal is not None:
                    try:
                        run_blocking(fsync_dir, self.data_dir)
                    except OSError as exc:  # rotated all the same: only the rename may not last
                        dir_error = exc
        except OSError as exc:
            self._maintenance_failed(self.rotation_failures, exc)
            return None
        self._max_ts = file_timestamp(rotated, self.name) or self._max_ts
        self.archived_size += old_size
        self.rotations += 1
        self._timed("journal_rotation_usec", started)
        if self._reader is not None:
            self._reader.file_finished(rotated, old_size)
        if self._sequence is not None:
            self._sequence.renamed(self.name, rotated)
            self._checkpoint_due = 0  # one at each rotation: check_rotate writes it
        if checkpoint and not self._checkpoint:
            self._checkpoint = True
        log.info("rotated journal", queue=self.name, file=rotated, bytes=old_size,
                 archived_bytes=self.archived_size, checkpoint=self._checkpoint)
        if dir_error is not None:
            self._maintenance_failed(self.rotation_failures, dir_error)
        else:
            self.rotation_failures.succeeded()
        return rotated

    def _maintenance_failed(self, failures: FailureLog, exc: BaseException) -> None:
        failures.failed(exc)
        self._maintenance_retry_at = self._clock() + MAINTENANCE_RETRY

    def rewrite(self, queue: Any) -> bool:
        """Replace every file by one holding the open reads and the items (behaviour §6.6 Rewrite).

        Refused (False) in read-behind, where the items on disk are not in ``queue.items``.
        An error before the snapshot is committed leaves the old files (False); one after it
        leaves a committed pack that the next listing finishes. Either is logged once per
        change of state. The files replaced are renamed out of the way (``<name>~~<ms>.gone``)
        and deleted on the threadpool: unlinking hundreds of megabytes on the queue's greenlet
        held the whole event loop while the disk freed their blocks.
        """
        if self.closed:
            return False
        if self._reader is not None:
            log.warning("journal rewrite skipped: the queue is in read-behind", queue=self.name)
            return False
        started = time.perf_counter()
        self._wait_for_checkpoint()  # it names the files a rewrite replaces
        self._wait_for_pack()
        self._rewrite_from = self._rewrite_open = 0  # rule (a) counts the open reads afresh
        open_items = sorted(queue.open_reads.items(), reverse=True)
        items = list(queue.items)
        data_dir = self.data_dir
        writer = self._writer
        after_commit: OSError | None = None
        gone: list[str] = []
        with writer.exclusive():
            if writer.unwritten and writer.error is None:
                return False  # a hold keeps records back: a snapshot would make them durable early
            try:
                writer.sync_now()
                rotated = unique_file(data_dir, self.name, ".", min_ts=self._max_ts + 1)
                rotated_path = os.path.join(data_dir, rotated)
                try:
                    os.replace(self.path, rotated_path)
                except OSError:
                    _unlink_quietly(rotated_path)
                    raise
                temp_path = None
                try:
                    temp_path = os.path.join(data_dir, unique_file(data_dir, self.name, "~~"))
                    size = run_blocking(write_snapshot, temp_path, open_items, items)
                    run_blocking(remove_checkpoint, data_dir, self.name)  # it names the files replaced
                    os.replace(temp_path, rotated_path + ".pack")  # the commit point
                except BaseException:
                    os.replace(rotated_path, self.path)  # keep the old files
                    if temp_path is not None:
                        _unlink_quietly(temp_path)
                    raise
            except Exception as exc:  # noqa: BLE001 - a disk error, or a bug (logged with its traceback)
                self._maintenance_failed(self.rewrite_failures, exc)
                return False
            try:
                run_blocking(fsync_dir, data_dir)
                # every archive renamed out of the way (deleted below, off the loop), the pack into place
                archived_files(data_dir, self.name, gone=gone)
                os.replace(rotated_path, self.path)
                run_blocking(fsync_dir, data_dir)
            except OSError as exc:
                after_commit = exc  # the pack is committed: the files replay to the snapshot
            # the old file is replaced: append to the snapshot, or to a new file after it
            writer.switch_file(self.path)
            if writer.unwritten:
                writer.discard_unwritten()  # the snapshot holds what they say, and is durable
            if after_commit is None and self._sequence is not None:
                # the snapshot is <name>: each open item an add taken at once, then the items
                self._sequence = AddSequence(added=len(open_items) + len(items), consumed=len(open_items))
                self._sequence.marks.append([0, self.name, 0])
            else:
                self._sequence = None  # where the snapshot ended up is not known: no checkpoints
        self._delete_later(gone)
        self._max_ts = file_timestamp(rotated, self.name) or self._max_ts
        self._update_archived_size()
        self.rewrites += 1
        self._timed("journal_rewrite_usec", started)
        log.info("rewrote journal", queue=self.name, items=len(items), open=len(open_items), bytes=size,
                 seconds=round(time.perf_counter() - started, 3))
        if after_commit is not None:
            self._maintenance_failed(self.rewrite_failures, after_commit)
        else:
            self.rewrite_failures.succeeded()
        self.pack_failures.succeeded()  # the archives a failed pack was for are compacted now
        return True

    def _delete_later(self, paths: list[str]) -> None:
        """Delete ``paths``: at once below :data:`DELETE_OFF_LOOP_FROM` bytes in all, else on
        the threadpool, from a greenlet of their own, which nothing waits for but :meth:`close`
        and :meth:`erase` (a file left by a crash is deleted at the next start)."""
        if not paths:
            return
        if sum(file_size(path) for path in paths) < DELETE_OFF_LOOP_FROM:
            delete_files(paths)
        else:
            self._deleting = [job for job in self._deleting if not job.dead]
            self._deleting.append(gevent.spawn(run_blocking, delete_files, paths))

    def _update_archived_size(self) -> None:
        try:
            self.archived_size = total_size(self.data_dir, archived_files(self.data_dir, self.name))
        except OSError:
            pass  # a pack could not be finished (it will be at the next listing): keep the old count

    # -- read-behind ------------------------------------------------------------------------

    @property
    def in_read_behind(self) -> bool:
        return self._reader is not None

    def start_read_behind(self) -> None:
        """Start reading behind the writer, from its current position (behaviour §5.8)."""
        if self._reader is None and not self.closed:
            self._reader = self._read_behind_from(ReadBehindPosition(self.name, self.size()))
            log.info("dropping to read-behind", queue=self.name, file=self.name, offset=self.size())

    def read_behind(self) -> Item | None:
        """The next item that is only on disk, or ``None`` (read-behind is then over)."""
        reader = self._reader
        if reader is None:
            return None
        item = reader.next_item()
        if item is None and reader.stalled:
            reader.stalled = False
            return None  # the next records are not written yet: still in read-behind
        if item is None:
            self._end_read_behind()
            log.info("coming out of read-behind", queue=self.name)
        return item

    def _read_behind_from(self, position: ReadBehindPosition) -> ReadBehindReader:
        return ReadBehindReader(self, position.filename, position.offset, read=_pread, read_ahead=_read_ahead)

    @property
    def current_file(self) -> str:
        """The file being written (the reader's leader): always ``<name>``."""
        return self.name

    def file_after(self, filename: str) -> str:
        """The file after ``filename``: the next archive by timestamp, else ``<name>``."""
        ts = file_timestamp(filename, self.name) or 0
        later = [f for f in archived_files(self.data_dir, self.name) if (file_timestamp(f, self.name) or 0) > ts]
        return later[0] if later else self.name

    def _end_read_behind(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def reader_moved(self, filename: str) -> None:
        """The reader moved on to ``filename``: pack what lies behind it if a checkpoint asks."""
        if not self._checkpoint or (self._pack_job is not None and not self._pack_job.dead):
            return
        limit = file_timestamp(filename, self.name)
        archives = archived_files(self.data_dir, self.name)
        behind = [f for f in archives if limit is None or (file_timestamp(f, self.name) or 0) < limit]
        if not behind:
            return
        self._checkpoint = False
        later = [f for f in archives if f not in behind]
        self._pack_job = gevent.spawn(self._pack, behind[-1], later)

    def _pack(self, upto: str, later_files: list[str]) -> None:
        """Pack the archives up to ``upto`` on the threadpool (the queue goes on meanwhile).

        The records written after them are read up to what is written now, so the pack can
        leave out what they discard; they are made durable before the pack is committed.
        """
        sources = []
        self._wait_for_checkpoint()  # it names the files a pack replaces
        try:
            for filename in later_files:
                fd = open_regular(os.path.join(self.data_dir, filename))
                sources.append((fd, os.fstat(fd).st_size))
            fd = open_regular(self.path)
            sources.append((fd, self._writer.file_written))
            budget = 2 * self.config.max_journal_size
            temp = run_blocking(functools.partial(prepare_pack, self.data_dir, self.name, upto, sources, budget))
            if temp is not None and self._writer.closed:
                os.unlink(temp)  # the later records can no longer be made durable: drop it
            elif temp is not None:
                with self._writer.exclusive():
                    self._writer.sync_now()
                run_blocking(commit_pack, self.data_dir, self.name, temp, upto)
                self.packs += 1
                self._forget_packed(upto)
        except Exception as exc:  # noqa: BLE001 - a failed pack leaves the files as they were
            self.pack_failures.failed(exc, upto=upto)  # the next checkpoint tries again
        else:
            self.pack_failures.succeeded()
        finally:
            for fd, _end in sources:
                os.close(fd)
        self._update_archived_size()
        if self._reader is not None and self._checkpoint and not self.closed:
            self._pack_job = None  # the reader moved on meanwhile: pack what it left behind now
            self.reader_moved(self._reader.filename)

    def _forget_packed(self, upto: str) -> None:
        """Drop the marks in the archives a pack replaced (their offsets changed): no checkpoint
        is written while the head is still in them."""
        sequence = self._sequence
        if sequence is None:
            return
        limit = file_timestamp(upto, self.name) or 0
        kept = [mark for mark in sequence.marks
                if mark[1] == self.name or (file_timestamp(mark[1], self.name) or 0) > limit]
        sequence.marks.clear()
        sequence.marks.extend(kept)

    # -- checkpoints (journal/_checkpoint.py) ----------------------------------------------------

    def checkpoint(self, queue: Any, wait: bool = True, when_worth: bool = False) -> bool:
        """Write the queue's checkpoint for the current end of the journal. The state is taken
        now; the fdatasync and the file are written by a greenlet of their own, which ``wait``
        waits for (blocking the calling greenlet, never the hub). False if none is written
        (logged when writing failed); without ``wait``, True once one is under way.

        ``when_worth`` (the checkpoints :meth:`check_rotate` makes due): none while the items it
        holds whole (the open reads, the front) take more than the journal written since the
        last one; it is due again once that much is written. A reader holding 50,000 reads of
        1 KiB open (the Spark source's read-ahead) had 52 MB written for every 4 MiB of journal
        (ADR 0026); a restart meanwhile replays from the last one, or the whole journal."""
        writer = self._writer
        self._checkpoint_due = writer.appended + CHECKPOINT_BYTES
        sequence = self._sequence
        if sequence is None or self.closed or (self._pack_job is not None and not self._pack_job.dead):
            return False
        if self._checkpoint_job is not None and not self._checkpoint_job.dead:
            if not wait:
                self._checkpoint_again = queue  # written once the one under way is
                return False
            self._wait_for_checkpoint()  # one at a time: they share the temporary file
        items = queue.items
        if len(items) < sequence.front:
            return False
        mark = sequence.head_mark()
        if mark is None:
            return False  # the head is in a packed archive
        front = list(itertools.islice(items, sequence.front))
        if when_worth:
            held = open_reads_bytes(queue.open_reads.items()) + sum(len(item.data) for item in front)
            if held > writer.appended - self._checkpoint_at:
                self._checkpoint_due = self._checkpoint_at + held
                return False
        self._checkpoint_at = writer.appended
        open_items = {xid: Item(item.data, item.add_time, item.expiry, xid) for xid, item in queue.open_reads.items()}
        later = [list(m) for m in sequence.marks if m[0] > mark[0]]
        state = Checkpoint(
            queue=self.name, files=[], tail_crc=0, head_offset=mark[2], head_skip=sequence.consumed - mark[0],
            length=queue_length(queue), bytes=queue.bytes, xid=self._xid, added=sequence.added,
            consumed=sequence.consumed, front=front, open_items=open_items, marks=[])
        job = gevent.spawn(self._write_checkpoint, state, mark[1], self.size(), later, self.rotations,
                           self.rewrites)
        self._checkpoint_job = job
        return bool(job.get()) if wait else True

    def _write_checkpoint(self, state: Checkpoint, head_file: str, offset: int, later: list[list[Any]],
                          rotations: int, rewrites: int) -> bool:
        """Make the records up to ``offset`` durable and write ``state`` (a greenlet of its own:
        the queue goes on meanwhile)."""
        try:
            return self._checkpoint_written(state, head_file, offset, later, rotations, rewrites)
        finally:
            queue, self._checkpoint_again = self._checkpoint_again, None
            if queue is not None and not self.closed:
                self._checkpoint_job = None
                self.checkpoint(queue, wait=False, when_worth=True)

    def _checkpoint_written(self, state: Checkpoint, head_file: str, offset: int, later: list[list[Any]],
                            rotations: int, rewrites: int) -> bool:
        writer = self._writer
        with writer.exclusive():  # the records up to ``offset`` reach the file
            if writer.error is not None or writer.unwritten:
                return False
        if self.closed or self.rotations != rotations or self.rewrites != rewrites:
            return False  # the files moved (a rotation writes a checkpoint of its own)
        try:
            fd = open_regular(self.path)  # the file of ``offset``: nothing ran since the check
        except OSError:
            return False
        try:
            written: bool = run_blocking(_write_checkpoint, self.data_dir, state, head_file, offset, later, fd)
        except OSError as exc:
            log.warning("cannot write the queue's checkpoint", queue=self.name, error=str(exc))
            return False
        finally:
            os.close(fd)
        if written:
            self.checkpoints += 1
        return written

    def _wait_for_checkpoint(self) -> None:
        # one finishing may start the next (one was due meanwhile): wait for that too
        while (job := self._checkpoint_job) is not None and not job.dead:
            job.join()

    def _wait_for_deletions(self) -> None:
        """Wait for the files replaced by rewrites to be deleted (blocking this greenlet)."""
        jobs, self._deleting = self._deleting, []
        gevent.joinall(jobs)

    def _wait_for_pack(self) -> None:
        # a finishing pack may start the next one (the reader moved on meanwhile): wait for
        # that too, or a rewrite or a close would run beside it
        while (job := self._pack_job) is not None:
            job.join()
            if self._pack_job is job:
                self._pack_job = None


def _write_checkpoint(data_dir: str, state: Checkpoint, head_file: str, offset: int,
                      later_marks: list[list[Any]], fd: int) -> bool:
    """fdatasync the current file (``fd``, which a rotation may rename meanwhile: it is named by
    inode), name the files from ``head_file`` to it in ``state`` and its marks after the head's
    (``[index, file name, offset]``) by file number, and write it (blocking)."""
    name = state.queue
    os.fdatasync(fd)  # the records up to ``offset`` are durable before a checkpoint names them
    current = os.fstat(fd).st_ino
    archives = archived_files(data_dir, name)
    if head_file == name:
        names: list[str] = []
    elif head_file in archives:
        names = archives[archives.index(head_file):]
    else:
        return False  # packed meanwhile
    files = []
    for filename in names:
        st = os.stat(os.path.join(data_dir, filename))
        if st.st_ino == current:
            break  # the current file, rotated meanwhile
        files.append(CheckpointFile(filename, st.st_ino, st.st_size))
    files.append(CheckpointFile(name, current, offset))
    number = {f.name: i for i, f in enumerate(files)}
    number[name] = len(files) - 1  # marks name the current file as it was named then
    state.files = files
    state.marks = [[index, number[filename], mark_offset] for index, filename, mark_offset in later_marks
                   if filename in number]
    state.tail_crc = tail_crc(fd, offset)
    write_checkpoint(data_dir, state)
    return True
