"""A full disk is seen everywhere an operator looks (issue 54 point 4): the live page (in a
real headless Chromium) says so on the server and on the queue, in colour and in words, within
its refresh; memcache ``stats`` and ``kestrel-actors stats`` show it per queue; ``/metrics``
has the data directory's free and whole bytes, so an alert can fire before the disk fills.

The data directory is a 4 MiB tmpfs mounted for the test (root is needed; without it the test
skips and says so), filled with a filler file until a SET is refused."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from ..helpers import ServerProcess, request

DISK_BYTES = 4 * 1024 * 1024
ITEM = b"x" * 10_000
RED = "rgba(214, 69, 69, 1)"
"""The page's ``--down`` colour."""


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs at ``tmp_path/data``, unmounted at teardown."""
    mount_point = tmp_path / "data"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def data_dir_bytes(server: ServerProcess) -> tuple[float, float]:
    """``kestrel_data_dir_free_bytes`` and ``kestrel_data_dir_size_bytes`` of a scrape."""
    body = request(server.admin_url + "/metrics").body.decode()
    found = [re.search(rf"^kestrel_data_dir_{name}_bytes (\S+)$", body, re.M) for name in ("free", "size")]
    assert all(found), body[-2000:]
    return float(found[0].group(1)), float(found[1].group(1))


def cli_stats(server: ServerProcess, *args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "kestrel_actors.cli", "stats", "--port", str(server.admin_port), *args],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, COLUMNS="200"))
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def row_of(lines: list[str], word: str) -> str:
    """The table's line (a row, or the titles) that holds ``word``."""
    return next(line for line in lines if re.search(rf"\b{word}\b", line) and re.search("[│┃]", line))


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split("[│┃]", line.strip(" │┃"))]


def fill_until_refused(disk: Path, client) -> Path:
    filler = disk / "filler.bin"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    filler.write_bytes(b"\0" * max(0, free - 200_000))
    for _ in range(100):
        reply = client.set("jobs", ITEM)
        if reply != b"STORED":
            assert reply.startswith(b"SERVER_ERROR"), reply
            return filler
    raise AssertionError("the disk never filled")


def test_a_full_disk_shows_on_the_page_in_stats_and_in_metrics(small_disk, browser):
    server = ServerProcess(small_disk, admin_port=True).start()
    try:
        client = server.client()
        assert client.set("other", b"small") == b"STORED"
        assert client.set("jobs", ITEM) == b"STORED"
        free_before, size = data_dir_bytes(server)
        assert size == DISK_BYTES
        assert 0 < free_before <= size

        browser.get(server.admin_url + "/")
        wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))

        def text(css: str) -> str:
            found = browser.find_elements(By.CSS_SELECTOR, css)
            return found[0].text if found else ""

        def colour(css: str, prop: str) -> str:
            return browser.find_element(By.CSS_SELECTOR, css).value_of_css_property(prop)

        wait.until(lambda _: text('tr[data-queue="jobs"] td.journal'))
        assert text("#status") == "Up"
        assert "failing" not in text('tr[data-queue="jobs"] td.journal')
        assert not browser.find_element(By.ID, "journal-alert").is_displayed()

        filler = fill_until_refused(small_disk, client)

        # the page: the server (badge, banner) and the queue (its Journal cell), red and in words
        wait.until(lambda _: text("#status") == "Up · journal failing")
        assert colour("#status", "background-color") == RED
        wait.until(lambda _: text('tr[data-queue="jobs"] td.journal').startswith("write failing"))
        assert colour('tr[data-queue="jobs"] td.journal', "color") == RED
        assert "failing" not in text('tr[data-queue="other"] td.journal')
        alert = browser.find_element(By.ID, "journal-alert")
        assert alert.is_displayed() and "Journal write failing" in alert.text and "jobs" in alert.text
        assert "other" not in alert.text

        # memcache stats, per queue
        stats = client.stats()
        assert (stats["queue_jobs_journal_failing"], stats["queue_other_journal_failing"]) == ("1", "0")

        # kestrel-actors stats: the header and the queue's row
        lines = cli_stats(server)
        assert any("journal write failing: jobs" in line for line in lines), lines
        assert "FAILING" in row_of(lines, "jobs"), lines
        assert "FAILING" not in row_of(lines, "other"), lines
        # with --server (memcache stats), the column "failing" counts the server's failing queues
        lines = cli_stats(server, "--server", server.address)
        titles = cells(row_of(lines, "failing"))
        assert cells(row_of(lines, re.escape(server.address)))[titles.index("failing")] == "1", lines

        # /metrics: what is left on the disk, before it is gone
        free_now, size_now = data_dir_bytes(server)
        assert size_now == DISK_BYTES
        assert free_now < free_before and free_now < 300_000

        # space again: everything says so by itself
        filler.unlink()
        deadline = time.monotonic() + 20
        while client.set("jobs", ITEM) != b"STORED":
            assert time.monotonic() < deadline, "writes never resumed"
            time.sleep(0.2)
        wait.until(lambda _: text("#status") == "Up")
        assert not browser.find_element(By.ID, "journal-alert").is_displayed()
        assert client.stats()["queue_jobs_journal_failing"] == "0"
        assert data_dir_bytes(server)[0] > free_now
        client.close()
    finally:
        server.stop(signal.SIGKILL)
