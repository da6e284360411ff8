"""A backlog held packed (issue 56 point 4) through the journal's work: a rewrite writes the packed
items, a replay packs them again, read-behind refills a packed queue within ``max_memory_size``."""

from __future__ import annotations

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import FileJournal, open_file_journal, replay_queue
from kestrel_actors.queue import QueueCore
from kestrel_actors.queue._items import CHUNK_BYTES

NOW = 1_700_000_000_000
ITEMS = 4 * CHUNK_BYTES // 100  # several chunks of 100 B items


def data(index: int) -> bytes:
    return b"%08d" % index + b"." * 92


def chunks(queue: QueueCore) -> int:
    return sum(isinstance(entry, bytes) for entry in queue.items._entries)


def queue_on(tmp_path, config: QueueConfig) -> QueueCore:
    return QueueCore("q", config, FileJournal(str(tmp_path), "q", config))


def test_a_rewrite_of_a_packed_backlog_replays_to_the_same_queue(tmp_path):
    config = QueueConfig()
    queue = queue_on(tmp_path, config)
    for index in range(ITEMS):
        assert queue.add(data(index), NOW + 5_000_000 if index % 7 == 0 else 0, NOW)
    assert chunks(queue) == 3  # packed, the last quarter not yet
    assert [queue.remove(NOW).data for _ in range(3)] == [data(0), data(1), data(2)]
    opened = queue.remove(NOW, transactional=True)
    kept_open = queue.remove(NOW, transactional=True)
    assert (opened.data, kept_open.data) == (data(3), data(4))
    assert queue.unremove(opened.xid) and queue.peek(NOW).data == data(3)
    assert queue.journal.rewrite(queue)
    queue.journal.close()

    state = replay_queue(str(tmp_path), "q", now_ms=NOW)
    assert [item.data for item in state.items] == [data(i) for i in range(3, ITEMS) if i != 4]
    assert [item.expiry for item in state.items][:5] == [0, 0, 0, NOW + 5_000_000, 0]  # items 3, 5, 6, 7, 8
    assert {xid: item.data for xid, item in state.open_items.items()} == {kept_open.xid: data(4)}
    assert state.length == ITEMS - 4 and state.mem_bytes == state.bytes == 100 * (ITEMS - 4)


def test_a_restarted_queue_holds_its_backlog_packed_and_in_order(tmp_path):
    config = QueueConfig()
    queue = queue_on(tmp_path, config)
    for index in range(ITEMS):
        queue.add(data(index), 0, NOW)
    queue.remove(NOW, transactional=True)  # backed out at the restart: the head again
    queue.journal.close()

    journal, state = open_file_journal(str(tmp_path), "q", config, now_ms=NOW)
    again = QueueCore("q", config, journal)
    again.restore(state)
    assert chunks(again) == 3 and again.length == ITEMS
    assert [again.remove(NOW).data for _ in range(ITEMS)] == [data(i) for i in range(ITEMS)]
    assert again.remove(NOW) is None
    journal.close()


def test_read_behind_refills_a_packed_queue_within_max_memory_size(tmp_path):
    limit = 2 * CHUNK_BYTES + 1000
    config = QueueConfig(max_memory_size=limit)
    queue = queue_on(tmp_path, config)
    for index in range(ITEMS):
        queue.add(data(index), 0, NOW)
    assert queue.journal.in_read_behind and queue.mem_bytes <= limit + 100 < queue.bytes
    out = []
    while (item := queue.remove(NOW)) is not None:
        out.append(item.data)
        assert queue.mem_bytes <= limit + 100 and len(queue.items) * 100 == queue.mem_bytes
    assert out == [data(i) for i in range(ITEMS)] and not queue.journal.in_read_behind
    queue.journal.close()


def test_expired_items_leave_a_packed_backlog_from_the_head(tmp_path):
    config = QueueConfig(max_expire_sweep=ITEMS)
    queue = queue_on(tmp_path, config)
    half = ITEMS // 2
    for index in range(ITEMS):
        queue.add(data(index), NOW + 1_000 if index < half else 0, NOW)
    assert chunks(queue) == 3
    assert queue.peek(NOW + 500).data == data(0)  # not yet
    assert queue.remove(NOW + 2_000).data == data(half) and queue.expired_items == half
    assert queue.length == ITEMS - half - 1 and queue.mem_bytes == 100 * queue.length == queue.bytes
    queue.journal.close()
