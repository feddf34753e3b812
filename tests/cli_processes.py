"""Apportion's CLI run as real processes, for the tests that start clusters that way.

Every process starts in its own session with its output in a log file, and
``stop_all`` (called by the ``procs`` fixture in conftest.py, even when a test
fails) ends each with its whole process group.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

APPORTION = [sys.executable, "-m", "apportion.cli.main"]


class Processes:
    """Starts CLI processes with logs in files; kills every one of them at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(
        self, *args: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """Start ``apportion ARGS`` (with ``env`` in place of this process's environment)."""
        return self.launch([*APPORTION, *args], env)

    def launch(
        self, argv: list[str], env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """Start ``argv`` (a command that runs apportion, e.g. in a network namespace)."""
        log = self.logdir / f"proc-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        self.procs.append((proc, log))
        return proc, log

    def scheduler(self) -> str:
        """Start ``apportion scheduler`` on any free port; its address."""
        return self.start_scheduler("--port", "0")[1]

    def two_workers(self) -> str:
        """A scheduler and two workers of one thread (``a`` and ``b``); its address."""
        address = self.scheduler()
        for name in ("a", "b"):
            self.start("worker", address, "--nthreads", "1", "--name", name)
        return address

    def start_scheduler(
        self, *args: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], str, Path]:
        """Start ``apportion scheduler ARGS``; the process, its address and its log."""
        proc, log = self.start("scheduler", *args, env=env)
        return proc, announced_address(proc, log), log

    def stop_all(self) -> None:
        # A group may end between the check and the signal: that is what was wanted.
        for proc, _ in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc, _ in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def announced_address(proc: subprocess.Popen[bytes], log: Path, timeout: float = 20) -> str:
    """The address a starting ``apportion scheduler`` announces in its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"apportion scheduler at ((?:tcp|tls)://[^\s\"]+)", log.read_text())
        if found:
            return found.group(1)
        time.sleep(0.02)
    raise AssertionError(f"scheduler did not start:\n{log.read_text()}")


def poll(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """The first truthy value of ``condition()`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def free_port() -> int:
    """A TCP port free on loopback now (for a scheduler restarted on the same port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_python_script(
    path: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run the Python script at ``path`` to its end in its folder, in a process group of
    its own, so that a timeout kills the workers it started too."""
    proc = subprocess.Popen(
        [sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=path.parent,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
