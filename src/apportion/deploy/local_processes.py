"""The worker processes of a ``LocalCluster``, supervised like ``apportion worker --nworkers``.

The ``Supervisor`` policy (worker/supervisor.py) runs on a thread of the user's
process: a worker that dies (a task calling ``os._exit``, SIGKILL from outside,
past its memory limit) is started again with the same name, and how it died
goes straight into the scheduler's state (a ``WorkerDeathReport``), so a task that
kills worker after worker fails with ``WorkerCrashedError`` saying how they died.

Each worker is told our pid as its supervisor's: once the user's process is gone
(even by SIGKILL) its workers see a new parent and stop by themselves, so no
worker outlives the script that started it.

A worker's stderr (its log) is read line by line into a bounded buffer for
``LocalCluster.get_logs``; lines at or above the user's level are also copied to
our own stderr, so warnings and tracebacks still reach the terminal.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import IO

from apportion.log_setup import FORMAT_VARIABLE, LEVEL_VARIABLE
from apportion.worker.memory_policy import Fraction
from apportion.worker.supervisor import (
    SUPERVISOR_PID_VARIABLE,
    ChildProcess,
    DeathReporter,
    Slot,
    Supervisor,
    worker_environment,
)

#: Lines of log kept per worker name (across its restarts).
LOG_LINES = 2_000

#: Seconds between two looks at the workers: how soon a death is noticed.
POLL_SECONDS = 0.1


def line_level(line: str) -> int | None:
    """The level of a log line written by ``configure_logging`` (None: not a record's
    first line, e.g. a traceback's continuation or a task's own ``print``)."""
    parts = line.split(" ", 4)
    if len(parts) < 4:
        return None
    level = logging.getLevelName(parts[3])
    return level if isinstance(level, int) else None


class WorkerLog:
    """The recent stderr of one worker name; copies the important lines to ours."""

    def __init__(self, show_from: int) -> None:
        self.lines: deque[str] = deque(maxlen=LOG_LINES)
        self._show_from = show_from
        self._lock = threading.Lock()

    def follow(self, stream: IO[bytes], muted: threading.Event) -> None:
        """Read ``stream`` until it closes (the process ended); runs on its own thread.

        Once ``muted`` is set (the process is being replaced on purpose) its lines
        are kept but no longer shown: its complaints about it are no news.
        """
        showing = True
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            level = line_level(line)
            if level is not None:  # continuation lines follow their record's fate
                showing = level >= self._show_from
            with self._lock:
                self.lines.append(line)
            if showing and not muted.is_set():
                sys.stderr.write(line)
        stream.close()

    def text(self) -> str:
        with self._lock:
            return "".join(self.lines)


class WorkerProcesses:
    """Starts, watches, restarts, retires and stops a local cluster's worker processes."""

    def __init__(
        self,
        report: DeathReporter,
        *,
        memory_limit: int,
        memory_terminate: Fraction,
        log_level: int,
        show_from: int,
        credentials: Mapping[str, str],
    ) -> None:
        # The cluster's secret goes to its workers in their environment: unlike a
        # command line, that is readable by this user only.
        self._env = {**worker_environment(os.environ), **credentials}
        self._env.setdefault("PYTHONUNBUFFERED", "1")
        self._env[LEVEL_VARIABLE] = logging.getLevelName(log_level)
        # ``line_level`` reads text lines: a JSON format inherited from the user's
        # environment would leave every line unclassified (shown, or not, by accident).
        self._env[FORMAT_VARIABLE] = "text"
        self._env[SUPERVISOR_PID_VARIABLE] = str(os.getpid())
        self._show_from = show_from
        self.logs: dict[str, WorkerLog] = {}
        #: pid -> set to stop showing that process's lines (see ``mute``).
        self._mutes: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self._supervisor = Supervisor(
            [],
            self._spawn,
            memory_limit=memory_limit,
            memory_terminate=memory_terminate,
            report=report,
            min_uptime=5.0,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="apportion-cluster-supervisor", daemon=True
        )
        self._thread.start()

    def _spawn(self, argv: list[str]) -> ChildProcess:
        name = argv[argv.index("--name") + 1]
        log = self.logs.setdefault(name, WorkerLog(self._show_from))
        proc = subprocess.Popen(
            argv, env=self._env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        assert proc.stderr is not None
        muted = self._mutes[proc.pid] = threading.Event()
        reader = threading.Thread(
            target=log.follow,
            args=(proc.stderr, muted),
            name=f"apportion-log-{name}",
            daemon=True,
        )
        reader.start()
        return proc

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            with self._lock:
                self._supervisor.poll()

    def add(self, argv: list[str], name: str) -> None:
        """Start one more worker process."""
        with self._lock:
            self._supervisor.add(argv, name)

    def retire(self, name: str) -> None:
        """Drain the worker ``name`` (SIGTERM) and let it go for good."""
        with self._lock:
            for slot in self._live():
                if slot.name == name:
                    self._supervisor.retire(slot)

    def mute(self) -> None:
        """Stop showing what the running processes log (they are about to be replaced)."""
        with self._lock:
            for event in self._mutes.values():
                event.set()
            self._mutes.clear()

    def replace_all(self) -> None:
        """Kill every worker process for a fresh one (a restart of the cluster)."""
        with self._lock:
            for slot in self._live():
                self._supervisor.replace(slot)

    def _live(self) -> list[Slot]:
        return [s for s in self._supervisor.slots if not s.stopped and not s.retired]

    def wait_retired(self, timeout: float) -> bool:
        """Wait until every retired worker has exited; False on timeout."""
        return self._wait_for(
            lambda: all(s.stopped for s in self._supervisor.slots if s.retired), timeout
        )

    def _wait_for(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)  # the supervisor's own pace: no event marks an exit
        return True

    @property
    def names(self) -> list[str]:
        """Names of the workers kept alive (retired ones excluded)."""
        with self._lock:
            return [s.name for s in self._live()]

    @property
    def processes(self) -> list[ChildProcess]:
        """The worker processes running now."""
        with self._lock:
            return [s.process for s in self._supervisor.slots if s.process is not None]

    def failing(self) -> list[str]:
        """Workers that died twice in a row soon after starting (the supervisor backs off)."""
        with self._lock:
            return [s.name for s in self._supervisor.slots if s.quick_failures >= 2]

    def close(self, timeout: float = 5.0) -> None:
        """Drain every worker (SIGTERM), then kill what is left after ``timeout``."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._supervisor.stop(timeout=timeout)
