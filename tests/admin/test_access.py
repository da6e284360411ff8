"""Who may act on the admin port (issue 21.4): not a page of another origin (in the real headless
Chromium, and by the headers a browser sends), not a request for another Host (DNS rebinding),
not a client without the token when ``--admin-token`` is set; ``curl`` from the machine still can.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time

import pytest

from ..helpers import ServerProcess, free_port, get_json, request

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


class _HostilePage(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_args) -> None:
        pass


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


@pytest.fixture
def page_of_another_origin():
    """Factory: serve ``html`` from 127.0.0.1 at a port of its own (the same site as the admin
    port, another origin); returns the page's URL."""
    servers = []

    def serve(html: str) -> str:
        handler = type("Page", (_HostilePage,), {"body": html.encode()})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_page_of_another_origin_cannot_shut_down_quiesce_or_reload_in_chromium(
        reloadable, browser, page_of_another_origin):
    """The issue's recipe: ``<img src=".../shutdown">`` on a page of another origin shut the
    server down in headless Chromium. Here the page also POSTs by fetch (no-cors) and by a
    form, to each acting endpoint: nine requests, nine refusals, and the server is as it was."""
    browser.get(page_of_another_origin(HOSTILE_PAGE.format(admin=reloadable.admin_url)))
    deadline = time.monotonic() + 20
    while len(refusals(reloadable)) < 9:
        assert reloadable.proc.poll() is None, "the page shut the server down"
        assert time.monotonic() < deadline, f"the page's nine requests were not all refused: {refusals(reloadable)}"
        time.sleep(0.1)
    refused = refusals(reloadable)
    assert sorted(line["path"] for line in refused) == sorted(ACTING * 3)
    assert all("Sec-Fetch-Site: same-site" in line["reason"] for line in refused), refused
    assert_up_and_not_quiescent(reloadable)
    assert max_items(reloadable, "jobs") == 2  # not reloaded

    # curl from the machine still can, as with ostrich
    assert get_json(reloadable.admin_url + "/reload") == {"response": "ok"}
    assert max_items(reloadable, "jobs") == 5
    assert get_json(reloadable.admin_url + "/shutdown") == {"response": "ok"}
    assert reloadable.proc.wait(timeout=15) == 0


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


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_requests_a_browser_makes_for_another_origin_cannot_act(reloadable, method):
    port = reloadable.admin_port
    for headers in OTHER_ORIGINS:
        headers = {name: value.format(port=port) for name, value in headers.items()}
        for path in ACTING:
            reply = request(reloadable.admin_url + path, method=method, headers=headers)
            assert reply.status == 403, (path, headers, reply)
            assert "another origin" in reply.json()["error"]
    assert len(refusals(reloadable)) == len(OTHER_ORIGINS) * len(ACTING)
    assert_up_and_not_quiescent(reloadable)
    assert max_items(reloadable, "jobs") == 2
    # what the admin origin itself, or a typed address, sends may act
    for headers in ({"Sec-Fetch-Site": "same-origin", "Origin": f"http://127.0.0.1:{port}"},
                    {"Sec-Fetch-Site": "none"},
                    {"Origin": f"http://localhost:{port}", "Referer": f"http://127.0.0.1:{port}/"}):
        assert request(reloadable.admin_url + "/reload", method=method, headers=headers).status == 200
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
            reply = request(reloadable.admin_url + path, headers={"Host": host, "Sec-Fetch-Site": "same-origin"})
            assert reply.status == 403, (host, path, reply)
    assert_up_and_not_quiescent(reloadable)
    assert max_items(reloadable, "jobs") == 2
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST", "localhost."):
        assert request(reloadable.admin_url + "/ping", headers={"Host": host}).status == 200, host
    # no Host at all (HTTP/1.0): no browser sends that
    assert raw_request(port, b"GET /reload HTTP/1.0\r\n").startswith(b"HTTP/1.1 200 ")
    assert max_items(reloadable, "jobs") == 5


def test_the_token_is_required_on_the_acting_endpoints_when_set(make_admin_server):
    server = make_admin_server("--admin-token", "s3cret-token")
    for path in ACTING:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"},
                        {"Authorization": "Bearer s3cret-token-and-more"}):
            reply = request(server.admin_url + path, method="POST", headers=headers)
            assert reply.status == 401, (path, headers, reply)
        assert request(server.admin_url + path + "?token=wrong").status == 401
    assert_up_and_not_quiescent(server)
    assert get_json(server.admin_url + "/stats.json")["counters"] is not None  # reading needs no token
    assert get_json(server.admin_url + "/reload?token=s3cret-token") == {"response": "ok"}
    reply = request(server.admin_url + "/shutdown", method="POST", headers={"Authorization": "Bearer s3cret-token"})
    assert reply.status == 200
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
        assert request(server.admin_url + "/reload").status == 401
        assert get_json(server.admin_url + "/reload?token=from-the-file") == {"response": "ok"}
    finally:
        server.stop()
    # a flag given on the command line wins over the file
    server.args += ("--admin-token", "from-the-flag")
    server.start()
    try:
        assert request(server.admin_url + "/reload?token=from-the-file").status == 401
        assert get_json(server.admin_url + "/reload?token=from-the-flag") == {"response": "ok"}
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

