"""A pool of three servers: round-robin writes, sweeping reads, a server killed and restarted."""

from __future__ import annotations

import threading
import time

import pytest

from kestrel_actors.client import Client, ConnectionLost

from ..helpers import ServerProcess


@pytest.fixture
def trio(make_server):
    return [make_server() for _ in range(3)]


def single(server: ServerProcess) -> Client:
    return Client(server.address, timeout=2.0)


def items_on(server: ServerProcess, queue: str) -> int:
    with single(server) as client:
        return client.queue_stats(queue).get("items", 0)


def test_writes_go_round_robin_and_reads_find_every_item(trio):
    with Client([s.address for s in trio], timeout=2.0) as pool:
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
    with Client([s.address for s in trio], timeout=2.0) as pool:
        for server in trio:
            with single(server) as one:
                one.put("any", server.address.encode())
            assert pool.peek("any") == server.address.encode()
            assert pool.get("any") == server.address.encode()
            assert pool.get("any") is None


def test_a_blocking_read_waits_on_each_server_in_turn(trio):
    with Client([s.address for s in trio], timeout=2.0, wait_slice=0.2) as pool:
        for server in trio:
            def put_later(server=server):
                time.sleep(0.5)
                with single(server) as one:
                    one.put("wait", b"from " + server.address.encode())
            threading.Thread(target=put_later, daemon=True).start()
            assert pool.get("wait", timeout=10.0) == b"from " + server.address.encode()


def test_a_reliable_read_is_confirmed_or_aborted_on_its_server(trio):
    target = trio[1]
    with single(target) as one:
        one.put_many("rel", [b"a", b"b"])
    with Client([s.address for s in trio], timeout=2.0) as pool:
        with pytest.raises(ValueError):
            with pool.reliable("rel") as item:
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
    with Client([s.address for s in trio], timeout=2.0) as pool:
        got: list[bytes] = []
        while len(got) < 6:
            with pool.monitor("mon", 1, 6) as batch:
                assert batch
                got += batch.items
        assert sorted(got) == sorted(b"%d-%d" % (i, j) for i in range(3) for j in range(2))
        assert pool.queue_stats("mon")["items"] == 0


def test_one_server_killed_mid_run_loses_nothing_acknowledged(trio):
    """SIGKILL one of three servers while a producer and consumers run: writes and reads go on
    with the other two; once it restarts on its port and data dir it is used again, and what
    it had acknowledged is read from its journal."""
    victim = trio[1]
    pool = Client([s.address for s in trio], timeout=2.0, retry_after=0.3, wait_slice=0.1)
    acknowledged: list[bytes] = []
    received: list[bytes] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    for i in range(90):  # 30 on each server, the victim's only in its journal from now on
        assert pool.put("kill", b"before-%04d" % i)
        acknowledged.append(b"before-%04d" % i)

    def produce() -> None:
        for i in range(600):
            data = b"during-%04d" % i
            try:
                if pool.put("kill", data):
                    acknowledged.append(data)
            except ConnectionLost:
                pass  # every server refused at that moment: not acknowledged
            time.sleep(0.002)

    def consume() -> None:
        while not stop.is_set():
            try:
                with pool.reliable("kill", timeout=0.2) as item:
                    if item is not None:
                        received.append(item)
            except ConnectionLost:
                pass  # the item (if any) stays on its server
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    victim.kill()
    producer = threading.Thread(target=produce)
    consumers = [threading.Thread(target=consume) for _ in range(2)]
    producer.start()
    for consumer in consumers:
        consumer.start()
    producer.join(60)
    assert not producer.is_alive()
    assert len(acknowledged) >= 90 + 590  # writes went on with two servers
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(received) < len(acknowledged) - 30:
        time.sleep(0.1)
    assert len(received) == len(acknowledged) - 30  # reads went on: all but the victim's
    assert set(acknowledged) - set(received) == {b"before-%04d" % i for i in range(1, 90, 3)}

    victim.start()  # same port, same data directory
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(received) < len(acknowledged):
        time.sleep(0.1)
    stop.set()
    for consumer in consumers:
        consumer.join(10)
    pool.close()
    assert not errors, errors
    assert sorted(received) == sorted(acknowledged)  # each exactly once
    assert items_on(victim, "kill") == 0
    with Client([s.address for s in trio], timeout=2.0) as again:
        assert all(again.put("after", b"%d" % i) for i in range(9))
    assert items_on(victim, "after") == 3  # and it is written to again
