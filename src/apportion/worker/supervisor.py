"""Keeps N worker processes alive for ``apportion worker --nworkers N``.

Each child is a fresh interpreter running apportion's own entry point, so nothing
of the supervisor's state leaks into it. A child that dies without being asked to
is started again; one that keeps dying within ``min_uptime`` is restarted with a
growing delay, so a wrong scheduler address does not become a busy loop. How a
child is spawned and how monotonic time is read are injected (``spawn``,
``monotonic``), so the policy is tested without processes or waiting.

A child that exits with status 0 was stopped (a drained worker): it is not
restarted, and the supervisor ends once every child has stopped.

With a memory limit the supervisor reads each child's resident memory on every
poll and kills a child above the limit's ``terminate`` fraction (0.95, Dask's
default; never, if it is turned off), with SIGKILL: a process that far gone would
only keep allocating while it drained. Below that, the worker manages its own
memory: it spills results to disk and pauses (``worker.memory_manager``).

How each child ended - exit status, signal, "out of memory" - goes to the
scheduler in a ``WorkerDied`` report, so a poison task's error names the cause
instead of "its connection closed".

A child's command runs die with it however it ends, SIGKILL included: each runs
under a guard that kills it when the child's end of a pipe closes
(``apportion.runs.guard``), so nothing is left here to clean up after a death.

Children also outlive a supervisor killed with SIGKILL (they are re-parented, not
signalled), so each one is told our pid in ``SUPERVISOR_PID_VARIABLE`` and stops by
itself once its parent is someone else (see ``apportion.cli.worker``). This is
portable, unlike Linux's ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

import psutil

from apportion.core.sizes import format_bytes
from apportion.net.handshake import open_connection
from apportion.net.security import Security, security_for
from apportion.protocol.worker import WorkerDied
from apportion.worker.memory_policy import Fraction, MemoryThresholds

logger = logging.getLogger("apportion.supervisor")

#: A worker exits with this status to be replaced by a fresh process at once (the
#: scheduler asked for it: a restart of the cluster); it is no death to report.
RESTART_EXIT = 75

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


#: Starts one child process from its command line (not ``runs``' launcher, which
#: starts command runs).
Spawner = Callable[[list[str]], ChildProcess]
#: Reads a child's resident memory in bytes (0 if it cannot be read).
MemoryReader = Callable[[int], int]
#: Tells the scheduler how a child ended.
DeathReporter = Callable[[WorkerDied], None]

#: Dask's fraction of the memory limit above which a child is killed.
DEFAULT_TERMINATE = MemoryThresholds().terminate

#: A child killed by SIGKILL that was at least this close to its limit at the last
#: reading was most likely killed by the kernel for memory.
NEAR_LIMIT = 0.9


def resident_memory(pid: int) -> int:
    """The resident set size of ``pid`` in bytes, 0 if it is gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def scheduler_reporter(
    address: str, timeout: float = 5.0, security: Security | None = None
) -> DeathReporter:
    """A ``DeathReporter`` that sends ``WorkerDied`` to the scheduler at ``address``.

    Each report goes on a short connection of its own, from a daemon thread, so a
    scheduler that is down (it may be what killed the worker) never stalls the
    restarts; a report that cannot be delivered is logged and dropped.
    """

    credentials = security_for(address, security)

    async def send(report: WorkerDied) -> None:
        conn, _ = await open_connection(
            address, "supervisor", f"supervisor-{os.getpid()}", security=credentials
        )
        conn.send(report)
        await conn.close()

    def deliver(report: WorkerDied) -> None:
        try:
            asyncio.run(asyncio.wait_for(send(report), timeout))
        except Exception as exc:
            logger.warning("could not tell the scheduler how %s ended: %s", report.name, exc)

    def report(message: WorkerDied) -> None:
        threading.Thread(target=deliver, args=(message,), daemon=True).start()

    return report


#: Set in each worker process's environment unless already set, as Dask's nanny
#: does (``distributed.nanny.pre-spawn-environ``). glibc otherwise raises its mmap
#: threshold as large blocks are freed, so the next arrays of tens of MiB come from
#: the heap and their memory is not returned to the system when they are spilled
#: or released: a worker would stay above its pause threshold with nothing left to
#: spill. A low trim threshold (which also keeps the mmap threshold fixed) returns it.
WORKER_ENVIRONMENT = {"MALLOC_TRIM_THRESHOLD_": "65536"}


def worker_environment(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``WORKER_ENVIRONMENT`` added where ``base`` does not set it."""
    return {**WORKER_ENVIRONMENT, **base}


def popen_spawn(argv: list[str]) -> ChildProcess:
    """Start ``argv`` as a child sharing our stdout and stderr, told our pid."""
    env = {**worker_environment(os.environ), SUPERVISOR_PID_VARIABLE: str(os.getpid())}
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
    name: str = ""
    process: ChildProcess | None = None
    started_at: float = 0.0
    #: Deaths in a row that came sooner than ``min_uptime`` after a start.
    quick_failures: int = 0
    #: When to start again after a death; None while running.
    restart_at: float | None = None
    #: Resident memory at the last reading of the running process.
    memory: int = 0
    #: Why we killed the running process for its memory, if we did.
    memory_kill: str = ""
    #: The process exited with status 0 (stopped, drained): never started again.
    stopped: bool = False
    #: We killed the running process to replace it (a restart of the cluster): its
    #: death is no news, and the fresh process starts at once.
    replacing: bool = False
    #: Asked to leave (a cluster scaled down): not started again however it ends.
    retired: bool = False


class Supervisor:
    """Runs one child per command and restarts those that die unexpectedly."""

    def __init__(
        self,
        commands: Sequence[list[str]],
        spawn: Spawner = popen_spawn,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        names: Sequence[str] | None = None,
        memory_limit: int = 0,
        memory_terminate: Fraction = DEFAULT_TERMINATE,
        memory_of: MemoryReader = resident_memory,
        report: DeathReporter | None = None,
        min_uptime: float = 10.0,
        max_backoff: float = 30.0,
    ) -> None:
        labels = (
            list(names) if names is not None else [f"process {i}" for i in range(len(commands))]
        )
        self.slots = [Slot(i, list(argv), labels[i]) for i, argv in enumerate(commands)]
        self._spawn = spawn
        self._monotonic = monotonic
        #: Bytes of resident memory a child may use; 0 for no limit.
        self.memory_limit = memory_limit
        #: Above this many bytes a child is killed; None: never (no limit, or off).
        self.kill_above = (
            int(memory_limit * memory_terminate) if memory_limit and memory_terminate else None
        )
        self._memory_of = memory_of
        self._report = report
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
        now = self._monotonic()
        for slot in self.slots:
            if self.stopping:
                return
            if slot.process is not None:
                code = slot.process.poll()
                if code is not None:
                    self._died(slot, code, now)
                elif self.memory_limit:
                    self._check_memory(slot)
            if slot.process is None and slot.restart_at is not None and slot.restart_at <= now:
                self._start(slot)

    def add(self, argv: list[str], name: str) -> Slot:
        """One more child (a cluster scaled up), started now."""
        slot = Slot(len(self.slots), list(argv), name)
        self.slots.append(slot)
        self._start(slot)
        return slot

    def retire(self, slot: Slot) -> None:
        """Ask ``slot``'s child to drain and leave (SIGTERM); it is not started again."""
        slot.restart_at = None
        slot.retired = True
        if slot.process is not None and slot.process.poll() is None:
            slot.process.send_signal(signal.SIGTERM)
        elif slot.process is None:
            slot.stopped = True

    def replace(self, slot: Slot) -> None:
        """Kill ``slot``'s child for a fresh one, without counting it as a death."""
        slot.quick_failures = 0
        if slot.process is not None and slot.process.poll() is None:
            slot.replacing = True
            slot.process.kill()
        elif not slot.stopped:
            slot.restart_at = self._monotonic()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Pass ``sig`` to every child, wait up to ``timeout``, then kill what is left."""
        self.stopping = True
        running = [s.process for s in self.slots if s.process is not None]
        for process in running:
            if process.poll() is None:
                process.send_signal(sig)
        deadline = self._monotonic() + timeout
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - self._monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("worker process %d ignored the signal; killing it", process.pid)
                process.kill()
                process.wait()
        for slot in self.slots:
            slot.process = None

    @property
    def all_stopped(self) -> bool:
        """Every child exited with status 0: nothing left to supervise."""
        return all(slot.stopped for slot in self.slots)

    def run(self, interval: float = 0.2, stop_timeout: float = 10.0) -> int:
        """Supervise until SIGTERM or SIGINT (forwarded to the children) or until every
        child stopped by itself; returns 0. ``stop_timeout`` is how long the children
        get to drain before they are killed."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.start()
        while self._signal is None and not self.all_stopped:
            self.poll()
            self._wake.wait(interval)
        if self._signal is None:
            logger.info("every worker process stopped; the supervisor ends")
            return 0
        logger.info(
            "received %s; stopping %d workers", signal.Signals(self._signal).name, len(self.slots)
        )
        self.stop(self._signal, stop_timeout)
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal = signum
        self._wake.set()

    def _start(self, slot: Slot) -> None:
        slot.process = self._spawn(slot.argv)
        slot.started_at = self._monotonic()
        slot.restart_at = None
        slot.memory = 0
        slot.memory_kill = ""
        logger.info("worker process %d started (pid %d)", slot.index, slot.process.pid)

    def _check_memory(self, slot: Slot) -> None:
        assert slot.process is not None
        slot.memory = self._memory_of(slot.process.pid)
        if self.kill_above is not None and slot.memory > self.kill_above and not slot.memory_kill:
            share = f"{100 * self.kill_above / self.memory_limit:.0f}% of its limit"
            slot.memory_kill = (
                f"was killed by its supervisor: its memory ({format_bytes(slot.memory)}) "
                f"passed {share} ({format_bytes(self.memory_limit)}) - out of memory"
            )
            logger.warning("worker %s %s", slot.name, slot.memory_kill)
            slot.process.kill()

    def died_of_memory(self, slot: Slot, code: int) -> bool:
        """We killed the child for its memory, or a SIGKILL found it near its limit."""
        near = bool(self.memory_limit) and slot.memory >= NEAR_LIMIT * self.memory_limit
        return bool(slot.memory_kill) or (code == -signal.SIGKILL and near)

    def describe_death(self, slot: Slot, code: int) -> str:
        """How a child ended, with the memory verdict when there is one."""
        if slot.memory_kill:
            return slot.memory_kill
        how = describe_exit(code)
        if self.died_of_memory(slot, code):
            how += (
                f" - likely out of memory (it used {format_bytes(slot.memory)} "
                f"of its {format_bytes(self.memory_limit)} limit)"
            )
        return how

    def _died(self, slot: Slot, code: int, now: float) -> None:
        pid = slot.process.pid if slot.process is not None else -1
        how = self.describe_death(slot, code)
        out_of_memory = self.died_of_memory(slot, code)
        slot.process = None
        if slot.replacing or (code == RESTART_EXIT and not slot.retired):
            slot.replacing = False
            logger.info("worker %s (pid %d) is replaced by a fresh process", slot.name, pid)
            self._start(slot)
            return
        if self._report is not None and code != 0 and not slot.retired:
            # A stop is no news for the scheduler.
            self._report(WorkerDied(slot.name, pid, how, int(out_of_memory)))
        if code == 0 or slot.retired:
            slot.stopped = True
            logger.info("worker %s (pid %d) stopped; not restarting it", slot.name, pid)
            return
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
            "worker %s (pid %d) %s; restarting it%s",
            slot.name,
            pid,
            how,
            f" in {delay:g}s" if delay else "",
        )
