"""``sync_journal always``: where a turn's fdatasync runs (``journal._writer._SyncThreads``).

A turn hands its round's fdatasync to one of the hub's own fdatasync threads, at most
``SYNC_THREADS``; with every one busy, the round goes to the writer greenlet (on gevent's
threadpool) rather than make the hub wait. Either way a callback runs only after the
fdatasync covering its record has returned."""

from __future__ import annotations

import os
import threading

import gevent

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import FileJournal, Item, replay_queue
from kestrel_actors.journal._writer import SYNC_THREADS


def test_a_turns_fdatasync_runs_on_the_hubs_own_threads_and_overflows_to_the_writer(tmp_path, monkeypatch):
    let_go = threading.Event()
    entered: list[str] = []
    lock = threading.Lock()

    def held(_fd: int) -> None:  # records where it runs, then waits for the test
        with lock:
            entered.append(threading.current_thread().name)
        let_go.wait(10)

    monkeypatch.setattr(os, "fdatasync", held)
    journals = [FileJournal(str(tmp_path), f"q{i}", QueueConfig(sync_journal=0.0)) for i in range(SYNC_THREADS + 1)]
    fired: list[int] = []
    try:
        for i, journal in enumerate(journals):
            journal.add(Item(b"item %d" % i, i))
            journal.after_durable(lambda i=i: fired.append(i))
        for _ in range(2000):
            if len(entered) == SYNC_THREADS + 1:
                break
            gevent.sleep(0.005)
        # every queue's round is in its fdatasync at once: the hub waited for none of them
        assert len(entered) == SYNC_THREADS + 1, entered
        assert entered.count("kestrel-fdatasync") == SYNC_THREADS, entered
        assert fired == []
        let_go.set()
        for _ in range(2000):
            if len(fired) == len(journals):
                break
            gevent.sleep(0.005)
        assert sorted(fired) == list(range(len(journals)))
        assert all(journal.writer.synced == journal.writer.appended for journal in journals)
    finally:
        let_go.set()
        for journal in journals:
            journal.close()
    assert [len(replay_queue(str(tmp_path), f"q{i}").items) for i in range(len(journals))] == [1] * len(journals)


def test_a_thread_that_cannot_start_leaves_the_round_to_the_writer(tmp_path, monkeypatch):
    """``threading`` refusing a new thread (``can't start new thread``) costs the speed-up, not
    the answer: the round goes to the writer greenlet, and the callback still waits for it."""
    import weakref

    from kestrel_actors.journal import _writer

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_writer, "_sync_threads", weakref.WeakKeyDictionary())  # none started yet
    monkeypatch.setattr(threading.Thread, "start", refused)
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    journal = FileJournal(str(tmp_path), "q", QueueConfig(sync_journal=0.0))
    fired: list[bool] = []
    try:
        journal.add(Item(b"item", 1))
        journal.after_durable(lambda: fired.append(bool(synced)))
        for _ in range(2000):
            if fired:
                break
            gevent.sleep(0.005)
        assert fired == [True] and journal.writer.synced == journal.writer.appended
    finally:
        journal.close()
