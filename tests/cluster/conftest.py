"""The cluster room's fixtures: one real ZooKeeper per test module (a JVM start costs
seconds), and servers that join its server sets under a prefix of their own per test."""

from __future__ import annotations

import pytest

from ..helpers import ZooKeeperProcess, unique


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    zk = ZooKeeperProcess(tmp_path_factory.mktemp("zookeeper")).start()
    yield zk
    zk.stop()


@pytest.fixture
def prefix() -> str:
    """A server-set parent node no other test uses."""
    return f"/kestrel/{unique('cluster')}"


@pytest.fixture
def zk_client(zookeeper):
    client = zookeeper.kazoo()
    yield client
    client.stop()
    client.close()


@pytest.fixture
def join_args(zookeeper, prefix):
    """``serve`` flags that join ``prefix``'s sets in the module's ZooKeeper."""
    def args(*more: str, session_timeout: float = 10.0, grace: float = 0.0) -> tuple[str, ...]:
        return ("--zookeeper", zookeeper.hosts, "--zookeeper-path-prefix", prefix,
                "--zookeeper-session-timeout", str(session_timeout),
                "--status-change-grace-period", str(grace), *more)
    return args
