"""A confirm that was answered is never delivered again (issue 21 point 2).

Every way of confirming (memcache ``/close``, ``confirm`` after ``monitor``, thrift
``confirm``, and the reads that consume at once: a plain GET, a thrift ``get`` without
``auto_abort_msec``) is answered only once its record is as durable as the queue's
``sync_journal`` says, and a shutdown (SIGTERM, ``shutdown``) answers nothing it has not
written: after a SIGKILL or a SIGTERM, no item whose confirm was answered comes back, and
no acknowledged SET is lost.
"""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest

from kestrel_actors.client import KestrelError
from kestrel_actors.loadtests.kill_soak import Ledger, summarize

from ..helpers import Client, ServerProcess, drain_queue

REPLY_TIMEOUT = 5.0
ALWAYS = ("--sync-journal", "always")


def _fill(server: ServerProcess, queue: str, count: int) -> list[bytes]:
    client = server.client(REPLY_TIMEOUT)
    items = [b"%s-%d" % (queue.encode(), i) for i in range(count)]
    for item in items:
        assert client.set(queue, item) == b"STORED"
    client.close()
    return items


def test_thrift_confirm_is_durable_before_its_answer(tmp_path):
    """Of 20 items confirmed over thrift and then a SIGKILL, none comes back (10 did when the
    confirm was answered before the queue had journaled it)."""
    server = ServerProcess(tmp_path / "data", ALWAYS, thrift_port=True).start()
    try:
        _fill(server, "work", 20)
        readers = [server.thrift_client(REPLY_TIMEOUT) for _ in range(20)]  # one open read each
        ids = []
        for reader in readers:
            [item] = reader.get("work", 1, 0, auto_abort_msec=60_000)
            ids.append(item.id)
        assert readers[0].confirm("work", ids) == 20  # any connection may confirm any id
        server.kill()  # at once: the answer must not have come before the record
        for reader in readers:
            reader.close()
        server.start()
        assert drain_queue(server, "work") == []
    finally:
        server.kill()


def test_memcache_close_is_durable_before_its_answer(tmp_path):
    """The memcache twin: ``/open`` then ``/close`` on a fresh connection each, then SIGKILL."""
    server = ServerProcess(tmp_path / "data", ALWAYS).start()
    try:
        _fill(server, "work", 20)
        for _ in range(20):
            client = server.client(REPLY_TIMEOUT)
            assert client.get("work/open") is not None
            assert client.call(b"get work/close") == b"END"
            client.close()
        server.kill()
        server.start()
        assert drain_queue(server, "work") == []
    finally:
        server.kill()


# -- the mixed load of issue 21, across SIGTERMs and SIGKILLs ------------------------------------

MIXED_CONFIG = '[queues.fan]\n[queues."fan+a"]\n'
"""A fanout queue: every SET to ``fan`` is also in ``fan+a`` (both read reliably)."""
SIGTERMS, SIGKILLS = 15, 50
WORKER_TIMEOUT = 3.0


def _memcache_sets(server: ServerProcess, ledger: Ledger, stop: threading.Event, queue: str,
                   copies: tuple[str, ...]) -> None:
    client = Client(server.host, server.port, WORKER_TIMEOUT)
    while not stop.is_set():
        [item] = ledger.payloads(queue, 1)
        if client.set(queue, item) == b"STORED":
            ledger.acked((queue, *copies), [item])


def _close_open(server: ServerProcess, ledger: Ledger, stop: threading.Event, queue: str, wait: str) -> None:
    """``get q/close/open`` in a loop: each answer confirms the item the previous one opened."""
    client = Client(server.host, server.port, WORKER_TIMEOUT)
    held: bytes | None = None
    while not stop.is_set():
        with ledger.confirming(queue, [held] if held is not None else []):
            client.send(b"get %s%s/close/open\r\n" % (queue.encode(), wait.encode()))
            item = client.read_value(queue.encode())
        if held is not None:
            ledger.confirmed(queue, [held], time.monotonic(), "close/open")
        held = item
        if item is not None:
            ledger.delivered(queue, [item], time.monotonic())


def _monitor_confirm(server: ServerProcess, ledger: Ledger, stop: threading.Event, queue: str) -> None:
    client = Client(server.host, server.port, WORKER_TIMEOUT)
    while not stop.is_set():
        client.send(b"monitor %s 1 2\r\n" % queue.encode())
        items = client.read_values(queue.encode(), 2)
        ledger.delivered(queue, items, time.monotonic())
        if items:
            with ledger.confirming(queue, items):
                assert client.call(b"confirm %s %d" % (queue.encode(), len(items))) == b"END"
            ledger.confirmed(queue, items, time.monotonic(), "monitor+confirm")


def _plain_gets(server: ServerProcess, ledger: Ledger, stop: threading.Event, queue: str) -> None:
    """Blocking plain GETs: an item read is consumed (confirmed) by the answer itself."""
    client = Client(server.host, server.port, WORKER_TIMEOUT)
    while not stop.is_set():
        ledger.take_unanswered(queue, 1)
        client.send(b"get %s/t=20\r\n" % queue.encode())
        item = client.read_value(queue.encode())
        ledger.take_unanswered(queue, -1)
        if item is not None:
            now = time.monotonic()
            ledger.delivered(queue, [item], now)
            ledger.confirmed(queue, [item], now, "plain get")


def _thrift_puts(server: ServerProcess, ledger: Ledger, stop: threading.Event, queue: str) -> None:
    thrift = server.thrift_client(WORKER_TIMEOUT)
    while not stop.is_set():
        items = ledger.payloads(queue + "-thrift", 3)
        stored = thrift.put(queue, items)
        ledger.acked((queue,), items[:stored])


def _thrift_reads(server: ServerProcess, ledger: Ledger, stop: threading.Event, queue: str,
                  reliable: bool) -> None:
    """Reliable: get with ``auto_abort_msec`` and confirm the ids. Not: the get consumes."""
    thrift = server.thrift_client(WORKER_TIMEOUT)
    while not stop.is_set():
        if reliable:
            got = thrift.get(queue, 1, 20, auto_abort_msec=30_000)
            items = [item.data for item in got]
            ledger.delivered(queue, items, time.monotonic())
            if got:
                with ledger.confirming(queue, items):
                    assert thrift.confirm(queue, [item.id for item in got]) == len(got)
                ledger.confirmed(queue, items, time.monotonic(), "thrift get+confirm")
        else:
            ledger.take_unanswered(queue, 3)
            items = [item.data for item in thrift.get(queue, 3, 20)]
            ledger.take_unanswered(queue, -3)
            now = time.monotonic()
            ledger.delivered(queue, items, now)
            ledger.confirmed(queue, items, now, "thrift plain get")


def _run_quietly(work, *args) -> None:
    """A worker ends when its connection does (the server was stopped)."""
    from thriftpy2.transport import TTransportException

    try:
        work(*args)
    except (OSError, KestrelError, TTransportException):
        pass


MIXED_WORKERS = [
    (_memcache_sets, ("rel", ())), (_memcache_sets, ("rel", ())),
    (_memcache_sets, ("plain", ())), (_memcache_sets, ("fan", ("fan+a",))),
    (_thrift_puts, ("rel",)), (_thrift_puts, ("plain",)),
    (_close_open, ("rel", "")), (_close_open, ("rel", "/t=20")),
    (_close_open, ("fan", "")), (_close_open, ("fan+a", "/t=20")),
    (_monitor_confirm, ("rel",)), (_monitor_confirm, ("rel",)),
    (_thrift_reads, ("rel", True)), (_thrift_reads, ("rel", True)),
    (_plain_gets, ("plain",)), (_plain_gets, ("plain",)), (_thrift_reads, ("plain", False)),
]


@pytest.mark.slow
@pytest.mark.timeout(900)  # 65 server starts: ~1.5 min on a 2-core box, 5 min when 5x oversubscribed
def test_mixed_load_across_sigterms_and_sigkills(tmp_path):
    """Issue 21's load: memcache SETs, ``/open``+``/close``, ``monitor``+``confirm``,
    blocking reads, thrift put/get/confirm and a fanout queue, several connections of each,
    stopped 15 times by SIGTERM and 50 times by SIGKILL in the middle of it (with
    ``--sync-journal always``): no acknowledged item is lost, no confirmed one comes back."""
    config = tmp_path / "kestrel.toml"
    config.write_text(MIXED_CONFIG)
    server = ServerProcess(tmp_path / "data", (*ALWAYS, "--config", str(config)), thrift_port=True)
    ledger = Ledger()
    signals = [signal.SIGTERM] * SIGTERMS + [signal.SIGKILL] * SIGKILLS
    random.Random(21).shuffle(signals)
    pace = random.Random(2)
    try:
        for sig in signals:
            server.start()
            stop = threading.Event()
            workers = [threading.Thread(target=_run_quietly, args=(work, server, ledger, stop, *args))
                       for work, args in MIXED_WORKERS]
            for worker in workers:
                worker.start()
            time.sleep(pace.uniform(0.1, 0.3))  # short: a server start costs more
            assert server.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
            stop.set()
            for worker in workers:
                worker.join(WORKER_TIMEOUT * 3)
                assert not worker.is_alive(), "a worker outlived its server"
        server.start()
        left = {queue: drain_queue(server, queue) for queue in ("rel", "plain", "fan", "fan+a")}
    finally:
        server.kill()
    for queue, items in left.items():
        ledger.delivered(queue, items, time.monotonic())
        ledger.queues[queue].left.extend(items)
    rows = {row.queue: row for row in summarize(ledger)}
    for queue in ("rel", "fan", "fan+a", "plain"):
        assert rows[queue].confirmed_again == 0, f"{queue}: confirmed items delivered again: {rows[queue]}"
    for queue in ("rel", "fan", "fan+a"):
        # a confirm whose answer never came may have been done (summarize counts it not lost)
        assert rows[queue].lost == 0, f"{queue}: acknowledged items lost: {rows[queue]}"
        assert rows[queue].confirmed > 50, f"{queue}: too little traffic to prove anything"
    # a consuming read whose answer never came may have taken its item: at most once
    assert rows["plain"].lost <= rows["plain"].unanswered_takes, f"plain: acknowledged items lost: {rows['plain']}"
