"""The admin HTTP application: ostrich's endpoints, ``/metrics``, ``/health``, the live page and
``/queue.json?name=`` (one queue's configuration, for the page's detail view).

It runs under gevent's WSGI server, one greenlet per request on the server's hub. A handler
only reads: the figures come from one snapshot (:func:`~kestrel_actors.snapshot.gather_snapshot`
asks the queue collection, and this greenlet alone waits for the answer); the three endpoints
that act (``/shutdown``, ``/quiesce``, ``/reload``) call the same server methods as the memcache
commands, and only on ``POST`` (ADR 0019): ``GET`` or ``HEAD`` on them is 405 with ``Allow:
POST`` and does nothing. Nothing else on this port changes anything. Unknown paths are 404, a
query string that does not parse or names an unknown parameter is 400, another method is 405;
who may ask at all is :mod:`._guard`'s (403, or 401 without the token).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from typing import Any, NoReturn
from urllib.parse import parse_qsl

import gevent
import structlog
from pykka import ActorDeadError

from .._compiled import fallback
from ..messages import ReloadFailed
from ..protocol import config_settings
from ..runtime import ReplyFuture
from ..snapshot import gather_snapshot
from ._builds import SharedBuilds
from ._guard import ACT_HEADER, AdminGuard
from ._ostrich import NamedListeners, PeriodLatches, json_bytes, ostrich_json, ostrich_stats, ostrich_text, server_info
from ._prometheus import CONTENT_TYPE, exposition

__all__ = ["AdminApp"]

log = structlog.get_logger("kestrel_actors.admin")

MAX_PERIOD = 86_400
_PERIOD = re.compile(r"[0-9]{1,6}\Z")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_JSON = "application/json"
_TEXT = "text/plain; charset=utf-8"

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
Body = bytes | list[bytes]
"""A reply's body: whole, or in pieces (a scrape's, written as it was built)."""


class _HttpError(Exception):
    def __init__(self, status: str, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class _Route:
    __slots__ = ("handler", "params", "acts", "methods")

    def __init__(self, handler: Callable[..., tuple[str, Body]], params: frozenset[str] = frozenset(),
                 acts: bool = False) -> None:
        self.handler = handler
        self.params = params
        self.acts = acts
        """An endpoint that changes the server: only POST reaches it (ostrich's took GET)."""
        self.methods = ("POST",) if acts else ("GET", "HEAD")


class AdminApp:
    """The WSGI application of one server's admin port."""

    def __init__(self, server: Any, guard: AdminGuard) -> None:
        self.server = server
        self.guard = guard
        self.latches = PeriodLatches(self._snapshot)
        self.namespaces = NamedListeners()
        self.pause: Callable[[], None] = gevent.idle
        """What a scrape's build calls between chunks of queues: it goes on once the hub has
        nothing else to do, so clients' requests go first."""
        self.builds: SharedBuilds[tuple[str, Body]] = SharedBuilds()
        self.routes: dict[str, _Route] = {}
        for stem, handler, params, acts in (
            ("/ping", self._ping, (), False),
            ("/stats", self._stats, ("period", "namespace", "filtered"), False),
            ("/server_info", self._server_info, (), False),
            ("/shutdown", self._shutdown, (), True),
            ("/quiesce", self._quiesce, (), True),
            ("/reload", self._reload, (), True),
        ):
            route = _Route(handler, frozenset(params), acts)
            for suffix in ("", ".json", ".txt"):
                self.routes[stem + suffix] = route
        self.routes["/metrics"] = _Route(self._metrics, frozenset({"queue_series"}))
        self.routes["/health"] = _Route(self._health)
        self.routes["/"] = _Route(self._page)
        self.routes["/queue.json"] = _Route(self._queue, frozenset({"name"}))

    def close(self) -> None:
        self.latches.close()

    # -- WSGI -----------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET")
        extra: tuple[tuple[str, str], ...] = ()
        try:
            route = self.routes.get(path)
            if route is None:
                raise _HttpError("404 Not Found", f"no such endpoint: {path}")
            if method not in route.methods:
                self._refuse_method(environ, path, method, route)
            params = _query(environ.get("QUERY_STRING", ""), route.params)
            self._admit(environ, path, route)
            text = path.endswith(".txt")
            content_type, body = route.handler(params, text)
            status = "200 OK"
        except _HttpError as exc:
            status, content_type, extra = exc.status, _JSON, exc.headers
            body = json_bytes({"error": exc.message})
        except Exception:  # a failing endpoint must not take the server down
            log.exception("admin request failed", path=path)
            status, content_type = "500 Internal Server Error", _JSON
            body = json_bytes({"error": "internal error"})
        parts = [body] if isinstance(body, bytes) else body  # a scrape's body comes in pieces
        headers = [("Content-Type", content_type), ("Content-Length", str(sum(map(len, parts)))),
                   ("Cache-Control", "no-store"), *extra]
        start_response(status, headers)
        if method == "HEAD":
            return [b""]
        return parts if isinstance(body, bytes) else _paced(parts, self.pause)

    def _refuse_method(self, environ: dict[str, Any], path: str, method: str, route: _Route) -> NoReturn:
        allow = (("Allow", ", ".join(route.methods)),)
        if not route.acts:
            raise _HttpError("405 Method Not Allowed", f"{method} is not allowed on {path}", allow)
        # a GET, HEAD or OPTIONS aimed at an endpoint that acts: an image, a prefetch, a
        # preflight or an old script; said once in the log, as any refusal
        reason = (f"{method} does not act: {path} acts on POST only, with the header {ACT_HEADER} "
                  "or Authorization: Bearer TOKEN")
        self._refuse(environ, path, "405 Method Not Allowed", reason, allow)

    def _admit(self, environ: dict[str, Any], path: str, route: _Route) -> None:
        refusal = self.guard.refusal(environ, route.acts)
        if refusal is not None:
            challenge = (("WWW-Authenticate", 'Bearer realm="kestrel-actors admin"'),) if refusal.challenge else ()
            self._refuse(environ, path, refusal.status, refusal.reason, challenge)

    def _refuse(self, environ: dict[str, Any], path: str, status: str, reason: str,
                headers: tuple[tuple[str, str], ...]) -> NoReturn:
        log.warning("admin request refused", path=path, method=environ.get("REQUEST_METHOD"), reason=reason,
                    peer=environ.get("REMOTE_ADDR"))
        raise _HttpError(status, reason, headers)

    # -- endpoints ------------------------------------------------------------------------

    def _snapshot(self):
        try:
            return gather_snapshot(self.server, pause=self.pause)
        except ActorDeadError as exc:
            raise _HttpError("503 Service Unavailable", "the server is shutting down") from exc

    def _ping(self, _params: dict[str, str], text: bool) -> tuple[str, bytes]:
        return _respond({"response": "pong"}, text)

    def _stats(self, params: dict[str, str], text: bool) -> tuple[str, Body]:
        # ostrich's filtered=1 drops the names its configured filters match; there are none
        if params.get("filtered", "0") not in ("0", "1"):
            raise _HttpError("400 Bad Request", "filtered must be 0 or 1")
        namespace = params.get("namespace")
        if namespace is not None and not _NAMESPACE.match(namespace):
            raise _HttpError("400 Bad Request", "namespace must be 1 to 64 letters, digits, '_', '.' or '-'")
        period = _period(params["period"]) if "period" in params else None
        if period is None and namespace is not None:  # each read of a namespace moves it on
            return self._stats_document(period, namespace, text)
        return self.builds.get(("/stats.txt" if text else "/stats.json", tuple(sorted(params.items()))),
                               lambda: self._stats_document(period, None, text))

    def _stats_document(self, period: int | None, namespace: str | None, text: bool) -> tuple[str, Body]:
        snapshot = self._snapshot()
        if period is not None:  # as in ostrich, a period wins over a namespace
            stats = self.latches.stats(period, snapshot, self.pause)
        elif namespace is not None:
            stats = self.namespaces.stats(namespace, snapshot, self.pause)
        else:
            stats = ostrich_stats(snapshot, pause=self.pause)
        if text:
            return _TEXT, ostrich_text(stats, self.pause)
        return _JSON, ostrich_json(stats, self.pause)

    def _server_info(self, _params: dict[str, str], text: bool) -> tuple[str, bytes]:
        return _respond(server_info(self.server), text)

    def _shutdown(self, _params: dict[str, str], text: bool) -> tuple[str, bytes]:
        log.info("shutdown requested on the admin port")
        self.server.shutdown()
        return _respond({"response": "ok"}, text)

    def _quiesce(self, _params: dict[str, str], text: bool) -> tuple[str, bytes]:
        log.info("quiesce requested on the admin port")
        self.server.quiesce()
        return _respond({"response": "ok"}, text)

    def _reload(self, _params: dict[str, str], text: bool) -> tuple[str, bytes]:
        done: ReplyFuture[bool | ReloadFailed] = ReplyFuture()  # True once every queue has its settings
        self.server.reload(done)
        answer = done.get(timeout=30)
        if type(answer) is ReloadFailed:  # the running configuration stays
            raise _HttpError("500 Internal Server Error", f"config not reloaded: {answer.reason}")
        return _respond({"response": "ok"}, text)

    def _health(self, _params: dict[str, str], _text: bool) -> tuple[str, bytes]:
        """``ok`` (200) while every journal writes; 503 naming the queues whose journal write
        is failing (a full disk), until they recover. ``/ping`` only says the port answers. A
        server that runs pure Python although a compiled build is installed (a stale build,
        ``KESTREL_ACTORS_PURE=1``) says so on a second line: ``build: pure-python (...)``."""
        snapshot = self._snapshot()
        failing = snapshot.failing_journals()
        if failing:
            raise _HttpError("503 Service Unavailable", "journal write failing: " + ", ".join(failing))
        build = fallback()
        return _TEXT, b"ok" if build is None else f"ok\nbuild: {build}\n".encode()

    def _metrics(self, params: dict[str, str], _text: bool) -> tuple[str, Body]:
        series = params.get("queue_series", "default")
        if series not in ("default", "all"):
            raise _HttpError("400 Bad Request", "queue_series must be default or all")
        return self.builds.get(("/metrics", series),
                               lambda: (CONTENT_TYPE, exposition(self._snapshot(), series == "all", self.pause)))

    def _page(self, _params: dict[str, str], _text: bool) -> tuple[str, bytes]:
        # the first snapshot goes in the page, so its first paint shows the queues; shutting
        # down, the page comes without one and says so at its first fetch
        try:
            initial = json_bytes(ostrich_stats(self._snapshot()))
        except _HttpError:
            initial = b"null"
        for raw, escaped in _SCRIPT_ESCAPES:  # JSON inside <script>: no "</script>" can end it early
            initial = initial.replace(raw, escaped)
        build = fallback()
        notice = "" if build is None else f"build: {html.escape(build)}"
        # the notice first: it stands in the page's header, before the stats' <script>
        page = PAGE.replace(_BUILD, notice.encode(), 1)
        return "text/html; charset=utf-8", page.replace(_INITIAL_STATS, initial, 1)

    def _queue(self, params: dict[str, str], _text: bool) -> tuple[str, bytes]:
        """One queue's effective configuration (the page's detail view), as ``dump_config``."""
        name = params.get("name")
        if name is None:
            raise _HttpError("400 Bad Request", "name is required")
        if name not in self._snapshot().queue_names():
            raise _HttpError("404 Not Found", f"no such queue: {name}")
        config = dict(config_settings(self.server.config.queue_config(name)))
        return _JSON, json_bytes({"name": name, "config": config})


PACE_BYTES = 256 * 1024
"""Bytes of a scrape written between two pauses."""


def _paced(parts: list[bytes], pause: Callable[[], None]) -> Iterator[bytes]:
    """``parts``, with a ``pause`` after every :data:`PACE_BYTES`: gevent's ``sendall``
    only gives the hub back when the client's socket is full, and a client that keeps up
    took a 60 MB scrape in one go."""
    written = 0
    for part in parts:
        yield part
        written += len(part)
        if written >= PACE_BYTES:
            written = 0
            pause()


def _query(query: str, allowed: frozenset[str]) -> dict[str, str]:
    if not query:
        return {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True, errors="strict")
    except (ValueError, UnicodeDecodeError) as exc:
        raise _HttpError("400 Bad Request", f"bad query string: {exc}") from exc
    params: dict[str, str] = {}
    for name, value in pairs:
        if name == "token" and name not in allowed:  # never echo it, and say where it goes now
            raise _HttpError("400 Bad Request", "the token goes in the header Authorization: Bearer TOKEN, "
                             "never in the URL")
        if name not in allowed:
            raise _HttpError("400 Bad Request", f"unknown parameter {name!r}")
        if name in params:
            raise _HttpError("400 Bad Request", f"parameter {name!r} given twice")
        params[name] = value
    return params


def _period(value: str) -> int:
    if not _PERIOD.match(value) or not 1 <= int(value) <= MAX_PERIOD:
        raise _HttpError("400 Bad Request", f"period must be whole seconds from 1 to {MAX_PERIOD}")
    return int(value)


def _respond(document: dict[str, Any], text: bool) -> tuple[str, bytes]:
    if text:
        return _TEXT, "".join(f"{key}: {value}\n" for key, value in document.items()).encode()
    return _JSON, json_bytes(document)


PAGE = resources.files(__package__).joinpath("page.html").read_bytes()
"""The live page: one self-contained file (no external assets), refreshing from /stats.json."""
_INITIAL_STATS = b"__INITIAL_STATS__"
_BUILD = b"__BUILD__"
"""The page's build notice: empty, or the fall-back to pure Python (:func:`.._compiled.fallback`)."""
_SCRIPT_ESCAPES = ((b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"))
