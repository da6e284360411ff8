"""While a journal write or fdatasync fails, nothing is answered as done (issue 53, point 1).

Real servers on real files, the disk broken two ways under one queue's journal:

* ``eio``: ``fdatasync`` fails with ``EIO``, through an ``LD_PRELOAD`` shim compiled here from
  ``fdatasync_fault.c`` (a control file says how many calls fail, on which files). Each failure
  also cuts the file back to its size at its last good fdatasync: what a crash finds once Linux
  has reported a writeback error and dropped the dirty pages. A device-mapper ``error`` target
  would fail every write, read and sync of a whole file system, with nothing to choose which
  call fails or how often, and needs a loop device; the shim fails one call of one file.
* ``full``: a 4 MiB tmpfs, filled to the last byte once the journal ends on a page boundary, so
  that the next record needs a page the disk has not got (``ENOSPC``).

A close, a confirm after ``monitor``, a thrift confirm and a plain GET whose record could not be
made durable get an error, and after a SIGKILL every item is back, once: nothing answered as
done comes back, nothing unanswered is lost. Then the fsyncgate cases (one failed fdatasync,
then success: the failed round's records are written again) and a sync period that fails
(``/health`` 503 and ``kestrel_queue_journal_failing`` 1 while it does).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from thriftpy2.thrift import TApplicationException

from ..helpers import Client, ServerProcess, drain_queue, log_lines, mounted_tmpfs, request, wait_for

ALWAYS = ("--sync-journal", "always")
PERIOD = ("--sync-journal", "200ms")
QUEUE = "work"
REPLY_TIMEOUT = 5.0
SETTLE = 15.0
"""A generous bound for what the server does by itself (a retry, a periodic fdatasync)."""
JOURNAL_ERROR = b"SERVER_ERROR journal write failed: "
ADD_HEADER = 21
"""An ADDX record's bytes before its item's data (journal/_format.py)."""


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    """The fdatasync shim, compiled for this run (``make test`` always has a C compiler: it
    compiles the request path with mypyc)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the fdatasync shim")
    library = tmp_path_factory.mktemp("shim") / "fdatasync_fault.so"
    source = Path(__file__).with_name("fdatasync_fault.c")
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"], check=True)
    return library


class Disk:
    """The data directory of one test and how its queue's journal is broken and mended."""

    def __init__(self, kind: str, data_dir: Path, control: Path | None = None, shim: Path | None = None) -> None:
        self.kind = kind
        self.data_dir = data_dir
        self.control = control
        self.env = None if shim is None else {"LD_PRELOAD": str(shim), "KESTREL_TEST_FDATASYNC_CONTROL": str(control)}
        self.filler = data_dir / "filler.bin"
        if control is not None:
            self.fail_fdatasyncs(0)

    @property
    def journal(self) -> Path:
        return self.data_dir / QUEUE

    def server(self, args: tuple[str, ...], **ports) -> ServerProcess:
        return ServerProcess(self.data_dir, args, env=self.env, **ports).start()

    def fail_fdatasyncs(self, count: int) -> None:
        """The next ``count`` fdatasyncs of the queue's journal fail (-1: all of them)."""
        assert self.control is not None
        # replaced whole, as the shim replaces it: the shim reads it on every fdatasync
        beside = self.control.with_name(self.control.name + ".test-tmp")
        beside.write_text(f"{count} {self.journal}\n")
        os.replace(beside, self.control)

    def failures_left(self) -> int:
        assert self.control is not None
        return int(self.control.read_text().split()[0])

    def synced_size(self) -> int | None:
        """The journal's size at its last good fdatasync (the shim's report)."""
        assert self.control is not None
        try:
            return int(Path(f"{self.control}.synced").read_text())
        except (OSError, ValueError):
            return None

    def break_under(self, client: Client, stored: list[bytes]) -> None:
        """Break the disk: the queue's next journal record cannot be made durable."""
        if self.kind == "eio":
            self.fail_fdatasyncs(-1)
            return
        # the next record must need a new page: end the journal on a page boundary first
        page = os.sysconf("SC_PAGE_SIZE")
        size = self.journal.stat().st_size
        pad = b"p" * ((-(size + ADD_HEADER)) % page or page)
        assert client.set(QUEUE, pad) == b"STORED"
        stored.append(pad)
        assert self.journal.stat().st_size % page == 0
        with open(self.filler, "wb", buffering=0) as filler:
            for chunk in (1 << 20, 1 << 16, 1 << 12, 1):
                try:
                    while filler.write(b"\0" * chunk):
                        pass
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc

    def mend(self) -> None:
        if self.kind == "eio":
            self.fail_fdatasyncs(0)
        else:
            self.filler.unlink()


@pytest.fixture
def eio_disk(tmp_path, shim) -> Disk:
    return Disk("eio", tmp_path / "data", tmp_path / "fdatasync-control", shim)


@pytest.fixture(params=["eio", "full"])
def disk(request, tmp_path) -> Iterator[Disk]:
    if request.param == "eio":
        yield request.getfixturevalue("eio_disk")
        return
    with mounted_tmpfs(tmp_path / "data", "size=4m") as data_dir:
        yield Disk("full", data_dir)


def fill_queue(client: Client, count: int = 5) -> list[bytes]:
    items = [b"item-%d" % n for n in range(count)]
    for item in items:
        assert client.set(QUEUE, item) == b"STORED"
    return items


def assert_every_item_back_once(server: ServerProcess, disk: Disk, stored: list[bytes]) -> None:
    """SIGKILL, mend the disk, start again: nothing was answered as done, so every item stored
    is there, once (a close or GET answered as done would be missing; a record written twice
    would bring an item back twice)."""
    server.kill()
    disk.mend()
    server.start()
    assert sorted(drain_queue(server, QUEUE)) == sorted(stored)


# -- a record that cannot be made durable is not answered as done ------------------------------


def test_a_close_whose_confirm_is_not_durable_is_an_error(disk):
    server = disk.server(ALWAYS)
    try:
        client = server.client(REPLY_TIMEOUT)
        stored = fill_queue(client)
        assert client.get(f"{QUEUE}/open") == stored[0]
        disk.break_under(client, stored)
        assert client.call(f"get {QUEUE}/close".encode()).startswith(JOURNAL_ERROR)
        # while the journal fails: an open still works from memory, its close is refused
        assert client.get(f"{QUEUE}/open") is not None
        assert client.call(f"get {QUEUE}/close".encode()).startswith(JOURNAL_ERROR)
        assert_every_item_back_once(server, disk, stored)
    finally:
        server.kill()


def test_a_confirm_after_monitor_that_is_not_durable_is_an_error(disk):
    server = disk.server(ALWAYS)
    try:
        client = server.client(REPLY_TIMEOUT)
        stored = fill_queue(client)
        client.send(f"monitor {QUEUE} 1 2\r\n".encode())
        assert client.read_values(QUEUE.encode(), 2) == stored[:2]
        disk.break_under(client, stored)
        assert client.call(f"confirm {QUEUE} 2".encode()).startswith(JOURNAL_ERROR)
        assert_every_item_back_once(server, disk, stored)
    finally:
        server.kill()


def test_a_thrift_confirm_that_is_not_durable_is_an_error(disk):
    server = disk.server((*ALWAYS, "--max-open-transactions", "2"), thrift_port=True)
    try:
        client = server.client(REPLY_TIMEOUT)
        stored = fill_queue(client)
        thrift = server.thrift_client(REPLY_TIMEOUT)
        opened = thrift.get(QUEUE, 2, 0, auto_abort_msec=600_000)
        assert [item.data for item in opened] == stored[:2]
        disk.break_under(client, stored)
        with pytest.raises(TApplicationException, match="journal write failed: ") as error:
            thrift.confirm(QUEUE, [item.id for item in opened])
        assert error.value.type == TApplicationException.INTERNAL_ERROR
        thrift.close()
        assert_every_item_back_once(server, disk, stored)
    finally:
        server.kill()


def test_a_plain_get_whose_remove_is_not_durable_hands_out_nothing(disk):
    server = disk.server(ALWAYS)
    try:
        client = server.client(REPLY_TIMEOUT)
        stored = fill_queue(client)
        disk.break_under(client, stored)
        assert client.call(f"get {QUEUE}".encode()).startswith(JOURNAL_ERROR)
        assert client.call(f"get {QUEUE}".encode()).startswith(JOURNAL_ERROR)  # refused while failing
        assert_every_item_back_once(server, disk, stored)
    finally:
        server.kill()


# -- fsyncgate: after a failed fdatasync the page cache is not trusted ---------------------------


def recovered(server: ServerProcess) -> bool:
    events, _raw = log_lines(server)
    return any("recovered" in event.get("event", "") and event.get("queue") == QUEUE for event in events)


def test_the_records_of_a_failed_fdatasync_are_written_again(eio_disk):
    """``always``: one fdatasync fails (its bytes lost), the next succeeds. The close it covered
    is an error and its item goes back to the queue; the CONFIRM and the item's new ADD are
    written again and synced, so after a SIGKILL the item is there once (without the rewrite,
    the open read and the ADD both bring it back)."""
    server = eio_disk.server(ALWAYS)
    try:
        client = server.client(REPLY_TIMEOUT)
        stored = fill_queue(client, 3)
        assert client.get(f"{QUEUE}/open") == stored[0]
        eio_disk.fail_fdatasyncs(1)
        assert client.call(f"get {QUEUE}/close".encode()).startswith(JOURNAL_ERROR)
        assert wait_for(lambda: recovered(server), SETTLE), server.log()
        assert eio_disk.failures_left() == 0
        assert client.get(QUEUE) == stored[1]  # the queue works again: a GET is answered
        server.kill()
        server.start()
        assert sorted(drain_queue(server, QUEUE)) == sorted([stored[0], stored[2]])
    finally:
        server.kill()


def test_a_confirm_answered_under_a_sync_period_survives_a_failed_fdatasync(eio_disk):
    """A sync period: the close is answered once written; the periodic fdatasync that covers it
    fails once (its bytes lost), the retry succeeds. The CONFIRM is written again before that
    retry, so a SIGKILL afterwards does not bring the confirmed item back."""
    server = eio_disk.server(PERIOD)
    try:
        client = server.client(REPLY_TIMEOUT)
        stored = fill_queue(client, 3)
        assert client.get(f"{QUEUE}/open") == stored[0]
        journal = eio_disk.journal
        assert wait_for(lambda: eio_disk.synced_size() == journal.stat().st_size, SETTLE)
        eio_disk.fail_fdatasyncs(1)
        assert client.call(f"get {QUEUE}/close".encode()) == b"END"
        assert wait_for(lambda: eio_disk.failures_left() == 0, SETTLE)
        assert wait_for(lambda: recovered(server), SETTLE), server.log()
        assert wait_for(lambda: eio_disk.synced_size() == journal.stat().st_size, SETTLE)
        server.kill()
        server.start()
        assert sorted(drain_queue(server, QUEUE)) == sorted(stored[1:])
    finally:
        server.kill()


# -- a sync period that fails shows as in always -------------------------------------------------


def journal_failing_gauge(server: ServerProcess) -> str | None:
    for line in request(server.admin_url + "/metrics").body.decode().splitlines():
        if line.startswith(f'kestrel_queue_journal_failing{{queue="{QUEUE}"}}'):
            return line.split()[-1]
    return None


def test_a_failing_periodic_fdatasync_turns_health_to_503_and_the_gauge_to_1(eio_disk):
    server = eio_disk.server(PERIOD, admin_port=True)
    try:
        client = server.client(REPLY_TIMEOUT)
        fill_queue(client, 1)
        assert request(server.admin_url + "/health").status == 200
        eio_disk.fail_fdatasyncs(-1)
        client.set(QUEUE, b"written, not synced")  # STORED once written; or refused, if the sync failed first
        assert wait_for(lambda: request(server.admin_url + "/health").status == 503, SETTLE)
        health = request(server.admin_url + "/health")
        assert health.json() == {"error": f"journal write failing: {QUEUE}"}
        assert float(journal_failing_gauge(server)) == 1
        assert client.set(QUEUE, b"refused").startswith(JOURNAL_ERROR)  # as with always
        eio_disk.fail_fdatasyncs(0)
        assert wait_for(lambda: request(server.admin_url + "/health").status == 200, SETTLE)
        assert float(journal_failing_gauge(server)) == 0
        assert client.set(QUEUE, b"stored again") == b"STORED"
    finally:
        server.kill()
