"""The journal writer of one queue: a greenlet that appends records and applies ``sync_journal``.

Why a greenlet and not a :class:`GeventActor`: the queue actor hands over one record per
change, up to hundreds of thousands a second. As an actor message each record would cost an
envelope, an inbox put and a future; here it costs a ``list.append``. The pending list *is*
the mailbox: the queue actor appends encoded records to it and sets an event, and the writer
greenlet, woken once, takes everything that has piled up and writes it with one ``writev``.
Both run on the hub thread, so no lock guards the list. Only the blocking system calls leave
the hub: ``fdatasync`` always, and a ``write`` when the batch is large, both on gevent's
threadpool (:func:`run_blocking`).

Sync policies (Kestrel's ``syncJournal``, reference §6.7), as positions in the byte stream
(``appended`` ≥ ``written`` ≥ ``synced``, never reset across files):

* ``None`` — never fsync; :meth:`after_durable` callbacks run once their bytes are written
  (``write()`` returned: the data survives a crash of this process, as with Kestrel);
* ``0.0`` — always: callbacks run only after an ``fdatasync`` covering their bytes. While one
  fdatasync runs, new records pile up and the next round writes and syncs them all at once:
  a group commit, one fdatasync for every writer that arrived meanwhile;
* ``P > 0`` — a timer fsyncs every ``P`` seconds while there are unsynced writes; callbacks
  do not wait for it (Kestrel 2.4 replies ``STORED`` after the write).

Callbacks always run on the hub thread, in the writer greenlet, in the order they were
registered; they must not block.
"""

from __future__ import annotations

import os
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

import gevent
import gevent.event
import gevent.lock
import structlog
from pykka import ActorDeadError

from ._files import open_regular

__all__ = ["JournalWriter", "run_blocking", "NEVER", "ALWAYS", "PERIODIC"]

log = structlog.get_logger("kestrel_actors.journal")

NEVER, ALWAYS, PERIODIC = "never", "always", "periodic"
INLINE_WRITE_MAX = 1024 * 1024
"""Batches up to this size are written from the hub thread: a page-cache copy, a few hundred
microseconds at most, cheaper than the threadpool's hand-off (with 256 KiB, bursts of ten
clients pipelining 32 SETs of 1 KiB, up to 330 KiB, went to the threadpool)."""
IOV_MAX = 1024
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0)


def run_blocking(fn: Callable, *args):  # type: ignore[no-untyped-def]
    """Run ``fn(*args)`` on gevent's threadpool, blocking only the calling greenlet.

    Called from the hub itself (where nothing may block on a switch) it runs inline.
    """
    hub = gevent.get_hub()
    if gevent.getcurrent() is hub:
        return fn(*args)
    return hub.threadpool.apply(fn, args)


def write_all(fd: int, chunks: list[bytes]) -> None:
    """Write every chunk, in order, with as few system calls as possible."""
    for start in range(0, len(chunks), IOV_MAX):
        group = chunks[start:start + IOV_MAX]
        total = sum(map(len, group))
        done = os.writev(fd, group)
        if done < total:  # a short write: finish the rest one buffer at a time
            rest = memoryview(b"".join(group))[done:]
            while rest:
                rest = rest[os.write(fd, rest):]


class JournalWriter:
    """Appends to the current journal file of one queue, from its own greenlet."""

    def __init__(self, path: str, sync_journal: float | None, queue: str) -> None:
        self.path = path
        self.queue = queue
        if sync_journal is None:
            self.mode, self.period = NEVER, 0.0
        elif sync_journal <= 0:
            self.mode, self.period = ALWAYS, 0.0
        else:
            self.mode, self.period = PERIODIC, float(sync_journal)
        self._fd = self._open(path)
        self.file_written = os.fstat(self._fd).st_size
        """Bytes of the current file that have reached the OS."""
        self.appended = 0
        self.written = 0
        self.synced = 0
        self.fsyncs = 0
        self.writes = 0
        self.error: OSError | None = None
        self._chunks: list[bytes] = []
        self._waiters: deque[tuple[int, Callable[[], None]]] = deque()
        self._wake = gevent.event.Event()
        self._kicked = False
        self._loop = gevent.get_hub().loop
        self._io = gevent.lock.Semaphore()
        self._timer: gevent.Greenlet | None = None
        self.closed = False
        self._greenlet = gevent.spawn(self._run)

    @staticmethod
    def _open(path: str) -> int:
        # a named pipe in the journal's place must raise, not wait for a reader for ever
        return open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    # -- called by the journal (on the hub thread) -----------------------------------------

    def append(self, data: bytes) -> None:
        """Queue ``data`` for the file; returns at once. Ignored once closed."""
        if self.closed:
            return
        self._chunks.append(data)
        self.appended += len(data)
        if not self._kicked:
            self._kicked = True
            self._loop.run_callback(self._kick)

    def _kick(self) -> None:
        """Wake the writer greenlet if anything is left for it once the burst is over.

        Usually nothing is: without ``always`` the queue writes small batches itself
        (:meth:`after_durable`), and waking the writer only to find that done would cost
        two greenlet switches per burst.
        """
        self._kicked = False
        if self._chunks or self._waiters or (
            self.mode == PERIODIC and self._timer is None and self.synced < self.written
        ):
            self._wake.set()

    @property
    def pending(self) -> int:
        """Bytes handed over but not yet written."""
        return self.appended - self.written

    def after_durable(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once everything appended so far is as durable as the policy says.

        Without ``always``, only ``write()`` must have returned: when the file is free and the
        batch small, the caller writes it now (a page-cache copy) rather than wait a greenlet
        switch for the writer, which takes a hop off every reply's path.
        """
        target = self.appended
        if (
            self.mode != ALWAYS
            and self.written < target <= self.written + INLINE_WRITE_MAX
            and not self.closed
            and not self._io.locked()
        ):
            with self._io:
                self._write_pending()
        done = self.synced if self.mode == ALWAYS else self.written
        if done >= target or self.closed:
            callback()
        else:
            self._waiters.append((target, callback))

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the file: pending records are written first, and no I/O runs meanwhile.

        The journal uses it to rotate or rewrite; it blocks the calling greenlet (never the
        hub) while an fdatasync or a large write in flight finishes.
        """
        with self._io:
            self._write_pending()
            yield
        self._fire()

    def sync_now(self) -> None:
        """fdatasync the current file (call inside :meth:`exclusive`)."""
        if self.synced < self.written:
            target = self.written
            run_blocking(os.fdatasync, self._fd)
            self.fsyncs += 1
            self.synced = target

    def switch_file(self, path: str) -> None:
        """Close the current file and append to ``path`` from now on (inside :meth:`exclusive`)."""
        os.close(self._fd)
        self.path = path
        self._fd = self._open(path)
        self.file_written = os.fstat(self._fd).st_size

    def close(self, sync: bool = True) -> None:
        """Write what is pending, fsync (unless ``sync`` is false), close; fire every callback."""
        if self.closed:
            return
        self.closed = True
        with self._io:
            self._write_pending(give_up=True)
            if sync:
                try:
                    self.sync_now()
                except OSError as exc:
                    log.error("journal fsync failed at close", queue=self.queue, error=str(exc))
            os.close(self._fd)
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
                if self._chunks:
                    with self._io:
                        self._write_pending()
                if self.mode == ALWAYS and self.synced < self.written:
                    with self._io:
                        self._sync_with_retry()
                elif self.mode == PERIODIC and self.synced < self.written and self._timer is None:
                    self._timer = gevent.spawn_later(self.period, self._periodic_sync)
            except Exception:  # noqa: BLE001 - the writer must outlive any one failure
                log.exception("journal writer failed", queue=self.queue)
                gevent.sleep(RETRY_DELAYS[-1])
                self._wake.set()
            self._fire()

    def _write_pending(self, give_up: bool = False) -> None:
        """Write the pending records (the caller holds ``_io``), retrying on I/O errors."""
        attempt = 0
        while self._chunks:
            chunks, self._chunks = self._chunks, []
            target = self.written + sum(map(len, chunks))
            try:
                if target - self.written <= INLINE_WRITE_MAX:
                    write_all(self._fd, chunks)
                else:
                    run_blocking(write_all, self._fd, chunks)
            except OSError as exc:
                self._chunks[:0] = chunks
                self.error = exc
                self._undo_partial_write()
                log.error("journal write failed; will retry", queue=self.queue, error=str(exc), attempt=attempt)
                if give_up and attempt >= 2:
                    log.error("journal closed with unwritten records; DATA MAY HAVE BEEN LOST!",
                              queue=self.queue, bytes=self.appended - self.written)
                    self._chunks = []
                    return
                gevent.sleep(RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)])
                attempt += 1
                continue
            self.writes += 1
            self.file_written += target - self.written
            self.written = target
            self.error = None

    def _undo_partial_write(self) -> None:
        """Cut a half-written batch off, so a retry cannot leave a torn record mid-file."""
        try:
            os.ftruncate(self._fd, self.file_written)
        except OSError:
            pass

    def _sync_with_retry(self) -> None:
        attempt = 0
        while not self.closed:
            try:
                self.sync_now()
                self.error = None
                return
            except OSError as exc:
                self.error = exc
                log.error("journal fsync failed; will retry", queue=self.queue, error=str(exc), attempt=attempt)
                gevent.sleep(RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)])
                attempt += 1

    def _periodic_sync(self) -> None:
        """One run of the periodic fsync; reschedules itself while writes keep coming."""
        try:
            with self._io:
                if not self.closed:
                    self.sync_now()
        except OSError as exc:
            self.error = exc
            log.error("periodic journal fsync failed", queue=self.queue, error=str(exc))
        finally:
            self._timer = None
        if not self.closed and self.synced < self.appended:
            self._timer = gevent.spawn_later(self.period, self._periodic_sync)

    def _fire(self) -> None:
        done = self.synced if self.mode == ALWAYS else self.written
        waiters = self._waiters
        while waiters and waiters[0][0] <= done:
            _target, callback = waiters.popleft()
            try:
                callback()
            except ActorDeadError:
                log.debug("a durable reply found its receiver gone", queue=self.queue)
            except Exception:  # noqa: BLE001
                log.exception("journal durability callback failed", queue=self.queue)
