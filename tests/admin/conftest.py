"""Servers with their admin HTTP port on (on a free port: never the default 2223)."""

from __future__ import annotations

import pytest

from ..helpers import ServerProcess


@pytest.fixture
def make_admin_server(make_server):
    """Factory: ``make_admin_server(*serve_args)`` starts a server with an admin port."""

    def start(*args: str) -> ServerProcess:
        return make_server(*args, admin_port=True)

    return start


@pytest.fixture
def admin_server(make_admin_server):
    return make_admin_server()
