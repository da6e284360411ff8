"""The ``kestrel`` source's calls made directly, as Spark's planner process and executors make
them (without Spark): the first micro-batch is small; a partition names a slice of its
batch's write-ahead file, and reading it gives the planned items in order (one Arrow record
batch), or fails if the file does not hold them; the read-ahead writes the next batch's file
unpublished."""

from __future__ import annotations

import os
import pickle
import threading
import time

import pytest

from kestrel_actors.client import PackedValues
from kestrel_actors.spark_bridge._buffers import BufferPool
from kestrel_actors.spark_bridge._source import (
    FIRST_BATCH_ITEMS,
    KestrelDataSource,
    KestrelPartition,
    KestrelStreamReader,
    SourceOptions,
    _PlannedBatch,
)
from kestrel_actors.spark_bridge._wal import BatchPart, WalCorrupt, WriteAheadLog
from kestrel_actors.spark_bridge._walstore import (
    SHELF_VARIABLE,
    WalLocation,
    open_store,
    spare_shelf,
)

from ._spark_jobs import load, queue_stats


def reader(server, tmp_path, **options) -> KestrelStreamReader:
    source = KestrelDataSource({"servers": f"127.0.0.1:{server.port}", "queue": "plan",
                                "walLocation": str(tmp_path / "wal"),
                                **{k: str(v) for k, v in options.items()}})
    return source.streamReader(None)


def rows_of(stream: KestrelStreamReader, start: dict, end: dict, queue: str = "plan") -> list[bytes]:
    """What the executors would return: each partition pickled (as Spark ships it) and read."""
    values: list[bytes] = []
    for partition in stream.partitions(start, end):
        shipped = pickle.loads(pickle.dumps(partition))
        for batch in pickle.loads(pickle.dumps(stream)).read(shipped):
            assert batch.schema.names == ["value", "queue", "server", "timestamp"]
            assert set(batch.column("queue").to_pylist()) == {queue}
            values.extend(batch.column("value").to_pylist())
    return values


def test_the_first_batch_is_small_and_the_next_ones_full(server, tmp_path):
    items = [f"item-{i:05d}-".encode() * (i % 7) for i in range(12_000)]
    load(server, "plan", items)
    stream = reader(server, tmp_path, maxItemsPerBatch=5000, itemsPerPartition=1500)
    try:
        start = stream.initialOffset()
        first = stream.latestOffset(start)
        assert sum(first["items"].values()) == FIRST_BATCH_ITEMS < 5000
        got = rows_of(stream, start, first)
        stream.commit(first)
        second = stream.latestOffset(first)  # read ahead while the first batch ran
        assert sum(second["items"].values()) == 5000
        got += rows_of(stream, first, second)
        stream.commit(second)
        third = stream.latestOffset(second)
        got += rows_of(stream, second, third)
        stream.commit(third)
    finally:
        stream.stop()
    assert sum(third["items"].values()) == 12_000 - 5000 - FIRST_BATCH_ITEMS
    assert got == items  # empty items included, in queue order
    assert queue_stats(server, "plan") == (0, 0)


def test_a_partition_spans_the_connections_of_its_server_with_each_items_enqueue_time(server,
                                                                                     tmp_path):
    """A batch opened on several connections of one server (``itemsPerConnection`` each) is
    cut into partitions of ``itemsPerPartition`` across them, each row stamped with the time
    the server enqueued its item (the ``stamp`` option of monitor), before it was read; a
    replay from the file cuts and stamps it the same way."""
    items = [b"%05d" % i for i in range(4000)]
    before = time.time()
    load(server, "plan", items[:2000])
    time.sleep(0.05)
    load(server, "plan", items[2000:])
    loaded = time.time()
    options = {"maxItemsPerBatch": 1000, "itemsPerConnection": 300, "itemsPerPartition": 500,
               "readAhead": "false"}
    stream = reader(server, tmp_path, **options)

    def stamps_of(planner, partitions) -> list[float]:
        stamps = []
        for partition in partitions:
            for batch in planner.read(pickle.loads(pickle.dumps(partition))):
                stamps += [t.timestamp() for t in batch.column("timestamp").to_pylist()]
        return stamps

    time.sleep(0.05)
    try:
        start = stream.initialOffset()
        first = stream.latestOffset(start)
        assert sum(first["items"].values()) == 1000 <= FIRST_BATCH_ITEMS
        partitions = stream.partitions(start, first)
        assert [p.items.count for p in partitions] == [500, 500]
        stamps = stamps_of(stream, partitions)
        assert int(before * 1000) / 1000 <= min(stamps) and max(stamps) <= loaded
        assert stamps == sorted(stamps)
        assert rows_of(stream, start, first) == items[:1000]
        stream.commit(first)
        second = stream.latestOffset(first)
        later = stamps_of(stream, stream.partitions(first, second))
        assert stamps[-1] <= min(later) and max(later) <= loaded
    finally:
        stream.stop()
    replayed = reader(server, tmp_path, **options)  # a restart before Spark committed it
    try:
        assert stamps_of(replayed, replayed.partitions(first, second)) == later
        assert rows_of(replayed, first, second) == items[1000:2000]
    finally:
        replayed.stop()


def test_a_replayed_batch_reads_the_same_rows_from_the_write_ahead_log(server, tmp_path):
    items = [bytes([i % 256]) * (i % 300) for i in range(1500)]
    load(server, "plan", items)
    planner = reader(server, tmp_path, itemsPerPartition=400)
    start = planner.initialOffset()
    end = planner.latestOffset(start)
    planned = rows_of(planner, start, end)
    planner.stop()  # the planner dies before Spark committed the batch
    restarted = reader(server, tmp_path, itemsPerPartition=400)
    try:
        assert rows_of(restarted, start, end) == planned == items
        assert WriteAheadLog(str(tmp_path / "wal")).sequences() == [1]
    finally:
        restarted.stop()


def test_the_read_ahead_writes_the_next_batch_unpublished_and_a_stop_discards_it(server,
                                                                                 tmp_path):
    """The read-ahead writes and syncs the next batch's file under its temporary name while
    Spark runs the current batch; planning that batch only renames it. Until then it is no
    batch: a stop removes it and the servers take its items back."""
    load(server, "plan", [f"a{i}".encode() for i in range(FIRST_BATCH_ITEMS + 700)])
    stream = reader(server, tmp_path)
    wal = WriteAheadLog(str(tmp_path / "wal"))
    start = stream.initialOffset()
    first = stream.latestOffset(start)
    stream.live.prefetch.wait()
    names = sorted(p.name for p in (tmp_path / "wal").iterdir())
    assert names[:2] == [".batch-000000000002.wal.tmp", "batch-000000000001.wal"]
    assert names[2:] and all(n.startswith("batch-000000000001.wal.confirmed-") for n in names[2:])
    assert wal.sequences() == [1] and not wal.has(2)
    assert queue_stats(server, "plan") == (0, 700)  # opened ahead, not confirmed
    stream.commit(first)
    second = stream.latestOffset(first)
    assert second["seq"] == 2 and sum(second["items"].values()) == 700
    assert wal.sequences() == [2] and not list((tmp_path / "wal").glob(".*.tmp"))
    assert rows_of(stream, first, second) == [f"a{i}".encode()
                                              for i in range(FIRST_BATCH_ITEMS, FIRST_BATCH_ITEMS + 700)]
    stream.commit(second)
    load(server, "plan", [b"later"])
    third = stream.latestOffset(second)  # opens "later" itself, reads ahead nothing
    stream.commit(third)
    load(server, "plan", [b"ahead"])
    assert stream.latestOffset(third) == {"seq": 4, "items": {f"127.0.0.1:{server.port}": 1}}
    stream.live.prefetch.wait()
    stream.stop()
    assert wal.sequences() == [4] and not list((tmp_path / "wal").glob(".*.tmp"))
    assert queue_stats(server, "plan") == (0, 0)


def test_committed_files_are_written_over_at_most_two_kept_and_removed_at_stop(server,
                                                                             tmp_path,
                                                                             monkeypatch):
    """With no shelf, a committed batch's file becomes a spare (``.spare-<pid>-<n>.wal``, at
    most two) in the directory that a later batch, the read-ahead's included, is written over
    instead of a new file; a stop removes the spares. A task still reading a reused file fails
    its checksum."""
    monkeypatch.setenv(SHELF_VARIABLE, "")
    directory = tmp_path / "wal"
    load(server, "plan", [b"s%05d" % i for i in range(3500)])
    stream = reader(server, tmp_path, maxItemsPerBatch=500)

    def inodes(pattern: str) -> set[int]:
        return {path.stat().st_ino for path in directory.glob(pattern)}

    try:
        offset, reused, got, spares = stream.initialOffset(), 0, [], set()
        partition = None
        for _ in range(7):
            end = stream.latestOffset(offset)
            assert end["seq"] == offset["seq"] + 1
            if stream.live.prefetch is not None:
                stream.live.prefetch.wait()
            if spares & (inodes("batch-*.wal") | inodes(".batch-*.tmp")):
                reused += 1
            partition = partition or stream.partitions(offset, end)[0]
            got += rows_of(stream, offset, end)
            stream.commit(end)
            spares = inodes(".spare-*")
            assert len(spares) <= 2
            offset = end
        assert got == [b"s%05d" % i for i in range(3500)]
        assert reused >= 4, "no batch was written over a spare"
        with pytest.raises(WalCorrupt, match="already committed"):
            list(stream.read(partition))  # batch 1's file is another batch's now
    finally:
        stream.stop()
    assert not list(directory.glob(".spare-*"))
    assert sorted(os.listdir(directory)) == []


def test_a_planners_spares_wait_on_the_shelf_for_the_next_planners_first_batches(
        server, tmp_path, monkeypatch):
    """A planner's spares are kept on the shelf (``KESTREL_WAL_SPARES``), two at most; the
    next planner, of another query (walLocation), writes its first two batches over them
    instead of new files and reads back exactly its own items (each spare longer than the
    batch written over it)."""
    shelf = tmp_path / "shelf"
    monkeypatch.setenv(SHELF_VARIABLE, str(shelf))

    def run(query: str, items: list[bytes]) -> tuple[list[bytes], list[set[int]]]:
        load(server, "plan", items)
        directory = tmp_path / query / "wal"
        stream = reader(server, tmp_path / query, maxItemsPerBatch=500)
        offset, got, written = stream.initialOffset(), [], []
        try:
            while (end := stream.latestOffset(offset)) != offset:
                if stream.live.prefetch is not None:
                    stream.live.prefetch.wait()
                written.append({p.stat().st_ino for p in directory.glob("*batch-*.wal*")
                                if ".confirmed-" not in p.name})
                got += rows_of(stream, offset, end)
                stream.commit(end)
                offset = end
        finally:
            stream.stop()
        assert sorted(os.listdir(directory)) == []
        return got, written

    first = [b"A%05d" % i + b"a" * 10 for i in range(2000)]
    assert run("one", first)[0] == first
    shelved = {p.stat().st_ino for p in shelf.glob("*")}
    assert len(shelved) == 2, "a stop removed its spares"
    second = [b"B%05d" % i for i in range(2000)]
    got, written = run("two", second)
    assert got == second
    assert shelved <= written[0] | written[1], "the first batches were new files"
    assert len(list(shelf.iterdir())) == 2


def test_a_small_batch_takes_no_long_spare_and_the_shelf_keeps_the_two_longest(tmp_path,
                                                                             monkeypatch):
    """Writing a small batch over a spare many times its size would truncate away pages a
    later full batch could have used: it gets a new file. Past two spares the shortest goes."""
    monkeypatch.setenv(SHELF_VARIABLE, str(tmp_path / "shelf"))
    store = open_store(WalLocation.parse(str(tmp_path / "wal")))
    store.ensure()
    for name, size in (("a", 1000), ("b", 10_000), ("c", 9000), ("d", 100)):
        (tmp_path / "wal" / name).write_bytes(b"x" * size)
        store.retire(name)
    assert sorted(p.stat().st_size for p in (tmp_path / "shelf").iterdir()) == [9000, 10_000]
    store.stage("small", [b"y" * 3000]).publish()
    assert len(list((tmp_path / "shelf").iterdir())) == 2
    store.stage("full", [b"z" * 6000]).publish()
    assert [p.stat().st_size for p in (tmp_path / "shelf").iterdir()] == [9000]
    assert (tmp_path / "wal" / "full").read_bytes() == b"z" * 6000


def test_no_shelf_when_unset_empty_or_readable_by_others(tmp_path, monkeypatch):
    monkeypatch.setenv(SHELF_VARIABLE, "")
    assert spare_shelf() is None
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv(SHELF_VARIABLE, str(shared))
    assert spare_shelf() is None  # a spare holds a batch's items
    monkeypatch.setenv(SHELF_VARIABLE, str(tmp_path / "mine"))
    assert spare_shelf() == tmp_path / "mine"


def test_a_partition_whose_file_changed_fails_its_read(server, tmp_path):
    load(server, "plan", [b"x" * 100] * 10)
    stream = reader(server, tmp_path)
    try:
        start = stream.initialOffset()
        end = stream.latestOffset(start)
        [partition] = stream.partitions(start, end)
        path = tmp_path / "wal" / "batch-000000000001.wal"
        data = bytearray(path.read_bytes())
        data[-50] ^= 1
        path.write_bytes(bytes(data))
        with pytest.raises(WalCorrupt, match="does not hold micro-batch 1's items"):
            list(stream.read(partition))
        path.unlink()
        with pytest.raises(WalCorrupt, match="every executor reaches"):
            list(stream.read(partition))
    finally:
        stream.stop()


def test_the_source_imports_neither_structlog_nor_the_thrift_codec_until_it_needs_them():
    """Every Spark Python process of a query (its reader, its planner, each executor worker)
    imports the source: structlog (with asyncio and rich) and Kestrel's thrift IDL were about
    half of that import's own time, and a healthy query needs neither."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "from kestrel_actors.spark_bridge import _source\n"
             "late = [m for m in ('structlog', 'kestrel_actors.protocol.thrift') if m in sys.modules]\n"
             "assert not late, late\n"
             "_source.log.info('first_message')\n"
             "assert 'structlog' in sys.modules\n")
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)


def test_an_executors_read_imports_no_pandas(tmp_path):
    """``read`` builds its Arrow columns from buffers: ``pa.scalar`` or ``pa.array`` import
    pandas, ~0.5 s of CPU in each Python worker before its first rows (issue 57 point 4)."""
    import subprocess
    import sys

    probe = ("import sys, time\n"
             "from kestrel_actors.client import PackedValues\n"
             "from kestrel_actors.spark_bridge._source import (KestrelPartition, KestrelStreamReader,\n"
             "    SourceOptions, _PlannedBatch)\n"
             "from kestrel_actors.spark_bridge._wal import BatchPart, WriteAheadLog\n"
             f"wal = WriteAheadLog({str(tmp_path)!r})\n"
             "parts = [BatchPart('s1', 1.5, PackedValues.of([b'a', b'bc']).stamps_or(1500), 'q'),\n"
             "         BatchPart('s1', 2.5, PackedValues.of([b'def']).stamps_or(2500), 'q')]\n"
             "batch = _PlannedBatch.counted(1, parts, wal.write(1, parts))\n"
             f"reader = KestrelStreamReader(SourceOptions.parse({{'queue': 'q', 'walLocation': {str(tmp_path)!r}}}))\n"
             "[sliced] = batch.slices(10, wal, 'q')\n"
             "[rows] = reader.read(KestrelPartition(sliced.server, sliced.queue, sliced.where))\n"
             "assert 'pandas' not in sys.modules\n"
             "table = rows.to_pydict()\n"
             "assert table['value'] == [b'a', b'bc', b'def'], table\n"
             "assert table['queue'] == ['q'] * 3 and table['server'] == ['s1'] * 3, table\n"
             "assert [t.timestamp() for t in table['timestamp']] == [1.5, 1.5, 2.5], table\n")
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)


def test_several_queues_in_one_batch_each_row_names_its_queue_and_a_restart_replays_them(
        server, tmp_path):
    """``queue`` as a comma-separated list: one batch opens every queue (offsets count items
    per queue per server), each row's ``queue`` column names its own, and a restart before
    Spark committed the batch replays it from the write-ahead file, queues included."""
    load(server, "qa", [b"a%d" % i for i in range(30)])
    load(server, "qb", [b"b%d" % i for i in range(20)])
    where = f"127.0.0.1:{server.port}"

    def planner() -> KestrelStreamReader:
        source = KestrelDataSource({"servers": where, "queue": "qa,qb",
                                    "walLocation": str(tmp_path / "wal"), "readAhead": "false"})
        return source.streamReader(None)

    def rows(stream, start, end) -> list[tuple[str, bytes]]:
        got = []
        for partition in stream.partitions(start, end):
            for batch in stream.read(pickle.loads(pickle.dumps(partition))):
                got += zip(batch.column("queue").to_pylist(), batch.column("value").to_pylist(),
                           strict=True)
        return got

    expected = sorted([("qa", b"a%d" % i) for i in range(30)] + [("qb", b"b%d" % i) for i in range(20)])
    stream = planner()
    try:
        start = stream.initialOffset()
        end = stream.latestOffset(start)
        assert end["items"] == {"qa": {where: 30}, "qb": {where: 20}}
        assert sorted(rows(stream, start, end)) == expected
        assert stream.reportLatestOffset()["backlog"] == {"qa": {where: 0}, "qb": {where: 0}}
    finally:
        stream.stop()  # killed before Spark committed the batch
    assert queue_stats(server, "qa") == (0, 0) and queue_stats(server, "qb") == (0, 0)
    restarted = planner()
    try:
        assert restarted.latestOffset(start) == end  # the same batch, from its file
        assert sorted(rows(restarted, start, end)) == expected
        restarted.commit(end)
        assert restarted.latestOffset(end) == end  # nothing more: each item once
    finally:
        restarted.stop()


def test_a_queue_list_with_an_empty_or_repeated_name_is_refused():
    for queue, message in (("qa,,qb", "must be a queue name"), ("qa,qb,qa", "names a queue twice")):
        with pytest.raises(ValueError, match=message):
            KestrelDataSource({"queue": queue, "walLocation": "/tmp/unused"}).schema()


class _WhoTook(BufferPool):
    """The planner's pool, noting which thread took each buffer (the read-ahead runs on one
    of its own)."""

    def __init__(self, keep: int) -> None:
        super().__init__(keep)
        self.taken: list[tuple[str, bytearray]] = []

    def take(self) -> bytearray:
        buffer = super().take()
        self.taken.append((threading.current_thread().name, buffer))
        return buffer


def test_a_planned_batch_keeps_no_item_bytes_its_buffers_take_the_read_ahead_s_items(server,
                                                                                    tmp_path):
    """Once a batch's file is written the batch keeps only its counts (and slices): its
    buffers go back to the pool at once and the read-ahead receives the next batch into
    them (no fresh pages to fault in), while Spark still runs the first; the rows of both
    come from the files as planned, another cut included (ADR 0022)."""
    items = [b"%05d" % i for i in range(5000)]
    load(server, "pooled", items)
    stream = reader(server, tmp_path, queue="pooled", maxItemsPerBatch=3000,
                    itemsPerConnection=1000, itemsPerPartition=1000)
    pool = stream.live.buffers = _WhoTook(stream.live.buffers.keep)
    try:
        start = stream.initialOffset()
        first = stream.latestOffset(start)  # 2,000 items, and the read-ahead opens 3,000
        stream.live.prefetch.wait()
        planned = stream.live.planned[1]
        assert all(type(part).__name__ == "_PartCount" for part in planned.parts)
        by_planner = [b for who, b in pool.taken if who != "kestrel-prefetch"]
        ahead = [b for who, b in pool.taken if who == "kestrel-prefetch"]
        assert len(by_planner) == 2 and len(ahead) == 3
        assert all(any(b is a for a in ahead) for b in by_planner), "no buffer went back"
        got = rows_of(stream, start, first, "pooled")
        [whole] = planned.slices(5000, stream.live.wal, "pooled")  # another cut: from the file
        assert whole.where.count == 2000
        stream.commit(first)
        second = stream.latestOffset(first)
        got += rows_of(stream, first, second, "pooled")
        stream.commit(second)
    finally:
        stream.stop()
    assert got == items


def _part(values: list[bytes]) -> BatchPart:
    return BatchPart("s1", 1.5, PackedValues.of(values).stamps_or(1500), "q")


def _one_batch_in_a_log(tmp_path, values: list[bytes], step: int):
    """Batch 1 of ``values`` written to a log in ``tmp_path``, cut into partitions of
    ``step``, and a reader as an executor unpickles it (no server: ``read`` touches none)."""
    wal = WriteAheadLog(str(tmp_path))
    parts = [_part(values)]
    batch = _PlannedBatch.counted(1, parts, wal.write(1, parts, step))
    stream = KestrelStreamReader(SourceOptions.parse({"queue": "q",
                                                      "walLocation": str(tmp_path)}))
    return wal, pickle.loads(pickle.dumps(stream)), [
        KestrelPartition(s.server, s.queue, s.where) for s in batch.slices(step, wal, "q")]


def test_a_read_hands_arrow_the_bytes_it_read_without_copying_them(tmp_path):
    """An executor's ``read`` reads its slice of the write-ahead file once: the values reach
    Arrow as the bytes read, not a second copy (a pass over 1 KiB per row in every Python
    worker: issue 57 point 4). A file that a commit unlinks, or that a rewrite replaces,
    after the read leaves the rows as they were read."""
    import os
    import tracemalloc

    values = [os.urandom(1024) for _ in range(4000)]
    wal, stream, partitions = _one_batch_in_a_log(tmp_path, values, 2000)
    list(stream.read(partitions[0]))  # the modules it imports are not its rows
    tracemalloc.start()
    try:
        [rows] = stream.read(partitions[1])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the values read once, and the lengths, times and offsets: 16 bytes a row
    assert peak < 2000 * 1024 + 2000 * 1024 / 8, peak
    wal.remove(1)
    wal.write(1, [_part([b"y" * 1024] * 4000)])
    assert rows.column("value").to_pylist() == values[2000:]


_READ_THEN_TRUNCATE = """
import os, sys
from kestrel_actors.client import PackedValues
from kestrel_actors.spark_bridge._wal import BatchPart, WriteAheadLog, read_slice

values = [bytes([i % 251]) * 4096 for i in range(64)]
wal = WriteAheadLog(sys.argv[1])
parts = [BatchPart("s1", 1.5, PackedValues.of(values).stamps_or(1500), "q")]
[sliced] = wal.write(1, parts, 64).slices(parts, 64)
items = read_slice(sliced.where)
os.truncate(wal.path(1), 0)  # another host's commit, or a rewrite in place, on shared storage
assert items.values() == values
print("read as written")
"""


def test_a_slice_read_keeps_its_bytes_when_the_file_is_truncated_after_the_read(tmp_path):
    """On shared storage a late (zombie or speculative) task may still hold a slice when
    another host removes or truncates the file: the rows it read stay as read, and the
    Python worker is not killed (a mapped file ends its reader with SIGBUS past the new end;
    run apart, so that such a signal cannot end pytest)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _READ_THEN_TRUNCATE, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "read as written"


def test_a_worker_makes_the_queue_and_server_columns_once_for_its_partitions(tmp_path):
    """Partition after partition of one queue and server (and size) get the same ``queue``
    and ``server`` columns, made once in the Python worker (a column is immutable)."""
    _, stream, partitions = _one_batch_in_a_log(tmp_path, [b"v%d" % i for i in range(30)], 10)
    batches = [batch for partition in partitions for batch in stream.read(partition)]
    assert [b.column("value").to_pylist() for b in batches] == [
        [b"v%d" % i for i in range(first, first + 10)] for first in (0, 10, 20)]
    for column in ("queue", "server"):
        made = {batch.column(column).buffers()[2].address for batch in batches}
        assert len(made) == 1, column
    assert batches[0].column("server").to_pylist() == ["s1"] * 10
