"""The journal driven by a queue as Kestrel drives it: rotation and rewrite rules (behaviour §6.6),
read-behind (behaviour §5.8) and packing, checked against replays of the files on disk.

``MiniQueue`` is Kestrel's ``PersistentQueue`` reduced to what touches the journal; it shows
the calls ``QueueCore`` is expected to make.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import gevent
import gevent.event

from kestrel_actors.config import QueueConfig
from kestrel_actors.journal import FileJournal, Item, RecordReader, open_file_journal, pack_archives, replay_queue
from kestrel_actors.journal._files import archived_files, journal_files
from kestrel_actors.journal._format import OP_REMOVE_TENTATIVE_XID
from kestrel_actors.journal._writer import INLINE_WRITE_MAX
from kestrel_actors.queue import QueueCore
from kestrel_actors.runtime import GeventActor


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class MiniQueue:
    """Kestrel's queue logic, as far as the journal sees it."""

    def __init__(self, journal: FileJournal, config: QueueConfig, state=None) -> None:
        self.journal = journal
        self.config = config
        self.items: deque[Item] = deque()
        self.open_reads: dict[int, Item] = {}
        self.length = self.bytes = self.mem_bytes = self.xid = 0
        self.clock = 0
        if state is not None:
            self.items, self.length, self.bytes = state.items, state.length, state.bytes
            self.mem_bytes, self.xid = state.mem_bytes, state.xid

    def add(self, data: bytes) -> None:
        self.clock += 1
        item = Item(data, self.clock)
        journal = self.journal
        journal.check_rotate(self)  # before the add is journaled
        if not journal.in_read_behind and self.bytes >= self.config.max_memory_size:
            journal.start_read_behind()
        journal.add(item)
        if not journal.in_read_behind:
            self.items.append(item)
            self.mem_bytes += len(data)
        self.length += 1
        self.bytes += len(data)

    def remove(self, transactional: bool = False) -> Item | None:
        if not self.items:
            return None
        item = self.items.popleft()
        self.length -= 1
        self.bytes -= len(item.data)
        self.mem_bytes -= len(item.data)
        if transactional:
            self.xid += 1
            item.xid = self.xid
            self.open_reads[self.xid] = item
            self.journal.remove_tentative(self.xid)
        else:
            self.journal.remove()
        self.fill()
        self.journal.check_rotate(self)  # after the remove is journaled
        return item

    def confirm(self, xid: int) -> None:
        del self.open_reads[xid]
        self.journal.confirm_remove(xid)

    def unremove(self, xid: int) -> None:
        item = self.open_reads.pop(xid)
        item.xid = 0
        self.journal.unremove(xid)
        self.items.appendleft(item)
        self.length += 1
        self.bytes += len(item.data)
        self.mem_bytes += len(item.data)

    def fill(self) -> None:
        journal = self.journal
        while journal.in_read_behind and self.mem_bytes < self.config.max_memory_size:
            item = journal.read_behind()
            if item is None:
                break
            self.items.append(item)
            self.mem_bytes += len(item.data)


def durable(journal) -> None:
    done = gevent.event.Event()
    journal.after_durable(done.set)
    assert done.wait(timeout=10)


def on_disk(data_dir: str, name: str = "q"):
    result = replay_queue(data_dir, name)
    return [i.data for i in result.items], {x: i.data for x, i in result.open_items.items()}


# -- rules (a), (b), (c) -----------------------------------------------------------------------

def test_rotate_logs_example_rewrites_to_an_empty_file(tmp_path):
    """ServerSpec "rotate logs": maxJournalSize 16 KB, two 8 KB items set and read."""
    config = QueueConfig(max_journal_size=16 * 1024)
    queue = MiniQueue(FileJournal(str(tmp_path), "q", config), config)
    queue.add(b"x" * 8192)
    assert queue.journal.size() == 8213
    queue.remove()
    queue.add(b"y" * 8192)
    assert queue.journal.size() == 16427 and queue.journal.rewrites == 0
    queue.remove()  # 16428 > 16384 with an empty queue: rewrite
    assert queue.journal.rewrites == 1 and queue.journal.size() == 0
    queue.journal.close()
    assert os.listdir(tmp_path) == ["q"] and os.path.getsize(tmp_path / "q") == 0


def test_on_the_hub_a_due_rewrite_is_left_for_later_and_says_so(tmp_path):
    """A queue run from a socket callback runs on the hub, where file work may not wait:
    check_rotate there only marks the work due; called again off the hub, it does it."""
    config = QueueConfig(max_journal_size=16 * 1024)
    queue = MiniQueue(FileJournal(str(tmp_path), "q", config), config)
    journal = queue.journal
    queue.add(b"x" * 8192)
    queue.remove()
    queue.add(b"y" * 8192)
    assert journal.rotation_due(queue)  # 16427 > 16384: the next check acts
    assert not journal.maintenance_due
    gevent.get_hub().loop.run_callback(queue.remove)  # the example's last remove, on the hub
    gevent.sleep(0)
    assert journal.maintenance_due and journal.rewrites == 0 and journal.size() == 16428
    journal.check_rotate(queue)  # off the hub (this test's greenlet): the rewrite happens
    assert journal.rewrites == 1 and journal.size() == 0
    assert not journal.rotation_due(queue)
    journal.close()


def test_big_journal_rewrites_are_throttled(tmp_path):
    """Kestrel's PersistentQueueSpec: rewrites wait minJournalCompactDelay after one."""
    clock = Clock()
    config = QueueConfig(default_journal_size=16, max_journal_size=160, max_memory_size=128,
                         min_journal_compact_delay=5.0)
    queue = MiniQueue(FileJournal(str(tmp_path), "q", config, clock=clock), config)
    for _ in range(8):
        queue.add(b"\x00")
    assert queue.journal.rewrites == 0 and queue.journal.rotations == 1
    queue.add(b"\x00")
    assert queue.journal.rewrites == 1
    queue.add(b"\x00")
    assert queue.journal.rewrites == 1 and queue.journal.rotations == 2
    clock.now += 5
    queue.add(b"\x00")
    assert queue.journal.rewrites == 2
    durable(queue.journal)
    assert on_disk(str(tmp_path))[0] == [b"\x00"] * 11
    queue.journal.close()


def test_without_aggressive_rewrites_an_empty_queue_waits_too(tmp_path):
    """Kestrel's "allow rewrites for empty queue after some time" (KEST-366)."""
    clock = Clock()
    config = QueueConfig(disable_aggressive_rewrites=True, default_journal_size=160, max_journal_size=1024,
                         max_memory_size=1024, min_journal_compact_delay=5.0)
    queue = MiniQueue(FileJournal(str(tmp_path), "q", config, clock=clock), config)
    for _ in range(8):
        queue.add(b"\x00")
        queue.remove(transactional=True)
    assert queue.journal.rewrites == 1
    for _ in range(8):
        queue.add(b"\x00")
        queue.remove()
    assert queue.journal.rewrites == 1
    clock.now += 5
    queue.add(b"\x00")
    queue.remove()
    assert queue.journal.rewrites == 2
    durable(queue.journal)
    assert on_disk(str(tmp_path)) == ([], dict.fromkeys(range(1, 9), b"\x00"))
    queue.journal.close()


def test_open_reads_filling_an_empty_queues_file_are_not_rewritten_at_every_change(tmp_path):
    """Rule (a) rewrites an empty queue only if its open reads take at most half of the current
    file (behaviour §6.6, ADR 0026): a reader holding a batch open (the Spark source's read-ahead)
    is not written again at every add and remove that finds the queue empty. Once most of the
    reads are confirmed, the next change rewrites; the files replay to the queue all along."""
    data_dir = str(tmp_path)
    config = QueueConfig(default_journal_size=4096)
    journal = FileJournal(data_dir, "q", config)
    queue = QueueCore("q", config, journal)
    now = 1_700_000_000_000
    for i in range(40):
        assert queue.add(b"open%03d" % i + b"." * 93, 0, now)  # 40 ADDX of 121 bytes
    held = queue.open_many(now, 40, 1 << 20)  # 40 REMOVE_TENTATIVE_XID: 5,040 bytes, all open reads
    assert len(held) == 40 and queue.length == 0 and journal.size() == 5040 >= config.default_journal_size
    for i in range(20):
        assert queue.add(b"pass%03d" % i, 0, now)
        assert queue.remove(now).data == b"pass%03d" % i
    # Kestrel's rule rewrote the 40 reads at each of these 40 changes; each rewrite left 5,040 bytes
    assert journal.rewrites == 0 and journal.size() == 5040 + 20 * (28 + 1)
    assert not journal.rotation_due(queue)  # nothing left for the queue's greenlet either
    assert queue.add(b"waiting", 0, now)
    durable(journal)
    items, open_items = on_disk(data_dir)  # what a stop now (a SIGKILL) would replay
    assert items == [b"waiting"] and sorted(open_items.values()) == sorted(item.data for item in held)

    assert queue.confirm_many(tuple(item.xid for item in held[:30]), []) == 30
    assert queue.remove(now).data == b"waiting"  # 10 reads left, 1,260 bytes: the rewrite is worth it
    assert journal.rewrites == 1 and journal.size() == 10 * 126
    assert queue.add(b"after", 0, now)
    durable(journal)
    items, open_items = on_disk(data_dir)
    assert items == [b"after"] and sorted(open_items.values()) == sorted(item.data for item in held[30:])
    journal.close()


def test_a_live_queue_is_told_a_rule_is_due_whenever_the_rule_says_so(tmp_path):
    """``rotation_due`` on a live queue (a ``QueueCore``) first compares the current file with
    the sizes the rules fire at, worked out once per limits and archived bytes. It answers as
    the rules read whole do (for any other queue object) after every change: as the file grows
    (c), as rotations add archived bytes (b), with a checkpoint due, after a reload that lowers
    a limit, as the queue empties (a)."""
    config = QueueConfig(default_journal_size=10**9, max_memory_size=1000, max_journal_size=3000,
                         min_journal_compact_delay=None)
    journal = FileJournal(str(tmp_path), "q", config, checkpoint_due=4300)
    core = QueueCore("q", config, journal)
    now = 1_700_000_000_000
    seen = []

    def check() -> None:
        rules = SimpleNamespace(items=core.items, open_reads=core.open_reads, bytes=core.bytes,
                                length=core.length, config=core.config)  # not a QueueCore: read whole
        due = journal.rotation_due(core)
        assert due == journal.rotation_due(rules), (journal.size(), journal.archived_size, core.length)
        seen.append(due)

    for i in range(60):  # a small queue's file: rotated at 1,000 bytes, rewritten past 3,000 in all
        assert core.add(b"%03d" % i + b"." * 97, 0, now)
        check()
        if core.length > 2:
            core.remove(now)
            check()
    assert journal.rotations >= 2 and journal.rewrites >= 2 and journal.checkpoints == 0
    core.config = dataclasses.replace(config, max_memory_size=100)  # a reload: new limits
    check()
    assert seen[-1] and journal.size() > 100
    core.config = QueueConfig(default_journal_size=500, max_memory_size=10**6, max_journal_size=10**7)
    check()
    while core.length:
        core.remove(now)
        check()
    for _ in range(10):  # rule (a) at every add that finds the queue empty past 500 bytes
        assert core.add(b"a" * 100, 0, now)
        check()
        core.remove(now)
        check()
    assert journal.rewrites >= 4 and seen.count(True) >= 8
    journal.close()


def test_big_current_file_rotates_and_asks_for_a_checkpoint(tmp_path):
    config = QueueConfig(max_memory_size=10_000, max_journal_size=25_000, default_journal_size=10**9)
    journal = FileJournal(str(tmp_path), "q", config)
    queue = MiniQueue(journal, config)
    for i in range(30):
        queue.add(b"%04d" % i + b"." * 996)
    assert journal.rotations == 2 and not journal._checkpoint
    queue.add(b"last")
    assert journal.rotations == 3 and journal._checkpoint
    assert len(archived_files(str(tmp_path), "q")) == 3 and journal.in_read_behind
    durable(journal)
    assert on_disk(str(tmp_path))[0] == [b"%04d" % i + b"." * 996 for i in range(30)] + [b"last"]
    journal.close()


# -- read-behind ----------------------------------------------------------------------------------

def test_read_behind_keeps_memory_bounded_and_order_exact(tmp_path):
    config = QueueConfig(max_memory_size=1024)
    journal = FileJournal(str(tmp_path), "q", config)
    queue = MiniQueue(journal, config)
    for i in range(20):
        queue.add(bytes([65 + i]) * 128)
        if i == 7:
            assert not journal.in_read_behind
    assert journal.in_read_behind and len(queue.items) == 8 and queue.length == 20  # from the 9th add
    out = []
    while (item := queue.remove()) is not None:
        out.append(item.data)
        assert queue.mem_bytes <= 1024 + 128
    assert out == [bytes([65 + i]) * 128 for i in range(20)] and not journal.in_read_behind
    journal.close()


def test_read_behind_across_rotations_and_restarts(tmp_path):
    data_dir = str(tmp_path)
    config = QueueConfig(max_memory_size=2000, max_journal_size=10**9, default_journal_size=10**9)
    queue = MiniQueue(FileJournal(data_dir, "q", config), config)
    expected = deque()
    rng = random.Random(7)
    counter = 0
    for round_ in range(6):
        for _ in range(rng.randrange(10, 60)):
            data = b"%06d" % counter + b"-" * rng.randrange(0, 200)
            counter += 1
            queue.add(data)
            expected.append(data)
        for _ in range(rng.randrange(5, 40)):
            item = queue.remove(transactional=rng.random() < 0.3)
            if item is None:
                break
            assert item.data == expected.popleft()
            if item.xid:
                if rng.random() < 0.5:
                    queue.confirm(item.xid)
                else:
                    queue.unremove(item.xid)
                    expected.appendleft(item.data)
        durable(queue.journal)
        assert queue.journal.rotations >= round_ // 2
        # restart: replay with read-behind, back out open reads, go on
        open_before = sorted(queue.open_reads.items())
        queue.journal.close()
        journal, state = open_file_journal(data_dir, "q", config, read_behind=True)
        queue = MiniQueue(journal, config, state)
        for _xid, item in reversed(open_before):
            expected.appendleft(item.data)
        assert queue.length == len(expected) and state.mem_bytes <= 2000 + 300
        assert [i.data for i in queue.items] == list(expected)[:len(queue.items)]
    out = []
    while (item := queue.remove()) is not None:
        out.append(item.data)
    assert out == list(expected)
    queue.journal.close()


def test_one_cursor_reads_behind_the_writer_then_the_replay_then_the_writer_again(tmp_path):
    """Read-behind across archives, live, then replayed, then live from where the replay left
    its cursor in an archive (not the current file): every item once, in order."""
    data_dir = str(tmp_path)
    config = QueueConfig(max_memory_size=1000, max_journal_size=10**9, default_journal_size=10**9)
    journal = FileJournal(data_dir, "q", config)
    queue = MiniQueue(journal, config)
    sent = [b"%03d" % i + b"." * 97 for i in range(60)]
    for data in sent:
        queue.add(data)  # read-behind from the 11th; the current file rotates past 1000 bytes
    assert journal.in_read_behind and journal.rotations >= 5
    got = [queue.remove().data for _ in range(15)]  # the live cursor reads the first archive
    durable(journal)
    journal.close()

    journal, state = open_file_journal(data_dir, "q", config, read_behind=True)
    assert state.read_behind is not None and state.read_behind.filename in archived_files(data_dir, "q")
    assert state.mem_bytes <= 1000 + 100 and state.length == 45
    queue = MiniQueue(journal, config, state)
    while (item := queue.remove()) is not None:
        got.append(item.data)
        assert queue.mem_bytes <= 1000 + 100
    assert got == sent and not journal.in_read_behind
    journal.close()


def test_read_behind_reads_its_next_chunk_ahead_across_rotations_and_a_restart(tmp_path):
    """Read-behind reads the chunk after the one it serves on the threadpool meanwhile (issue
    56): items larger and smaller than a record's share of a chunk, so records lie across
    chunks; the current file rotates while the cursor reads it, and the server restarts
    halfway: every item once, in order, memory within the limit."""
    from kestrel_actors.journal._format import CHUNK_SIZE

    data_dir = str(tmp_path)
    config = QueueConfig(max_memory_size=1 << 20, max_journal_size=10**10, default_journal_size=10**10)
    journal = FileJournal(data_dir, "q", config)
    queue = MiniQueue(journal, config)
    rng = random.Random(56)
    sent: list[bytes] = []

    def add(count: int) -> None:
        for _ in range(count):
            data = b"%07d" % len(sent) + bytes([len(sent) % 251]) * rng.choice((10, 700, 4093, 9000))
            sent.append(data)
            queue.add(data)

    add(900)  # about 3.2 MiB: read-behind from the first MiB, through rotated files
    assert journal.in_read_behind and journal.rotations >= 2
    got = [queue.remove().data for _ in range(200)]
    reader = journal._reader._reader  # the cursor's file: its second chunk was read ahead
    assert reader is not None and reader._ahead_at >= CHUNK_SIZE
    add(400)  # the current file rotates while the cursor reads behind in it
    got += [queue.remove().data for _ in range(300)]
    durable(journal)
    journal.close()  # with a chunk read ahead: it reads through a descriptor of its own

    journal, state = open_file_journal(data_dir, "q", config, read_behind=True)
    queue = MiniQueue(journal, config, state)
    while (item := queue.remove()) is not None:
        got.append(item.data)
        assert queue.mem_bytes <= config.max_memory_size + 9100
    assert got == sent and not journal.in_read_behind
    journal.close()


def test_a_chunk_read_ahead_reads_its_own_descriptor(tmp_path):
    """The cursor closes its file when it moves on or read-behind ends, maybe with a chunk still
    being read: that read has a descriptor of its own, not a number another file may take."""
    from kestrel_actors.journal._file import _read_ahead

    first, second = tmp_path / "a", tmp_path / "b"
    first.write_bytes(b"a" * 100_000)
    second.write_bytes(b"b" * 100_000)
    fd = os.open(first, os.O_RDONLY)
    ahead = _read_ahead(fd, 50_000, 1000)
    os.close(fd)
    other = os.open(second, os.O_RDONLY)  # most likely the number just closed
    try:
        assert ahead is not None and ahead.result() == b"a" * 50_000
        assert ahead.result() == b"a" * 50_000
    finally:
        os.close(other)


def test_on_the_hub_a_chunk_not_read_yet_is_not_waited_for(tmp_path):
    """The hub waits for no file: asked there before its chunk is in, a read ahead says so
    (the reader then reads for itself, as before); asked again off the hub, it waits."""
    from kestrel_actors.journal._file import _read_ahead

    path = tmp_path / "a"
    path.write_bytes(b"a" * 100_000)
    fd = os.open(path, os.O_RDONLY)
    seen = []

    def on_the_hub() -> None:
        ahead = _read_ahead(fd, 50_000, 0)
        seen.append((ahead, ahead.result()))  # its end reaches the hub only after this callback

    try:
        gevent.get_hub().loop.run_callback(on_the_hub)
        gevent.sleep(0)
        ahead, on_hub = seen[0]
        assert on_hub is None and ahead.result() == b"a" * 50_000
    finally:
        os.close(fd)


# -- packing --------------------------------------------------------------------------------------

def test_reading_behind_does_not_write_the_journal_for_every_read(tmp_path):
    """A remove journaled just before a read-behind read is pending; the reader needs only
    what is written, so reads do not force a write each (writes stay batched)."""
    config = QueueConfig(max_memory_size=20_000, default_journal_size=10**9, max_journal_size=10**9)
    journal = FileJournal(str(tmp_path), "q", config)
    queue = MiniQueue(journal, config)
    for i in range(320):  # read-behind from about item 200 on, in the current file
        queue.add(b"%05d" % i + b"#" * 95)
    durable(journal)
    assert journal.in_read_behind
    writes = journal.writer.writes
    got = [queue.remove().data[:5] for _ in range(320)]
    assert got == [b"%05d" % i for i in range(320)]
    assert journal.writer.writes - writes < 10  # was one write per read-behind read (~120)
    journal.close()


def test_packing_while_reading_behind_bounds_the_files(tmp_path):
    data_dir = str(tmp_path)
    config = QueueConfig(max_memory_size=4000, max_journal_size=12_000, default_journal_size=10**9,
                         min_journal_compact_delay=None)
    journal = FileJournal(data_dir, "q", config)
    queue = MiniQueue(journal, config)
    expected = deque()
    for i in range(400):
        data = b"%05d" % i + b"#" * 95
        queue.add(data)
        expected.append(data)
        if i % 2:
            assert queue.remove().data == expected.popleft()
        if i % 50 == 49:
            journal._wait_for_pack()
            durable(journal)
            assert on_disk(data_dir) == (list(expected), {})
    assert journal.packs >= 1 and journal.in_read_behind
    total = sum(os.path.getsize(os.path.join(data_dir, f)) for f in journal_files(data_dir, "q"))
    assert total < 40_000  # 400 adds and 200 removes would be ~50 KB unpacked
    while (item := queue.remove()) is not None:
        assert item.data == expected.popleft()
    assert not expected
    journal.close()


def _random_history(data_dir: str, rng: random.Random) -> None:
    journal = FileJournal(data_dir, "q", QueueConfig())
    items: deque[bytes] = deque()
    open_reads: dict[int, bytes] = {}
    xid = 0
    for step in range(rng.randrange(20, 120)):
        roll = rng.random()
        if roll < 0.4:
            data = b"i%d" % step
            journal.add(Item(data, step, rng.choice([0, 10**13])))
            items.append(data)
        elif roll < 0.55 and items:
            items.popleft()
            journal.remove()
        elif roll < 0.7 and items:
            xid += 1
            open_reads[xid] = items.popleft()
            journal.remove_tentative(xid)
        elif roll < 0.8 and open_reads:
            x = rng.choice(list(open_reads))
            items.appendleft(open_reads.pop(x))
            journal.unremove(x)
        elif roll < 0.88 and open_reads:
            x = rng.choice(list(open_reads))
            del open_reads[x]
            journal.confirm_remove(x)
        elif roll < 0.95:
            journal.rotate()
        else:
            journal.remove()
            if items:
                items.popleft()
    journal.close()


def test_pack_archives_replays_to_the_same_queue(tmp_path):
    """With and without the later records (which turn the items they discard into placeholders)."""
    placeholders = 0
    for seed in range(80):
        rng = random.Random(seed)
        data_dir = str(tmp_path / f"s{seed}")
        os.mkdir(data_dir)
        _random_history(data_dir, rng)
        archives = archived_files(data_dir, "q")
        if not archives:
            continue
        before = replay_queue(data_dir, "q")
        upto = rng.choice(archives)
        later_files = [*archives[archives.index(upto) + 1:], "q"]
        fds = [os.open(os.path.join(data_dir, f), os.O_RDONLY) for f in later_files] if seed % 2 else []
        try:
            assert pack_archives(data_dir, "q", upto, [(fd, os.fstat(fd).st_size) for fd in fds]) == upto
        finally:
            for fd in fds:
                os.close(fd)
        placeholders += sum(1 for r in RecordReader(Path(data_dir, upto).read_bytes())
                            if r.item is not None and r.item.data == b"")
        after = replay_queue(data_dir, "q")
        assert [(i.data, i.add_time, i.expiry) for i in after.items] == \
            [(i.data, i.add_time, i.expiry) for i in before.items], seed
        assert {x: i.data for x, i in after.open_items.items()} == {x: i.data for x, i in before.open_items.items()}
        remaining = archived_files(data_dir, "q")
        assert remaining[0] == upto and len(remaining) == len(archives) - archives.index(upto)
    assert placeholders > 20  # the later records did let the packs drop items


def test_replay_with_read_behind_matches_a_full_replay(tmp_path):
    """Bounded-memory replay, then reading behind at run time, yields the full queue in order."""
    for seed in range(40):
        rng = random.Random(1000 + seed)
        data_dir = str(tmp_path / f"s{seed}")
        os.mkdir(data_dir)
        _random_history(data_dir, rng)
        full = replay_queue(data_dir, "q")
        limit = rng.choice([1, 5, 12, 30])
        part = replay_queue(data_dir, "q", max_memory_size=limit)
        def totals(state):
            return state.length, state.bytes, state.total_items, state.xid
        assert totals(part) == totals(full)
        assert {x: i.data for x, i in part.open_items.items()} == {x: i.data for x, i in full.open_items.items()}
        assert [i.data for i in part.items] == [i.data for i in full.items][:len(part.items)], seed
        expected = [i.data for _x, i in sorted(full.open_items.items())] + [i.data for i in full.items]
        journal, state = open_file_journal(data_dir, "q", QueueConfig(max_memory_size=limit), read_behind=True)
        got = [i.data for i in state.items]
        while (item := journal.read_behind()) is not None:
            got.append(item.data)
        assert got == expected and not journal.in_read_behind, seed
        journal.close()


# -- a monitor's batch (ADR 0022) -------------------------------------------------------------------

def _monitor_history(data_dir: str, batched: bool) -> None:
    """Adds past ``max_memory_size`` (read-behind), monitor-sized opens, confirms of some, more
    adds after those records, more opens: item by item, or a batch's records at once."""
    config = QueueConfig(max_memory_size=40)
    queue = QueueCore("q", config, FileJournal(data_dir, "q", config))
    now = 1_700_000_000_000

    def add(count: int, start: int) -> None:
        for i in range(start, start + count):
            assert queue.add(b"item%03d" % i, 0, now)

    def open_run(count: int) -> list[Item]:
        if batched:
            return queue.open_many(now, count, 1 << 20)
        items = []
        for _ in range(count):
            item = queue.remove(now, transactional=True)
            assert item is not None
            items.append(item)
        return items

    def confirm(xids: tuple[int, ...]) -> None:
        if batched:
            assert queue.confirm_many(xids, []) == len(xids)
        else:
            for xid in xids:
                assert queue.confirm(xid) is not None

    add(20, 0)
    first = open_run(7)
    confirm(tuple(item.xid for item in first[:5]))
    add(10, 20)  # read behind these, past the records above
    second = open_run(12)
    confirm(tuple(item.xid for item in second[::2]))
    durable(queue.journal)
    queue.journal.close()


def test_a_monitor_batch_writes_the_bytes_and_replays_to_the_state_of_item_by_item_opens(tmp_path):
    dirs = []
    for batched in (False, True):
        data_dir = tmp_path / ("batched" if batched else "one-by-one")
        data_dir.mkdir()
        _monitor_history(str(data_dir), batched)
        dirs.append(data_dir)
    # the same records, byte for byte, in the files' order (a rotation may fall elsewhere: a
    # batch checks for one once, after its records)
    one, many = (b"".join((d / name).read_bytes() for name in journal_files(str(d), "q")) for d in dirs)
    assert many == one and one.count(bytes([OP_REMOVE_TENTATIVE_XID])) >= 19
    replayed = [on_disk(str(d)) for d in dirs]
    assert replayed[1] == replayed[0]
    items, open_items = replayed[1]
    assert items == [b"item%03d" % i for i in range(19, 30)] and len(open_items) == 2 + 6


# -- durability callbacks and the greenlets that wait ---------------------------------------------

class RotatingQueue(GeventActor):
    """A queue actor as its journal meets it: told a durability answer, its handler does file
    work that waits (a rotation's checkpoint), so it never runs on the hub."""

    inline_dispatch = True

    def __init__(self, journal: FileJournal, queue: MiniQueue, done: gevent.event.Event) -> None:
        super().__init__()
        self.journal, self.queue, self.done = journal, queue, done

    def may_run_on_hub(self) -> bool:
        return False

    def on_receive(self, message) -> None:
        self.journal.checkpoint(self.queue, wait=True)
        self.done.set()


def test_a_durability_answer_never_runs_a_queue_on_the_checkpoints_own_greenlet(tmp_path):
    # An idle actor told from a greenlet runs its handler right there. Told by callbacks the
    # checkpoint's greenlet fired, the queue's rotation joined that very greenlet and the
    # queue answered nothing again (a server hang under a pipelined stream of 64 KiB SETs).
    config = QueueConfig()
    journal, state = open_file_journal(str(tmp_path), "q", config, read_behind=True)
    queue = MiniQueue(journal, config, state)
    done = gevent.event.Event()
    ref = RotatingQueue.start(journal, queue, done)
    try:
        queue.add(b"x" * (8 * INLINE_WRITE_MAX))  # the checkpoint writes it, on a thread
        assert journal.checkpoint(queue, wait=False)
        gevent.sleep(0)  # the checkpoint's greenlet holds the file, its write under way
        journal.after_durable(lambda: ref.tell("durable"))  # answered when that write ends
        assert done.wait(timeout=10), "the queue's handler waits for its own greenlet"
        assert journal.checkpoints == 2
    finally:
        ref.stop()
        journal.close()


def test_durability_callbacks_run_on_the_hub_whoever_writes(tmp_path):
    config = QueueConfig()
    journal, state = open_file_journal(str(tmp_path), "q", config, read_behind=True)
    queue = MiniQueue(journal, config, state)
    ran_on: list[object] = []
    try:
        queue.add(b"x" * (INLINE_WRITE_MAX + 1))  # the writer greenlet writes it
        journal.after_durable(lambda: ran_on.append(gevent.getcurrent()))
        durable(journal)
        queue.add(b"y")
        token = journal.hold()
        journal.after_durable(lambda: ran_on.append(gevent.getcurrent()))
        journal.release(token)
        gevent.spawn(journal.checkpoint, queue, True).join()  # its exclusive() writes it
        durable(journal)
        queue.add(b"z")
        journal.hold()  # not written in this turn: the close writes it
        journal.after_durable(lambda: ran_on.append(gevent.getcurrent()))
        gevent.spawn(journal.close).join()
        with gevent.Timeout(10):
            while len(ran_on) < 3:
                gevent.sleep(0.01)
        assert ran_on == [gevent.get_hub()] * 3
    finally:
        journal.close()
