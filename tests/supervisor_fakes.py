"""Fakes of the supervisor's outside world: processes whose deaths a test decides, and
monotonic time (not ``apportion.testing``'s ``FakeLauncher`` and ``FakeClock``, which
stand in for the command-run launcher and the services' ``Clock``)."""

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


class FakeSpawner:
    """A supervisor's ``spawn``: makes ``FakeProcess``es and keeps them in order."""

    def __init__(self, *, stubborn: bool = False) -> None:
        self.spawned: list[FakeProcess] = []
        self.stubborn = stubborn

    def __call__(self, argv: list[str]) -> FakeProcess:
        process = FakeProcess(argv, 1000 + len(self.spawned), stubborn=self.stubborn)
        self.spawned.append(process)
        return process


class FakeMonotonic:
    """A supervisor's ``monotonic``: reads ``now``, which only the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
