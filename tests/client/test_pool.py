"""A pool of three servers: round-robin writes, sweeping reads, a server killed and restarted."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from kestrel_actors.client import Client, ConnectionLost

from ..helpers import PATIENCE, ServerProcess, wait_for


@pytest.fixture
def trio(make_server):
    return [make_server() for _ in range(3)]


def single(server: ServerProcess) -> Client:
    return Client(server.address, timeout=PATIENCE)


def items_on(server: ServerProcess, queue: str) -> int:
    with single(server) as client:
        return client.queue_stats(queue).get("items", 0)


def test_writes_go_round_robin_and_reads_find_every_item(trio):
    with Client([s.address for s in trio], timeout=PATIENCE) as pool:
        assert all(pool.put("rr", b"%d" % i) for i in range(30))
        assert [items_on(s, "rr") for s in trio] == [10, 10, 10]
        assert pool.put_many("rr", [b"x", b"y"]) == 2  # one batch stays together on one server
        assert sorted(items_on(s, "rr") for s in trio) == [10, 10, 12]
        got = [pool.get("rr") for _ in range(32)]
        assert None not in got and pool.get("rr") is None
        assert sorted(got) == sorted([b"%d" % i for i in range(30)] + [b"x", b"y"])
        assert pool.queue_stats("rr")["total_items"] == 32
        assert set(pool.version()) == {s.address for s in trio}


def test_a_read_finds_an_item_on_any_server(trio):
    with Client([s.address for s in trio], timeout=PATIENCE) as pool:
        for server in trio:
            with single(server) as one:
                one.put("any", server.address.encode())
            assert pool.peek("any") == server.address.encode()
            assert pool.get("any") == server.address.encode()
            assert pool.get("any") is None


def test_a_blocking_read_waits_on_each_server_in_turn(trio):
    with Client([s.address for s in trio], timeout=PATIENCE, wait_slice=0.2) as pool:
        for server in trio:
            def put_later(server=server):
                time.sleep(0.5)
                with single(server) as one:
                    one.put("wait", b"from " + server.address.encode())
            threading.Thread(target=put_later, daemon=True).start()
            assert pool.get("wait", timeout=PATIENCE) == b"from " + server.address.encode()


def test_a_reliable_read_is_confirmed_or_aborted_on_its_server(trio):
    target = trio[1]
    with single(target) as one:
        one.put_many("rel", [b"a", b"b"])
    with Client([s.address for s in trio], timeout=PATIENCE) as pool:
        with pytest.raises(ValueError), pool.reliable("rel") as item:
            assert item == b"a"
            raise ValueError
        assert items_on(target, "rel") == 2
        with pool.reliable("rel") as item:
            assert item == b"a"
        assert items_on(target, "rel") == 1
        with pool.monitor("rel", 1, 5) as batch:
            assert batch.items == [b"b"] and batch.servers == [target.address]
        with single(target) as one:
            stats = one.queue_stats("rel")
        assert (stats["items"], stats["open_transactions"], stats["total_items"]) == (0, 0, 2)


def test_monitor_gathers_from_several_servers(trio):
    for i, server in enumerate(trio):
        with single(server) as one:
            one.put_many("mon", [b"%d-%d" % (i, j) for j in range(2)])
    with Client([s.address for s in trio], timeout=PATIENCE) as pool:
        got: list[bytes] = []
        while len(got) < 6:
            with pool.monitor("mon", 1, 6) as batch:
                assert batch
                got += batch.items
        assert sorted(got) == sorted(b"%d-%d" % (i, j) for i in range(3) for j in range(2))
        assert pool.queue_stats("mon")["items"] == 0


class HangingUp:
    """A listener that accepts each connection and closes it at once, counting them: a server
    that fails every request."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)
        self.sock.close()


def test_a_failed_server_is_skipped_until_its_backoff_ends(make_server):
    server, broken = make_server(), HangingUp()
    try:
        with Client([broken.address, server.address], timeout=PATIENCE, retry_after=3.0) as pool:
            start = time.monotonic()
            assert all(pool.put("backoff", b"%d" % i) for i in range(10))  # the broken one failed ...
            assert pool.get("backoff") == b"0" and pool.get("backoff", timeout=0.3) == b"1"
            assert pool.peek("backoff") == b"2" and pool.stats() and pool.version()
            if time.monotonic() - start < 3.0:  # (a machine so loaded that they took longer proves nothing)
                assert broken.accepted == 1  # ... and was left alone for its backoff
            tried = broken.accepted
            time.sleep(3.1)
            assert pool.put("backoff", b"x") and pool.put("backoff", b"y")
            assert broken.accepted == tried + 1  # tried again once its backoff was over, then left alone
        assert items_on(server, "backoff") == 10
    finally:
        broken.close()


def test_one_server_killed_mid_run_loses_nothing_acknowledged(trio):
    """SIGKILL one of three servers while a producer and two reliable consumers run through
    one pool: writes and reads go on with the other two; once it restarts on its port and data
    dir the same pool uses it again, and what it had acknowledged is read from its journal.

    Delivery is at least once: an item whose confirm failed with the kill may have been removed
    (the reply was lost) or come back; a put whose reply was lost may be stored twice."""
    victim = trio[1]
    pool = Client([s.address for s in trio], timeout=PATIENCE, retry_after=0.3, wait_slice=0.1)
    acknowledged: list[bytes] = []
    after_kill: list[bytes] = []  # acknowledged once the victim was dead: on the other two
    confirmed: list[bytes] = []
    confirm_failed: set[bytes] = set()
    killed, stop = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    for i in range(90):  # 30 on each server
        assert pool.put("kill", b"before-%04d" % i)
        acknowledged.append(b"before-%04d" % i)

    def produce() -> None:
        for i in range(600):
            data = b"during-%04d" % i
            dead = killed.is_set()  # before the put: a put after it cannot reach the victim
            try:
                if pool.put("kill", data):
                    acknowledged.append(data)
                    if dead:
                        after_kill.append(data)
            except ConnectionLost:
                pass  # every server refused at that moment: not acknowledged
            time.sleep(0.002)

    def consume() -> None:
        while not stop.is_set():
            taken = None
            try:
                with pool.reliable("kill", timeout=0.2) as item:
                    taken = item
                    time.sleep(0.005)  # handling it: the queue backs up, the victim holds items
            except ConnectionLost:
                if taken is not None:
                    confirm_failed.add(taken)
                continue
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return
            if taken is not None:
                confirmed.append(taken)

    threads = [threading.Thread(target=produce)] + [threading.Thread(target=consume) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        assert wait_for(lambda: len(confirmed) >= 60 and len(acknowledged) >= 200, 30)
        victim.kill()  # mid-run: puts and open reads in flight
        killed.set()
        threads[0].join(60)
        assert not threads[0].is_alive()
        assert len(acknowledged) >= 90 + 590  # writes went on with two servers
        # reads went on: everything written after the kill is on the other two and is read
        assert wait_for(lambda: set(after_kill) <= set(confirmed), 30)
        stranded = set(acknowledged) - set(confirmed) - confirm_failed
        assert stranded  # the victim's items, in its journal only

        victim.start()  # same port, same data directory
        assert wait_for(lambda: set(acknowledged) <= set(confirmed) | confirm_failed, 30)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not errors, errors
    assert stranded <= set(confirmed)  # read again from the restarted server, through the same pool
    assert set(confirmed) <= set(acknowledged) | {b"during-%04d" % i for i in range(600)}
    assert len(confirmed) - len(set(confirmed)) <= 1  # at most the one put in flight at the kill
    assert items_on(victim, "kill") == 0
    assert all(pool.put("after", b"%d" % i) for i in range(9))
    assert items_on(victim, "after") == 3  # and it is written to again
    pool.close()

