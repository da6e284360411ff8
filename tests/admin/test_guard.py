"""The guard's rules on their own (the server tests in test_access.py drive it over HTTP):
which Host and origin values each kind of admin address takes."""

from __future__ import annotations

import socket

import pytest

from kestrel_actors.admin import AdminGuard


def refused(guard: AdminGuard, acts: bool = True, **headers: str) -> bool:
    """``headers`` by their environ names (``x_kestrel_admin``); a request that acts carries the
    header ``X-Kestrel-Admin`` unless ``headers`` gives it as ``None``."""
    if acts:
        headers = {"x_kestrel_admin": "1", **headers}
    environ = {"HTTP_" + name.upper(): value for name, value in headers.items() if value is not None}
    return guard.refusal(environ, acts) is not None


def test_on_a_loopback_address_only_its_own_names_are_taken():
    guard = AdminGuard("127.0.0.1", "127.0.0.1", 2223, None)
    for host in ("127.0.0.1:2223", "127.0.0.1", "localhost:2223", "Localhost", "localhost.:2223"):
        assert not refused(guard, host=host), host
    for host in ("evil.example:2223", "10.0.0.1:2223", "[::1]:2223", "127.0.0.1:2224", "127.0.0.1:", "",
                 "127.0.0.1:2223/x", "a@127.0.0.1:2223", "127.0.0.1 :2223", "[::1", "localhost:99999x"):
        assert refused(guard, host=host), host
    assert not refused(guard)  # no Host: HTTP/1.0, no browser


def test_an_ipv6_admin_address():
    guard = AdminGuard("::1", "::1", 2223, None)
    for host in ("[::1]:2223", "[::1]", "[0:0:0:0:0:0:0:1]:2223", "localhost:2223"):
        assert not refused(guard, host=host), host
    for host in ("127.0.0.1:2223", "::1", "[::2]:2223", "[zz]:2223"):
        assert refused(guard, host=host), host
    assert not refused(guard, origin="http://[::1]:2223", host="[::1]:2223")


def test_a_named_admin_address_takes_its_name_and_its_address():
    guard = AdminGuard("kestrel1.example", "10.1.2.3", 2223, None)
    for host in ("kestrel1.example:2223", "KESTREL1.example", "10.1.2.3:2223", "localhost"):
        assert not refused(guard, host=host), host
    assert refused(guard, host="kestrel2.example:2223")


def test_a_wildcard_address_takes_any_ip_literal_and_this_machines_name():
    """A rebinding page sends its own name, never an address: an IP literal is safe to take."""
    guard = AdminGuard("0.0.0.0", "0.0.0.0", 2223, None)
    for host in ("10.9.8.7:2223", "192.168.1.5", "localhost:2223", f"{socket.gethostname()}:2223"):
        assert not refused(guard, host=host), host
    assert refused(guard, host="evil.example:2223")
    assert refused(guard, host="10.9.8.7:2224")


def test_reading_is_open_to_other_origins_acting_is_not():
    """Without CORS headers a page of another origin cannot read a reply; it could act."""
    guard = AdminGuard("127.0.0.1", "127.0.0.1", 2223, None)
    cross = {"host": "127.0.0.1:2223", "sec_fetch_site": "same-site", "origin": "http://127.0.0.1:8000"}
    assert not refused(guard, acts=False, **cross)
    assert refused(guard, acts=True, **cross)
    for site in ("same-origin", "none", "Same-Origin"):
        assert not refused(guard, sec_fetch_site=site)
    for origin in ("http://127.0.0.1:2223", "http://localhost:2223"):
        assert not refused(guard, origin=origin)
    for origin in ("null", "http://127.0.0.1", "https://127.0.0.1:2223", "http://127.0.0.1:2223.evil.example",
                   "http://evil.example:2223", "http://127.0.0.1:2223@evil.example", "http://[::1"):
        assert refused(guard, origin=origin), origin
    assert not refused(guard, referer="http://127.0.0.1:2223/")
    assert refused(guard, referer="http://127.0.0.1:8000/attack.html")


def test_acting_needs_the_header_no_page_of_another_origin_can_send():
    guard = AdminGuard("kestrel-alias", "127.0.0.1", 2223, None)
    assert refused(guard, x_kestrel_admin=None)  # an image, a form: no origin headers, no header
    assert refused(guard, x_kestrel_admin=None, host="kestrel-alias:2223")
    assert not refused(guard, host="kestrel-alias:2223")
    assert not refused(guard, x_kestrel_admin="")  # present is enough: a page cannot send it at all
    assert not refused(guard, acts=False, x_kestrel_admin=None)  # reading needs nothing


@pytest.mark.parametrize("authorization, taken", [
    (None, False),
    ("Bearer s3cret", True),
    ("bearer   s3cret ", True),
    ("Bearer s3cre", False),
    ("Basic s3cret", False),
    ("Bearer wrong", False),
    ("Bearer caf\u00e9", False),
])
def test_the_token(authorization, taken):
    guard = AdminGuard("127.0.0.1", "127.0.0.1", 2223, "s3cret")
    headers = {} if authorization is None else {"authorization": authorization}
    assert refused(guard, **headers) is not taken
    assert refused(guard, x_kestrel_admin=None, **headers) is not taken  # the token is the header then
    assert not refused(guard, acts=False)  # reading needs no token
