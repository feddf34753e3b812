"""The scheduler's job queue: runs in the journal, tasks in the state machine.

``RunQueue`` is a client of the scheduler's state machine that lives inside the
scheduler process (client id ``RUNS_CLIENT``). Each queued run becomes one task,
``run-<id>``, whose function is ``execute_run``: placement, resources, priority,
backfill, retries, cancellation and worker loss are the scheduler's, unchanged.
What is particular to runs happens here:

- the journal is the truth: staged runs are picked up from it (also while running,
  so ``apportion stage`` and ``apportion cancel`` work beside a live scheduler),
  and every state change is written to it before anyone is told;
- workers report a run's start, output and end as typed messages; output goes to
  the run's log under the journal, through the cluster, not a shared filesystem;
- after a scheduler restart, runs the journal says were running wait
  ``adopt_grace`` seconds for their worker to come back and are *adopted*, not
  started again; the others are requeued (within their retries) or marked lost.

The queue owns no socket and no clock: the service calls it with the time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from apportion.core.payload import dumps_function, function_id, pack_call
from apportion.core.resources import describe_amount, describe_resources, parse_demand, parse_supply
from apportion.protocol import messages as m
from apportion.runs.journal import (
    CANCELLED,
    COMPLETED,
    FAILED,
    LOST,
    QUEUED,
    RUNNING,
    STAGED,
    Journal,
    RunRecord,
)
from apportion.runs.live import execute_run, run_id_of, run_key
from apportion.scheduler.events import AdoptRunning, Event, FromClient
from apportion.scheduler.explain import explain
from apportion.scheduler.state import SchedulerState

logger = logging.getLogger("apportion.runs")

#: The queue's client id inside the scheduler's state machine.
RUNS_CLIENT = "runs"
#: Seconds between looks at the journal for runs staged and cancels asked meanwhile.
POLL_SECONDS = 0.5
#: Seconds between updates of the "why is it waiting" text of queued runs.
WAITING_SECONDS = 2.0
#: At most this many queued runs get their waiting text refreshed per update.
WAITING_BATCH = 200


class QueueHost(Protocol):
    """What the queue needs of the scheduler service around it."""

    state: SchedulerState

    def handle(self, event: Event) -> None: ...

    def send_to(self, peer_id: str, message: m.Message) -> None: ...


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """How a scheduler runs its job queue."""

    #: After a restart, how long a run that was running waits for its worker.
    adopt_grace: float = 30.0
    #: The supply of a fixed cluster (``--run-once``): staged runs it can never
    #: meet are reported and left staged instead of queued. None: workers may join.
    fixed_supply: dict[str, int] | None = None
    #: Called with every chunk of run output (``--run-once`` echoes it).
    echo: Callable[[bytes], None] | None = None


class RunQueue:
    """Feeds journal runs to the scheduler as tasks and records what becomes of them."""

    def __init__(self, journal: Journal, host: QueueHost, options: QueueOptions) -> None:
        self.journal = journal
        self.host = host
        self.options = options
        blob = dumps_function(execute_run)
        self._function = (function_id(blob), blob)
        #: Runs with a live task in the scheduler, by id.
        self.active: set[int] = set()
        #: Runs that were running when the scheduler stopped: id -> adoption deadline.
        self.awaiting: dict[int, float] = {}
        #: How each active run's latest attempt ended (``RunEnded``), until it settles.
        self.ended: dict[int, m.RunEnded] = {}
        #: Log bytes written per run, to place output sent again after a reconnection.
        self._log_sizes: dict[int, int] = {}
        #: Log byte where each run's current attempt began (see ``_new_attempt``).
        self._bases: dict[int, int] = {}
        #: What each active run's command holds, as its worker last said (units!).
        self._held: dict[int, str] = {}
        #: Staged runs a fixed cluster can never run, reported once each.
        self.ignored: set[int] = set()
        #: Active runs already asked to stop (the journal keeps asking until they end).
        self._cancelling: set[int] = set()
        #: Cancelled runs whose processes are still being stopped: id -> (worker
        #: name, failure); settled on their ``RunEnded`` or their worker's loss.
        self._stopping: dict[int, tuple[str, tuple[str, str]]] = {}
        #: Runs processed in this session that did not complete (``--run-once`` exit).
        self.failures = 0
        self._next_poll = 0.0
        self._next_waiting = 0.0

    # --- lifecycle ----------------------------------------------------------------

    def start(self, now: float, wall: float) -> None:
        """Resume what the journal holds: queued runs queue, running ones await adoption."""
        queued = self.journal.runs(states={QUEUED})
        if queued:
            logger.info("resuming %d queued runs", len(queued))
        self._submit(queued)
        for record in self.journal.runs(states={RUNNING}):
            self.awaiting[record.id] = now + self.options.adopt_grace
            logger.info(
                "run %s was running on %s; waiting %gs for it to be adopted",
                record.label(),
                record.worker or "?",
                self.options.adopt_grace,
            )
        self.tick(now, wall)

    def idle(self) -> bool:
        """Nothing queued, running, awaiting adoption, or staged that this cluster can run."""
        if self.active or self.awaiting:
            return False
        staged = self.journal.runs(states={STAGED})
        return all(record.id in self.ignored for record in staged)

    def tick(self, now: float, wall: float) -> None:
        """Time passes: pick up staged runs and cancels, expire adoptions, explain waits."""
        if now >= self._next_poll:
            self._next_poll = now + POLL_SECONDS
            self._take_staged(wall)
            for run_id in self.journal.cancel_requests():
                self._cancel(run_id)
        for run_id, deadline in list(self.awaiting.items()):
            if now >= deadline:
                del self.awaiting[run_id]
                self._not_adopted(run_id, wall)
        if now >= self._next_waiting:
            self._next_waiting = now + WAITING_SECONDS
            self._explain_waiting()

    # --- runs into tasks ------------------------------------------------------------

    def submit_specs(self, specs: list[dict[str, object]], wall: float) -> list[int]:
        """``SubmitRuns`` from a client: validate, journal as queued, queue."""
        from apportion.runs.spec import RunSpec

        parsed = [RunSpec.from_dict(spec) for spec in specs]
        ids = self.journal.stage(parsed, wall, queued=True)
        self._submit(self.journal.runs(ids=ids))
        return ids

    def _take_staged(self, wall: float) -> None:
        staged = [r for r in self.journal.runs(states={STAGED}) if r.id not in self.ignored]
        runnable = []
        for record in staged:
            problem = self._never_fits(record)
            if problem:
                self.ignored.add(record.id)
                logger.warning(
                    "ignoring staged run %s (%s); it stays staged", record.label(), problem
                )
                cluster = describe_resources(self.options.fixed_supply or {}) or "no resources"
                text = f"the --run-once cluster ({cluster}) cannot run it: {problem}"
                self.journal.set_waiting(record.id, text)
            else:
                runnable.append(record)
        if runnable:
            self.journal.mark_queued([r.id for r in runnable], wall)
            self._submit(runnable)  # queuing changes nothing the tasks are made of

    def _never_fits(self, record: RunRecord) -> str:
        supply = self.options.fixed_supply
        if supply is None:
            return ""
        demand = parse_demand(record.spec.resources or None)
        undefined = sorted(name for name in demand if name not in supply)
        if undefined:
            return "requires resources not defined for the cluster: " + ", ".join(undefined)
        short = [f"{n}={describe_amount(n, t)}" for n, t in sorted(demand.items()) if t > supply[n]]
        if short:
            return "requires more than the cluster has: " + " ".join(short)
        return ""

    def _submit(self, records: list[RunRecord]) -> None:
        if not records:
            return
        func_id, blob = self._function
        tasks = []
        for record in records:
            spec = record.spec
            task = self._task_spec(record)
            tasks.append(task)
            self.active.add(record.id)
            logger.info(
                "scheduling run %s (requires %s)", record.label(), spec.resources or "nothing"
            )
        submit = m.SubmitTasks(tasks, {func_id: blob}, [t.key for t in tasks])
        self.host.handle(FromClient(RUNS_CLIENT, [submit], self._now()))

    def _task_spec(self, record: RunRecord, *, running: bool = False) -> m.TaskSpec:
        """The task that runs ``record``'s command: ``execute_run(id, spec)``, its demand.

        Its retries are what the run has left: attempts made before (a restart
        resumes a run, it does not renew its retries) count, the one now running
        (``running``, an adopted run) excepted.
        """
        spec = record.spec
        args = pack_call((record.id, spec.to_dict()), {})[0]
        demand = parse_demand(spec.resources or None)
        func_id = self._function[0]
        left = max(0, spec.retries - record.attempts + (1 if running else 0))
        return m.TaskSpec(run_key(record.id), func_id, args, [], demand, spec.priority, left)

    def _now(self) -> float:
        return self.host.state.now

    # --- what the state machine tells its client ------------------------------------

    def on_message(self, message: m.Message, wall: float) -> None:
        """A message the state machine addressed to the queue's client."""
        match message:
            case m.KeysDone():
                for key in message.keys:
                    self._settle(key, wall, None)
            case m.TaskErred():
                self._settle(message.key, wall, ("failed", ""))
            case m.KeysFailed():
                for key in message.keys:
                    self._settle(key, wall, (message.kind, message.message))
            case m.Notice():
                level = logging.WARNING if message.level == "warning" else logging.INFO
                logger.log(level, "%s", message.text)
            case _:
                pass  # KeysPending and the like: a run's task is never an input

    def _settle(self, key: str, wall: float, failure: tuple[str, str] | None) -> None:
        run_id = run_id_of(key)
        if run_id is None or run_id not in self.active or run_id in self._stopping:
            return
        self.host.handle(FromClient(RUNS_CLIENT, [m.ReleaseKeys([key])], self._now()))
        record = self.journal.get(run_id)
        cancelled = failure is not None and failure[0] == "cancelled"
        ended = self.ended.get(run_id)
        if cancelled and ended is not None and ended.reason == "completed":
            failure = None  # the cancel came after the command had completed
            cancelled = False
        started = record is not None and record.state == RUNNING
        if cancelled and started and record is not None and run_id not in self.ended:
            # The scheduler failed the task at once; the run is cancelled only once
            # its processes are gone (RunEnded), as its resources are freed.
            self._stopping[run_id] = (record.worker, failure or ("", ""))
            return
        self._finish(run_id, wall, failure)

    def _finish(self, run_id: int, wall: float, failure: tuple[str, str] | None) -> None:
        self.active.discard(run_id)
        self._held.pop(run_id, None)
        self._bases.pop(run_id, None)
        self._log_sizes.pop(run_id, None)
        self.journal.log_path(run_id).with_suffix(".base").unlink(missing_ok=True)
        self._cancelling.discard(run_id)
        self._stopping.pop(run_id, None)
        ended = self.ended.pop(run_id, None)
        code = None if ended is None or ended.exit_code < 0 else ended.exit_code
        sig = None if ended is None or not ended.signal else ended.signal
        detail = ended.detail if ended is not None else ""
        if failure is None:
            state, reason = COMPLETED, ""
        elif failure[0] == "cancelled":
            state, reason = CANCELLED, detail or "cancelled before it started"
        elif failure[0] in ("crashed", "lost"):
            state, reason = LOST, failure[1]
        else:
            state, reason = FAILED, detail or failure[1]
            if ended is not None and ended.reason in ("timed out", "could not start"):
                reason = f"{ended.reason}: {detail}"  # tables show "timed out" from this
        record = self.journal.get(run_id)
        if record is not None and record.state == QUEUED and state in (COMPLETED, LOST):
            # Its start report never came (an adopted run that ended meanwhile, say):
            # the journal only lets a run that started complete or be lost.
            self.journal.mark_running(run_id, "", "", wall)
        self.journal.mark_ended(run_id, state, wall, exit_code=code, signal=sig, reason=reason)
        label = record.label() if record is not None else str(run_id)
        if state == COMPLETED:
            logger.info("run %s completed", label)
        else:
            self.failures += 1
            logger.warning("run %s %s: %s", label, state, reason)

    # --- what workers report ----------------------------------------------------------

    def on_worker_message(self, worker_id: str, message: m.Message, wall: float) -> None:
        """``RunStarted``, ``RunOutput`` or ``RunEnded`` from the worker ``worker_id``."""
        match message:
            case m.RunStarted():
                self._started(worker_id, message, wall)
            case m.RunOutput():
                self._output(message)
            case m.RunEnded():
                if message.run_id in self.active:
                    self.ended[message.run_id] = message
                stopping = self._stopping.get(message.run_id)
                if stopping is not None:
                    self._finish(message.run_id, wall, stopping[1])

    def _started(self, worker_id: str, message: m.RunStarted, wall: float) -> None:
        record = self.journal.get(message.run_id)
        if record is None or message.run_id not in self.active:
            return
        worker = self.host.state.workers.get(worker_id)
        name = worker.name if worker is not None else worker_id
        previous = self.ended.pop(record.id, None)
        if record.state == RUNNING and previous is not None:
            # The last attempt ended and the scheduler runs it again (its retries).
            why = f"attempt {record.attempts} ended: {previous.detail}; retrying"
            self.journal.requeue(record.id, why, wall)
            logger.warning("run %s: %s", record.label(), why)
            record = self.journal.get(record.id) or record
        self._held[record.id] = message.held
        if record.state == QUEUED:
            self._new_attempt(record)
            self.journal.mark_running(record.id, name, message.held, wall)
            logger.info(
                "run %s started on %s (pid %d%s)",
                record.label(),
                name,
                message.pid,
                f", holding {message.held}" if message.held else "",
            )

    # A run's log holds every attempt, one after the other. Workers count output
    # offsets from the start of their attempt; the log byte where the current
    # attempt began is kept in memory and in ``<id>.base`` beside the log, so that
    # output sent again by an adopted run after a restart is written once.

    def _new_attempt(self, record: RunRecord) -> None:
        path = self.journal.log_path(record.id)
        size = path.stat().st_size if path.exists() else 0
        if size and record.attempts:
            banner = f"\n[apportion: attempt {record.attempts + 1}]\n".encode()
            self.journal.append_log(record.id, banner)
            size += len(banner)
        self._log_sizes[record.id] = size
        self._bases[record.id] = size
        if size:
            path.with_suffix(".base").write_text(str(size))

    def _base(self, run_id: int) -> int:
        base = self._bases.get(run_id)
        if base is None:
            marker = self.journal.log_path(run_id).with_suffix(".base")
            base = int(marker.read_text()) if marker.exists() else 0
            self._bases[run_id] = base
        return base

    def _output(self, message: m.RunOutput) -> None:
        run_id = message.run_id
        base = self._base(run_id)
        size = self._log_sizes.get(run_id)
        if size is None:
            path = self.journal.log_path(run_id)
            size = path.stat().st_size if path.exists() else 0
        offset = base + message.offset
        data = message.data
        if offset < size:  # sent again after a reconnection: keep the new part
            data = data[size - offset :]
        elif offset > size:
            gap = offset - size
            data = f"\n[apportion: {gap} bytes of output were lost here]\n".encode() + data
        if data:
            self.journal.append_log(run_id, data)
            if self.options.echo is not None:
                self.options.echo(data)
        self._log_sizes[run_id] = max(size, offset + len(message.data))

    def worker_left(self, name: str, wall: float) -> None:
        """A worker is gone: its cancelled runs are settled, its running ones requeued.

        The scheduler runs the lost worker's tasks again (or fails them as poison,
        which ``on_message`` then records as lost); the journal says so meanwhile.
        """
        for run_id, (worker, failure) in list(self._stopping.items()):
            if worker == name:
                self._finish(run_id, wall, (failure[0], f"{failure[1]}; its worker left"))
        for record in self.journal.runs(states={RUNNING}):
            if record.worker == name and record.id in self.active:
                self.ended.pop(record.id, None)
                self.journal.requeue(record.id, f"its worker {name} left", wall)
                logger.warning("run %s interrupted: its worker %s left", record.label(), name)

    # --- adoption after a restart -----------------------------------------------------

    def worker_joined(self, worker_id: str, reg: m.RegisterWorker, wall: float) -> None:
        """Adopt the runs this worker still runs that we wait for; stop the others."""
        stray: list[str] = []
        for run_id in reg.live_runs:
            record = self.journal.get(run_id)
            task = self.host.state.tasks.get(run_key(run_id))
            if record is not None and run_id in self.active and task is not None:
                if task.state == "queued":
                    # Requeued when this worker was declared lost, not started again
                    # anywhere yet: its command still runs here, so keep it there.
                    self._adopt(worker_id, reg.name, record, wall)
                else:
                    stray.append(run_key(run_id))  # it runs elsewhere now: stop this copy
                continue
            if run_id not in self.awaiting or record is None or record.state != RUNNING:
                stray.append(run_key(run_id))
                continue
            del self.awaiting[run_id]
            self._adopt(worker_id, reg.name, record, wall)
        if stray:
            # Not ours to run any more (finished, cancelled or running elsewhere).
            self.host.send_to(worker_id, m.FreeKeys(stray))

    def _adopt(self, worker_id: str, name: str, record: RunRecord, wall: float) -> None:
        """Record ``record``'s run as running on the worker whose command still runs it."""
        run_id = record.id
        func_id, blob = self._function
        task = self._task_spec(record, running=True)  # its latest attempt still runs
        self.active.add(run_id)
        held = self._held.get(run_id) or record.held
        if record.state == QUEUED:  # requeued when its worker was declared lost
            self.journal.mark_running(run_id, name, held, wall)
        self.journal.note(run_id, f"adopted: still running on {name}", wall)
        logger.info("run %s adopted: still running on %s", record.label(), name)
        units = parse_supply(held or None)[1]
        submit = m.SubmitTasks([task], {func_id: blob}, [task.key])
        self.host.handle(AdoptRunning(worker_id, RUNS_CLIENT, submit, units, self._now()))

    def _not_adopted(self, run_id: int, wall: float) -> None:
        record = self.journal.get(run_id)
        if record is None or record.state != RUNNING:
            return
        why = "its worker did not come back after the scheduler restarted"
        if record.cancel_requested:
            self.journal.mark_ended(run_id, CANCELLED, wall, reason=f"cancelled; {why}")
        elif record.attempts > record.spec.retries:
            self.failures += 1
            self.journal.mark_ended(run_id, LOST, wall, reason=why)
            logger.warning("run %s lost: %s", record.label(), why)
        else:
            self.journal.requeue(run_id, why, wall)
            logger.warning("run %s interrupted (%s); queued again", record.label(), why)
            self._submit([record])

    # --- cancel and explain -----------------------------------------------------------

    def cancel(self, ids: list[int], wall: float) -> None:
        """A client asked to cancel these runs: journal it, then act as on a poll."""
        asked = []
        with self.journal.batch():  # one commit, and before the workers are told
            for run_id in ids:
                try:
                    self.journal.request_cancel(run_id, wall)
                except KeyError:
                    continue
                asked.append(run_id)
        for run_id in asked:
            self._cancel(run_id)

    def _cancel(self, run_id: int) -> None:
        if run_id in self.active and run_id not in self._cancelling:
            self._cancelling.add(run_id)
            key = run_key(run_id)
            self.host.handle(FromClient(RUNS_CLIENT, [m.CancelKeys([key])], self._now()))
        # A run awaiting adoption is stopped when its worker comes back, or ends
        # cancelled when the grace runs out (``_not_adopted``).

    def _explain_waiting(self) -> None:
        state = self.host.state
        queued = sorted(self.active)[:WAITING_BATCH]
        with self.journal.batch():  # one commit, not one per run
            for run_id in queued:
                task = state.tasks.get(run_key(run_id))
                if task is not None and task.state in ("queued", "waiting"):
                    self.journal.set_waiting(run_id, waiting_text(explain(state, task.key)))

    def report(self, ids: list[int]) -> list[dict[str, object]]:
        """What ``QueryRuns`` and ``CancelRuns`` answer: each known run of ``ids``, or
        the latest runs if ``ids`` is empty, as ``remote.record_to_dict`` gives them."""
        from apportion.runs.remote import MAX_LISTED, record_to_dict

        records = self.journal.runs(ids=ids) if ids else self.journal.runs(latest=MAX_LISTED)
        return [record_to_dict(record) for record in records]


def waiting_text(explanation: str) -> str:
    """The scheduler's explanation of a waiting task as one line for the run table.

    ``"queued: needs gpu=1\n  w1: gpu 0 of 1 free"`` -> ``"needs gpu=1; w1: gpu 0 of 1 free"``
    (the table already says the run is queued).
    """
    lines = [line.strip() for line in explanation.splitlines() if line.strip()]
    if lines and lines[0].startswith("queued: "):
        lines[0] = lines[0][len("queued: ") :]
    return "; ".join(lines)
