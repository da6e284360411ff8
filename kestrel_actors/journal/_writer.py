"""The journal writer of one queue: a greenlet that appends records and applies ``sync_journal``.

Why a greenlet and not a :class:`GeventActor`: the queue actor hands over one record per
change, up to hundreds of thousands a second. As an actor message each record would cost an
envelope, an inbox put and a future; here it costs a ``list.append``. The pending list *is*
the mailbox: the queue actor appends encoded records to it and, at the end of its turn, asks
:meth:`JournalWriter.after_durable`, which writes them in that turn when it may (no
``always``, a small batch, the file free) or sets an event; the writer greenlet, woken once,
takes everything that has piled up and writes it with one ``writev``.
Both run on the hub thread, so no lock guards the list. Only the blocking system calls leave
the hub: ``fdatasync`` always, and a ``write`` when the batch is large, on gevent's threadpool
(:func:`run_blocking`), or a turn's fdatasync on the hub's own threads (:class:`_SyncThreads`).

Sync policies (Kestrel's ``syncJournal``, behaviour §6.7), as positions in the byte stream
(``appended`` ≥ ``written`` ≥ ``synced``, never reset across files):

* ``None`` — never fsync; :meth:`after_durable` callbacks run once their bytes are written
  (``write()`` returned: the data survives a crash of this process, as with Kestrel);
* ``0.0`` — always: callbacks run only after an ``fdatasync`` covering their bytes. While one
  fdatasync runs, new records pile up and the next round writes and syncs them all at once:
  a group commit, one fdatasync for every writer that arrived meanwhile. The turn that asks
  :meth:`after_durable` writes and hands the fdatasync to a thread itself (:class:`_SyncThreads`) when the
  file is free, and the fdatasync's end (a hub callback) answers and starts the next round;
  the writer greenlet takes over only when that cannot be done (issue 24);
* ``P > 0`` — a timer fsyncs every ``P`` seconds while there are unsynced writes; callbacks
  do not wait for it (Kestrel 2.4 replies ``STORED`` after the write).

Callbacks run in the order they were registered, in the turn of the caller of
:meth:`after_durable` or on the hub itself (a callback of the loop), never on a greenlet of the
writer's or a caller of :meth:`exclusive`; they must not block. A callback tells actors, and an
idle actor told from a greenlet runs its handler right there: run on the writer greenlet, a
checkpoint's greenlet or inside ``_io``, a queue's handler could wait for that very greenlet or
lock (a rotation's checkpoint joined itself and the queue answered nothing again).

A write or fsync that fails (``ENOSPC``, ``EIO``) never blocks a caller: the writer enters the
*failing* state (logged once), keeps the unwritten records in order, cuts any half-written
record off the file, and retries them from its own greenlet with a back-off, leaving ``_io``
free meanwhile. Callers that gave :meth:`after_durable` an ``on_error`` are answered with the
error at once (a client gets ``SERVER_ERROR`` in bounded time); those without one wait until
their bytes are durable. The first write that succeeds again ends the state (logged once);
after a failed fdatasync (under ``always`` or a period alike) only an fdatasync that succeeds
ends it, and the records it should have covered are cut off the file and written again first
(:meth:`JournalWriter._distrust_unsynced`: Linux forgets a writeback error once reported).
Since records are only ever written in order, the file is always a prefix of what the queue
did: nothing after an unwritten record can reach the disk before it.

Once :meth:`JournalWriter.observe` gives it a :class:`SyncStats`, the writer reports Kestrel's
``PeriodicSyncStorage`` figures: each fdatasync's duration, each failed one, and, with
``always`` or a period, how long the records waited for their fdatasync beyond the period.
For that last one it notes the time of each written batch (not each record: one
``perf_counter`` per write, and only when an fdatasync will follow); ``never`` costs nothing.

A *hold* (:meth:`hold`, :meth:`release`) keeps the records appended from now on off the disk
until released: a queue that moves an expired item to ``expire_to_queue`` holds its REMOVE
until the target's ADD is durable, so a crash can duplicate the item but never lose it. A
hold still there after ``HOLD_PATIENCE`` seconds is dropped with a warning (two queues that
expire into each other would otherwise wait on each other for ever); the replies that waited
on it were held no longer than that.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from queue import SimpleQueue
from typing import Any, Final, Protocol, TypeVar

import gevent
import gevent.event
import gevent.lock
import structlog
from gevent import getcurrent as _getcurrent
from mypy_extensions import i64

from ..runtime import hub_runs
from ._failures import FailureLog, error_fields
from ._files import open_regular
from ._format import chunks_length, write_all

__all__ = ["ALWAYS", "NEVER", "PERIODIC", "JournalWriter", "Started", "SyncStats", "run_blocking", "start_blocking"]

_T = TypeVar("_T")

log = structlog.get_logger("kestrel_actors.journal")

NEVER: Final = "never"
ALWAYS: Final = "always"
PERIODIC: Final = "periodic"
INLINE_WRITE_MAX: Final = 1024 * 1024
"""Batches up to this size are written from the hub thread: a page-cache copy, a few hundred
microseconds at most, cheaper than the threadpool's hand-off (with 256 KiB, bursts of ten
clients pipelining 32 SETs of 1 KiB, up to 330 KiB, went to the threadpool)."""
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0)
HOLD_PATIENCE = 2.0
"""Seconds a hold may keep records back before it is dropped."""
GATHER_MAX: Final = 0.002
"""With ``always``, the longest a round waits for the sessions the last round answered (seconds;
the wait is also at most the last fdatasync's duration): see :meth:`JournalWriter._next_round`."""
ROUND_WORK_PER_RECORD: Final = 0.00002
"""With ``always``, the hub's work for one session's record in a round, as :meth:`JournalWriter.
_synced_from_turn` reckons it (seconds: a durable SET cost the hub 25–35 µs here, issue 24):
when a round's sessions need more of the hub than its fdatasync took, the next round no
longer waits for them, and its fdatasync runs while the hub answers and reads."""
OVERLAP_MIN_RECORDS: Final = 80
"""With ``always``, the fewest sessions' records (a round and what came during its fdatasync)
for which rounds overlap: with fewer, each half of the sessions is too small a burst, its
requests run one at a time and cost the hub more than the overlap saves. Against rounds that
wait for every session, overlapping measured 18–32% slower with 10 clients, 1–29% slower
with 30, 15–22% slower in two runs of three with 50, 20% slower and 5% faster with 70, and
11–16% faster with 100 (ADR 0016)."""
MAX_WRITE_MARKS: Final = 1024
"""Written batches remembered between two fdatasyncs, for ``item_fsync_delay_usec``; past
that (an fdatasync stalled for long), later batches are counted with the last one."""
MARK_GRAIN = 0.0001
"""Batches written closer together than this (or than 1/256 of the period) share one mark."""
SYNC_THREADS: Final = 10
"""Threads per hub that run the fdatasyncs handed off from a turn (:class:`_SyncThreads`), as
many as gevent's threadpool has: a turn that finds them all busy leaves its round to the
writer greenlet."""

_perf_counter: Final = time.perf_counter


class SyncStats(Protocol):
    """Where the writers report their fdatasyncs (the server's ``ServerStats``)."""

    def fsync_done(self, usec: int) -> None:
        """One fdatasync took ``usec`` µs (``fsync_delay_usec``)."""

    def fsync_waited(self, usec: int, records: int) -> None:
        """``records`` written records waited ``usec`` µs beyond the period for the fdatasync
        that covered them (``item_fsync_delay_usec``)."""

    def fsync_failed(self, exc: BaseException) -> None:
        """An fdatasync raised ``exc`` (``fsync_error_<class>``)."""


class _Raised:
    """What a function run on the threadpool raised, carried back to re-raise in the caller.
    (A plain class: mypyc cannot make a ``NamedTuple`` whose field is annotated ``Exception``.)"""

    __slots__ = ("exc",)

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


def _capturing(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - re-raised by run_blocking in the caller
        return _Raised(exc)


def run_blocking(fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn(*args)`` on gevent's threadpool, blocking only the calling greenlet.

    Called from the hub itself (where nothing may block on a switch) it runs inline. An
    exception is raised in the calling greenlet only: left to the threadpool, gevent's hub
    would also print its traceback to stderr, several lines a time, on every failed write of
    a full disk.
    """
    hub = gevent.get_hub()
    if gevent.getcurrent() is hub:
        return fn(*args)
    result = hub.threadpool.apply(_capturing, (fn, args))
    if type(result) is _Raised:
        raise result.exc
    return result  # type: ignore[no-any-return]  # what fn returned, through the threadpool


class Started:
    """A call :func:`start_blocking` started on gevent's threadpool; its result is taken later."""

    __slots__ = ("_job",)

    def __init__(self, job: Any) -> None:
        self._job = job

    def ready(self) -> bool:
        return bool(self._job.ready())

    def get(self) -> Any:
        """What the call returned, waiting for it (not on the hub: see :meth:`ready`); raises
        what it raised."""
        result = self._job.get()
        if type(result) is _Raised:
            raise result.exc
        return result


class _SyncThreads:
    """Where a turn's fdatasync runs (:meth:`JournalWriter._sync_from_turn`): native threads
    that wait on a C queue, and one async watcher of the hub's loop that they wake; its callback
    hands each outcome (``None``, or :class:`_Raised`) to the turn's callback, on the hub.

    gevent's threadpool did the same through interpreted code a round (a result with an async
    watcher of its own, a queue guarded by locks, a semaphore, the links' notification): ~200
    instructions a durable SET with 100 clients (callgrind, ADR 0018). Only the hub counts
    the idle threads (a thread is idle again once its outcome is handed over), so no lock."""

    def __init__(self, hub: Any) -> None:
        self._jobs: SimpleQueue[tuple[int, Callable[[Any], None]]] = SimpleQueue()
        self._done: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._watcher: Any = hub.loop.async_()
        self._watcher.start(self._deliver)
        self._watcher.ref = False  # held only while an fdatasync is out (:meth:`start`)
        self._threads = 0
        self._idle = 0
        self._out = 0

    def available(self) -> bool:
        """Whether an idle thread waits for :meth:`start`, started now if need be: ``False``
        when all are busy (or none could be started), and nothing has been done."""
        if self._idle:
            return True
        if self._threads >= SYNC_THREADS:
            return False
        try:
            threading.Thread(target=self._work, name="kestrel-fdatasync", daemon=True).start()
        except RuntimeError:  # "can't start new thread": the writer greenlet syncs instead
            return False
        self._threads += 1
        self._idle += 1
        return True

    def start(self, fd: int, on_done: Callable[[Any], None]) -> None:
        """Run ``fdatasync(fd)`` on a thread, then ``on_done(outcome)`` on the hub. Only right
        after :meth:`available` said so, in the same turn."""
        self._idle -= 1
        if not self._out:
            self._watcher.ref = True  # the loop runs until the outcome is handed over
        self._out += 1
        self._jobs.put((fd, on_done))

    def _work(self) -> None:
        jobs = self._jobs
        done = self._done
        watcher = self._watcher
        while True:
            fd, on_done = jobs.get()
            outcome: Any = None
            try:
                os.fdatasync(fd)
            except Exception as exc:  # noqa: BLE001 - handed to on_done, on the hub
                outcome = _Raised(exc)
            done.append((on_done, outcome))
            watcher.send()

    def _deliver(self) -> None:
        done = self._done
        while len(done):
            on_done, outcome = done.popleft()
            self._idle += 1
            self._out -= 1
            if not self._out:
                self._watcher.ref = False
            try:
                on_done(outcome)
            except Exception:
                log.exception("an fdatasync's answer failed")


_sync_threads: weakref.WeakKeyDictionary[Any, _SyncThreads] = weakref.WeakKeyDictionary()
"""Each hub's :class:`_SyncThreads`, made by the first writer on it."""


def _sync_threads_of(hub: Any) -> _SyncThreads:
    threads = _sync_threads.get(hub)
    if threads is None:
        threads = _sync_threads[hub] = _SyncThreads(hub)
    return threads


def start_blocking(fn: Callable[..., Any], *args: Any) -> Started:
    """Start ``fn(*args)`` on gevent's threadpool and return at once: :func:`run_blocking` for
    a caller that has something to do meanwhile (read-behind reads the next chunk so)."""
    return Started(gevent.get_hub().threadpool.spawn(_capturing, fn, args))


class _FileLock:
    """The writer's hold on its file (``JournalWriter._io``): a gevent ``Semaphore`` that also
    says natively whether it is held. The request path asks that of every lone request
    (:meth:`JournalWriter.durable_now`); the semaphore's ``locked()`` was a call by name (ADR 0020)."""

    __slots__ = ("_semaphore", "held")

    def __init__(self) -> None:
        self._semaphore = gevent.lock.Semaphore()
        self.held = False
        """From the moment :meth:`acquire` returns until :meth:`release`."""

    def acquire(self) -> None:
        """Take the file, waiting (this greenlet only) while another holds it."""
        self._semaphore.acquire()
        self.held = True

    def release(self) -> None:
        self.held = False
        self._semaphore.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class JournalWriter:
    """Appends to the current journal file of one queue, from its own greenlet."""

    def __init__(self, path: str, sync_journal: float | None, queue: str,
                 on_state: Callable[[OSError | None], None] | None = None) -> None:
        self.path = path
        self.queue = queue
        if sync_journal is None:
            self.mode, self.period = NEVER, 0.0
        elif sync_journal <= 0:
            self.mode, self.period = ALWAYS, 0.0
        else:
            self.mode, self.period = PERIODIC, float(sync_journal)
        self._fd = self._open(path)
        # the byte and record counts in native 64-bit integers: the request path adds to them
        # and compares them several times a record (boxed, each a tag test or an allocation)
        self.file_written: i64 = os.fstat(self._fd).st_size
        """Bytes of the current file that have reached the OS."""
        self._synced_file_size: i64 = self.file_written
        """Bytes of the current file that the last good fdatasync covered (or that were there)."""
        self._unsynced: list[bytes] | None = None
        """With a sync policy: the chunks written since the last good fdatasync, in order, kept
        to be written again if it fails (:meth:`_distrust_unsynced`)."""
        self._unsynced_records = 0
        """Records in :attr:`_unsynced`."""
        self._marked_again = 0
        """Records at the head of the pending ones that are written again and were marked
        (``_marks``) the first time: their wait runs from that first write."""
        self.appended: i64 = 0
        self.written: i64 = 0
        self.synced: i64 = 0
        self.fsyncs = 0
        self.writes = 0
        self.error: OSError | None = None
        """Set while the writer is failing (a write or fsync failed and is being retried)."""
        self._on_state = on_state
        self._failed_at = 0.0
        self._attempt = 0
        self._sync_failing = False
        self._loop_failures = FailureLog(queue, "writer")
        """A bug in the writer's loop (not a disk error: those are :attr:`error`)."""
        self._torn = False
        """A failed write may have left part of a record that ftruncate could not cut yet."""
        self._holds = 0
        self._hold_round = 0
        """Counts holds that ended all at once, so a release of an ended one is ignored."""
        self._held_at: int | None = None
        """While holds are active: the stream position from which nothing is written."""
        self._chunks: list[bytes] = []
        self._waiters: deque[tuple[int, Callable[[], None], Callable[[OSError], None] | None]] = deque()
        self._wake = gevent.event.Event()
        self._hub = gevent.get_hub()
        self._sync_threads = _sync_threads_of(self._hub)
        self._hub_runs = hub_runs()
        """The hub's inline runs, told when a hub callback of this writer answers (:meth:`_sync_returned`)."""
        self._syncing = False
        """An fdatasync handed to a thread from a turn is in flight (it holds ``_io``)."""
        self._gathering: Any = None
        """With ``always``, between rounds: the timer that ends the wait for the last round's
        sessions (:meth:`_next_round`)."""
        self._records: i64 = 0
        """Records appended, ever (an ADD is one record in two chunks: :meth:`append_record`)."""
        self._written_records: i64 = 0
        """Records written, ever."""
        self._held_records: i64 = 0
        """While holds are active: :attr:`_records` when the first began (at :attr:`_held_at`)."""
        self._round_records: i64 = 0
        """Records covered by the last round an fdatasync handed off from a turn made durable."""
        self._round_from: i64 = 0
        """:attr:`_records` when that round wrote its records."""
        self._last_sync = 0.0
        """How long that round's fdatasync took (seconds)."""
        self._overlap = False
        """With ``always``: the sessions take the hub longer than an fdatasync, so a round starts
        as soon as records wait, before the last round's answers go (:meth:`_synced_from_turn`)."""
        self._io = _FileLock()
        self._fire_due = False
        """A loop callback of the hub's will run the callbacks now durable (:meth:`_fire`)."""
        self._timer: gevent.Greenlet[..., Any] | None = None
        self.sync_stats: SyncStats | None = None
        self._marks: list[list[float]] | None = None
        """While observed with a sync policy: ``[time, records]`` of each batch written since
        the last fdatasync (close ones merged)."""
        self._grain = max(self.period / 256, MARK_GRAIN)
        self.closed = False
        self._greenlet = gevent.spawn(self._run)

    def observe(self, stats: SyncStats | None) -> None:
        """Report fdatasyncs to ``stats`` from now on (``None``: stop)."""
        self.sync_stats = stats
        self._marks = [] if stats is not None and self.mode != NEVER else None

    @staticmethod
    def _open(path: str) -> int:
        # a named pipe in the journal's place must raise, not wait for a reader for ever
        return open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    # -- called by the journal (on the hub thread) -----------------------------------------

    def append(self, data: bytes) -> None:
        """Queue ``data`` for the file; returns at once. Ignored once closed.

        Nothing is scheduled here: the queue actor ends every turn that appended with
        :meth:`after_durable`, which writes the records in that turn or wakes the writer
        (issue 24: a lone request costs the loop no callback of the journal's).
        """
        if self.closed:
            return
        self._chunks.append(data)
        self.appended += len(data)
        self._records += 1

    def append_many(self, data: bytes, records: int) -> None:
        """:meth:`append` of ``records`` whole records joined into ``data`` (one chunk of the
        ``writev``, where a chunk per record of 5 bytes cost a buffer lookup each)."""
        if self.closed:
            return
        self._chunks.append(data)
        self.appended += len(data)
        self._records += records

    def append_record(self, head: bytes, body: bytes) -> None:
        """:meth:`append` of ``head + body``, kept as two chunks of the same ``writev``: an
        ADD's header and its item's data, which gluing would copy once more (issue 24)."""
        if self.closed:
            return
        chunks = self._chunks
        chunks.append(head)
        chunks.append(body)
        self.appended += len(head) + len(body)
        self._records += 1

    @property
    def pending(self) -> int:
        """Bytes handed over but not yet written."""
        return self.appended - self.written

    @property
    def unwritten(self) -> bool:
        """Whether records are still waiting for the file (a failure or a hold keeps them)."""
        return bool(self._chunks)

    def after_durable(self, callback: Callable[[], None],
                      on_error: Callable[[OSError], None] | None = None) -> None:
        """Call ``callback`` once everything appended so far is as durable as the policy says.

        Without ``always``, only ``write()`` must have returned: when the file is free and the
        batch small, the caller writes it now (a page-cache copy) rather than wait a greenlet
        switch for the writer, which takes a hop off every reply's path.

        With ``on_error``, a failing writer calls ``on_error(exc)`` instead, at once (or when
        the failure happens), and ``callback`` never; without it the wait lasts until the
        bytes are durable, however long the failure lasts.
        """
        if self.durable_now():
            callback()
            return
        target = self.appended
        if self.mode == ALWAYS and self.synced < target and not self._syncing:
            if self._gathering is None:
                self._next_round()
            elif self._round_ready():
                self._end_gathering()  # the last round's sessions are back
        if on_error is not None and self.error is not None:
            on_error(self.error)
        else:
            self._waiters.append((target, callback, on_error))
            if not self._syncing and self._gathering is None:
                # the writer greenlet takes everything pending when it runs; with a sync in
                # flight, its end starts the next round, which covers these records too
                self._wake.set()

    def durable_now(self) -> bool:
        """Whether everything appended so far is as durable as the policy says, after writing
        it now when that is an inline write (see :meth:`after_durable`)."""
        target = self.appended
        if (
            self.mode != ALWAYS
            and self.written < target <= self.written + INLINE_WRITE_MAX
            and self.error is None
            and self._held_at is None
            and not self.closed
            and not self._io.held
        ):
            # no need to take _io: an inline write never waits (at most INLINE_WRITE_MAX bytes,
            # no threadpool), so no other greenlet runs before it ends to see the lock, and a
            # gevent Semaphore cost a lone request 3% of its CPU (issue 24)
            self._write_pending()
            if self.mode == PERIODIC and self._timer is None and self.synced < self.written:
                self._timer = gevent.spawn_later(self.period, self._periodic_sync)
        done = self.synced if self.mode == ALWAYS else self.written
        return done >= target or self.closed

    def _sync_from_turn(self) -> None:
        """With ``always``: write what is pending now and hand its fdatasync to a thread
        (:class:`_SyncThreads`), from the caller's turn (the hub's included), its end answered by a hub callback
        (:meth:`_synced_from_turn`) rather than the writer greenlet: a lone durable request
        costs no greenlet switch. Does nothing when the writer greenlet must do it (a failure,
        a hold, the file busy, a large batch, no free thread)."""
        threads = self._sync_threads
        if (
            not threads.available()
            or self.error is not None
            or self._held_at is not None
            or self.closed
            or self._io.held
            or self.appended - self.written > INLINE_WRITE_MAX
        ):
            return
        self._io.acquire()
        if not self._write_pending() or self.synced >= self.written:
            self._io.release()  # a failed write leaves the retries to the writer greenlet
            return
        self._syncing = True
        target = self.written
        self._round_records = self._records - self._round_from
        self._round_from = self._records
        started = _perf_counter()
        threads.start(self._fd, lambda outcome: self._sync_returned(target, started, outcome))

    def _sync_returned(self, target: int, started: float, outcome: Any) -> None:
        """:meth:`_synced_from_turn`, a hub callback: the tells its answers make know that the
        hub makes them (``runtime._HubRuns.callback_begins``)."""
        runs = self._hub_runs
        runs.callback_begins()
        try:
            self._synced_from_turn(target, started, outcome)
        finally:
            runs.callback_ends()

    def _synced_from_turn(self, target: int, started: float, outcome: Any) -> None:
        """The fdatasync :meth:`_sync_from_turn` handed off has returned (on the hub).

        ``_syncing`` stays set while the answers go: a session answered here may send its next
        request at once, and its record waits for the next round with the rest, as it would
        have for the writer greenlet (one fdatasync for all that came meanwhile).

        When many sessions (:data:`OVERLAP_MIN_RECORDS`) need more of the hub than an fdatasync
        takes (their records times :data:`ROUND_WORK_PER_RECORD`, against this fdatasync's
        time), the rounds *overlap*: the records that came during this fdatasync start their
        round before the answers go, and between rounds a record starts one at once. Then one
        half of the sessions' records is on the disk while the hub answers and reads the other
        half, where a round that waited for every session left the hub idle through each
        hand-off and fdatasync (issue 24: 0.8–1.0 ms of a 3.1–3.7 ms round with 100 clients).
        With fewer sessions the rounds wait for them (:meth:`_next_round`), which served 10,
        30 and 50 clients better."""
        self._io.release()
        if type(outcome) is _Raised:
            self._syncing = False
            exc = outcome.exc
            if self.sync_stats is not None:
                self.sync_stats.fsync_failed(exc)
            if isinstance(exc, OSError):
                self._sync_failed(exc)  # the writer greenlet retries, with a back-off
            else:
                self._loop_failures.failed(exc)
                self._wake.set()
            return
        self._last_sync = _perf_counter() - started
        self._synced(target, started)
        if self.error is not None and not self._chunks and self._held_at is None:
            self._recovered()
        came = self._records - self._round_from
        # the sessions of this round and of what came during its fdatasync: if serving them
        # takes the hub longer than an fdatasync, the rounds overlap the hub's work
        sessions = self._round_records + came
        self._overlap = (sessions >= OVERLAP_MIN_RECORDS
                         and float(sessions) * ROUND_WORK_PER_RECORD > self._last_sync)
        if came and self._overlap:
            # the next round's fdatasync runs while this round's answers go and the sessions'
            # next requests are read (issue 24: the hub idled through every fdatasync)
            self._syncing = False
            self._start_round()
            self._fire_on_hub()
            return
        self._fire_on_hub()
        self._syncing = False
        if self._waiters:  # what came during this fdatasync, and more: the next round covers it all
            self._next_round()

    def _next_round(self) -> None:
        """Start the next round from a turn, or wait for it a moment (records are pending, and
        no round is in flight: at a round's end, or as records come between rounds).

        The sessions a round has just answered send their next records within a moment, but
        no sooner than the answers reach them; a round started at once (or by the first record
        back) would leave the others to the round after, so that, under steady load, each
        session's records made every other round (with 100 clients, 42–50 records a round). So
        the next round waits until as many records have come since the last one started as
        that round had, or for as long as its fdatasync took (:data:`GATHER_MAX` at most). A
        lone client's record, one a round, starts its round the moment it comes, and so does
        any record while the rounds overlap (:meth:`_synced_from_turn`)."""
        if self._round_ready() or self.closed:
            self._start_round()
            return
        timer = self._hub.loop.timer(min(self._last_sync, GATHER_MAX))
        self._gathering = timer
        timer.start(self._end_gathering)

    def _round_ready(self) -> bool:
        """As many records have come since the last round started as that round covered, or
        the rounds overlap (then a round waits for nobody)."""
        return self._overlap or self._records - self._round_from >= self._round_records

    def _end_gathering(self) -> None:
        timer = self._gathering
        if timer is None:
            return
        self._gathering = None
        timer.close()
        self._start_round()

    def _start_round(self) -> None:
        self._sync_from_turn()
        if not self._syncing:
            self._wake.set()  # the writer greenlet does what a turn could not

    def hold(self) -> int:
        """Keep every record appended from now on off the disk until :meth:`release` is
        called with the token this returns."""
        if self.closed:
            return -1
        self._holds += 1
        if self._held_at is None:
            self._held_at = self.appended
            self._held_records = self._records
            gevent.spawn_later(HOLD_PATIENCE, self._hold_overdue, self._hold_round)
        return self._hold_round

    def release(self, token: int) -> None:
        """End one :meth:`hold`; once none is left, the held records go to the file."""
        if token != self._hold_round or self._holds <= 0:
            return  # that hold was dropped (overdue, or the file closed)
        self._holds -= 1
        if self._holds == 0:
            self._end_holds()

    def _end_holds(self) -> None:
        self._holds = 0
        self._held_at = None
        self._hold_round += 1
        if self._chunks and not self.closed:
            self._wake.set()

    def _hold_overdue(self, hold_round: int) -> None:
        if self._hold_round == hold_round and self._held_at is not None and not self.closed:
            log.warning("journal hold overdue; writing the held records", queue=self.queue,
                        holds=self._holds, seconds=HOLD_PATIENCE)
            self._end_holds()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the file: pending records are written first, and no I/O runs meanwhile.

        The journal uses it to rotate or rewrite; it blocks the calling greenlet (never the
        hub) while an fdatasync or a large write in flight finishes. A failing writer (or a
        hold) may leave records unwritten (:attr:`unwritten`).
        """
        with self._io:
            self._write_pending()
            yield
        self._fire()

    def sync_now(self) -> None:
        """fdatasync the current file (call inside :meth:`exclusive`)."""
        if self.synced < self.written:
            target = self.written
            started = _perf_counter()
            try:
                run_blocking(os.fdatasync, self._fd)
            except Exception as exc:
                if self.sync_stats is not None:
                    self.sync_stats.fsync_failed(exc)
                if isinstance(exc, OSError):
                    self._sync_failed(exc)
                raise
            self._synced(target, started)

    def _synced(self, target: int, started: float) -> None:
        """An fdatasync that started at ``started`` covered the stream up to ``target``."""
        stats = self.sync_stats
        if stats is not None:
            stats.fsync_done(int((_perf_counter() - started) * 1e6))
            marks = self._marks
            if marks:
                # as Kestrel: from the write to the fdatasync's start, less the period
                period = self.period
                for written_at, records in marks:
                    behind = started - written_at - period
                    stats.fsync_waited(int(behind * 1e6) if behind > 0 else 0, int(records))
                marks.clear()
        self.fsyncs += 1
        self.synced = target
        self._synced_file_size = self.file_written - (self.written - target)
        self._unsynced = None
        self._unsynced_records = 0
        self._sync_failing = False

    def _sync_failed(self, exc: OSError) -> None:
        """An fdatasync failed: the writer is failing until one succeeds, and what it should
        have covered is written again first (:meth:`_distrust_unsynced`)."""
        self._distrust_unsynced()
        self._sync_failing = True
        self._failing(exc)

    def _distrust_unsynced(self) -> None:
        """Treat the bytes written since the last good fdatasync as never written.

        Linux reports a writeback error to one fdatasync and then forgets it: the dirty pages
        may have been dropped (marked clean, their bytes never on the disk), and the next
        fdatasync succeeds without writing them (PostgreSQL's "fsyncgate", 2018). Retrying the
        fdatasync proves nothing; so the file is cut back to what the last good one covered
        and those records go back in front of the pending ones, to be written (new pages,
        dirty again) and synced before anything after them is answered. A cut that fails is
        retried before the next write (``_torn``), so nothing is written after a gap."""
        unsynced = self._unsynced
        if unsynced is None:
            return
        self._unsynced = None
        unsynced += self._chunks
        self._chunks = unsynced
        self._written_records -= self._unsynced_records
        self._marked_again = self._unsynced_records
        self._unsynced_records = 0
        self.written = self.synced
        self.file_written = self._synced_file_size
        self._torn = True
        self._undo_partial_write()

    def switch_file(self, path: str) -> None:
        """Append to ``path`` from now on (inside :meth:`exclusive`). If it cannot be opened
        (no inode left, a read-only file system) this raises and the current file stays."""
        if self.closed:
            raise OSError(errno.EBADF, "journal writer closed", self.path)
        fd = self._open(path)
        os.close(self._fd)
        self.path = path
        self._fd = fd
        self.file_written = self._synced_file_size = os.fstat(fd).st_size
        self._torn = False

    def discard_unwritten(self) -> None:
        """Drop the unwritten records: a snapshot just made durable holds what they say
        (a rewrite; call inside :meth:`exclusive`, after :meth:`switch_file`)."""
        self._chunks = []
        self._unsynced = None
        self._unsynced_records = self._marked_again = 0
        self._sync_failing = False
        self._written_records = self._records
        self.written = self.synced = self.appended
        self._recovered()

    def close(self, sync: bool = True) -> None:
        """Write what is pending, fsync (unless ``sync`` is false), close; fire every callback.

        Holds are ignored: the queue that would release them is closing too. If the disk
        still refuses the records after a few tries, they are lost (and logged).
        """
        if self.closed:
            return
        self.closed = True
        if self._gathering is not None:
            self._gathering.close()
            self._gathering = None
        self._end_holds()
        with self._io:
            for attempt in range(3):
                if self._write_pending() or not sync:
                    break
                gevent.sleep(RETRY_DELAYS[attempt])
            if self._chunks:
                log.error("journal closed with unwritten records; DATA MAY HAVE BEEN LOST!",
                          queue=self.queue, bytes=self.appended - self.written)
                self._chunks = []
                self._written_records = self._records
            if sync:
                try:
                    self.sync_now()
                except OSError as exc:
                    log.error("journal fsync failed at close", queue=self.queue, error=str(exc))
            os.close(self._fd)
            # the number may be another file's from now on: a late truncate, switch or sync
            # must fail (EBADF), not act on whatever file took it
            self._fd = -1
        self.written = self.synced = self.appended
        if self._timer is not None:
            self._timer.kill(block=False)
        self._fire()
        self._wake.set()

    # -- the writer greenlet ----------------------------------------------------------------

    def _run(self) -> None:
        while not self.closed:
            self._wake.wait()
            self._wake.clear()
            if self.closed:
                return
            try:
                ok = True
                if self._chunks and self._held_at != self.written:
                    with self._io:
                        ok = self._write_pending()
                if ok and (self.mode == ALWAYS or self._sync_failing) and self.synced < self.written:
                    # a sync period that failed is retried here, as always is, with the back-off
                    with self._io:
                        ok = self._sync_once()
                elif ok and self.mode == PERIODIC and self.synced < self.written and self._timer is None:
                    self._timer = gevent.spawn_later(self.period, self._periodic_sync)
                if not ok:
                    self._fire()
                    self._back_off()  # outside ``_io``: a rotation or a close may go ahead
                    continue
                self._loop_failures.succeeded()
            except Exception as exc:  # noqa: BLE001 - the writer must outlive any one failure
                self._loop_failures.failed(exc)  # a traceback once, not once a second
                gevent.sleep(RETRY_DELAYS[-1])
                self._wake.set()
            self._fire()

    def _back_off(self) -> None:
        gevent.sleep(RETRY_DELAYS[min(self._attempt, len(RETRY_DELAYS) - 1)])
        self._attempt += 1
        self._wake.set()

    def _write_pending(self) -> bool:
        """One try at writing the pending records (the caller holds ``_io``, or writes inline).

        Returns False if a write failed: the records stay pending, in order, and the writer
        is failing; a caller never waits here for the disk to recover.
        """
        if self._torn and not self._undo_partial_write():
            return False
        while self._chunks:
            chunks = self._chunks
            held_at = self._held_at
            if held_at is not None:
                if self.written >= held_at:
                    return True
                chunks, position = [], self.written
                for chunk in self._chunks:
                    if position + len(chunk) > held_at:
                        break
                    chunks.append(chunk)
                    position += len(chunk)
                self._chunks = self._chunks[len(chunks):]
                records: int = self._held_records - self._written_records  # int: a mark's count
            else:
                self._chunks = []
                records = self._records - self._written_records
            size = chunks_length(chunks)
            target = self.written + size
            try:
                if size <= INLINE_WRITE_MAX:
                    write_all(self._fd, chunks, size)
                else:
                    run_blocking(write_all, self._fd, chunks, size)
            except OSError as exc:
                self._chunks[:0] = chunks
                self._torn = True
                self._undo_partial_write()
                self._failing(exc)
                return False
            self.writes += 1
            self.file_written += target - self.written
            self.written = target
            self._written_records += records
            if self.mode != NEVER:  # kept until an fdatasync covers them (a reference, no copy)
                unsynced = self._unsynced
                if unsynced is None:
                    self._unsynced = chunks
                else:
                    unsynced += chunks
                self._unsynced_records += records
            marks = self._marks
            if marks is not None and self._marked_again:
                again = min(records, self._marked_again)
                self._marked_again -= again
                records -= again
            if marks is not None and records:
                now = _perf_counter()
                if marks and (now - marks[-1][0] < self._grain or len(marks) >= MAX_WRITE_MARKS):
                    marks[-1][1] += records
                else:
                    marks.append([now, records])
            if self.error is not None and self._held_at is None and self.mode != ALWAYS and not self._sync_failing:
                self._recovered()
        return True

    def _undo_partial_write(self) -> bool:
        """Cut a half-written batch off, so no record is ever torn in the middle of the file."""
        try:
            os.ftruncate(self._fd, self.file_written)
        except OSError as exc:
            log.debug("journal truncate failed; will retry", queue=self.queue, error=str(exc))
            return False
        self._torn = False
        return True

    def _sync_once(self) -> bool:
        try:
            self.sync_now()
        except OSError:
            return False  # sync_now has made the writer failing
        if self.error is not None and not self._chunks and self._held_at is None:
            self._recovered()
        return True

    def _failing(self, exc: OSError) -> None:
        """A write or fsync failed: answer the callers that asked to know, log a change once."""
        if self.error is None:
            self._failed_at = time.monotonic()
            log.error("journal write failing; writes to this queue get SERVER_ERROR until it recovers",
                      queue=self.queue, **error_fields(exc), pending_bytes=self.pending)
            if self._on_state is not None:
                self._on_state(exc)
        self.error = exc
        waiters = self._waiters
        if any(on_error is not None for _t, _c, on_error in waiters):
            kept: deque[tuple[int, Callable[[], None], Callable[[OSError], None] | None]] = deque()
            told: list[Callable[[OSError], None]] = []
            for waiter in waiters:
                on_error = waiter[2]
                if on_error is None:
                    kept.append(waiter)
                else:
                    told.append(on_error)
            # kept first: a callback may run its queue at once, which waits again
            self._waiters = kept
            if _getcurrent() is self._hub:
                self._tell_failure(told, exc)
            else:  # as :meth:`_fire`: never a queue's handler on this greenlet, inside ``_io``
                self._hub.loop.run_callback(self._tell_failure, told, exc)
        self._wake.set()  # the writer greenlet retries, with a back-off

    def _tell_failure(self, told: list[Callable[[OSError], None]], exc: OSError) -> None:
        for on_error in told:
            try:
                on_error(exc)
            except Exception:
                log.exception("journal failure callback failed", queue=self.queue)

    def _recovered(self) -> None:
        self._attempt = 0
        if self.error is None:
            return
        self.error = None
        log.warning("journal write recovered", queue=self.queue,
                    failed_seconds=round(time.monotonic() - self._failed_at, 3))
        if self._on_state is not None:
            self._on_state(None)

    def _periodic_sync(self) -> None:
        """One run of the periodic fsync; reschedules itself while writes keep coming.

        One that fails makes the writer failing, as with ``always`` (``/health``, the
        ``journal_failing`` gauge, adds refused): the writer greenlet then writes the records
        again and retries the fdatasync with its back-off, and the timer waits for it."""
        try:
            with self._io:
                if not self.closed and not self._sync_failing:
                    self.sync_now()
        except OSError:
            pass  # sync_now has made the writer failing; its greenlet retries
        finally:
            self._timer = None
        if not self.closed and not self._sync_failing and self.synced < self.appended:
            self._timer = gevent.spawn_later(self.period, self._periodic_sync)

    def _fire(self) -> None:
        """Run the callbacks whose bytes are durable: now, on the hub; called on another greenlet
        (the writer's, a checkpoint's, a caller of :meth:`exclusive` or :meth:`close`), from the
        hub's next loop turn (the module's doc says why)."""
        if _getcurrent() is self._hub:
            self._fire_on_hub()
        elif not self._fire_due:
            self._fire_due = True
            self._hub.loop.run_callback(self._fire_from_loop)

    def _fire_from_loop(self) -> None:
        self._fire_due = False
        self._fire_on_hub()

    def _fire_on_hub(self) -> None:
        done = self.synced if self.mode == ALWAYS else self.written
        waiters = self._waiters
        while waiters and waiters[0][0] <= done:
            _target, callback, _on_error = waiters.popleft()
            try:
                callback()
            except Exception:
                log.exception("journal durability callback failed", queue=self.queue)
