"""Apportion's CLI run as real processes, for the tests that start clusters that way.

Every process starts in its own session with its output in a log file, and
``stop_all`` (called by the ``procs`` fixture in conftest.py, even when a test
fails) ends each with its whole process group.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

APPORTION = [sys.executable, "-m", "apportion.cli.main"]


class Processes:
    """Starts CLI processes with logs in files; kills every one of them at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.logdir / f"proc-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*APPORTION, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append((proc, log))
        return proc, log

    def scheduler(self) -> str:
        _, log = self.start("scheduler", "--port", "0")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = re.search(r"apportion scheduler at (tcp://\S+)", log.read_text())
            if found:
                return found.group(1)
            time.sleep(0.02)
        raise AssertionError(f"scheduler did not start:\n{log.read_text()}")

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc, _ in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
