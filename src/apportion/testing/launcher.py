"""A launcher that runs no process: command runs for tests, in microseconds."""

from __future__ import annotations

import threading
from collections.abc import Callable

from apportion.runs.launcher import Launch
from apportion.runs.process import ExitStatus, RunOutcome


class FakeLauncher:
    """Pretends to run each command: prints ``output``, then exits with ``exit_code``.

    With ``block=True`` a command runs until it is cancelled (then it ends as a
    process stopped with SIGTERM would). ``launches`` records every command run, in
    order. Give it to a worker through its live runs:
    ``Worker(..., long_lived=LiveRuns(FakeLauncher()))`` (``apportion.runs.live``).
    """

    def __init__(self, output: bytes = b"", exit_code: int = 0, *, block: bool = False) -> None:
        self.output = output
        self.exit_code = exit_code
        self.block = block
        #: Every launch so far, in order.
        self.launches: list[Launch] = []
        self._lock = threading.Lock()
        self._next_pid = 100_000

    def run(
        self,
        launch: Launch,
        *,
        on_start: Callable[[int], None],
        on_output: Callable[[bytes], None],
        cancel: threading.Event,
    ) -> RunOutcome:
        """See ``apportion.runs.launcher.Launcher.run``."""
        with self._lock:
            self.launches.append(launch)
            self._next_pid += 1
            pid = self._next_pid
        if cancel.is_set():
            never = ExitStatus(code=None, signal=None)
            return RunOutcome(never, "cancelled", "cancelled before it started", 0)
        on_start(pid)
        if self.output:
            on_output(self.output)
        if self.block:
            cancel.wait()
            status = ExitStatus(code=None, signal=15)
            return RunOutcome(status, "cancelled", "cancelled; stopped with SIGTERM", 0)
        status = ExitStatus(code=self.exit_code, signal=None)
        if self.exit_code == 0:
            return RunOutcome(status, "completed", "exit code 0", 0)
        return RunOutcome(status, "failed", f"exit code {self.exit_code}", 0)
