"""Servers with their admin HTTP port on (on a free port: never the default 2223)."""

from __future__ import annotations

import pytest

from ..helpers import ServerProcess


@pytest.fixture
def make_admin_server(tmp_path):
    """Factory: ``make_admin_server(*serve_args)`` starts a server with an admin port."""
    servers: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        server = ServerProcess(tmp_path / f"data{len(servers)}", args, admin_port=True)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def admin_server(make_admin_server):
    return make_admin_server()
