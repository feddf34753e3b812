"""Command runs on a worker: started once, adopted across scheduler restarts.

A run reaches a worker as an ordinary task whose function is ``execute_run``, so
it is placed, holds resources and is cancelled like any task. The command itself
runs in a thread of this module's ``LiveRuns``, which belongs to the worker
process and outlives scheduler sessions: when the scheduler restarts, the worker
registers again with the keys of the runs still alive (``RegisterWorker.live_tasks``)
and the new scheduler sends the same task again; ``execute_run`` then *attaches*
to the live run instead of starting the command a second time.

Everything the job queue must know travels as typed messages (``RunStarted``,
``RunOutput``, ``RunEnded``), each in a ``TaskNote`` about the run's task that the
scheduler forwards unread to the queue, so nobody unpickles a run's result;
notes sent while no scheduler is connected wait in the worker until one is.

``LiveRuns`` is the worker's long-lived executor (``worker.long_lived``): whoever
builds a worker that runs commands gives it one, with the launcher that starts them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from apportion.protocol.base import Message
from apportion.protocol.codec import encode_message
from apportion.protocol.services import TaskNote
from apportion.runs.launcher import Launch, Launcher
from apportion.runs.messages import RunEnded, RunOutput, RunStarted
from apportion.runs.process import ExitStatus, RunOutcome
from apportion.runs.spec import RunSpec
from apportion.worker.context import CancelEvent, TaskInterrupted
from apportion.worker.long_lived import WorkerLink

logger = logging.getLogger("apportion.runs")

#: A run's task key is this prefix and its id: ``run-7``.
RUN_KEY_PREFIX = "run-"


def run_key(run_id: int) -> str:
    """The task key of run ``run_id``."""
    return f"{RUN_KEY_PREFIX}{run_id}"


def run_id_of(key: str) -> int | None:
    """The run id in a task key, or None if the key is not a run's."""
    if key.startswith(RUN_KEY_PREFIX) and key[len(RUN_KEY_PREFIX) :].isdigit():
        return int(key[len(RUN_KEY_PREFIX) :])
    return None


def note(
    send: Callable[[Message], None], run_id: int, message: Message, *, droppable: bool = False
) -> None:
    """Tell the scheduler, for the client wanting the run's task (``TaskNote``)."""
    send(TaskNote(run_key(run_id), encode_message(message), int(droppable)))


class RunFailed(Exception):
    """A run's command did not complete: failed, timed out, cancelled or did not start.

    Raised by ``execute_run`` so that the task's ``retries`` re-run the command.
    """


class RunPreempted(RunFailed, TaskInterrupted):
    """A run's command was stopped by an interruption (the scheduler preempts it).

    Raised by ``execute_run``; as a ``TaskInterrupted`` the worker reports it as such,
    so that any scheduler, one restarted since it asked for the stop included, runs
    the task again without using a retry.
    """


@dataclass
class LiveRun:
    """One run's command on this worker, from its start until a session reports it."""

    run_id: int
    held: str
    #: Set to stop the command (cancelled by the scheduler, or not adopted).
    cancel: threading.Event = field(default_factory=threading.Event)
    #: Set once every process of the run is gone and ``outcome`` is known.
    done: threading.Event = field(default_factory=threading.Event)
    outcome: RunOutcome | None = None
    pid: int = 0
    #: Bytes of output so far: where the next ``RunOutput`` starts in the log.
    offset: int = 0
    #: Stopped on the scheduler's word: dropped from the registry once it ends.
    forget_when_done: bool = False
    #: The stop asked is an interruption (preemption): its end is said to be
    #: ``"preempted"``, not ``"cancelled"``. Kept across scheduler sessions, so that a
    #: scheduler restarted during the stop learns what the stop was.
    preempted: bool = False


class LiveRuns:
    """The runs alive in this worker process, whatever happens to scheduler sessions.

    ``launcher`` runs each command: ``ProcessLauncher`` for real process groups,
    ``apportion.testing.FakeLauncher`` for none. The worker ``attach``es it before
    any run starts (``worker.long_lived.LongLivedTasks``).
    """

    def __init__(self, launcher: Launcher) -> None:
        #: Runs each command.
        self.launcher = launcher
        #: The worker served; set once by ``attach``.
        self._link: WorkerLink | None = None
        self._runs: dict[int, LiveRun] = {}
        self._lock = threading.Lock()

    def attach(self, link: WorkerLink) -> None:
        """Serve the worker behind ``link`` (its sending and kill grace)."""
        if self._link is not None:
            raise RuntimeError("these live runs already serve a worker")
        self._link = link

    @property
    def link(self) -> WorkerLink:
        """The worker served (``attach`` first)."""
        if self._link is None:
            raise RuntimeError("these live runs serve no worker yet: attach() first")
        return self._link

    def keys(self) -> list[str]:
        """Task keys of the runs a restarted scheduler may adopt: alive, or ended and not
        yet reported (``RegisterWorker.live_tasks``)."""
        with self._lock:
            return [run_key(run_id) for run_id in sorted(self._runs)]

    def cancel_keys(self, keys: Collection[str]) -> None:
        """``cancel`` the runs among these task keys (the others are not runs)."""
        runs = [run_id_of(key) for key in keys]
        self.cancel([run_id for run_id in runs if run_id is not None])

    def _note(self, run_id: int, message: Message, *, droppable: bool = False) -> None:
        note(self.link.send, run_id, message, droppable=droppable)

    def execute(
        self,
        run_id: int,
        spec: RunSpec,
        env: Mapping[str, str],
        held: str,
        task_cancel: threading.Event,
    ) -> RunOutcome:
        """Start the run's command, or attach to it if it already runs; wait for its end.

        ``task_cancel`` is the calling task's cancel event: when it is set, the
        command is stopped (TERM, grace, KILL) and this returns once it is gone.
        """
        with self._lock:
            live = self._runs.get(run_id)
            attach = live is not None
            if live is None:
                live = self._runs[run_id] = LiveRun(run_id, held)
        if attach:
            logger.info("run %d: attached to its live command (pid %d)", run_id, live.pid)
            if live.pid and not live.done.is_set():  # an ended one has said so already
                self._note(run_id, RunStarted(run_id, live.pid, live.held))
        else:
            thread = threading.Thread(
                target=self._run,
                args=(live, spec, env),
                name=f"apportion-run-{run_id}",
                daemon=True,
            )
            thread.start()
        while not live.done.wait(0.1):
            if task_cancel.is_set():
                # Before the stop begins: its end then says whether it was preempted.
                live.preempted = isinstance(task_cancel, CancelEvent) and task_cancel.interrupted
                live.cancel.set()
        assert live.outcome is not None
        return live.outcome

    def settled(self, run_id: int) -> None:
        """The scheduler has been told how the run ended: nothing left to adopt."""
        with self._lock:
            live = self._runs.get(run_id)
            if live is not None and live.done.is_set():
                del self._runs[run_id]

    def cancel(self, run_ids: Collection[int]) -> None:
        """Stop these runs if they are alive (cancelled, or a copy nobody adopted).

        A stopped run is forgotten once its processes are gone: a later attempt of
        the same run on this worker must start afresh, not attach to this copy.
        """
        with self._lock:
            found = [self._runs[i] for i in run_ids if i in self._runs]
            for live in found:
                live.preempted = False  # a cancel wins over an interruption
                live.cancel.set()
                if live.done.is_set():
                    del self._runs[live.run_id]
                else:
                    live.forget_when_done = True

    def stop_all(self, timeout: float) -> int:
        """Stop every live run (the worker is closing) and wait up to ``timeout`` for them.

        A run must not outlive its worker: nobody would report it, and it would keep
        the GPUs the scheduler hands to the run's next attempt. Returns how many
        are still not gone.
        """
        with self._lock:
            runs = list(self._runs.values())
        for live in runs:
            live.cancel.set()
        deadline = time.monotonic() + timeout
        for live in runs:
            live.done.wait(max(0.0, deadline - time.monotonic()))
        return sum(1 for live in runs if not live.done.is_set())

    def _run(self, live: LiveRun, spec: RunSpec, env: Mapping[str, str]) -> None:
        # Output can be read before ``run_command`` reports the start: it waits, so
        # that the scheduler always hears of a start before that attempt's output.
        order = threading.Lock()
        early: list[bytes] = []

        def started(pid: int) -> None:
            with order:
                live.pid = pid
                self._note(live.run_id, RunStarted(live.run_id, pid, live.held))
                for chunk in early:
                    output = RunOutput(live.run_id, live.offset, chunk)
                    self._note(live.run_id, output, droppable=True)
                    live.offset += len(chunk)
                early.clear()

        def output(chunk: bytes) -> None:
            with order:
                if not live.pid:
                    early.append(chunk)
                    return
                self._note(live.run_id, RunOutput(live.run_id, live.offset, chunk), droppable=True)
                live.offset += len(chunk)

        try:
            launch = Launch(spec.command, spec.cwd, env, spec.time_limit, self.link.kill_grace)
            outcome = self.launcher.run(
                launch, on_start=started, on_output=output, cancel=live.cancel
            )
        except Exception as exc:  # a bug here must still end the run, not hang it
            logger.exception("run %d: could not be run", live.run_id)
            no_status = ExitStatus(code=None, signal=None)
            outcome = RunOutcome(no_status, "could not start", f"internal error: {exc}", 0)
        if live.preempted and outcome.reason == "cancelled":
            detail = "preempted" + outcome.detail.removeprefix("cancelled")
            outcome = RunOutcome(outcome.status, "preempted", detail, outcome.leftovers)
        code = -1 if outcome.status.code is None else outcome.status.code
        sig = outcome.status.signal or 0
        self._note(live.run_id, RunEnded(live.run_id, code, sig, outcome.reason, outcome.detail))
        live.outcome = outcome
        live.done.set()
        if live.forget_when_done:
            with self._lock:
                if self._runs.get(live.run_id) is live:
                    del self._runs[live.run_id]


def run_environment(run_id: int, spec: RunSpec, resources_env: Mapping[str, str]) -> dict[str, str]:
    """The run's environment: as captured at submission, plus what it holds and its id."""
    env = dict(resources_env)
    env["RUN_ID"] = str(run_id)
    env["APPORTION_RUN_ID"] = str(run_id)
    if spec.array_index is not None:
        env["APPORTION_ARRAY_INDEX"] = str(spec.array_index)
    return env


def execute_run(run_id: int, run: RunSpec) -> dict[str, Any]:
    """The task function of a run: run its command on this worker, raise if it failed.

    ``run`` arrives in its final form, validated once when it was staged or submitted.
    """
    from apportion.worker.context import task_cancel_event, task_environment, task_held
    from apportion.worker.service import get_worker

    worker = get_worker()
    runs = worker.long_lived
    if not isinstance(runs, LiveRuns):
        # Said as the run's end, so the journal shows why rather than a bare failure.
        detail = (
            f"worker {worker.name} runs no commands: it was built without a launcher "
            "(Worker(long_lived=LiveRuns(launcher)))"
        )
        logger.error("run %d: %s", run_id, detail)
        note(worker.send_threadsafe, run_id, RunEnded(run_id, -1, 0, "could not start", detail))
        raise RunFailed(f"run {run_id}: could not start: {detail}")
    env = run_environment(run_id, run, task_environment(run.env))
    session = worker.sessions
    outcome = runs.execute(run_id, run, env, task_held(), task_cancel_event())
    if worker.sessions == session and worker.connected:
        runs.settled(run_id)
    if outcome.reason == "preempted":
        raise RunPreempted(f"run {run_id}: {outcome.detail}")
    if outcome.reason != "completed":
        raise RunFailed(f"run {run_id}: {outcome.reason}: {outcome.detail}")
    return {"exit_code": outcome.status.code, "detail": outcome.detail}
