"""One contract, every journal: what a queue needs of its journal (``queue.Journal``) holds for
``MemoryJournal`` and ``FileJournal`` alike, as huey's ``StorageTests`` run against each
storage. A new journal joins by adding a case to ``JOURNALS``.
"""

from __future__ import annotations

import os

import gevent
import gevent.event
import pytest

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import FileJournal, MemoryJournal
from kestrel_actors.queue import Journal, QueueCore

NOW = 1_700_000_000_000
JOURNALS = ["memory", "file"]


@pytest.fixture(params=JOURNALS)
def make_journal(request, tmp_path):
    """Factory: ``make_journal(name, config)`` makes a journal of the parametrized kind."""
    made = []

    def make(name: str = "q", config: QueueConfig | None = None):
        config = config or QueueConfig()
        journal = MemoryJournal() if request.param == "memory" else FileJournal(str(tmp_path), name, config)
        made.append(journal)
        return journal

    make.kind = request.param  # type: ignore[attr-defined]
    make.data_dir = str(tmp_path)  # type: ignore[attr-defined]
    yield make
    for journal in made:
        journal.close()


def durable(journal) -> int:
    """Wait until ``after_durable`` calls back; returns how many times it was called."""
    calls = []
    done = gevent.event.Event()

    def callback() -> None:
        calls.append(1)
        done.set()

    journal.after_durable(callback)
    assert done.wait(timeout=10)
    gevent.sleep(0.01)  # a second call, were there one, would have come by now
    return len(calls)


def test_it_implements_every_member_of_the_base_class(make_journal):
    journal = make_journal()
    members = [name for name in vars(Journal) if not name.startswith("_")]
    assert members  # the base class names what a queue calls
    # the base's methods raise NotImplementedError: each must be the journal's own; its two
    # attributes are set by Journal.__init__
    inherited = [name for name in members
                 if name not in ("failure", "maintenance_due")
                 and getattr(type(journal), name) is getattr(Journal, name)]
    assert inherited == []
    assert journal.failure is None  # no write has failed
    assert journal.maintenance_due is False


def test_after_durable_calls_back_exactly_once(make_journal):
    journal = make_journal()
    core = QueueCore("q", QueueConfig(), journal)
    for i in range(3):
        assert core.add(b"item %d" % i, 0, NOW)
    assert durable(journal) == 1


def test_durable_now_answers_without_a_callback_only_when_nothing_must_wait(make_journal):
    journal = make_journal()
    core = QueueCore("q", QueueConfig(), journal)
    assert core.add(b"item", 0, NOW)
    # no fsync policy: the add is written now (the file journal's inline write)
    assert journal.durable_now() is True
    if make_journal.kind == "file":
        with open(os.path.join(make_journal.data_dir, "q"), "rb") as file:
            assert file.read().endswith(b"item")
        always = make_journal("a", QueueConfig(sync_journal=0.0))
        QueueCore("a", QueueConfig(sync_journal=0.0), always).add(b"x", 0, NOW)
        assert always.durable_now() is False  # an fdatasync must come first
        assert durable(always) == 1
        assert always.durable_now() is True


def test_a_hold_does_not_stop_other_callbacks_once_released(make_journal):
    journal = make_journal()
    token = journal.hold()
    QueueCore("q", QueueConfig(), journal).add(b"x", 0, NOW)
    journal.release(token)
    assert durable(journal) == 1


def test_a_queue_behaves_the_same_over_every_journal(make_journal):
    core = QueueCore("q", QueueConfig(), make_journal())
    for data in (b"a", b"b", b"c", b"d"):
        assert core.add(data, 0, NOW)
    first = core.remove(NOW, transactional=True)
    second = core.remove(NOW, transactional=True)
    assert (first.data, second.data) == (b"a", b"b")
    assert core.confirm(first.xid) and not core.confirm(first.xid)
    assert core.unremove(second.xid)
    assert core.peek(NOW).data == b"b"
    assert core.remove(NOW).data == b"b"
    core.flush(NOW)
    assert (core.length, core.bytes, len(core.open_reads)) == (0, 0, 0)
    assert dict(core.stats(NOW, 0))["total_items"] == 4


def test_rotation_and_rewrite_keep_the_queue(make_journal):
    journal = make_journal()
    core = QueueCore("q", QueueConfig(), journal)
    for i in range(5):
        core.add(b"%d" % i, 0, NOW)
    opened = core.remove(NOW, transactional=True)
    journal.check_rotate(core)
    assert isinstance(journal.rewrite(core), bool)
    assert [item.data for item in core.items] == [b"1", b"2", b"3", b"4"]
    assert core.confirm(opened.xid)
    assert journal.size() >= 0


def test_check_rotate_on_the_hub_leaves_file_work_for_later(make_journal):
    """What a queue run on the hub relies on: ``rotation_due`` says whether ``check_rotate``
    has work; on the hub it only sets ``maintenance_due`` and changes nothing."""
    config = QueueConfig(default_journal_size=64)
    journal = make_journal(config=config)
    core = QueueCore("q", config, journal)
    assert not journal.maintenance_due and not journal.rotation_due(core)
    core.add(b"x" * 100, 0, NOW)
    # on the hub, the remove empties the queue past default_journal_size: a rewrite is due
    gevent.get_hub().loop.run_callback(core.remove, NOW)
    gevent.sleep(0)
    assert core.length == 0
    if make_journal.kind == "memory":
        assert not journal.rotation_due(core) and not journal.maintenance_due  # nothing on disk
        return
    assert journal.maintenance_due and journal.rotation_due(core) and journal.size() > 100
    journal.check_rotate(core)
    assert journal.size() == 0 and not journal.rotation_due(core)


def test_read_behind_gives_back_what_was_added_in_order_or_is_not_offered(make_journal):
    journal = make_journal()
    core = QueueCore("q", QueueConfig(), journal)
    core.add(b"in memory", 0, NOW)
    journal.start_read_behind()
    if not journal.in_read_behind:  # a journal without files keeps every item in memory
        assert journal.read_behind() is None
        return
    for i in range(3):
        core.add(b"on disk %d" % i, 0, NOW)  # the queue now keeps new items on disk only
    assert [item.data for item in core.items] == [b"in memory"]
    read = []
    while (item := journal.read_behind()) is not None:
        read.append(item.data)
    assert read == [b"on disk 0", b"on disk 1", b"on disk 2"]
    assert not journal.in_read_behind


def test_erase_leaves_no_file_behind(make_journal):
    journal = make_journal("gone")
    QueueCore("gone", QueueConfig(), journal).add(b"x", 0, NOW)
    durable(journal)
    journal.erase()
    assert [f for f in os.listdir(make_journal.data_dir) if f.startswith("gone")] == []
