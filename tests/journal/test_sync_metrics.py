"""The journal writer's fsync figures (Kestrel's ``PeriodicSyncStorage``): each fdatasync timed,
each failed one counted by its class, the wait of each write beyond the period; nothing
recorded with ``never``.

A failing fdatasync cannot be had from outside a server here (that needs a failing device),
so the failure is made in process, with ``os.fdatasync`` raising ``EIO`` as a dying disk's
would; the counter's way to ``/stats.json`` and ``/metrics`` is checked from the same stats.
"""

from __future__ import annotations

import errno
import os
import time
from types import SimpleNamespace

import gevent
import gevent.event
from prometheus_client.parser import text_string_to_metric_families

from kestrel_actors.admin._ostrich import ostrich_stats
from kestrel_actors.admin._prometheus import exposition
from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import FileJournal, Item, encode_add
from kestrel_actors.snapshot import take_snapshot
from kestrel_actors.stats import ServerStats
from kestrel_actors.status import ServerStatus


def durable(journal) -> None:
    done = gevent.event.Event()
    journal.after_durable(done.set)
    assert done.wait(timeout=10)


def observed(tmp_path, sync_journal) -> tuple[FileJournal, ServerStats]:
    stats = ServerStats()
    journal = FileJournal(str(tmp_path), "q", QueueConfig(sync_journal=sync_journal))
    journal.observe(stats.open_queue("q"), stats)
    return journal, stats


def test_a_failed_fdatasync_is_counted_by_class_and_the_retry_timed(tmp_path, monkeypatch):
    journal, stats = observed(tmp_path, 0.0)
    real = os.fdatasync
    failures = [OSError(errno.EIO, "Input/output error")]

    def dying_disk(fd):
        if failures:
            raise failures.pop()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", dying_disk)
    journal.add(Item(b"a", 1))
    durable(journal)  # waits through the failure: the writer retries
    assert stats.fsync_errors == {"OSError": 1}
    assert stats.histograms["fsync_delay_usec"].count == 1  # the one that succeeded
    waited = stats.histograms["item_fsync_delay_usec"]
    assert waited.count == 1 and waited.sum > 0  # the record waited through the retry's back-off
    journal.close()

    server = SimpleNamespace(stats=stats, status=ServerStatus(None), version="test",
                             config=SimpleNamespace(queue_config=lambda name: QueueConfig()))
    snapshot = take_snapshot(server, [])
    assert ostrich_stats(snapshot)["counters"]["fsync_error_OSError"] == 1
    families = {f.name: f for f in text_string_to_metric_families(b"".join(exposition(snapshot)).decode())}
    errors = families["kestrel_fsync_error"]
    assert [(s.labels, s.value) for s in errors.samples if s.name.endswith("_total")] == [({"exception": "OSError"}, 1)]


def test_fsync_error_names_are_bounded():
    stats = ServerStats()
    for number in range(100):
        stats.fsync_failed(type(f"Error{number}", (OSError,), {})())
    assert len(stats.fsync_errors) <= 17 and sum(stats.fsync_errors.values()) == 100


def test_periodic_writes_wait_about_nothing_beyond_the_period(tmp_path):
    journal, stats = observed(tmp_path, 0.05)
    for n in range(5):
        journal.add(Item(b"%d" % n, n))
        durable(journal)  # only written: the reply does not wait for the fdatasync
    deadline = time.monotonic() + 5
    while journal.writer.fsyncs == 0 and time.monotonic() < deadline:
        gevent.sleep(0.01)
    assert stats.histograms["fsync_delay_usec"].count == journal.writer.fsyncs >= 1
    waited = stats.histograms["item_fsync_delay_usec"]
    assert waited.count == 5  # one per record, each covered by the timer's fdatasync
    assert waited.maximum() < 1_000_000  # not the whole wait: only what ran past the 50 ms
    journal.close()


def test_never_records_no_write_but_a_rotation_fsync_is_timed(tmp_path):
    journal, stats = observed(tmp_path, None)
    for n in range(5):
        journal.add(Item(b"%d" % n, n))
        durable(journal)
    assert journal.writer._marks is None  # nothing noted per write
    assert stats.histograms["fsync_delay_usec"].count == 0
    journal.rotate()  # a rotation fsyncs the file it archives, whatever the policy
    assert stats.histograms["fsync_delay_usec"].count == 1
    assert stats.histograms["item_fsync_delay_usec"].count == 0
    assert stats.queues["q"].histograms["journal_rotation_usec"].count == 1
    journal.close()


def test_an_add_is_one_record_however_it_is_written(tmp_path):
    """An ADD goes to the writer as two buffers (its header, then the item's data, not copied
    into one); ``item_fsync_delay_usec`` still counts records, held ones included."""
    journal, stats = observed(tmp_path, 0.0)
    data = b"d" * 1024
    journal.add(Item(data, 1))
    token = journal.hold()
    journal.add(Item(b"held", 2))
    journal.add(Item(b"held too", 3))
    done = gevent.event.Event()
    journal.after_durable(done.set)
    deadline = time.monotonic() + 5
    while journal.writer.fsyncs == 0 and time.monotonic() < deadline:
        gevent.sleep(0.01)
    assert not done.is_set() and stats.histograms["item_fsync_delay_usec"].count == 1
    journal.release(token)
    assert done.wait(timeout=10)
    assert stats.histograms["item_fsync_delay_usec"].count == 3
    journal.close()
    with open(tmp_path / "q", "rb") as f:
        assert f.read() == b"".join(encode_add(Item(d, t)) for d, t in ((data, 1), (b"held", 2), (b"held too", 3)))
