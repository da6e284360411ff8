"""ZooKeeper that misbehaves cannot stall or crash anyone (issue 53, point 4), against a real
ZooKeeper: a server-set member whose data is a JSON array nested 100,000 deep is skipped with
one warning by the client library and the ``-s zk://`` commands; a server told to stop while
ZooKeeper stops at the same moment still shuts down within its drain bound."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from kestrel_actors.client import Client
from kestrel_actors.cluster._membership import CLOSE_TIMEOUT
from kestrel_actors.server import DRAIN_SECONDS

from ..helpers import ServerProcess, ZooKeeperProcess, wait_for
from ..helpers import server_set_ports as ports

pytestmark = pytest.mark.timeout(240)

DEEP = b"[" * 100_000 + b"]" * 100_000


def test_a_member_nested_100000_deep_is_skipped_with_one_warning(make_server, join_args, zookeeper,
                                                                  zk_client, prefix, qname):
    servers = [make_server(*join_args()) for _ in range(2)]
    write_set = f"{prefix}/write"
    assert wait_for(lambda: ports(zk_client, write_set) == {s.port for s in servers}, timeout=30)
    zk_client.create(f"{write_set}/member_", DEEP, sequence=True)

    client = Client.from_server_set(zookeeper.hosts, write_set)
    try:
        for i in range(10):
            assert client.put(qname, b"item-%d" % i)
        got: list[bytes] = []
        for _ in range(200):  # each get asks one server, which may hold none of them
            if len(got) == 10:
                break
            if (value := client.get(qname)) is not None:
                got.append(value)
        assert sorted(got) == sorted(b"item-%d" % i for i in range(10))
    finally:
        client.close()

    cli = [sys.executable, "-m", "kestrel_actors.cli"]
    address = f"zk://{zookeeper.hosts}{write_set}"
    put = subprocess.run([*cli, "put", qname, "-s", address], input=b"one\ntwo\n", capture_output=True, timeout=60)
    assert put.returncode == 0, put.stderr
    get = subprocess.run([*cli, "get", qname, "-n", "2", "-s", address], capture_output=True, timeout=60)
    assert get.returncode == 0, get.stderr
    assert sorted(get.stdout.splitlines()) == [b"one", b"two"]
    for run in (put, get):
        assert b"RecursionError" not in run.stderr and b"Traceback" not in run.stderr, run.stderr
        [warning] = [line for line in run.stderr.splitlines() if b"member ignored" in line]
        assert b"nested too deeply" in warning


def test_sigterm_while_zookeeper_stops_shuts_down_within_the_drain_bound(tmp_path):
    """ZooKeeper frozen (SIGSTOP) at the moment the server is told to stop: the server's
    requests to leave its sets get no answer, then ``ConnectionLoss``; it exits all the same."""
    zk = ZooKeeperProcess(tmp_path / "zookeeper").start()
    server = ServerProcess(tmp_path / "data", ("--zookeeper", zk.hosts, "--zookeeper-path-prefix", "/kestrel/stop",
                                               "--zookeeper-session-timeout", "2"))
    try:
        server.start(30)
        watcher = zk.kazoo()
        try:
            assert wait_for(lambda: ports(watcher, "/kestrel/stop/write") == {server.port}, timeout=30), server.log()
        finally:
            watcher.stop()
            watcher.close()
        assert zk.proc is not None and server.proc is not None
        zk.proc.send_signal(signal.SIGSTOP)
        server.proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        try:
            # the bound: ZooKeeper's share, then the connections' drain; the rest is margin
            server.proc.wait(CLOSE_TIMEOUT + DRAIN_SECONDS + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not exit {time.monotonic() - stopped:.0f} s after SIGTERM:\n{server.log()}")
        assert server.proc.returncode == 0, server.log()
        assert "goodbye" in server.log()
    finally:
        if zk.proc is not None:
            zk.proc.send_signal(signal.SIGCONT)
        server.stop(signal.SIGKILL)
        zk.stop(signal.SIGKILL)
