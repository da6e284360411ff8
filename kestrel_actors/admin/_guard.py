"""Who may use the admin port (ADR 0012, ADR 0019): the checks made before an endpoint runs.

* **Method**, on the endpoints that act (:mod:`._app`): only ``POST`` acts; ``GET`` and ``HEAD``
  answer 405 and do nothing, whoever asks.
* **Host**, on every endpoint. A browser sends the name in its address bar; a page whose name
  has been re-pointed at this machine (DNS rebinding) sends its own name, and is refused. Taken:
  the admin address (as configured and as bound), ``localhost``, and, when the port is bound to
  a wildcard address, any IP literal and this machine's host name; each bare or with the admin
  port. A request without ``Host`` (HTTP/1.0) comes from no browser and is taken.
* **Origin**, on the endpoints that act. A browser says on whose behalf it asks: a
  ``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` (a page on 127.0.0.1 at another port
  is ``same-site``, and another origin all the same), or an ``Origin`` or ``Referer`` that is
  not this port's own ``http://`` origin, is refused. ``curl`` sends none of them, and neither
  does a browser in every case (no ``Sec-Fetch-*`` to a name it does not deem trustworthy, no
  ``Origin`` on an image, no ``Referer`` under ``no-referrer``): this check is a second line.
* **The acting header**, on the endpoints that act: ``Authorization: Bearer TOKEN`` when
  ``--admin-token`` is set, else :data:`ACT_HEADER`. Neither is a header a page of another
  origin can send without a CORS preflight, which this port never grants (an ``OPTIONS`` is
  405, with no ``Access-Control-*`` header): this is the check that holds under any
  ``--admin-host``.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

__all__ = ["ACT_HEADER", "AdminGuard", "Refusal"]

ACT_HEADER = "X-Kestrel-Admin"
"""The header a request to an endpoint that acts carries when no token is set (any value)."""
_ACT_ENVIRON = "HTTP_" + ACT_HEADER.upper().replace("-", "_")

_SAME_ORIGIN = frozenset({"same-origin", "none"})
_AUTHORITY = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>[^:\[\]@/?#\s]+))(?::(?P<port>[0-9]{1,5}))?\Z")
_HTTP_PORT = 80
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Refusal:
    """Why a request may not reach its endpoint, and the status that says so."""

    status: str
    reason: str
    challenge: bool = False
    """A 401: the reply carries ``WWW-Authenticate: Bearer``."""


class _Authority(NamedTuple):
    """The host (a lower-case name or an IP address) and port of a ``Host`` or an origin."""

    host: str | IPAddress
    port: int | None


def _authority(text: str) -> _Authority | None:
    match = _AUTHORITY.match(text.strip())
    if match is None:
        return None
    port = int(match["port"]) if match["port"] else None
    if match["ipv6"] is not None:
        try:
            return _Authority(ipaddress.IPv6Address(match["ipv6"]), port)
        except ValueError:
            return None
    name = match["name"].lower().rstrip(".")
    try:
        return _Authority(ipaddress.IPv4Address(name), port)
    except ValueError:
        return _Authority(name, port)


def _address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


class AdminGuard:
    """The checks of one admin port: ``host`` as configured (``--admin-host``), ``bound`` and
    ``port`` as the kernel gave them, and ``token`` (``--admin-token``) or ``None``."""

    def __init__(self, host: str, bound: str, port: int, token: str | None) -> None:
        self.port = port
        self.token = token.encode() if token else None
        self.names = {"localhost"}
        self.addresses: set[IPAddress] = set()
        for text in (host, bound):
            address = _address(text)
            if address is not None:
                self.addresses.add(address)
            elif text:
                self.names.add(text.lower().rstrip("."))
        bound_address = _address(bound)
        self.any_address = bound_address is not None and bound_address.is_unspecified
        if self.any_address:
            self.names.add(socket.gethostname().lower())

    def refusal(self, environ: dict[str, Any], acts: bool) -> Refusal | None:
        """Why this request may not go on (``None``: it may). ``acts``: the endpoint changes the
        server (the caller has seen to the method)."""
        host = environ.get("HTTP_HOST")
        if host is not None and not self._ours(_authority(host), default_port=None):
            return Refusal("403 Forbidden", f"Host {host!r} is not this admin port's address")
        if not acts:
            return None
        site = environ.get("HTTP_SEC_FETCH_SITE")
        if site is not None and site.strip().lower() not in _SAME_ORIGIN:
            return Refusal("403 Forbidden", f"asked by a page of another origin (Sec-Fetch-Site: {site})")
        for header, name in (("HTTP_ORIGIN", "Origin"), ("HTTP_REFERER", "Referer")):
            value = environ.get(header)
            if value is not None and not self._our_origin(value):
                return Refusal("403 Forbidden", f"asked by a page of another origin ({name}: {value})")
        if self.token is not None:
            if not self._token_given(environ):
                return Refusal("401 Unauthorized", "this admin port requires Authorization: Bearer TOKEN on this "
                               "endpoint", challenge=True)
        elif _ACT_ENVIRON not in environ:
            return Refusal("403 Forbidden", f"this endpoint acts only with the header {ACT_HEADER} "
                           "(which no page of another origin can send)")
        return None

    def _ours(self, authority: _Authority | None, default_port: int | None) -> bool:
        if authority is None:
            return False
        port = authority.port if authority.port is not None else default_port
        if port is not None and port != self.port:
            return False
        if isinstance(authority.host, str):
            return authority.host in self.names
        # an address in the address bar cannot be re-pointed: only a name can be rebound
        return self.any_address or authority.host in self.addresses

    def _our_origin(self, value: str) -> bool:
        try:
            parts = urlsplit(value.strip())
        except ValueError:
            return False
        return parts.scheme == "http" and self._ours(_authority(parts.netloc), default_port=_HTTP_PORT)

    def _token_given(self, environ: dict[str, Any]) -> bool:
        assert self.token is not None
        scheme, _, credentials = environ.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode("utf-8", "replace"), self.token)
