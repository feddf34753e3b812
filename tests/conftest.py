"""Fixtures shared by the test files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_processes import Processes

# headless_chromium and browser_page, for the tests that drive a web page.
pytest_plugins = ["browser"]


@pytest.fixture(autouse=True, scope="session")
def _apportion_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Schedulers started by tests keep their run journal here, never in ~/.apportion."""
    previous = os.environ.get("APPORTION_HOME")
    os.environ["APPORTION_HOME"] = str(tmp_path_factory.mktemp("apportion-home"))
    yield
    if previous is None:
        del os.environ["APPORTION_HOME"]
    else:
        os.environ["APPORTION_HOME"] = previous


@pytest.fixture(autouse=True)
def _apportion_variables() -> Iterator[None]:
    """The ``APPORTION_*`` variables as they were before each test. A command run in
    this process (``CliRunner``) sets what a scheduler file gives it, the secret
    included, as a command process does for its own life: left behind, the next
    test's processes would take another cluster's secret."""
    before = {k: v for k, v in os.environ.items() if k.startswith("APPORTION_")}
    yield
    for name in [k for k in os.environ if k.startswith("APPORTION_")]:
        if name not in before:
            del os.environ[name]
    os.environ.update(before)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """CLI processes for one test, all stopped at its end whatever happens."""
    group = Processes(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()
