"""The admin HTTP service (ostrich's port, 2223 by default): what operators watch.

``/ping``, ``/stats.json`` (``?period=N``), ``/stats.txt``, ``/server_info`` as ostrich served
them for Kestrel; ``/shutdown``, ``/quiesce``, ``/reload`` as ostrich's, but on POST only, with a
header no web page can send (ADR 0019); ``/metrics`` for Prometheus; and a live page at ``/``.
See :mod:`._app` for the rules, :mod:`._guard` for who may ask, :mod:`._arrivals` for how long
a request may take to arrive, and :mod:`kestrel_actors.snapshot` for where the figures come from.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

import gevent
import structlog
from gevent.pool import Pool
from gevent.pywsgi import WSGIHandler, WSGIServer

from ..logs import error_fields
from ._app import AdminApp
from ._arrivals import Arrival, Arrivals
from ._guard import AdminGuard

__all__ = ["MAX_ARRIVING", "MAX_CONNECTIONS", "REQUEST_DEADLINE", "SEND_TIMEOUT", "AdminApp", "AdminGuard",
           "AdminService"]

MAX_CONNECTIONS = 1024
"""Admin connections held at once. Further ones wait in the listen backlog, holding no
descriptor of ours: a flood of HTTP clients cannot use up the file descriptors the memcache
listener needs."""

MAX_ARRIVING = 512
"""Of those, connections whose request has not arrived whole yet. One more closes the oldest of
them, so that a client that sends its request at once is served however many others trickle;
the other places stay for requests being answered."""

REQUEST_DEADLINE = 10.0
"""Seconds in which a request (line, headers and body) must arrive whole, counted from the
accept or from the end of the previous reply, and never restarted by a byte."""

SEND_TIMEOUT = 10.0
"""Seconds a socket operation on an admin connection may wait: a client that never reads its
reply is closed, and frees its place."""


log = structlog.get_logger("kestrel_actors.admin")

_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
"""The whole reply to a request that does not parse (gevent's own)."""

_TURN = 0.001
"""Seconds an admin connection gives way to the hub's other work before each request."""


class _Handler(WSGIHandler):
    arrival: Arrival
    server: _AdminHTTP

    def handle_one_request(self) -> Any:
        arrival = self.arrival = self.server.arrivals.expect(self.socket, str(self.client_address))
        try:
            # Pipelined requests are already buffered and an answer may not wait on anything:
            # without a turn for the hub's I/O between them, 100 pipelined /metrics hold
            # memcache clients up for seconds. A timer, not sleep(0): the hub polls I/O only
            # every 50 callbacks. (After expect: arrivals queue in the order of accept.)
            gevent.sleep(_TURN)
            result = super().handle_one_request()
        finally:
            arrival.done()
        return None if arrival.was_cut else result

    def run_application(self) -> None:
        # No endpoint reads a body, but it is part of the request and must arrive in time too;
        # what a cut-off connection has read is not a request, whatever it looks like.
        wsgi_input = self.wsgi_input
        assert wsgi_input is not None  # handle_one_request made it before the application runs
        try:
            while wsgi_input.read(65536):
                pass
            whole = True
        except OSError:  # the client closed in the middle of it, or sent a broken chunk
            whole = False
        if not self.arrival.done() or not whole:
            raise ConnectionResetError(errno.ECONNRESET, "the request did not arrive whole")
        super().run_application()

    # gevent's own hook for a client's error, private, so its stub leaves it out
    def _handle_client_error(self, ex: BaseException) -> Any:
        # A timeout, a reset or a cut-off while reading a request is the client's going: close
        # quietly (gevent's default prints a traceback and answers 400 to nobody).
        if isinstance(ex, OSError) or self.arrival.was_cut:
            return None
        # A request that does not parse (a bad request line; more than 100 headers, which
        # http.client raises and gevent printed as a 20-line traceback): one line, and 400.
        peer = self.client_address[0] if isinstance(self.client_address, tuple) else self.client_address
        log.warning("bad admin request", peer=peer, **error_fields(ex), error_type=type(ex).__name__)
        return "400", _BAD_REQUEST


class _AdminHTTP(WSGIServer):
    handler_class = _Handler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrivals = Arrivals(MAX_ARRIVING, REQUEST_DEADLINE)

    def handle(self, sock: Any, address: Any) -> None:
        sock.settimeout(SEND_TIMEOUT)
        super().handle(sock, address)


class AdminService:
    """The admin port of one server: gevent's WSGI server (a greenlet per connection, on the
    hub, at most :data:`MAX_CONNECTIONS` of them)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.app: AdminApp | None = None
        self.http: WSGIServer | None = None

    def start(self, host: str, port: int, token: str | None = None) -> int:
        """Listen on ``host`` (``--admin-host``); raises ``OSError`` if the port cannot be had.
        ``token``: ``--admin-token``. Returns the bound port."""
        http = _AdminHTTP((host, port), spawn=Pool(MAX_CONNECTIONS), log=None,
                          error_log=logging.getLogger("kestrel_actors.admin"))
        http.init_socket()  # bind now: the guard checks Host against the port the kernel gave
        bound = http.socket.getsockname()
        self.app = http.application = AdminApp(self.server, AdminGuard(host, bound[0], bound[1], token))
        http.start()
        self.http = http
        return int(bound[1])

    def close(self) -> None:
        if self.app is not None:
            self.app.close()
        if self.http is not None:
            self.http.close()
            self.http = None
