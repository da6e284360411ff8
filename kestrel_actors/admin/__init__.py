"""The admin HTTP service (ostrich's port, 2223 by default): what operators watch.

``/ping``, ``/stats.json`` (``?period=N``), ``/stats.txt``, ``/server_info``, ``/shutdown``,
``/quiesce``, ``/reload`` as ostrich served them for Kestrel; ``/metrics`` for Prometheus; and
a live page at ``/``. See :mod:`._app` for the rules and :mod:`kestrel_actors.snapshot` for
where the figures come from.
"""

from __future__ import annotations

import logging
from typing import Any

from gevent.pool import Pool
from gevent.pywsgi import WSGIHandler, WSGIServer

from ._app import AdminApp

__all__ = ["IDLE_TIMEOUT", "MAX_CONNECTIONS", "AdminApp", "AdminService"]

MAX_CONNECTIONS = 64
"""Admin connections served at once. Further ones wait in the listen backlog, holding no
descriptor of ours: a flood of HTTP clients cannot use up the file descriptors the memcache
listener needs."""

IDLE_TIMEOUT = 10.0
"""Seconds a socket operation on an admin connection may wait: a half-sent request, an idle
keep-alive or a client that never reads its reply is closed, and frees its place."""


class _Handler(WSGIHandler):
    def _handle_client_error(self, ex: BaseException) -> Any:
        # A timeout or a reset while reading a request is the client's going: close quietly
        # (gevent's default prints a traceback and answers 400 to nobody).
        if isinstance(ex, OSError):
            return None
        return super()._handle_client_error(ex)


class _AdminHTTP(WSGIServer):
    handler_class = _Handler

    def handle(self, sock: Any, address: Any) -> None:
        sock.settimeout(IDLE_TIMEOUT)
        super().handle(sock, address)


class AdminService:
    """The admin port of one server: gevent's WSGI server (a greenlet per connection, on the
    hub, at most :data:`MAX_CONNECTIONS` of them)."""

    def __init__(self, server: Any) -> None:
        self.app = AdminApp(server)
        self.http: WSGIServer | None = None

    def start(self, host: str, port: int) -> int:
        """Listen; raises ``OSError`` if the port cannot be had. Returns the bound port."""
        self.http = _AdminHTTP((host, port), self.app, spawn=Pool(MAX_CONNECTIONS), log=None,
                               error_log=logging.getLogger("kestrel_actors.admin"))
        self.http.start()
        return self.http.server_port

    def close(self) -> None:
        self.app.close()
        if self.http is not None:
            self.http.close()
            self.http = None
