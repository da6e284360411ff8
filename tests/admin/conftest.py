"""Servers with their admin HTTP port on (on a free port: never the default 2223), and a real
headless Chromium (Debian's chromium and chromium-driver, which ``make test`` installs)."""

from __future__ import annotations

import shutil

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
