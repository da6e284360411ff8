"""Who may act on the admin port (issue 21.4, issue 53.5, ADR 0019): not a page of another origin
(in the real headless Chromium, under a loopback address or a host name, and by the headers a
browser sends), not a request for another Host (DNS rebinding), not a GET or a HEAD, not a POST
without ``X-Kestrel-Admin`` or, when ``--admin-token`` is set, without the token; a script on
the machine still can (``curl -X POST -H 'X-Kestrel-Admin: 1'``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import ServerProcess, act, act_json, free_port, get_json, request

ACTING = ("/shutdown", "/quiesce", "/reload")


def refusals(server: ServerProcess) -> list[dict]:
    return [event for event in server.log_events() if event.get("event") == "admin request refused"]


def max_items(server: ServerProcess, queue: str) -> int:
    return get_json(server.admin_url + "/stats.json")["gauges"][f"q/{queue}/max_items"]


def assert_up_and_not_quiescent(server: ServerProcess) -> None:
    time.sleep(0.5)  # a /shutdown or /quiesce let through acts within 100 ms
    assert server.proc.poll() is None, server.log()
    fresh = server.client()  # /quiesce closes the listeners: a new client would be refused
    assert fresh.set("alive", b"yes") == b"STORED"
    fresh.close()
    assert get_json(server.admin_url + "/server_info")["status"] == "Up"


@pytest.fixture
def reloadable(tmp_path, make_admin_server):
    """A server whose config file has been edited (max_items 2 → 5) but not reloaded: a
    /reload that gets through shows as max_items 5."""
    config = tmp_path / "kestrel.toml"
    config.write_text("[queues.jobs]\nmax_items = 2\n")
    server = make_admin_server("--config", str(config))
    server.client().set("jobs", b"a")
    config.write_text("[queues.jobs]\nmax_items = 5\n")
    return server


def reason_of(line: dict) -> str:
    return f"{line['method']} {line['path']}: {line['reason']}"


HOSTILE_PAGE = """<!doctype html>
<html><body>
<img src="{admin}/shutdown"><img src="{admin}/quiesce"><img src="{admin}/reload">
<script>
for (const path of ["/shutdown", "/quiesce", "/reload"]) {{
  fetch("{admin}" + path, {{mode: "no-cors", method: "POST"}}).catch(() => {{}});
  const sink = document.createElement("iframe");
  sink.name = "sink" + path.slice(1);
  document.body.appendChild(sink);
  const form = document.createElement("form");
  form.method = "POST";
  form.action = "{admin}" + path;
  form.target = sink.name;
  document.body.appendChild(form);
  form.submit();
}}
</script>
</body></html>
"""


def test_a_page_of_another_origin_cannot_shut_down_quiesce_or_reload_in_chromium(
        reloadable, browser, page_of_another_origin):
    """Issue 21.4's recipe: ``<img src=".../shutdown">`` on a page of another origin shut the
    server down in headless Chromium. Here the page also POSTs by fetch (no-cors) and by a
    form, to each acting endpoint: nine requests, nine refusals, and the server is as it was."""
    browser.get(page_of_another_origin(HOSTILE_PAGE.format(admin=reloadable.admin_url)))
    deadline = time.monotonic() + 20
    while len(refusals(reloadable)) < 9:
        assert reloadable.proc.poll() is None, "the page shut the server down"
        assert time.monotonic() < deadline, f"the page's nine requests were not all refused: {refusals(reloadable)}"
        time.sleep(0.1)
    refused = refusals(reloadable)
    assert sorted((line["method"], line["path"]) for line in refused) == sorted(
        [("GET", path) for path in ACTING] + [("POST", path) for path in ACTING] * 2)
    for line in refused:  # an image's GET never acts; a POST says whose page it comes from
        expected = "GET does not act" if line["method"] == "GET" else "Sec-Fetch-Site: same-site"
        assert expected in line["reason"], reason_of(line)
    assert_up_and_not_quiescent(reloadable)
    assert max_items(reloadable, "jobs") == 2  # not reloaded

    # a script on the machine still can: POST with the header
    assert act_json(reloadable.admin_url + "/reload") == {"response": "ok"}
    assert max_items(reloadable, "jobs") == 5
    assert act_json(reloadable.admin_url + "/shutdown") == {"response": "ok"}
    assert reloadable.proc.wait(timeout=15) == 0


# Issue 53.5: under a host name Chromium does not deem potentially trustworthy, it sends no
# Sec-Fetch-*; an image sends no Origin, and no-referrer drops Referer: the image's GET looked
# like curl's and shut the server down. Each request below is made once per endpoint that acts.
HOSTILE_PAGE_BY_NAME = """<!doctype html>
<html><head><meta name="referrer" content="no-referrer"></head><body>
<script>
const admin = "{admin}";
const settled = [];
for (const path of ["/shutdown", "/quiesce", "/reload"]) {{
  const image = document.createElement("img");
  image.referrerPolicy = "no-referrer";
  settled.push(new Promise(done => {{ image.onload = image.onerror = done; }}));
  image.src = admin + path;
  document.body.appendChild(image);
  // no-cors: the browser drops the header it may not send, and sends the POST
  settled.push(fetch(admin + path, {{method: "POST", mode: "no-cors", referrerPolicy: "no-referrer",
                                     headers: {{"X-Kestrel-Admin": "1"}}}}).catch(() => {{}}));
  // cors: the header asks for a preflight, which the port never grants; the POST is not sent
  settled.push(fetch(admin + path, {{method: "POST", referrerPolicy: "no-referrer",
                                     headers: {{"X-Kestrel-Admin": "1"}}}}).catch(() => {{}}));
  const sink = document.createElement("iframe");
  sink.name = "sink" + path.slice(1);
  settled.push(new Promise(done => {{ sink.onload = done; }}));
  document.body.appendChild(sink);
  const form = document.createElement("form");
  form.method = "POST";
  form.action = admin + path;
  form.target = sink.name;
  document.body.appendChild(form);
  form.submit();
}}
Promise.all(settled).then(() => {{ document.title = "settled"; }});
</script>
</body></html>
"""


def _loopback_only(name: str) -> bool:
    try:
        found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(entry[4][0]).is_loopback for entry in found)


ALIAS = "kestrel-admin-alias"
"""The /etc/hosts alias the test adds (as root) when this machine's own name is not loopback."""


@contextlib.contextmanager
def loopback_host_name() -> Iterator[str]:
    """A host name (not ``localhost``, which Chromium deems trustworthy) that resolves to
    loopback: this machine's name if it does, else an alias added to /etc/hosts and removed."""
    name = socket.gethostname()
    if name.lower() != "localhost" and _loopback_only(name):
        yield name
        return
    hosts = Path("/etc/hosts")
    if os.geteuid() != 0 or not os.access(hosts, os.W_OK):
        pytest.skip("no host name resolves to loopback, and /etc/hosts cannot be written")
    before = hosts.read_text()
    hosts.write_text(before + f"\n127.0.0.1 {ALIAS}\n")
    try:
        yield ALIAS
    finally:
        hosts.write_text(before)


def test_a_page_cannot_act_through_an_admin_host_name_in_chromium(
        tmp_path, make_admin_server, browser, page_of_another_origin):
    """Issue 53.5: ``--admin-host NAME`` (the /etc/hosts alias docs/operations.md advises), no
    token, and ``<img referrerpolicy="no-referrer" src="http://NAME:PORT/shutdown">`` on any
    page. The images' GETs, the fetches' POSTs (no-cors, and cors with the header: its preflight
    is refused) and the forms' POSTs: each is refused, once, and the server is as it was."""
    config = tmp_path / "kestrel.toml"
    config.write_text("[queues.jobs]\nmax_items = 2\n")
    with loopback_host_name() as name:
        server = ServerProcess(tmp_path / "named", ("--config", str(config), "--admin-host", name),
                               admin_port=True)
        server.admin_host = name
        try:
            server.start()
            server.client().set("jobs", b"a")
            config.write_text("[queues.jobs]\nmax_items = 5\n")
            browser.set_page_load_timeout(30)
            browser.get(page_of_another_origin(HOSTILE_PAGE_BY_NAME.format(admin=server.admin_url)))
            deadline = time.monotonic() + 30
            while browser.title != "settled" or len(refusals(server)) < 12:
                assert server.proc.poll() is None, "the page shut the server down"
                assert time.monotonic() < deadline, (browser.title, [reason_of(line) for line in refusals(server)])
                time.sleep(0.1)
            refused = refusals(server)
            assert sorted((line["method"], line["path"]) for line in refused) == sorted(
                [(method, path) for path in ACTING for method in ("GET", "OPTIONS", "POST", "POST")])
            for line in refused:
                if line["method"] == "POST":  # the header was dropped (no-cors) or never given (form)
                    assert "another origin" in line["reason"], reason_of(line)
                else:  # the images, and the cors fetches' preflights
                    assert f"{line['method']} does not act" in line["reason"], reason_of(line)
            assert_up_and_not_quiescent(server)
            assert max_items(server, "jobs") == 2  # not reloaded
            # a script on the machine, by the name, still can
            assert act_json(server.admin_url + "/reload") == {"response": "ok"}
            assert max_items(server, "jobs") == 5
            assert act_json(server.admin_url + "/shutdown") == {"response": "ok"}
            assert server.proc.wait(timeout=15) == 0
        finally:
            server.stop()


@pytest.mark.parametrize("path", ACTING)
def test_get_and_head_never_act_and_answer_405_allow_post(reloadable, path):
    """``curl -I`` (a HEAD) on /shutdown shut the server down; an image or a prefetch is a GET;
    a browser's preflight is an OPTIONS, which is never granted."""
    for method in ("HEAD", "GET", "OPTIONS"):
        for suffix in ("", ".json", ".txt"):
            for headers in ({}, {"X-Kestrel-Admin": "1"}):
                reply = request(reloadable.admin_url + path + suffix, method=method, headers=headers)
                assert reply.status == 405, (method, path, headers, reply)
                assert reply.headers["allow"] == "POST"
                assert method != "HEAD" or reply.body == b""
                assert not any(name.startswith("access-control-") for name in reply.headers), reply.headers
    assert_up_and_not_quiescent(reloadable)
    assert max_items(reloadable, "jobs") == 2
    # HEAD never acts on the endpoints that read either, and they answer it
    assert request(reloadable.admin_url + "/ping", method="HEAD").status == 200
    assert request(reloadable.admin_url + "/stats.json", method="POST").headers["allow"] == "GET, HEAD"


def test_a_post_acts_only_with_the_header(reloadable):
    """A POST without X-Kestrel-Admin (a form, a no-cors fetch, whatever its origin headers say)
    is refused; with it, it acts."""
    for path in ACTING:
        for headers in ({}, {"X-Kestrel-Other": "1"}, {"Content-Type": "application/x-www-form-urlencoded"}):
            reply = request(reloadable.admin_url + path, method="POST", headers=headers)
            assert reply.status == 403, (path, headers, reply)
            assert "X-Kestrel-Admin" in reply.json()["error"]
    assert_up_and_not_quiescent(reloadable)
    assert max_items(reloadable, "jobs") == 2
    assert act(reloadable.admin_url + "/reload.txt").body == b"response: ok\n"
    assert max_items(reloadable, "jobs") == 5


OTHER_ORIGINS = [
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Origin": "http://127.0.0.1:1"},
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Origin": "https://127.0.0.1:{port}"},
    {"Referer": "http://127.0.0.1:1/page.html"},
    {"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost:1"},
]


def test_requests_a_browser_makes_for_another_origin_cannot_act(reloadable):
    """With the header, even: the origin is checked first (a second line behind the header)."""
    port = reloadable.admin_port
    for headers in OTHER_ORIGINS:
        headers = {name: value.format(port=port) for name, value in headers.items()}
        headers["X-Kestrel-Admin"] = "1"
        for path in ACTING:
            reply = request(reloadable.admin_url + path, method="POST", headers=headers)
            assert reply.status == 403, (path, headers, reply)
            assert "another origin" in reply.json()["error"]
    assert len(refusals(reloadable)) == len(OTHER_ORIGINS) * len(ACTING)
    assert_up_and_not_quiescent(reloadable)
    assert max_items(reloadable, "jobs") == 2
    # what the admin origin itself, or a typed address, sends may act
    for headers in ({"Sec-Fetch-Site": "same-origin", "Origin": f"http://127.0.0.1:{port}"},
                    {"Sec-Fetch-Site": "none"},
                    {"Origin": f"http://localhost:{port}", "Referer": f"http://127.0.0.1:{port}/"}):
        headers["X-Kestrel-Admin"] = "1"
        assert request(reloadable.admin_url + "/reload", method="POST", headers=headers).status == 200
    assert max_items(reloadable, "jobs") == 5


def raw_request(port: int, head: bytes) -> bytes:
    """Send ``head`` (request line and headers, as given) and read the reply to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + b"Connection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_a_request_for_another_host_is_refused_everywhere(reloadable):
    """DNS rebinding: a page whose name has been re-pointed at 127.0.0.1 is same-origin with
    itself, but sends its own name as Host."""
    port = reloadable.admin_port
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.nip.io:{port}",
                 f"localhost.evil.example:{port}", f"127.0.0.2:{port}", f"[::1]:{port}", f"127.0.0.1:{port + 1}",
                 f"user@127.0.0.1:{port}"):
        for path in (*ACTING, "/stats.json", "/ping", "/"):
            method = "POST" if path in ACTING else "GET"
            headers = {"Host": host, "Sec-Fetch-Site": "same-origin", "X-Kestrel-Admin": "1"}
            reply = request(reloadable.admin_url + path, method=method, headers=headers)
            assert reply.status == 403, (host, path, reply)
    assert_up_and_not_quiescent(reloadable)
    assert max_items(reloadable, "jobs") == 2
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST", "localhost."):
        assert request(reloadable.admin_url + "/ping", headers={"Host": host}).status == 200, host
    # no Host at all (HTTP/1.0): no browser sends that
    assert raw_request(port, b"POST /reload HTTP/1.0\r\nX-Kestrel-Admin: 1\r\n").startswith(b"HTTP/1.1 200 ")
    assert max_items(reloadable, "jobs") == 5


def test_the_token_is_required_on_the_acting_endpoints_when_set(make_admin_server):
    server = make_admin_server("--admin-token", "s3cret-token")
    for path in ACTING:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"},
                        {"Authorization": "Bearer s3cret-token-and-more"}, {"X-Kestrel-Admin": "1"}):
            reply = request(server.admin_url + path, method="POST", headers=headers)
            assert reply.status == 401, (path, headers, reply)
        # the token is taken in the header only: a URL is kept in histories and logs
        for query in ("?token=wrong", "?token=s3cret-token"):
            reply = request(server.admin_url + path + query, method="POST", headers={"X-Kestrel-Admin": "1"})
            assert reply.status == 400 and "Authorization: Bearer" in reply.json()["error"], reply
            assert b"s3cret" not in reply.body
    assert_up_and_not_quiescent(server)
    assert get_json(server.admin_url + "/stats.json")["counters"] is not None  # reading needs no token
    assert act_json(server.admin_url + "/reload", token="s3cret-token") == {"response": "ok"}
    assert act(server.admin_url + "/shutdown", token="s3cret-token").status == 200
    assert server.proc.wait(timeout=15) == 0
    assert "s3cret-token" not in server.log_path.read_text()


def test_admin_host_and_admin_token_from_the_config_file(tmp_path):
    config = tmp_path / "kestrel.toml"
    config.write_text('admin_host = "127.0.0.2"\nadmin_token = "from-the-file"\n')
    server = ServerProcess(tmp_path / "data", ("--config", str(config)), admin_port=True)
    server.admin_host = "127.0.0.2"
    server.start()
    try:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.admin_port), timeout=2).close()
        assert act(server.admin_url + "/reload").status == 401
        assert act_json(server.admin_url + "/reload", token="from-the-file") == {"response": "ok"}
    finally:
        server.stop()
    # a flag given on the command line wins over the file
    server.args += ("--admin-token", "from-the-flag")
    server.start()
    try:
        assert act(server.admin_url + "/reload", token="from-the-file").status == 401
        assert act_json(server.admin_url + "/reload", token="from-the-flag") == {"response": "ok"}
    finally:
        server.stop()


@pytest.mark.parametrize("token", ["", "has space", "caf\u00e9", "x" * 257])
def test_a_token_that_cannot_be_sent_as_is_is_refused_at_start(tmp_path, token):
    result = subprocess.run(
        [sys.executable, "-m", "kestrel_actors.cli", "serve", "--data-dir", str(tmp_path / "data"),
         "--port", str(free_port()), "--text-port", "0", "--thrift-port", "0",
         "--admin-port", str(free_port()), "--admin-token", token],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "--admin-token" in result.stderr and "visible ASCII" in result.stderr
    if len(token) > 3:
        assert token not in result.stderr  # a secret is never echoed

