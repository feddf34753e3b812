"""A headless Chromium for the tests that drive a web page (the dashboard's).

One Chromium serves the whole test session: its start-up is the slow part. The tests
start it themselves (``headless_chromium``) rather than letting Playwright launch it,
so that its command line, its throw-away profile and its clean-up are ours. Each test
then connects to it over the DevTools protocol with a Playwright of its own and gets a
fresh browser context (``browser_page``): no cookies or storage leak between tests.
Playwright's sync API marks its event loop as running in the calling thread for as long
as it is connected; held for the whole session, it would make every later
``asyncio.run()`` in the session fail. So it lives for one test, and inside a test that
uses ``browser_page`` a server under test must run in a thread or a process of its own.

Without Chromium at /usr/bin/chromium or without the ``playwright`` package, the tests
that use these fixtures skip, saying what to install. Never run ``playwright install``:
the browser comes from Debian's ``chromium`` package.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import psutil
import pytest

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Error, Page

CHROMIUM = Path("/usr/bin/chromium")

#: The flags besides the profile and the DevTools port. The network ones matter: without
#: them Chromium keeps calling Google's services, and the test machines have no network.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Debian's launcher script loads extensions by default; a test page wants none.
    "--disable-extensions",
)

#: How long a Playwright action (click, goto, ...) may take before it fails the test with
#: Playwright's own message, well before the test's timeout kills it without one.
ACTION_TIMEOUT_S = 10.0

REPO = Path(__file__).resolve().parent.parent


def unavailable() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM}: apt-get install chromium"
    if find_spec("playwright") is None:
        return "no Playwright for Python: pip install -e '.[test]'"
    return None


@dataclass(frozen=True)
class Chromium:
    """A running headless Chromium that Playwright connects to over DevTools."""

    process: subprocess.Popen[bytes]
    #: The DevTools WebSocket address of the browser (ws://127.0.0.1:PORT/devtools/...).
    endpoint: str
    #: Holds the profile, the HOME Chromium sees and its log; nothing outside it is written.
    root: Path

    @property
    def log(self) -> Path:
        """Chromium's stderr."""
        return self.root / "chromium.log"


def start_chromium(root: Path, timeout: float = 30) -> Chromium:
    """Start Chromium with an empty profile under ``root``; stop it with ``stop_chromium``."""
    profile, home = root / "profile", root / "home"
    profile.mkdir()
    home.mkdir()
    # HOME and XDG_* point into root: its crash handler would otherwise keep its reports
    # in ~/.config/chromium.
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }
    argv = [
        str(CHROMIUM),
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        "about:blank",
    ]
    with open(root / "chromium.log", "wb") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    chromium = Chromium(process, "", root)
    try:
        endpoint = _devtools_endpoint(chromium, profile / "DevToolsActivePort", timeout)
    except BaseException:
        stop_chromium(chromium)
        raise
    return Chromium(process, endpoint, root)


def _devtools_endpoint(chromium: Chromium, port_file: Path, timeout: float) -> str:
    # Chromium writes the file ("PORT\n/devtools/browser/ID") once it listens.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and chromium.process.poll() is None:
        with contextlib.suppress(FileNotFoundError):
            lines = port_file.read_text().split()
            if len(lines) == 2:
                return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        time.sleep(0.02)
    raise AssertionError(f"Chromium did not start:\n{chromium.log.read_text()}")


def stop_chromium(chromium: Chromium, timeout: float = 10) -> None:
    """Stop Chromium and wait until none of its processes is left, zombies included.

    Its children are killed with its process group, but stay zombies until the system
    reaps them, orphans now; its crash handlers run in sessions of their own but name
    ``root`` on their command line and leave by themselves. Whatever is still there at
    the deadline is killed and reported.
    """
    process = chromium.process
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # its children have nothing left to do
    deadline = time.monotonic() + timeout
    while left := _leftovers(chromium):
        if time.monotonic() > deadline:
            for proc in left:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            raise AssertionError(f"Chromium processes outlived the browser: {left}")
        time.sleep(0.05)


def _leftovers(chromium: Chromium) -> list[psutil.Process]:
    left = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            in_group = os.getpgid(proc.pid) == chromium.process.pid
            if in_group or f"{chromium.root}/" in " ".join(proc.cmdline()):
                left.append(proc)
    return left


@pytest.fixture(scope="session")
def headless_chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    """The session's Chromium (skips when it or Playwright is not installed)."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    chromium = start_chromium(tmp_path_factory.mktemp("chromium"))
    try:
        yield chromium
    finally:
        stop_chromium(chromium)


@pytest.fixture
def browser_page(headless_chromium: Chromium) -> Iterator[Page]:
    """A blank page in a fresh browser context, its errors collected (``page_errors``)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(headless_chromium.endpoint)
        try:
            context = browser.new_context()
            context.set_default_timeout(ACTION_TIMEOUT_S * 1000)
            page = context.new_page()
            watch_page_errors(page)
            yield page
        finally:
            # Over DevTools this closes the contexts this connection made and
            # disconnects; the session's Chromium runs on.
            browser.close()


#: The JavaScript errors of each watched page, in the order they happened.
_errors: WeakKeyDictionary[Page, list[str]] = WeakKeyDictionary()


def watch_page_errors(page: Page) -> None:
    """Collect ``page``'s uncaught exceptions and console errors (``browser_page`` does)."""
    errors = _errors.setdefault(page, [])

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            where = message.location
            errors.append(f"console.error at {where['url']}:{where['lineNumber']}: {message.text}")

    def on_page_error(error: Error) -> None:
        errors.append(f"uncaught {error.stack or error.message}")

    page.on("console", on_console)
    page.on("pageerror", on_page_error)


def page_errors(page: Page) -> list[str]:
    """The errors ``page`` reported so far (a copy)."""
    if page not in _errors:
        raise ValueError("the page's errors are not watched: call watch_page_errors(page)")
    # A round trip to the page first: the errors it raised before this call have been
    # delivered once its answer arrives (they come down the same DevTools session).
    page.evaluate("0")
    return list(_errors[page])


def assert_no_page_errors(page: Page) -> None:
    """Fail, listing them, if ``page`` has had an uncaught exception or a console error."""
    errors = page_errors(page)
    assert not errors, "the page had JavaScript errors:\n" + "\n".join(errors)


def wait_for_count(page: Page, selector: str, count: int, timeout: float = 10) -> None:
    """Wait until ``count`` elements match the CSS ``selector``; fail after ``timeout`` seconds."""
    from playwright.sync_api import expect

    expect(page.locator(selector)).to_have_count(count, timeout=timeout * 1000)


def wait_for_text(page: Page, text: str, selector: str = "body", timeout: float = 10) -> None:
    """Wait until the first ``selector`` match holds ``text``; fail after ``timeout`` seconds."""
    from playwright.sync_api import expect

    expect(page.locator(selector).first).to_contain_text(text, timeout=timeout * 1000)


def artefacts_dir() -> Path:
    """Where tests leave files for people to look at: $APPORTION_TEST_ARTEFACTS or build/."""
    configured = os.environ.get("APPORTION_TEST_ARTEFACTS")
    return Path(configured) if configured else REPO / "build" / "test-artefacts"


def screenshot(page: Page, name: str) -> Path:
    """Save a full-page PNG of ``page``, named after the running test and ``name``; its path.

    In test_x.py's test_y, ``screenshot(page, "after-click")`` writes
    ``test_x.test_y.after-click.png`` in ``artefacts_dir()``.
    """
    # PYTEST_CURRENT_TEST: "tests/system/test_x.py::test_y[param] (call)".
    nodeid = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    module, _, test = nodeid.rpartition("::")
    parts = [Path(module).stem, test, name] if test else [name]
    path = artefacts_dir() / (".".join(re.sub(r"[^\w-]+", "_", part) for part in parts) + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=path, full_page=True)
    return path
