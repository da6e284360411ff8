"""The live page in a real headless Chromium (Debian's chromium and chromium-driver, which
``make test`` installs): a queue filled while the page is open appears with its item count;
with 500 queues the first paint shows them all, and they sort, filter, scroll and open."""

from __future__ import annotations

import time

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from ..helpers import ServerProcess, create_queues


def test_a_queue_filled_while_the_page_is_open_appears_with_its_items(admin_server, browser, tmp_path):
    client = admin_server.client()
    client.set("early", b"x")
    browser.get(admin_server.admin_url + "/")
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-queue="early"]'))
    assert browser.find_element(By.ID, "status").text == "Up"

    for number in range(12):
        assert client.set("browser_jobs", b"item %d" % number) == b"STORED"
    waiter = admin_server.client()
    waiter.send(b"get parked/t=30000\r\n")

    def cell(queue: str, column: str) -> str:
        found = browser.find_elements(By.CSS_SELECTOR, f'tr[data-queue="{queue}"] td.{column}')
        return found[0].text if found else ""

    wait.until(lambda _: cell("browser_jobs", "items") == "12")
    wait.until(lambda _: cell("parked", "waiters") == "1")
    assert cell("browser_jobs", "bytes") == "74 B"  # "item 0" … "item 11"
    assert browser.find_element(By.ID, "connections").text == "2"
    assert browser.find_element(By.ID, "queue-count").text == "3"
    assert not browser.find_element(By.ID, "error").is_displayed()
    screenshot = tmp_path / "admin-page.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 10_000
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- 500 queues (issue 26, point 6) -----------------------------------------------------------

QUEUES = [f"q{number:03d}" for number in range(500)]
BUSY = "q137"
"""The queue with the most items, an older head and a configuration of its own."""


@pytest.fixture(scope="module")
def five_hundred(tmp_path_factory):
    """A server with 500 queues; ``BUSY`` holds 9 items, the first added a second before the rest."""
    base = tmp_path_factory.mktemp("page500")
    config = base / "kestrel.toml"
    config.write_text(f'[queues."{BUSY}"]\nmax_items = 777\n')
    server = ServerProcess(base / "data", ("--config", str(config)), admin_port=True).start()
    try:
        client = server.client()
        assert client.set(BUSY, b"first") == b"STORED"
        time.sleep(1.2)
        create_queues(server, QUEUES)
        for _ in range(7):
            assert client.set(BUSY, b"more") == b"STORED"
        yield server
    finally:
        server.stop()


def rows(browser) -> list[str]:
    return browser.execute_script(
        "return [...document.querySelectorAll('#queues tr')].map(row => row.dataset.queue)")


def test_the_first_paint_already_shows_every_queue(five_hundred, browser):
    # the page's fetches cannot return: whatever shows came with the page itself
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*stats.json*", "*queue.json*"]})
    browser.get(five_hundred.admin_url + "/")
    assert rows(browser) == QUEUES  # sorted by name
    assert not browser.find_element(By.ID, "no-queues").is_displayed()
    assert browser.find_element(By.ID, "queue-count").text == "500"
    assert browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{BUSY}"] td.items').text == "9"


def test_500_queues_sort_filter_reach_the_last_and_open_a_detail(five_hundred, browser, tmp_path):
    browser.get(five_hundred.admin_url + "/")
    wait = WebDriverWait(browser, 20)

    def header(column: str):
        return browser.find_element(By.CSS_SELECTOR, f'th[data-column="{column}"]')

    def click(css: str) -> None:
        # the page redraws the table on every refresh: an element found a moment before the
        # click can be gone by then (stale, and not clicked), so it is found again
        WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda _: browser.find_element(By.CSS_SELECTOR, css).click() is None)

    # all reachable: the table scrolls, and its last row comes into view
    assert len(rows(browser)) == 500
    in_view = browser.execute_script("""
        const box = document.getElementById('queue-scroll');
        box.scrollTop = box.scrollHeight;
        const last = document.querySelector('#queues tr:last-child');
        const outer = box.getBoundingClientRect(), inner = last.getBoundingClientRect();
        return [last.dataset.queue, inner.top >= outer.top && inner.bottom <= outer.bottom + 1];""")
    assert in_view == ["q499", True]

    click('th[data-column="items"]')  # most first
    assert rows(browser)[:2] == [BUSY, "q000"]
    click('th[data-column="items"]')  # fewest first; ties by name
    assert rows(browser)[:2] == ["q000", "q001"] and rows(browser)[-1] == BUSY
    assert header("items").get_attribute("aria-sort") == "ascending"
    click('th[data-column="oldest"]')  # the longest waiting first
    assert rows(browser)[0] == BUSY
    click('th[data-column="name"]')
    click('th[data-column="name"]')  # name, descending
    assert rows(browser)[:3] == ["q499", "q498", "q497"]

    search = browser.find_element(By.ID, "filter")
    search.send_keys("q49")
    wait.until(lambda _: rows(browser) == [f"q49{digit}" for digit in range(9, -1, -1)])
    assert browser.find_element(By.ID, "shown").text == "10 of 500 shown"
    wait.until(lambda _: len(rows(browser)) == 10)  # still filtered after a refresh
    search.clear()
    search.send_keys(BUSY)
    wait.until(lambda _: rows(browser) == [BUSY])

    click(f'tr[data-queue="{BUSY}"] td.name')
    detail = browser.find_element(By.ID, "detail")
    wait.until(lambda _: detail.is_displayed())
    assert browser.find_element(By.ID, "detail-name").text == BUSY
    assert browser.find_element(By.ID, "detail-items").text == "9"
    oldest = browser.find_element(By.ID, "detail-oldest").text
    assert oldest.endswith(" s") and float(oldest.split()[0]) >= 1.0, oldest
    assert browser.find_element(By.ID, "detail-open").text == "0"
    assert browser.find_element(By.ID, "detail-waiters").text == "0"
    wait.until(lambda _: browser.find_elements(By.CSS_SELECTOR, '#detail-config tr[data-key="max_items"]'))
    assert browser.find_element(By.CSS_SELECTOR, '#detail-config tr[data-key="max_items"] td.value').text == "777"
    # the chart: a point per reading once two readings give a rate
    wait.until(lambda _: len(browser.find_element(By.ID, "detail-in").get_attribute("points").split()) >= 2)
    assert not browser.find_element(By.ID, "error").is_displayed()

    screenshot = tmp_path / "page-500.png"
    assert browser.save_screenshot(str(screenshot))
    print(f"screenshot of the page with 500 queues: {screenshot}")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000
