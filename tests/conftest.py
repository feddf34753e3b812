"""Fixtures shared by the test files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_processes import Processes


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """CLI processes for one test, all stopped at its end whatever happens."""
    group = Processes(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()
