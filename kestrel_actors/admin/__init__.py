"""The admin HTTP service (ostrich's port, 2223 by default): what operators watch.

``/ping``, ``/stats.json`` (``?period=N``), ``/stats.txt``, ``/server_info``, ``/shutdown``,
``/quiesce``, ``/reload`` as ostrich served them for Kestrel; ``/metrics`` for Prometheus; and
a live page at ``/``. See :mod:`._app` for the rules and :mod:`kestrel_actors.snapshot` for
where the figures come from.
"""

from __future__ import annotations

import logging
from typing import Any

from gevent.pywsgi import WSGIServer

from ._app import AdminApp

__all__ = ["AdminApp", "AdminService"]


class AdminService:
    """The admin port of one server: gevent's WSGI server (a greenlet per request, on the hub)."""

    def __init__(self, server: Any) -> None:
        self.app = AdminApp(server)
        self.http: WSGIServer | None = None

    def start(self, host: str, port: int) -> int:
        """Listen; raises ``OSError`` if the port cannot be had. Returns the bound port."""
        self.http = WSGIServer((host, port), self.app, log=None,
                               error_log=logging.getLogger("kestrel_actors.admin"))
        self.http.start()
        return self.http.server_port

    def close(self) -> None:
        self.app.close()
        if self.http is not None:
            self.http.close()
            self.http = None
