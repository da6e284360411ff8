"""Shared fixtures: real server processes on loopback with data in a temp dir, and unique queue
names. The Spark fixtures are the bridge room's (``tests/bridge/conftest.py``).

``make test`` runs the suite on two pytest-xdist workers (``--dist loadfile``): a module's
tests stay on one worker, so its module-scoped fixtures (a shared server, a ZooKeeper) start
once. Two groups of modules stay on one worker too (:func:`pytest_xdist_make_scheduler`). A
test that serves on the default ports holds :func:`tests.helpers.default_ports_held`."""

from __future__ import annotations

import pytest

from .helpers import ServerProcess, World, unique

WORKER_GROUPS = {
    "tests/bridge/": "spark",
    "tests/admin/test_page.py": "browser",
    "tests/admin/test_access.py": "browser",
}
"""Modules that run on one worker, one after another, as one group: the Spark tests (one
SparkSession for the room, and never a second Spark JVM, a spark-submit driver or a standalone
cluster beside it on two cores) and the browser tests (one Chromium at a time). Keys are paths,
a folder's ending in ``/``."""


def worker_group(nodeid: str) -> str:
    """The unit ``--dist loadfile`` keeps on one worker: the test's module, or its group."""
    module = nodeid.split("::", 1)[0]
    for path, group in WORKER_GROUPS.items():
        if module == path or (path.endswith("/") and module.startswith(path)):
            return group
    return module


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with :data:`WORKER_GROUPS`. (pytest-xdist's own ``--dist loadgroup``
    cannot group under pytest 9: it renames a test by an attribute pytest 9 no longer reads.)
    Groups go out largest first (pytest-xdist's default order), so the Spark group starts early."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return GroupedFileScheduling(config, log)


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
