"""How a worker runs a command: through a ``Launcher``, so tests can run none.

``LiveRuns`` hands each command to its launcher and reports what the launcher says:
the start (a pid), output chunks, and how it ended. ``ProcessLauncher``, the
default, runs a real process group (``process.run_command``);
``apportion.testing.FakeLauncher`` runs nothing and says what a test wants.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from apportion.runs.process import RunOutcome, run_command


@dataclass(frozen=True, slots=True)
class Launch:
    """One command to run, and how."""

    #: The argv, run without a shell.
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    #: Seconds before it is stopped; None for no limit.
    time_limit: float | None
    #: Seconds between SIGTERM and SIGKILL when it is stopped.
    grace: float


class Launcher(Protocol):
    """Runs one command to its end (called in a thread of its own)."""

    def run(
        self,
        launch: Launch,
        *,
        on_start: Callable[[int], None],
        on_output: Callable[[bytes], None],
        cancel: threading.Event,
    ) -> RunOutcome:
        """Start the command, call ``on_start(pid)`` once it runs and ``on_output``
        with its output as it comes; stop it when ``cancel`` is set. Return once all
        its processes are gone and all its output was delivered."""
        ...


class ProcessLauncher:
    """The default launcher: a real process group (TERM, grace, KILL when stopped)."""

    def run(
        self,
        launch: Launch,
        *,
        on_start: Callable[[int], None],
        on_output: Callable[[bytes], None],
        cancel: threading.Event,
    ) -> RunOutcome:
        """See ``Launcher.run``."""
        return run_command(
            launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            on_output=on_output,
            cancel=cancel,
            time_limit=launch.time_limit,
            grace=launch.grace,
            on_start=on_start,
        )
