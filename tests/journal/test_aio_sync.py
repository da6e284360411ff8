"""With ``always``, a round's fdatasync goes to the kernel through Linux AIO, not to a thread
(``kestrel_actors/journal/_aio.py``, issue 56): no reply before its record is synced, no
threadpool job per round, and the threadpool again where AIO cannot serve.

Real files, a real writer on the hub; gevent's threadpool is watched (not replaced) to count
the jobs handed to it."""

from __future__ import annotations

import os

import gevent
import gevent.event
import pytest

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import FileJournal, Item, replay_queue
from kestrel_actors.journal._aio import open_aio_sync


def _aio_here() -> bool:
    aio = open_aio_sync(gevent.get_hub().loop)
    if aio is None:
        return False
    aio.close()
    return True


pytestmark = pytest.mark.skipif(not _aio_here(), reason="no Linux AIO here (or a preloaded library)")


class _CountingPool:
    """gevent's threadpool, each job handed to it noted (its class's ``spawn`` cannot be
    replaced on the instance)."""

    def __init__(self, pool) -> None:
        self._pool = pool
        self.jobs: list[object] = []

    def spawn(self, fn, *args, **kwargs):
        self.jobs.append(args[0] if args else fn)
        return self._pool.spawn(fn, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._pool, name)


@pytest.fixture
def pool_jobs(monkeypatch):
    """The jobs handed to the hub's threadpool from now on."""
    hub = gevent.get_hub()
    counting = _CountingPool(hub.threadpool)
    monkeypatch.setattr(hub, "threadpool", counting)
    return counting.jobs


def _clients(journal, count: int) -> list[int]:
    """``count`` clients each add an item and wait for it to be durable; the clients whose
    callback ran before an fdatasync covered their record."""
    writer = journal.writer
    early: list[int] = []

    def client(i):
        journal.add(Item(b"item %d" % i, i))
        target = writer.appended
        event = gevent.event.Event()

        def callback():
            if writer.synced < target:
                early.append(i)
            event.set()

        journal.after_durable(callback)
        assert event.wait(timeout=10)

    gevent.joinall([gevent.spawn(client, i) for i in range(count)], timeout=30, raise_error=True)
    return early


def test_always_rounds_sync_through_aio_with_no_threadpool_job(tmp_path, pool_jobs):
    journal = FileJournal(str(tmp_path), "q", QueueConfig(sync_journal=0.0))
    assert _clients(journal, 100) == []
    assert journal.writer.fsyncs >= 1
    # each round used to be one threadpool job of os.fdatasync
    assert [job for job in pool_jobs if job is os.fdatasync] == []
    journal.close()
    assert len(replay_queue(str(tmp_path), "q").items) == 100


def test_a_replaced_fdatasync_is_called_on_the_threadpool(tmp_path, pool_jobs, monkeypatch):
    """A test (or a tracer) that replaces ``os.fdatasync`` sees every round's call."""
    calls = []
    real = os.fdatasync

    def counted(fd):
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    journal = FileJournal(str(tmp_path), "q", QueueConfig(sync_journal=0.0))
    assert _clients(journal, 20) == []
    assert len(calls) >= journal.writer.fsyncs >= 1
    assert pool_jobs.count(counted) >= journal.writer.fsyncs
    journal.close()


def test_aio_refusing_a_descriptor_says_so():
    """The kernel refuses an fdatasync by AIO on a pipe (EINVAL): ``submit`` says it did not
    start, calls nothing, and marks the context broken, so the writer's next round goes to the
    threadpool (``JournalWriter._sync_from_turn``)."""
    aio = open_aio_sync(gevent.get_hub().loop)
    assert aio is not None
    called = []
    read_end, write_end = os.pipe()
    try:
        assert aio.submit(write_end, called.append) is False
        assert aio.broken and called == []
    finally:
        aio.close()
        os.close(read_end)
        os.close(write_end)


def test_aio_fdatasync_ends_on_the_hub_with_its_result(tmp_path):
    aio = open_aio_sync(gevent.get_hub().loop)
    assert aio is not None
    results = []
    done = gevent.event.Event()
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, b"x" * 4096)
        assert aio.submit(fd, lambda result: (results.append(result), done.set()))
        assert done.wait(timeout=10) and results == [0]
    finally:
        aio.close()
        os.close(fd)
