"""The browser harness (tests/browser.py) against a tiny page served on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import browser

if TYPE_CHECKING:
    from playwright.sync_api import Page

# Three items appear after a timer; the button logs a console error and throws.
PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>Harness</title><link rel="icon" href="data:,"></head>
<body>
<h1>Browser harness</h1>
<button id="fail">Fail</button>
<ul id="items"></ul>
<script>
setTimeout(() => {
  for (const name of ["alpha", "beta", "gamma"]) {
    const item = document.createElement("li");
    item.textContent = "item " + name;
    document.getElementById("items").append(item);
  }
}, 200);
document.getElementById("fail").addEventListener("click", () => {
  console.error("the console is told first");
  throw new Error("boom from the page");
});
</script>
</body></html>
"""


class _PageHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path == "/"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write(PAGE if found else b"not found")

    def log_message(self, format: str, *args: object) -> None:
        pass  # the test's output stays readable


@pytest.fixture
def page_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.process
@pytest.mark.tcp
def test_waits_for_the_elements_a_timer_adds_and_screenshots_them(
    browser_page: Page, page_url: str
) -> None:
    browser_page.goto(page_url)
    browser.wait_for_count(browser_page, "#items li", 3)
    browser.wait_for_text(browser_page, "item gamma", selector="#items")
    path = browser.screenshot(browser_page, "items")
    assert path == browser.artefacts_dir() / (
        "test_browser_harness.test_waits_for_the_elements_a_timer_adds_and_screenshots_them"
        ".items.png"
    )
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    browser.assert_no_page_errors(browser_page)


@pytest.mark.process
@pytest.mark.tcp
def test_a_wait_that_is_never_met_fails_at_its_timeout(browser_page: Page, page_url: str) -> None:
    browser_page.goto(page_url)
    with pytest.raises(AssertionError, match="#items li"):
        browser.wait_for_count(browser_page, "#items li", 4, timeout=1)


@pytest.mark.process
@pytest.mark.tcp
def test_errors_of_the_page_fail_the_test(browser_page: Page, page_url: str) -> None:
    browser_page.goto(page_url)
    browser.assert_no_page_errors(browser_page)
    browser_page.click("#fail")
    with pytest.raises(AssertionError) as failure:
        browser.assert_no_page_errors(browser_page)
    assert "console.error" in str(failure.value)
    assert "the console is told first" in str(failure.value)
    assert "uncaught Error: boom from the page" in str(failure.value)


def test_artefacts_go_where_the_environment_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("APPORTION_TEST_ARTEFACTS", str(tmp_path))
    assert browser.artefacts_dir() == tmp_path
    monkeypatch.delenv("APPORTION_TEST_ARTEFACTS")
    assert browser.artefacts_dir() == Path(browser.__file__).parent.parent / "build/test-artefacts"
