"""The live page in a real headless Chromium (Debian's chromium and chromium-driver, which
``make test`` installs): a queue filled while the page is open appears with its item count."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


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
