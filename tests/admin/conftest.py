"""A real headless Chromium (Debian's chromium and chromium-driver, which ``make test`` installs), and
pages of another origin for it to load."""

from __future__ import annotations

import http.server
import shutil
import threading

import pytest

from ..helpers import free_port

CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path):
    """A headless Chromium driven by selenium, with a profile of its own in ``tmp_path``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    driver_path = shutil.which("chromedriver") or CHROMEDRIVER
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,800", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


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
