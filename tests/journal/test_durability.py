"""Durability with a real server process (behaviour §6, §7.1, §10 item 11).

Every test runs ``kestrel-actors serve`` on a data directory in a temp dir, stops it with
SIGTERM or kills it with SIGKILL, starts it again on the same directory and checks what comes
back over the wire. With the default ``sync_journal`` ("never"), a reply is sent only after its
journal record has been written to the OS, so a SIGKILL of the process after the reply loses
nothing; ``--sync-journal always`` additionally waits for the fsync.

Read-behind (memory-limited queues) across restarts is in ``test_read_behind.py``.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from ..helpers import (
    Client,
    Pipeline,
    ServerProcess,
    assert_numbered,
    drain_pipelined,
    files_size,
    free_port,
    listening,
    number_of,
    numbered,
    queue_files,
    stat,
    write_config,
)

SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGKILL, id="SIGKILL")]


# -- restarts keep every item, in order --------------------------------------------------------

ITEMS = [
    b"first",
    b"",
    b"binary \x00\xff\r\nEND\r\nVALUE x 0 1\r\n",
    bytes(range(256)) * 400,
    *[b"item %d" % i for i in range(50)],
]


@pytest.mark.parametrize("sig", SIGNALS)
def test_items_survive_a_restart_in_order(make_server, sig):
    server = make_server()
    client = server.client()
    for data in ITEMS:
        assert client.set("jobs", data) == b"STORED"
    assert client.get("jobs") == b"first"
    assert client.get("touched") is None  # creates an empty queue (and its file), behaviour §5.2
    client.close()

    server.restart(sig)
    client = server.client()
    stats = client.stats()
    assert stats["queue_jobs_items"] == str(len(ITEMS) - 1)
    assert stats["queue_jobs_bytes"] == str(sum(map(len, ITEMS[1:])))
    assert stats["queue_jobs_total_items"] == str(len(ITEMS))  # add records replayed (behaviour §6.4)
    assert stats["queue_touched_items"] == "0"
    assert [client.get("jobs") for _ in ITEMS[1:]] == ITEMS[1:]
    assert client.get("jobs") is None
    client.close()

    server.restart(sig)  # a second replay, of a journal that now ends with removes
    client = server.client()
    assert stat(client, "jobs", "items") == 0
    assert client.get("jobs") is None


def test_twenty_thousand_items_survive_sigkill(make_server):
    server = make_server()
    items = [numbered(i, 100) for i in range(20_000)]
    pipe = Pipeline(server.host, server.port)
    pipe.set_all("bulk", items)
    pipe.close()

    server.kill()
    server.start()
    client = server.client()
    assert stat(client, "bulk", "items") == 20_000
    assert stat(client, "bulk", "bytes") == 20_000 * 100
    client.close()
    assert_numbered(drain_pipelined(server, "bulk"), range(20_000), size=100)


# -- open, confirmed and aborted reads across a crash -------------------------------------------


def test_an_open_item_comes_back_at_the_head_after_sigkill(make_server):
    server = make_server()
    client = server.client()
    for data in (b"a", b"b", b"c"):
        client.set("q", data)
    reader = server.client()
    assert reader.get("q/open") == b"a"
    assert stat(client, "q", "open_transactions") == 1
    assert stat(client, "q", "logsize") == 3 * 22 + 5

    server.kill()
    server.start()
    client = server.client()
    stats = client.stats()
    assert stats["queue_q_open_transactions"] == "0"
    assert stats["queue_q_items"] == "3"
    # the back-out is journaled: UNREMOVE(1), 5 bytes (behaviour §6.4)
    assert stats["queue_q_logsize"] == str(3 * 22 + 5 + 5)
    assert os.path.getsize(server.data_dir / "q") == 3 * 22 + 5 + 5
    assert [client.get("q") for _ in range(4)] == [b"a", b"b", b"c", None]


@pytest.mark.parametrize("sig", SIGNALS)
def test_open_one_to_four_confirm_two_and_four_restart(make_server, sig):
    """behaviour §6.4: open one…four, confirm two and four, restart → one, three, five.

    Each item is opened on its own connection, because ``get q/close`` confirms the *oldest*
    open read of the connection (behaviour §2.5): connection 2 confirms two, connection 4 confirms four.
    A graceful stop does not abort the open reads into the journal either (behaviour §7.4): they are
    backed out at the next start, in ascending xid order, not in disconnect order.
    """
    server = make_server("--max-open-transactions", "10")
    words = [b"one", b"two", b"three", b"four", b"five"]
    client = server.client()
    for word in words:
        client.set("q", word)
    readers = [server.client() for _ in range(4)]
    for reader, word in zip(readers, words[:4], strict=True):
        assert reader.get("q/open") == word
    assert readers[1].call(b"get q/close") == b"END"
    assert readers[3].call(b"get q/close") == b"END"
    assert stat(client, "q", "open_transactions") == 2

    server.restart(sig)
    client = server.client()
    assert stat(client, "q", "open_transactions") == 0
    assert stat(client, "q", "items") == 3
    assert [client.get("q") for _ in range(4)] == [b"one", b"three", b"five", None]


def test_several_open_reads_of_one_connection_come_back_in_xid_order(make_server):
    """Restart recovery puts them back in ascending xid order, twice in a row (behaviour §6.4, §11)."""
    server = make_server("--max-open-transactions", "10")
    client = server.client()
    for data in (b"a", b"b", b"c", b"d"):
        client.set("q", data)
    reader = server.client()
    assert [reader.get("q/open") for _ in range(3)] == [b"a", b"b", b"c"]

    server.kill()
    server.start()
    client = server.client()
    assert client.get("q/peek") == b"a"
    server.kill()  # the back-out records (UNREMOVE 3, 2, 1) replay to the same order
    server.start()
    client = server.client()
    assert [client.get("q") for _ in range(5)] == [b"a", b"b", b"c", b"d", None]


def test_monitor_then_confirm_survives_sigkill(make_server):
    """``monitor`` opens four items on one connection; ``confirm q 2`` confirms the two oldest."""
    server = make_server("--max-open-transactions", "10")
    client = server.client()
    words = [b"one", b"two", b"three", b"four", b"five"]
    for word in words:
        client.set("q", word)
    watcher = server.client()
    watcher.send(b"monitor q 5 4\r\n")
    assert [watcher.read_value() for _ in range(4)] == words[:4]
    assert watcher.read_line() == b"END"
    assert watcher.call(b"confirm q 2") == b"END"

    server.kill()
    server.start()
    client = server.client()
    assert [client.get("q") for _ in range(4)] == [b"three", b"four", b"five", None]


def test_confirmed_items_never_come_back(make_server):
    server = make_server("--max-open-transactions", "10")
    client = server.client()
    for data in (b"a", b"b", b"c", b"d", b"e", b"f", b"g"):
        client.set("q", data)
    assert client.get("q") == b"a"  # plain GET: gone for good
    assert client.get("q/open") == b"b"
    assert client.call(b"get q/close") == b"END"  # confirms b
    assert client.get("q/open") == b"c"
    assert client.get("q/close/open") == b"d"  # confirms c, opens d
    client.send(b"monitor q 1 1\r\n")
    assert client.read_value() == b"e"
    assert client.read_line() == b"END"
    assert client.call(b"confirm q 2") == b"END"  # confirms d and e
    assert client.get("q/open") == b"f"
    assert client.call(b"get q/abort") == b"END"  # f goes back: not confirmed
    assert stat(client, "q", "open_transactions") == 0

    server.kill()
    server.start()
    client = server.client()
    assert client.get("q/peek") == b"f"
    server.restart(signal.SIGTERM)
    client = server.client()
    assert [client.get("q") for _ in range(3)] == [b"f", b"g", None]
    server.kill()
    server.start()
    client = server.client()
    assert client.get("q") is None
    assert stat(client, "q", "items") == 0


# -- sync_journal always under concurrent load -------------------------------------------------


def _producer(host: str, port: int, tag: bytes, acked: list[int], errors: list[str]) -> None:
    """SET ``<tag><n>`` for n = 0, 1, … one at a time; record each n that got ``STORED``."""
    try:
        client = Client(host, port, timeout=10.0)
    except OSError as exc:
        errors.append(f"connect: {exc!r}")
        return
    n = 0
    try:
        while True:
            reply = client.set("load", b"%s%08d" % (tag, n))
            if reply != b"STORED":
                errors.append(f"{tag!r} {n}: {reply!r}")
                return
            acked.append(n)
            n += 1
    except TimeoutError:
        errors.append(f"{tag!r} {n}: timed out")
    except (ConnectionError, OSError):
        pass  # the server was killed
    finally:
        client.close()


def test_sync_always_keeps_every_acknowledged_set_through_sigkill(make_server):
    """20 clients SET as fast as they can; SIGKILL at a random moment; 3 rounds, one data dir.

    Every SET that got ``STORED`` is back after the restart. A client's in-flight SET (sent,
    no reply) may or may not be there. Nothing is duplicated and each client's items keep
    their order — so each client's items are exactly 0…k-1 or 0…k for its k acknowledged.
    """
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    clients = 20
    server = make_server("--sync-journal", "always")
    for round_ in range(3):
        acked: list[list[int]] = [[] for _ in range(clients)]
        errors: list[str] = []
        threads = [
            threading.Thread(target=_producer, daemon=True,
                             args=(server.host, server.port, b"r%d-c%02d-" % (round_, i), acked[i], errors))
            for i in range(clients)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while sum(map(len, acked)) < 500 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.6))
        assert all(thread.is_alive() for thread in threads), f"a producer stopped early: {errors}"
        server.kill()
        for thread in threads:
            thread.join(10)
        assert not errors, errors
        total_acked = sum(map(len, acked))
        assert total_acked >= 500, f"round {round_}: only {total_acked} SETs acknowledged (seed {seed})"

        server.start()
        found: dict[int, list[int]] = {i: [] for i in range(clients)}
        for value in drain_pipelined(server, "load"):
            match = re.fullmatch(rb"r(\d+)-c(\d\d)-(\d{8})", value)
            assert match, value
            assert int(match[1]) == round_, f"an item of round {match[1]!r} came back in round {round_}"
            found[int(match[2])].append(int(match[3]))
        for i in range(clients):
            k = len(acked[i])
            assert acked[i] == list(range(k))
            got = found[i]
            assert got[:k] == list(range(k)), (
                f"round {round_} client {i} (seed {seed}): {k} acknowledged, got {len(got)} items "
                f"starting {got[:5]}; missing {sorted(set(range(k)) - set(got))[:5]}")
            assert got in (list(range(k)), list(range(k + 1))), (
                f"round {round_} client {i} (seed {seed}): {k} acknowledged, got extra {got[k:][:5]}")


# -- journal size, rewrites and rotations ----------------------------------------------------


def test_logsize_follows_the_record_sizes(server):
    """behaviour §6.2 worked sizes: SET of 11 bytes → 32, GET → 33; /open, /close and abort add 5 each."""
    client = server.client()

    def logsize(queue: str) -> int:
        return stat(client, queue, "logsize")

    client.set("a", b"hello world")
    assert logsize("a") == 32
    assert client.get("a") == b"hello world"
    assert logsize("a") == 33
    assert client.get("a") is None  # a miss writes nothing
    assert logsize("a") == 33

    client.set("b", b"first")
    client.set("b", b"second")
    client.get("b")
    assert logsize("b") == 26 + 27 + 1

    client.set("t", b"0123456789")
    assert logsize("t") == 31
    assert client.get("t/open") == b"0123456789"
    assert logsize("t") == 36
    assert client.call(b"get t/abort") == b"END"
    assert logsize("t") == 41
    assert client.get("t/peek") == b"0123456789"  # peek writes nothing
    assert logsize("t") == 41
    assert client.get("t/open") == b"0123456789"
    assert logsize("t") == 46
    assert client.call(b"get t/close") == b"END"
    assert logsize("t") == 51

    client.set("e", b"")
    assert logsize("e") == 21
    assert client.get("created") is None
    assert logsize("created") == 0

    sizes = {q: logsize(q) for q in ("a", "b", "t", "e", "created")}
    for queue, size in sizes.items():  # the reply came after the write: the OS has it all
        assert os.path.getsize(server.data_dir / queue) == size, queue
    client.close()
    server.restart(signal.SIGKILL)
    client = server.client()
    assert {q: logsize(q) for q in sizes} == sizes


def test_rotate_logs_rewrites_the_journal_to_an_empty_file(make_server, tmp_path):
    """behaviour §6.6 ServerSpec "rotate logs": maxJournalSize 16 KB, SET 8 KB, GET, SET 8 KB, GET."""
    config = write_config(tmp_path, '[queues.rot]\nmax_journal_size = "16KiB"\n')
    server = make_server("--config", config)
    client = server.client()
    data = b"x" * 8192
    client.set("rot", data)
    assert stat(client, "rot", "logsize") == 8213
    assert client.get("rot") == data
    assert stat(client, "rot", "logsize") == 8214
    client.set("rot", data)
    assert stat(client, "rot", "logsize") == 8214 + 8213
    assert stat(client, "rot", "journal_rewrites") == 0
    assert client.get("rot") == data  # 16428 > 16384 and the queue is empty → rewrite
    stats = client.stats()
    assert stats["queue_rot_journal_rewrites"] == "1"
    assert stats["queue_rot_journal_rotations"] == "0"
    assert stats["queue_rot_logsize"] == "0"
    assert queue_files(server.data_dir, "rot") == ["rot"]
    assert os.path.getsize(server.data_dir / "rot") == 0

    client.set("rot", b"after")
    server.restart(signal.SIGKILL)
    client = server.client()
    assert stat(client, "rot", "logsize") == 26
    assert [client.get("rot"), client.get("rot")] == [b"after", None]


def test_a_rewrite_found_by_a_get_on_the_hub_is_done_before_the_reply(make_server, tmp_path):
    """A lone GET runs on the hub (no greenlet switch); the rewrite its remove makes due (an
    empty queue, the file past default_journal_size) is file work the hub may not wait for.
    It runs on the queue's own greenlet, and the GET's reply still comes after it."""
    config = write_config(tmp_path, '[queues.rw]\ndefault_journal_size = "4KiB"\n')
    server = make_server("--config", config)
    client = server.client()
    for _ in range(5):
        client.set("rw", b"x" * 1000)  # 5 records of 1021 bytes: past 4 KiB, queue not empty
    assert stat(client, "rw", "journal_rewrites") == 0
    for _ in range(4):
        assert client.get("rw") == b"x" * 1000
    assert stat(client, "rw", "journal_rewrites") == 0
    assert client.get("rw") == b"x" * 1000  # empties the queue: the rewrite is due
    stats = client.stats()
    assert stats["queue_rw_journal_rewrites"] == "1"
    assert stats["queue_rw_logsize"] == "0"
    assert os.path.getsize(server.data_dir / "rw") == 0
    client.set("rw", b"after")
    server.restart(signal.SIGKILL)
    client = server.client()
    assert [client.get("rw"), client.get("rw")] == [b"after", None]


def test_a_monitors_open_reads_are_not_rewritten_at_every_set_and_survive_sigkill(make_server, tmp_path):
    """Rule (a) (behaviour §6.6, ADR 0026): an empty queue whose open reads take more than half
    of its file is not rewritten (Kestrel's rule wrote all 40 again at each SET and GET below);
    after a SIGKILL the open reads come back at the head, in order, and the passed items stay gone."""
    config = write_config(tmp_path, '[queues.held]\ndefault_journal_size = "16KiB"\n')
    server = make_server("--config", config, "--max-open-transactions", "100")
    client = server.client()
    held = [b"%02d" % i + b"." * 998 for i in range(40)]
    for data in held:
        client.set("held", data)
    reader = server.client()
    reader.send(b"monitor held 5 40\r\n")
    assert [reader.read_value() for _ in range(40)] == held
    assert reader.read_line() == b"END"
    for i in range(10):  # each finds the queue empty, the file past 16 KiB (41,040 bytes)
        client.set("held", b"pass%d" % i)
        assert client.get("held") == b"pass%d" % i
    stats = client.stats()
    assert stats["queue_held_journal_rewrites"] == "0"
    assert stats["queue_held_open_transactions"] == "40"
    assert stats["queue_held_logsize"] == str(40 * 1026 + 10 * 27)

    server.kill()
    server.start()
    client = server.client()
    assert [client.get("held") for _ in range(41)] == [*held, None]


def test_small_max_memory_size_rotates_and_replays(make_server, tmp_path):
    """A journal bigger than max_memory_size rotates (behaviour §6.6 c); the archives replay in order."""
    config = write_config(tmp_path, '[queues.small]\nmax_memory_size = "4KiB"\n')
    server = make_server("--config", config)
    items = [numbered(i, 1000) for i in range(60)]
    pipe = Pipeline(server.host, server.port)
    pipe.set_all("small", items, batch=7)
    client = server.client()
    stats = client.stats()
    # each add first checks the current file: > 4096 bytes (5 records of 1021) → rotate
    assert stats["queue_small_journal_rotations"] == "11"
    assert stats["queue_small_items"] == "60"
    assert stats["queue_small_bytes"] == "60000"
    assert int(stats["queue_small_mem_bytes"]) <= 4096 + 1000  # read-behind (behaviour §5.8)
    archives = [f for f in queue_files(server.data_dir, "small") if f != "small"]
    assert archives, "no archived journal files"
    assert_numbered(pipe.get_all("small", 25), range(25), size=1000)
    stats = client.stats()
    assert int(stats["queue_small_mem_bytes"]) <= 4096 + 1000
    assert stats["queue_small_journal_rotations"] == "12"  # the first GET found 5105 bytes
    assert stats["queue_small_journal_rewrites"] == "0"
    pipe.close()
    client.close()

    server.kill()
    server.start()
    client = server.client()
    assert stat(client, "small", "items") == 35
    assert stat(client, "small", "bytes") == 35_000
    client.set("small", numbered(60, 1000))
    client.close()
    server.restart(signal.SIGKILL)
    assert_numbered(drain_pipelined(server, "small"), range(25, 61), size=1000)


def test_packing_under_a_steady_backlog_bounds_the_files_and_replays(make_server, tmp_path):
    """max_journal_size far below what goes through: rotations ask for checkpoints and the
    archives the read-behind reader has passed are packed (behaviour §6.6, the JournalPacking load test
    behaviour §8.6 in small); the files stay bounded and replay to exactly the queue."""
    config = write_config(
        tmp_path, '[queues.packed]\nmax_memory_size = "4KiB"\nmax_journal_size = "16KiB"\n')
    server = make_server("--config", config, "--max-open-transactions", "10")
    pipe = Pipeline(server.host, server.port)
    pipe.set_all("packed", [numbered(i, 1000) for i in range(50)], batch=13)
    written, taken, largest = 50, [], 0
    for _ in range(40):  # a backlog of ~50 items; 20 in, 20 out per cycle
        pipe.set_all("packed", [numbered(i, 1000) for i in range(written, written + 20)], batch=20)
        written += 20
        taken += pipe.get_all("packed", 20)
        largest = max(largest, files_size(server.data_dir, "packed"))
    assert_numbered(taken, range(800), size=1000)
    client = server.client()
    assert stat(client, "packed", "journal_rotations") >= 100
    assert stat(client, "packed", "items") == 50
    reader = server.client()
    assert number_of(reader.get("packed/open")) == 800  # left open across the crash
    pipe.close()
    # ~850 KB went through the journal; without packing it would all still be on disk
    assert largest < 300_000, f"journal files grew to {largest} bytes: nothing was packed"

    server.kill()
    server.start()
    assert_numbered(drain_pipelined(server, "packed"), range(800, 850), size=1000)


# -- bad data directory, torn journal ------------------------------------------------------------


def _run_serve(args: list[str], port: int) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "kestrel_actors.cli", "serve", "--text-port", "0", "--admin-port", "0",
               "--thrift-port", "0", "--host", "127.0.0.1", "--port", str(port), *args]
    return subprocess.run(command, capture_output=True, timeout=30)


@pytest.mark.parametrize("how", ["flag", "config-file", "below-a-file"])
def test_a_data_dir_that_is_a_regular_file_exits_with_code_1(tmp_path, how):
    """behaviour §7.1: a queue path that is not a writable directory → exit code 1 and a clear message;
    the process must not stay up (half-alive) nor listen."""
    regular = tmp_path / "not-a-dir"
    regular.write_bytes(b"hello")
    port = free_port()
    if how == "flag":
        result = _run_serve(["--data-dir", str(regular)], port)
    elif how == "config-file":
        config = write_config(tmp_path, f'data_dir = "{regular}"\n')
        result = _run_serve(["--config", config], port)
    else:
        result = _run_serve(["--data-dir", str(regular / "queues")], port)
    message = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == 1, f"exit code {result.returncode}: {message}"
    assert str(regular) in message, message
    assert re.search(r"director|not a dir", message, re.I), message
    assert not listening(port)
    assert regular.read_bytes() == b"hello"


def _stopped_server_with(make_server, queue: str, items: list[bytes], open_first: bool = False) -> ServerProcess:
    server = make_server()
    client = server.client()
    for data in items:
        assert client.set(queue, data) == b"STORED"
    reader = server.client()  # kept connected: a disconnect would abort the open read
    if open_first:
        assert reader.get(f"{queue}/open") == items[0]
    server.stop(signal.SIGTERM)
    reader.close()
    return server


@pytest.mark.parametrize("cut", [1, 3, 24], ids=["1-byte", "3-bytes", "opcode-only"])
def test_a_torn_last_add_is_cut_and_the_rest_served(make_server, cut):
    """behaviour §6.5: a journal ending inside a record replays up to the last whole record, and the
    file is truncated there. Each ADDX of a 4-byte item is 25 bytes."""
    items = [b"it%02d" % i for i in range(5)]
    server = _stopped_server_with(make_server, "torn", items)
    path = server.data_dir / "torn"
    assert os.path.getsize(path) == 5 * 25
    os.truncate(path, 5 * 25 - cut)

    server.start()
    assert os.path.getsize(path) == 4 * 25  # cut at replay, before anything is served
    client = server.client()
    assert stat(client, "torn", "logsize") == 4 * 25
    assert stat(client, "torn", "items") == 4
    assert [client.get("torn") for _ in range(5)] == [*items[:4], None]
    client.set("torn", b"next")  # appended right after the last whole record
    server.restart(signal.SIGKILL)
    client = server.client()
    assert [client.get("torn"), client.get("torn")] == [b"next", None]


def test_a_torn_open_record_leaves_the_item_in_the_queue(make_server):
    """The last record is a torn REMOVE_TENTATIVE_XID (5 bytes): the open never happened."""
    server = _stopped_server_with(make_server, "torn", [b"a", b"b", b"c"], open_first=True)
    path = server.data_dir / "torn"
    assert os.path.getsize(path) == 3 * 22 + 5
    os.truncate(path, 3 * 22 + 2)

    server.start()
    assert os.path.getsize(path) == 3 * 22  # no UNREMOVE written: nothing was open
    client = server.client()
    assert stat(client, "torn", "open_transactions") == 0
    assert [client.get("torn") for _ in range(4)] == [b"a", b"b", b"c", None]
