"""Shared fixtures: real server processes on loopback with data in a temp dir, and unique queue
names. The Spark fixtures are the bridge room's (``tests/bridge/conftest.py``).

``make test`` runs the suite on two pytest-xdist workers (``--dist loadfile``): a module's
tests stay on one worker, so its module-scoped fixtures (a shared server, a ZooKeeper) start
once. A test that serves on the default ports holds :func:`tests.helpers.default_ports_held`."""

from __future__ import annotations

import pytest

from .helpers import ServerProcess, World, unique


@pytest.fixture
def make_server(tmp_path):
    """Factory: ``make_server(*serve_args, **ports)`` starts a server; all are stopped at
    teardown. ``ports`` are :class:`ServerProcess`'s (``admin_port=True``, ``thrift_port=True``:
    on a free port)."""
    servers: list[ServerProcess] = []

    def start(*args: str, data_dir=None, **ports) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / f"data{len(servers)}", args, **ports)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def make_admin_server(make_server):
    """Factory: ``make_admin_server(*serve_args)`` starts a server with its admin port on
    (a free port: never the default 2223)."""

    def start(*args: str) -> ServerProcess:
        return make_server(*args, admin_port=True)

    return start


@pytest.fixture
def admin_server(make_admin_server):
    return make_admin_server()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    """One server for a whole test module (tests must use distinct queue names)."""
    server = ServerProcess(tmp_path_factory.mktemp("module") / "data").start()
    yield server
    server.stop()


@pytest.fixture
def server(make_server):
    """A fresh server for one test."""
    return make_server()


@pytest.fixture
def qname() -> str:
    """A queue name no other test in this process uses."""
    return unique()


@pytest.fixture
def world(tmp_path):
    """A server without sockets (:class:`~tests.helpers.World`): one queue collection with
    memory journals and the context its in-process sessions share."""
    world = World(tmp_path)
    yield world
    world.collection.stop()
