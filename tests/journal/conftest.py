"""The journal room's fixtures."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ..helpers import ServerProcess


@pytest.fixture
def started():
    """Factory: ``started(data_dir, *serve_args, timeout=20.0)`` starts a server on
    ``data_dir`` and returns it listening; every one is killed at teardown."""
    servers: list[ServerProcess] = []

    def start(data_dir: Path, *args: str, timeout: float = 20.0) -> ServerProcess:
        server = ServerProcess(data_dir, args)
        servers.append(server)
        return server.start(timeout)

    yield start
    for server in servers:
        server.stop(signal.SIGKILL)
