"""A full disk answers instead of hanging; ``STORED`` covers every copy a SET makes (issue 17).

Disk full (case 3): each test mounts a small tmpfs as the server's data directory (root is
needed; without it the tests skip and say so), fills it with a filler file, and drives a real
server into ``ENOSPC``: a SET must get ``SERVER_ERROR`` within the client's timeout, other
queues and ``stats`` keep answering, writes resume by themselves once the filler is deleted,
and after a SIGKILL every ``STORED`` item is back and the journal has no torn record.

Copies (case 9): a SET to a fanout master or an alias is acknowledged only once every copy
is in its queue's journal; a SIGKILL right after ``STORED`` never loses a copy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from thriftpy2.thrift import TApplicationException

from kestrel_actors.journal import RecordReader

from ..helpers import PATIENCE, Client, ServerProcess, free_port, get_json, log_lines, mounted_tmpfs, request

REPLY_TIMEOUT = PATIENCE
"""Every reply must come within this (a hang fails the test instead of stalling it)."""


# -- the tmpfs --------------------------------------------------------------------------------


@pytest.fixture
def mount_tmpfs(tmp_path):
    """``mount_tmpfs(options)``: a tmpfs at ``tmp_path/data``, unmounted at teardown (the test
    skips, saying why, if mounting is refused: it needs root)."""
    with contextlib.ExitStack() as mounts:
        yield lambda options: mounts.enter_context(mounted_tmpfs(tmp_path / "data", options))


@pytest.fixture
def small_disk(mount_tmpfs):
    """An 8 MiB tmpfs as a data directory."""
    return mount_tmpfs("size=8m")


def fill(disk: Path, leave: int) -> Path:
    """Write a filler file so that about ``leave`` bytes stay free on ``disk``."""
    filler = disk / "filler.bin"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def journal_problems(path: Path) -> list[str]:
    """Problems a replay would find reading ``path`` record by record (none for a clean file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = RecordReader(fd)
        while reader.next() is not None:
            pass
        return [] if reader.problem is None else [f"{reader.problem.offset}: {reader.problem.message}"]
    finally:
        os.close(fd)


def item(n: int, size: int = 10_000) -> bytes:
    head = b"item-%06d-" % n
    return head + b"x" * (size - len(head))


def number(data: bytes) -> int:
    return int(data[5:11])


def text_put(sock_client: Client, queue: str, data: bytes) -> bytes:
    sock_client.send(b"put %s:\n%s\n\n" % (queue.encode(), data))
    return sock_client.read_line()


class TextClient(Client):
    EOL = b"\n"


# -- case 3: a full disk ----------------------------------------------------------------------


@pytest.mark.parametrize("sync", ["never", "always"])
def test_full_disk_answers_server_error_and_recovers(small_disk, tmp_path, sync):
    text_port = free_port()
    config = tmp_path / "kestrel.toml"
    config.write_text('[aliases]\nto_jobs = ["jobs"]\n')
    server = ServerProcess(small_disk, ("--sync-journal", sync, "--text-port", str(text_port),
                                        "--config", str(config)), thrift_port=True)
    server.start()
    try:
        _full_disk_scenario(server, small_disk, text_port)
    finally:
        server.stop(signal.SIGKILL)


def _full_disk_scenario(server: ServerProcess, disk: Path, text_port: int) -> None:
    client = server.client(REPLY_TIMEOUT)
    for n in range(3):
        assert client.set("other", b"other-%d" % n) == b"STORED"
    assert client.set("jobs", item(0)) == b"STORED"
    stored = {0}
    refused: set[int] = set()

    filler = fill(disk, leave=300_000)
    n = 1
    reply = b""
    while n < 200:  # 2 MB of items against ~300 KB free: the disk runs out long before
        reply = client.set("jobs", item(n))
        if reply != b"STORED":
            refused.add(n)
            break
        stored.add(n)
        n += 1
    assert reply.startswith(b"SERVER_ERROR journal write failed: "), reply
    assert b"No space left on device" in reply

    # the connection stays open; the next SET is refused before it touches the queue
    n += 1
    assert client.set("jobs", item(n)).startswith(b"SERVER_ERROR "), "a SET while failing"
    refused.add(n)

    other = server.client(REPLY_TIMEOUT)
    assert other.stats()["queue_other_items"] == "3"  # stats answers
    assert other.get("other") == b"other-0"  # another queue answers, reads work
    other.send(b"get other/open\r\n")
    assert other.read_value() == b"other-1"
    assert other.call(b"get other/close") == b"END"
    n += 1
    fresh = other.set("fresh", item(n))  # a new queue: its first write fails too
    assert fresh.startswith(b"SERVER_ERROR "), fresh
    refused.add(n)

    text = TextClient(server.host, text_port, REPLY_TIMEOUT)
    n += 1
    put = text_put(text, "jobs", item(n))
    assert put.startswith(b"-journal write failed: "), put  # the text protocol's error line
    refused.add(n)

    # thrift's SERVER_ERROR is a TApplicationException (not a count, which reads as a full
    # queue's refusal); the connection stays
    thrift = server.thrift_client(REPLY_TIMEOUT)
    n += 1
    with pytest.raises(TApplicationException, match="journal write failed: No space left on device") as error:
        thrift.put("jobs", [item(n)])
    assert error.value.type == TApplicationException.INTERNAL_ERROR
    refused.add(n)
    assert thrift.get_version()

    # through an alias, each protocol answers the same
    n += 1
    assert client.set("to_jobs", item(n)).startswith(b"SERVER_ERROR journal write failed: ")
    refused.add(n)
    n += 1
    assert text_put(text, "to_jobs", item(n)).startswith(b"-journal write failed: ")
    refused.add(n)
    n += 1
    with pytest.raises(TApplicationException, match="journal write failed: "):
        thrift.put("to_jobs", [item(n)])
    refused.add(n)

    filler.unlink()  # space comes back: writes resume by themselves
    deadline = time.monotonic() + PATIENCE
    while True:
        n += 1
        reply = client.set("jobs", item(n))
        if reply == b"STORED":
            stored.add(n)
            break
        assert reply.startswith(b"SERVER_ERROR "), reply
        refused.add(n)
        assert time.monotonic() < deadline, "writes did not resume after the disk had space again"
        time.sleep(0.1)
    for _ in range(5):
        n += 1
        assert client.set("jobs", item(n)) == b"STORED"
        stored.add(n)
    assert text_put(text, "fresh", b"after") == b"+1"
    n += 1
    assert thrift.put("jobs", [item(n)]) == 1
    stored.add(n)
    n += 1
    assert thrift.put("to_jobs", [item(n)]) == 1
    stored.add(n)
    for sock in (client, other, text, thrift):
        sock.close()

    events = server.log_events()
    failing = [e for e in events if e.get("event", "").startswith("journal write failing")]
    recovered = [e for e in events if e.get("event") == "journal write recovered"]
    # one line per queue per change of state, not one per retry
    assert sorted(e["queue"] for e in failing) == ["fresh", "jobs"], failing
    assert sorted(e["queue"] for e in recovered) == ["fresh", "jobs"], recovered
    assert not [e for e in events if "retry" in e.get("event", "")]

    server.stop(signal.SIGKILL)
    for name in ("jobs", "fresh", "other"):
        assert journal_problems(disk / name) == [], name  # no torn record left by ENOSPC
    server.start()
    client = server.client(REPLY_TIMEOUT)
    count = int(client.stats()["queue_jobs_items"])
    found = [client.get("jobs") for _ in range(count)]
    assert client.get("jobs") is None
    numbers = [number(data) for data in found]
    assert found == [item(k) for k in numbers]
    assert len(set(numbers)) == len(numbers), "an item came back twice"
    missing = stored - set(numbers)
    assert not missing, f"acknowledged items lost: {sorted(missing)}"
    # an unacknowledged SET may or may not be there (it was kept in memory and written when
    # space came back); nothing else may appear
    assert set(numbers) <= stored | refused
    assert numbers == sorted(numbers)
    assert client.get("other") == b"other-2"
    assert client.get("other") is None
    client.close()
    log = server.log()
    assert "truncated" not in log and "corrupt" not in log, log


def test_full_disk_reads_succeed_and_replay_matches(small_disk):
    """On a full disk a read that would take an item for good (a plain GET, a close) is refused
    and leaves it (issue 53); an open is served from memory. Their records are written once
    space is back, so after a restart the journal agrees with what clients saw."""
    server = ServerProcess(small_disk, ("--text-port", "0"))
    server.start()
    try:
        client = server.client(REPLY_TIMEOUT)
        for n in range(20):
            assert client.set("reads", item(n, 1000)) == b"STORED"
        filler = fill(small_disk, leave=0)
        while client.set("reads", item(999, 1000)) == b"STORED":  # until the disk is full
            pass
        for _ in range(3):  # REMOVE records cannot be written: nothing is handed out
            assert client.call(b"get reads").startswith(b"SERVER_ERROR journal write failed: ")
        client.send(b"get reads/open\r\n")
        assert number(client.read_value()) == 0
        # its CONFIRM could not be written: refused, the item goes back to the head
        assert client.call(b"get reads/close").startswith(b"SERVER_ERROR journal write failed: ")
        assert client.stats()["queue_reads_items"] != ""
        filler.unlink()
        deadline = time.monotonic() + PATIENCE
        while client.set("reads", item(1000, 1000)) != b"STORED":
            assert time.monotonic() < deadline, "writes did not resume"
            time.sleep(0.1)
        assert [number(client.get("reads")) for _ in range(2)] == [0, 1]
        client.close()

        server.stop(signal.SIGKILL)
        server.start()
        client = server.client(REPLY_TIMEOUT)
        first = client.get("reads")
        assert first is not None and number(first) == 2, "the journal does not agree with the answers"
        client.close()
    finally:
        server.stop(signal.SIGKILL)


def test_queue_whose_file_cannot_be_created_answers(mount_tmpfs):
    """No inode left for a new queue's journal: its SET gets SERVER_ERROR (the text protocol an
    error line), and every other queue goes on."""
    disk = mount_tmpfs("size=8m,nr_inodes=8")
    text_port = free_port()
    server = ServerProcess(disk, ("--text-port", str(text_port)))
    server.start()
    try:
        client = server.client(REPLY_TIMEOUT)
        replies = [client.set(f"q{n}", b"x") for n in range(12)]
        assert replies[0] == b"STORED"
        failed = [n for n, reply in enumerate(replies) if reply != b"STORED"]
        assert failed, "the inodes never ran out"
        assert all(replies[n] == b"SERVER_ERROR cannot open queue: No space left on device" for n in failed)
        text = TextClient(server.host, text_port, REPLY_TIMEOUT)
        assert text_put(text, f"q{failed[0]}", b"y") == b"-cannot open queue: No space left on device"
        assert client.set("q0", b"again") == b"STORED"
        assert client.stats()["queue_q0_items"] == "2"
        assert client.get("q0") == b"x"
        client.close()
        text.close()
    finally:
        server.stop(signal.SIGKILL)


# -- case 3: disk errors are logged once per change of state, whatever the errno ------------------


SMALL_JOURNALS = """
[queues.packed]
max_memory_size = "4KiB"
max_journal_size = "16KiB"
[queues.rw]
default_journal_size = "4KiB"
"""
"""Journals that rotate, pack (in read-behind) and rewrite every few items."""


def state_changes(events: list[dict], ending: str) -> list[tuple[str, str]]:
    """(queue, event) of every ``journal … failing`` (or ``recovered``) line, in order."""
    return [(e.get("queue", ""), e["event"].split(";")[0]) for e in events
            if e.get("event", "").startswith("journal ") and e["event"].split(";")[0].endswith(ending)]


def _queue_stored(client: Client, queue: str, data: bytes, deadline: float) -> None:
    while (reply := client.set(queue, data)) != b"STORED":
        assert reply.startswith(b"SERVER_ERROR "), reply
        assert time.monotonic() < deadline, f"{queue}: writes did not resume"
        time.sleep(0.05)


def test_full_disk_with_small_journals_logs_once_per_change(small_disk, tmp_path):
    """Seconds of a full disk under rotations, packs, rewrites and a write too large for the
    hub (the threadpool's): one ``failing`` line per queue and kind of work, one ``recovered``
    each once space is back, every line one JSON event (no traceback printed raw)."""
    config = tmp_path / "kestrel.toml"
    config.write_text(SMALL_JOURNALS)
    server = ServerProcess(small_disk, ("--config", str(config)))
    server.start()
    try:
        client = server.client(REPLY_TIMEOUT)
        for n in range(50):  # a backlog: read-behind, rotations with checkpoints, packs
            assert client.set("packed", item(n, 1000)) == b"STORED"
        filler = fill(small_disk, leave=0)
        assert client.set("big", b"b" * (2 << 20)).startswith(b"SERVER_ERROR ")  # on the threadpool
        refused = 0
        started = time.monotonic()
        while time.monotonic() - started < 4:  # a few seconds of retries
            for queue in ("packed", "rw"):
                reply = client.set(queue, item(999, 1000))
                refused += reply != b"STORED"
                assert reply == b"STORED" or reply.startswith(b"SERVER_ERROR journal write failed: "), reply
            # packed keeps its backlog: still in read-behind when space is back; a GET of rw
            # is refused while its journal fails (it would take an item for good), or served
            reply = client.call(b"get rw")
            if reply.startswith(b"VALUE"):
                client.read_line()  # its data
                assert client.read_line() == b"END"
            else:
                assert reply == b"END" or reply.startswith(b"SERVER_ERROR journal write failed: "), reply
            assert client.stats()["queue_packed_items"]  # stats answers all along
            time.sleep(0.01)
        assert refused
        events, raw = log_lines(server)
        failing = state_changes(events, "failing")
        assert sorted(failing) == sorted(set(failing)), f"logged more than once per change: {failing}"
        assert {("big", "journal write failing"), ("rw", "journal write failing"),
                ("packed", "journal write failing")} <= set(failing), failing
        assert not raw, "lines that are not one JSON event: " + "\n".join(raw[:20])
        for event in events:
            if event.get("event", "").endswith("failing"):
                assert "exception" not in event, event  # an OSError: no traceback
                assert event.get("errno") == "ENOSPC", event

        filler.unlink()
        deadline = time.monotonic() + PATIENCE
        for queue in ("big", "packed", "rw"):
            _queue_stored(client, queue, item(1000, 1000), deadline)
        for n in range(60):  # keep rotating, packing and rewriting: the work that failed recovers
            assert client.set("packed", item(2000 + n, 1000)) == b"STORED"
            assert client.get("packed") is not None  # the reader moves on: packs
            assert client.set("rw", item(2000 + n, 1000)) == b"STORED"
            assert client.get("rw") is not None
        while True:
            events, raw = log_lines(server)
            failing = state_changes(events, "failing")
            recovered = state_changes(events, "recovered")
            if {(q, e.replace("failing", "recovered")) for q, e in failing} <= set(recovered):
                break
            assert time.monotonic() < deadline, f"failing {failing}, recovered only {recovered}"
            assert client.set("packed", item(3000, 1000)) == b"STORED"
            time.sleep(0.05)
        assert sorted(failing) == sorted(set(failing)), failing
        assert sorted(recovered) == sorted(set(recovered)), recovered
        assert not raw, raw[:20]
        client.close()
    finally:
        server.stop(signal.SIGKILL)


@pytest.fixture
def immutable(small_disk):
    """``immutable(True/False)``: ``chattr +i``/``-i`` on the tmpfs data directory (no file can
    be created, renamed or deleted in it; an open journal can still be written)."""
    def set_immutable(on: bool) -> None:
        result = subprocess.run(["chattr", "+i" if on else "-i", str(small_disk)], capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot chattr the tmpfs here: {result.stderr.strip()}")

    yield set_immutable
    subprocess.run(["chattr", "-i", str(small_disk)], capture_output=True)


def test_rotations_that_fail_with_eperm_are_logged_once_and_recover(small_disk, tmp_path, immutable):
    """A data directory where no file can be created or renamed (``EPERM``): rotations and
    rewrites fail while writes go on; every SET is still answered ``STORED``, the failure is
    one line per queue and kind of work, the queue actor never fails, and once the directory
    is writable again the rotations resume (one ``recovered`` line) and nothing is lost."""
    config = tmp_path / "kestrel.toml"
    config.write_text(SMALL_JOURNALS)
    server = ServerProcess(small_disk, ("--config", str(config)))
    server.start()
    try:
        client = server.client(REPLY_TIMEOUT)
        stored = {"packed": [], "rw": []}
        n = 0

        def put(queue: str) -> None:
            nonlocal n
            assert client.set(queue, item(n, 1000)) == b"STORED", (queue, n)
            stored[queue].append(n)
            n += 1

        def write_round() -> None:
            put("packed")
            put("rw")
            assert number(client.get("rw")) == stored["rw"].pop(0)  # empty again: a rewrite is due

        for _ in range(10):
            put("packed")
        put("rw")  # its file exists before no file can be made
        assert number(client.get("rw")) == stored["rw"].pop(0)
        immutable(True)
        # writes until both kinds of work have failed (counted in rounds, not seconds: a loaded
        # machine makes fewer in a given time), then as many again that fail the same way
        expected = {("packed", "journal rotation failing"), ("rw", "journal rewrite failing")}
        deadline = time.monotonic() + PATIENCE
        while not expected <= set(state_changes(log_lines(server)[0], "failing")):
            assert time.monotonic() < deadline, "no rotation or rewrite failed"
            write_round()
        for _ in range(100):
            write_round()
        events, raw = log_lines(server)
        failing = state_changes(events, "failing")
        assert ("packed", "journal rotation failing") in failing, failing
        assert ("rw", "journal rewrite failing") in failing, failing
        assert sorted(failing) == sorted(set(failing)), f"logged more than once per change: {failing}"
        for event in events:
            if event.get("event", "").endswith("failing"):
                assert event.get("errno") == "EPERM" and "exception" not in event, event
        assert not [e for e in events if "actor had failed" in e.get("event", "")], "a queue actor failed"
        assert not raw, raw[:20]

        immutable(False)
        deadline = time.monotonic() + PATIENCE
        while True:
            put("packed")
            put("rw")
            assert number(client.get("rw")) == stored["rw"].pop(0)
            recovered = state_changes(log_lines(server)[0], "recovered")
            if {("packed", "journal rotation recovered"), ("rw", "journal rewrite recovered")} <= set(recovered):
                break
            assert time.monotonic() < deadline, f"rotations did not resume: {recovered}"
            time.sleep(0.05)
        assert sorted(recovered) == sorted(set(recovered)), recovered
        assert int(client.stats()["queue_packed_journal_rotations"]) > 0
        client.close()

        server.stop(signal.SIGKILL)
        server.start()
        client = server.client(REPLY_TIMEOUT)
        for queue, numbers in stored.items():
            found = [number(client.get(queue)) for _ in numbers]
            assert found == numbers, queue
            assert client.get(queue) is None
        client.close()
    finally:
        server.stop(signal.SIGKILL)


def test_a_write_failing_with_another_errno_answers_server_error_and_recovers(tmp_path):
    """Not only ``ENOSPC``: a journal write refused with ``EFBIG`` (the server's file-size limit,
    lowered under it with ``prlimit`` — a read-only remount is refused while a journal is open
    for writing) gets ``SERVER_ERROR`` at once, is not acknowledged, other queues and ``stats``
    go on, writes resume by themselves when the limit is lifted, and it is logged once each way."""
    import resource

    server = ServerProcess(tmp_path / "data")
    server.start()
    try:
        pid = server.proc.pid  # type: ignore[union-attr]
        client = server.client(REPLY_TIMEOUT)
        assert client.set("other", b"small") == b"STORED"
        stored, refused = [], []
        for n in range(100):
            assert client.set("jobs", item(n, 1000)) == b"STORED"
            stored.append(n)
        limit = os.path.getsize(tmp_path / "data" / "jobs") + 20_000  # far above the log's size
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        except (OSError, AttributeError) as exc:
            pytest.skip(f"cannot lower the server's file-size limit here: {exc}")
        try:
            n = 100
            while True:
                reply = client.set("jobs", item(n, 1000))
                if reply != b"STORED":
                    break
                stored.append(n)
                n += 1
                assert n < 200, "the file-size limit never applied"
            assert reply == b"SERVER_ERROR journal write failed: File too large", reply
            refused.append(n)
            n += 1
            # a write too large for the hub fails on the threadpool: answered and logged alike
            assert client.set("large", b"l" * (2 << 20)) == b"SERVER_ERROR journal write failed: File too large"
            started = time.monotonic()
            while time.monotonic() - started < 2:  # retries meanwhile: logged once
                reply = client.set("jobs", item(n, 1000))
                assert reply.startswith(b"SERVER_ERROR journal write failed: "), reply
                refused.append(n)
                n += 1
                assert client.set("other", b"more") == b"STORED"  # a small journal goes on
                assert client.stats()["queue_jobs_items"]
                time.sleep(0.05)
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        deadline = time.monotonic() + PATIENCE
        while (reply := client.set("jobs", item(n, 1000))) != b"STORED":
            assert reply.startswith(b"SERVER_ERROR "), reply
            refused.append(n)
            n += 1
            assert time.monotonic() < deadline, "writes did not resume after the limit was lifted"
            time.sleep(0.05)
        stored.append(n)
        while client.set("large", b"after") != b"STORED":
            assert time.monotonic() < deadline, "writes to the large queue did not resume"
            time.sleep(0.05)
        client.close()

        events, raw = log_lines(server)
        assert not raw, "lines that are not one JSON event: " + "\n".join(raw[:20])
        assert sorted(state_changes(events, "failing")) == [("jobs", "journal write failing"),
                                                            ("large", "journal write failing")]
        assert sorted(state_changes(events, "recovered")) == [("jobs", "journal write recovered"),
                                                              ("large", "journal write recovered")]
        for failing in (e for e in events if e["event"].startswith("journal write failing")):
            assert failing["errno"] == "EFBIG" and "exception" not in failing, failing

        server.stop(signal.SIGKILL)
        assert journal_problems(tmp_path / "data" / "jobs") == []  # no torn record left
        server.start()
        client = server.client(REPLY_TIMEOUT)
        count = int(client.stats()["queue_jobs_items"])
        numbers = [number(client.get("jobs")) for _ in range(count)]
        assert not set(stored) - set(numbers), "acknowledged items lost"
        assert set(numbers) <= set(stored) | set(refused) and numbers == sorted(numbers)
        client.close()
    finally:
        server.stop(signal.SIGKILL)


# -- case 9: STORED covers every copy ---------------------------------------------------------


FANOUT_CONFIG = """
[queues.fan]
[queues."fan+keep"]
[queues.synced]
[queues."synced+always"]
sync_journal = "always"

[aliases]
both = ["dest_a", "dest_b"]
via = ["synced"]
"""


@pytest.mark.parametrize("rounds", [25])
def test_stored_covers_fanout_and_alias_copies_across_sigkill(tmp_path, rounds):
    config = tmp_path / "kestrel.toml"
    config.write_text(FANOUT_CONFIG)
    server = ServerProcess(tmp_path / "data", ("--config", str(config)))
    try:
        for round_ in range(rounds):
            server.start()
            client = server.client(REPLY_TIMEOUT)
            value = b"before-%d" % round_
            if round_ % 2:  # the recipe: a child made by referring to it, not configured
                assert client.get("loose+keep") is None
                assert client.set("loose", value) == b"STORED"
                server.kill()
                client.close()
                server.start()
                client = server.client(REPLY_TIMEOUT)
                assert client.get("loose+keep") == value, f"round {round_}: loose+keep lost its copy"
                assert client.get("loose") == value
                client.close()
                server.stop(signal.SIGKILL)
                continue
            # one write, and the kill as soon as the last STORED is read
            client.send(
                b"set fan 0 0 %d\r\n%s\r\n" % (len(value), value)
                + b"set both 0 0 %d\r\n%s\r\n" % (len(value), value)
                + b"set via 0 0 %d\r\n%s\r\n" % (len(value), value)
            )
            replies = [client.read_line() for _ in range(3)]
            server.kill()
            client.close()
            assert replies == [b"STORED"] * 3, replies

            restart_and_find_every_copy(server, value, round_)
    finally:
        server.stop(signal.SIGKILL)


def test_text_and_thrift_puts_cover_fanout_and_alias_copies_across_sigkill(tmp_path):
    """Text ``put``'s ``+n`` and thrift ``put``'s count are acknowledgements too."""
    config = tmp_path / "kestrel.toml"
    config.write_text(FANOUT_CONFIG)
    text_port = free_port()
    server = ServerProcess(tmp_path / "data", ("--config", str(config), "--text-port", str(text_port)),
                           thrift_port=True)
    try:
        for round_ in range(12):
            server.start()
            value = b"put-%d" % round_
            if round_ % 2:
                text = TextClient(server.host, text_port, REPLY_TIMEOUT)
                text.send(b"".join(b"put %s:\n%s\n\n" % (queue, value) for queue in (b"fan", b"both", b"synced")))
                replies = [text.read_line() for _ in range(3)]
            else:
                thrift = server.thrift_client(REPLY_TIMEOUT)
                replies = [thrift.put(queue, [value]) for queue in ("fan", "both", "synced")]
            server.kill()
            assert replies in ([b"+1"] * 3, [1] * 3), replies

            restart_and_find_every_copy(server, value, round_)
    finally:
        server.stop(signal.SIGKILL)


def restart_and_find_every_copy(server: ServerProcess, value: bytes, round_: int) -> None:
    """After a SIGKILL that followed the acknowledgement: every copy of ``value`` is there."""
    server.start()
    client = server.client(REPLY_TIMEOUT)
    for queue in ("fan+keep", "fan", "dest_a", "dest_b", "synced", "synced+always"):
        assert client.get(queue) == value, f"round {round_}: {queue} lost its copy"
    client.close()
    server.stop(signal.SIGKILL)


def test_expired_items_move_durably(tmp_path):
    """An expired item moved to ``expire_to_queue`` is in the target after a SIGKILL, even
    when the source's REMOVE was written (durable-before-remove)."""
    config = tmp_path / "kestrel.toml"
    config.write_text('[queues.src]\nexpire_to_queue = "dst"\n[queues.dst]\nsync_journal = "always"\n')
    server = ServerProcess(tmp_path / "data", ("--config", str(config)))
    try:
        for round_ in range(10):
            server.start()
            client = server.client(REPLY_TIMEOUT)
            assert client.set("src", b"soon-%d" % round_, exptime=1) == b"STORED"
            time.sleep(1.1)
            # the GET sweeps the expired item to dst; STORED after it covers the REMOVE too
            assert client.get("src") is None
            assert client.set("src", b"marker") == b"STORED"
            server.kill()
            client.close()

            server.start()
            client = server.client(REPLY_TIMEOUT)
            assert client.get("dst") == b"soon-%d" % round_, f"round {round_}: the moved item was lost"
            assert client.get("src") == b"marker"
            assert client.get("src") is None
            client.close()
            server.stop(signal.SIGKILL)
    finally:
        server.stop(signal.SIGKILL)


# -- issue 21.6: a fanout child on a full disk ---------------------------------------------------


def test_a_fanout_childs_failing_write_answers_server_error(small_disk, tmp_path):
    """A child whose journal write fails while it holds a copy's ack answers the master with
    the failure (a copy's ack is no batch answer: the failure path must take both), so the SET
    gets ``SERVER_ERROR`` and is not acknowledged; nothing hangs, nothing is logged as a bug,
    and once there is space again every STORED item is in the master and in the child."""
    config = tmp_path / "kestrel.toml"
    config.write_text('[queues.fan]\n[queues."fan+kid"]\n')
    server = ServerProcess(small_disk, ("--config", str(config)))
    server.start()
    try:
        client = server.client(REPLY_TIMEOUT)
        assert client.set("fan", item(0)) == b"STORED"
        stored = [0]
        filler = fill(small_disk, leave=200_000)
        n = 1
        while (reply := client.set("fan", item(n))) == b"STORED":
            stored.append(n)
            n += 1
            assert n < 100, "the disk never filled"
        assert reply.startswith(b"SERVER_ERROR journal write failed: "), reply
        for _ in range(3):  # while failing: refused at once, the connection stays
            n += 1
            assert client.set("fan", item(n)).startswith(b"SERVER_ERROR journal write failed: ")
        assert client.stats()["queue_fan+kid_items"]
        filler.unlink()
        n += 1
        _queue_stored(client, "fan", item(n), time.monotonic() + PATIENCE)
        stored.append(n)
        client.close()
        events, raw = log_lines(server)
        assert not raw, raw[:20]
        assert not [e for e in events if e.get("level") in ("error", "critical") and "exception" in e], events
        server.stop(signal.SIGKILL)
        server.start()
        client = server.client(REPLY_TIMEOUT)
        for queue in ("fan", "fan+kid"):
            count = int(client.stats()[f"queue_{queue}_items"])
            numbers = [number(client.get(queue)) for _ in range(count)]
            assert not set(stored) - set(numbers), f"{queue}: acknowledged items lost"
        client.close()
    finally:
        server.stop(signal.SIGKILL)


def journal_failing(server: ServerProcess) -> tuple[dict[str, float], dict[str, float]]:
    """``q/<name>/journal_failing`` of /stats.json and ``kestrel_queue_journal_failing`` of
    /metrics, by queue."""
    from prometheus_client.parser import text_string_to_metric_families

    gauges = get_json(server.admin_url + "/stats.json")["gauges"]
    ostrich = {name.split("/")[1]: value for name, value in gauges.items()
               if name.startswith("q/") and name.endswith("/journal_failing")}
    metrics = request(server.admin_url + "/metrics").body.decode()
    prometheus = {sample.labels["queue"]: sample.value for family in text_string_to_metric_families(metrics)
                  for sample in family.samples if sample.name == "kestrel_queue_journal_failing"}
    return ostrich, prometheus


def test_health_and_the_journal_failing_gauge_follow_a_full_disk(small_disk):
    """/ping says pong and the status stays Up on a full disk; /health answers 503 naming the
    queue whose journal cannot write, its ``journal_failing`` gauge is 1 (0 for the others), and
    both come back by themselves once there is space again."""
    server = ServerProcess(small_disk, admin_port=True)
    server.start()
    try:
        client = server.client(REPLY_TIMEOUT)
        assert client.set("other", b"small") == b"STORED"
        assert client.set("jobs", item(0)) == b"STORED"
        assert request(server.admin_url + "/health")[:3] == (200, "text/plain; charset=utf-8", b"ok")
        assert journal_failing(server) == ({"other": 0, "jobs": 0}, {"other": 0, "jobs": 0})

        filler = fill(small_disk, leave=200_000)
        n = 1
        while client.set("jobs", item(n)) == b"STORED":
            n += 1
            assert n < 100, "the disk never filled"
        health = request(server.admin_url + "/health")
        assert health.status == 503, health
        assert health.json() == {"error": "journal write failing: jobs"}
        assert journal_failing(server) == ({"other": 0, "jobs": 1}, {"other": 0, "jobs": 1})
        assert get_json(server.admin_url + "/ping") == {"response": "pong"}  # only says it answers

        filler.unlink()
        _queue_stored(client, "jobs", item(n + 1), time.monotonic() + PATIENCE)
        assert request(server.admin_url + "/health")[:3] == (200, "text/plain; charset=utf-8", b"ok")
        assert journal_failing(server) == ({"other": 0, "jobs": 0}, {"other": 0, "jobs": 0})
        client.close()
    finally:
        server.stop(signal.SIGKILL)
