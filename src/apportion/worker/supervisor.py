"""Keeps N worker processes alive for ``apportion worker --nworkers N``.

Each child is a fresh interpreter running apportion's own entry point, so nothing
of the supervisor's state leaks into it. A child that dies without being asked to
is started again; one that keeps dying within ``min_uptime`` is restarted with a
growing delay, so a wrong scheduler address does not become a busy loop. The
launcher and the clock are injected, so the policy is tested without processes.

Children also outlive a supervisor killed with SIGKILL (they are re-parented, not
signalled), so each one is told our pid in ``SUPERVISOR_PID_VARIABLE`` and stops by
itself once its parent is someone else (see ``apportion.cli.worker``). This is
portable, unlike Linux's ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

logger = logging.getLogger("apportion.supervisor")

#: Set in each child's environment to the supervisor's pid; a worker process that
#: finds it watches ``os.getppid()`` and stops when it no longer matches.
SUPERVISOR_PID_VARIABLE = "APPORTION_SUPERVISOR_PID"


class ChildProcess(Protocol):
    """The part of ``subprocess.Popen`` the supervisor uses."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


Launcher = Callable[[list[str]], ChildProcess]


def popen_launcher(argv: list[str]) -> ChildProcess:
    """Start ``argv`` as a child sharing our stdout and stderr, told our pid."""
    env = {**os.environ, SUPERVISOR_PID_VARIABLE: str(os.getpid())}
    return subprocess.Popen(argv, env=env)


def describe_exit(returncode: int) -> str:
    """``"exited with status 1"`` or ``"was killed by SIGKILL"``."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


@dataclass
class Slot:
    """One of the N places a worker process runs in."""

    index: int
    argv: list[str]
    process: ChildProcess | None = None
    started_at: float = 0.0
    #: Deaths in a row that came sooner than ``min_uptime`` after a start.
    quick_failures: int = 0
    #: When to start again after a death; None while running.
    restart_at: float | None = None


class Supervisor:
    """Runs one child per command and restarts those that die unexpectedly."""

    def __init__(
        self,
        commands: Sequence[list[str]],
        launcher: Launcher = popen_launcher,
        clock: Callable[[], float] = time.monotonic,
        *,
        min_uptime: float = 10.0,
        max_backoff: float = 30.0,
    ) -> None:
        self.slots = [Slot(i, list(argv)) for i, argv in enumerate(commands)]
        self._launch = launcher
        self._clock = clock
        self.min_uptime = min_uptime
        self.max_backoff = max_backoff
        #: Set once ``stop`` began: children that exit now were stopped by us.
        self.stopping = False
        self._wake = threading.Event()
        self._signal: int | None = None

    def start(self) -> None:
        for slot in self.slots:
            self._start(slot)

    def poll(self) -> None:
        """Notice children that died and start those whose restart is due."""
        now = self._clock()
        for slot in self.slots:
            if self.stopping:
                return
            if slot.process is not None:
                code = slot.process.poll()
                if code is not None:
                    self._died(slot, code, now)
            if slot.process is None and slot.restart_at is not None and slot.restart_at <= now:
                self._start(slot)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Pass ``sig`` to every child, wait up to ``timeout``, then kill what is left."""
        self.stopping = True
        running = [s.process for s in self.slots if s.process is not None]
        for process in running:
            if process.poll() is None:
                process.send_signal(sig)
        deadline = self._clock() + timeout
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - self._clock()))
            except subprocess.TimeoutExpired:
                logger.warning("worker process %d ignored the signal; killing it", process.pid)
                process.kill()
                process.wait()
        for slot in self.slots:
            slot.process = None

    def run(self, interval: float = 0.2) -> int:
        """Supervise until SIGTERM or SIGINT, forward it to the children; returns 0."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.start()
        while self._signal is None:
            self.poll()
            self._wake.wait(interval)
        logger.info(
            "received %s; stopping %d workers", signal.Signals(self._signal).name, len(self.slots)
        )
        self.stop(self._signal)
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal = signum
        self._wake.set()

    def _start(self, slot: Slot) -> None:
        slot.process = self._launch(slot.argv)
        slot.started_at = self._clock()
        slot.restart_at = None
        logger.info("worker process %d started (pid %d)", slot.index, slot.process.pid)

    def _died(self, slot: Slot, code: int, now: float) -> None:
        pid = slot.process.pid if slot.process is not None else -1
        slot.process = None
        if now - slot.started_at < self.min_uptime:
            slot.quick_failures += 1
        else:
            slot.quick_failures = 0
        delay = (
            0.0
            if slot.quick_failures <= 1
            else min(self.max_backoff, 2.0 ** (slot.quick_failures - 2))
        )
        slot.restart_at = now + delay
        logger.warning(
            "worker process %d (pid %d) %s; restarting it%s",
            slot.index,
            pid,
            describe_exit(code),
            f" in {delay:g}s" if delay else "",
        )
