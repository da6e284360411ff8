"""The cluster room's fixtures: one real ZooKeeper per test module (a JVM start costs
seconds), and servers that join its server sets under a prefix of their own per test."""

from __future__ import annotations

import pytest

from ..helpers import ZooKeeperProcess, server_set_ports, unique, wait_for


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


@pytest.fixture
def start_cluster(make_server, join_args, zk_client, prefix):
    """Factory: ``start_cluster(count, **join_args)`` starts ``count`` servers joined to
    ``prefix``'s sets and returns them once both sets list every one."""
    def start(count: int, **options) -> list:
        servers = [make_server(*join_args(**options)) for _ in range(count)]
        everyone = {s.port for s in servers}
        for set_name in ("read", "write"):
            path = f"{prefix}/{set_name}"
            if not wait_for(lambda path=path: server_set_ports(zk_client, path) == everyone, timeout=45):
                logs = "\n".join(f"--- server {s.port}:\n{s.log()}" for s in servers)
                pytest.fail(f"{set_name} set shows {server_set_ports(zk_client, path)}, want "
                            f"{everyone}; children {zk_client.get_children(path)}\n{logs}")
        return servers
    return start
