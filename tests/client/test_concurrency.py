"""One Client shared by threads, and by greenlets (whose sockets must then cooperate)."""

from __future__ import annotations

import subprocess
import sys
import threading

import gevent
import gevent.pool

from kestrel_actors.client import Client, cooperative

from ..helpers import PATIENCE


def test_threads_share_one_client(module_server):
    with Client(module_server.address, timeout=PATIENCE) as client:
        got: list[bytes] = []
        lock = threading.Lock()

        def reader() -> None:
            for _ in range(50):
                with client.reliable("threads", timeout=PATIENCE) as item:
                    assert item is not None
                    with lock:
                        got.append(item)

        def writer(n: int) -> None:
            for i in range(50):
                assert client.put("threads", b"%d-%d" % (n, i))

        threads = [threading.Thread(target=reader) for _ in range(4)]
        threads += [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        assert sorted(got) == sorted(b"%d-%d" % (n, i) for n in range(4) for i in range(50))
        assert client.queue_stats("threads")["items"] == 0


def test_greenlets_wait_cooperatively(module_server):
    """Twenty greenlets block in ``get`` on one hub while another greenlet puts: with blocking
    sockets the first reader would hold the hub for its whole wait and every read would time
    out before the writer ran."""
    with Client(module_server.address, timeout=PATIENCE) as client:
        readers = [gevent.spawn(client.get, "green", PATIENCE) for _ in range(20)]
        gevent.sleep(0.2)  # every reader is now parked in its blocking read

        def write() -> None:
            for i in range(20):
                assert client.put("green", b"%d" % i)

        gevent.spawn(write).join(30)
        gevent.joinall(readers, timeout=30, raise_error=True)
        assert sorted(g.value for g in readers) == sorted(b"%d" % i for i in range(20))
        assert all(conn.hub is gevent.get_hub() for server in client.servers
                   for conn in server.idle.get(gevent.get_hub(), ()))


def test_a_plain_thread_gets_blocking_sockets_even_with_gevent_loaded():
    gevent.get_hub()  # this thread runs a hub
    assert cooperative() is gevent.get_hub()
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(cooperative()))
    thread.start()
    thread.join()
    assert seen == [None]


def test_reliable_reads_in_greenlets(module_server):
    with Client(module_server.address, timeout=PATIENCE) as client:
        client.put_many("green_rel", [b"%d" % i for i in range(10)])
        pool = gevent.pool.Pool(5)
        results: list[bytes] = []

        def take() -> None:
            with client.reliable("green_rel", timeout=PATIENCE) as item:
                gevent.sleep(0.01)  # others run while this item is open
                results.append(item)

        for _ in range(10):
            pool.spawn(take)
        pool.join(raise_error=True)
        assert sorted(results) == sorted(b"%d" % i for i in range(10))
        assert client.queue_stats("green_rel")["open_transactions"] == 0


MONKEY_PATCHED = """
from gevent import monkey
monkey.patch_all()
import sys, threading
from kestrel_actors.client import Client

got = []
with Client(sys.argv[1], timeout=float(sys.argv[2])) as client:
    # patched threads are greenlets: a reader blocked in a plain socket would hold the
    # one hub for its whole wait, and the writer would only run after every read timed out
    readers = [threading.Thread(target=lambda: got.append(client.get("patched", float(sys.argv[2]))))
               for _ in range(10)]
    for reader in readers:
        reader.start()
    threading.Event().wait(0.2)
    assert all(client.put("patched", b"%d" % i) for i in range(10))
    for reader in readers:
        reader.join()
print(" ".join(sorted(item.decode() for item in got)))
"""


def test_a_monkey_patched_program(module_server):
    """``gevent.monkey.patch_all()`` before the import, as gevent programs start: patched
    threads (greenlets) share one client, blocking reads and a writer interleaved. The sockets
    cooperate through the patched socket module here; test_greenlets_wait_cooperatively
    covers the client's own choice on an unpatched hub."""
    proc = subprocess.run([sys.executable, "-c", MONKEY_PATCHED, module_server.address, str(PATIENCE)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(i) for i in range(10)]


CONNECTING = """
import os, sys
import gevent.pool
from kestrel_actors.client import Connection
from kestrel_actors.client.thrift import ThriftClient

host, port, thrift_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
connections = [Connection(host, port, use_gevent=True) for _ in range(10)]
pool = gevent.pool.Pool(10)
for conn in connections:
    pool.spawn(conn.connect)
pool.join(raise_error=True)
for conn in connections:
    conn.send(b"version\\r\\n")
    assert conn.read_line().startswith(b"VERSION ")
ThriftClient(host, thrift_port, use_gevent=True).close()
print(len(os.listdir("/proc/self/task")))
"""


def test_greenlets_connect_to_a_numeric_address_without_starting_a_thread(make_server):
    """Ten greenlets connect at once, as a load test's clients do, and a thrift client once:
    gevent's own ``create_connection`` would resolve each numeric address on its threadpool,
    starting up to ten OS threads, and Python 3.11 crashes when it exits before such a thread
    has first run (the load generator died of SIGSEGV that way). In a fresh process: the
    threadpool of this one may have its threads already."""
    server = make_server(thrift_port=True)
    proc = subprocess.run([sys.executable, "-c", CONNECTING, server.host, str(server.port), str(server.thrift_port)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1"]  # the main thread alone
