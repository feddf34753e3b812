"""Fakes of the supervisor's outside world: processes whose deaths a test decides, and time."""

from __future__ import annotations

import signal
import subprocess


class FakeProcess:
    """Behaves like a ``Popen`` whose death the test decides."""

    def __init__(self, argv: list[str], pid: int, *, stubborn: bool = False) -> None:
        self.argv = argv
        self.pid = pid
        self.returncode: int | None = None
        self.signals: list[int] = []
        self.stubborn = stubborn

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if not self.stubborn:
            self.returncode = -sig

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.argv, timeout or 0)
        return self.returncode

    def kill(self) -> None:
        self.returncode = -signal.SIGKILL


class FakeLauncher:
    def __init__(self, *, stubborn: bool = False) -> None:
        self.launched: list[FakeProcess] = []
        self.stubborn = stubborn

    def __call__(self, argv: list[str]) -> FakeProcess:
        process = FakeProcess(argv, 1000 + len(self.launched), stubborn=self.stubborn)
        self.launched.append(process)
        return process


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
