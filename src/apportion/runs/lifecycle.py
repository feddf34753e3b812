"""The job queue's decisions, pure: events in, commands out.

Theory of operation
-------------------
A run is one shell command in the journal. While the queue serves it, it is a task
in the scheduler (``run-<id>``), and ``RunLifecycle`` keeps a ``RunView`` of it: its
state, attempts, worker and held resources, as the journal will have them once
the commands issued so far are carried out. Everything the queue decides is here:

- staged runs are queued, unless a fixed cluster can never run them (left staged);
- a task's end maps to a run state: completed, failed (its command failed, timed
  out, could not start), cancelled, or lost (its worker crashed or vanished);
- a cancelled run that had started is *settled* only once its worker says its
  processes are gone (``Ended``), or once that worker leaves;
- a worker's report of a new start after an ended attempt means the scheduler
  retries it: the run is requeued, then marked running again;
- a run the scheduler stops to let another share in (``Preempted``) is requeued
  as preempted once its worker says it was stopped so (``Ended`` with reason
  ``"preempted"``): not a failure, so the attempt uses none of its retries. The
  worker's word decides, not ours: it also comes for a run adopted after a restart
  of the scheduler that asked for the stop (the worker keeps what the stop was),
  and a run that completed or failed by itself before the stop reached it says so
  and is settled as such;
- after a scheduler restart, runs the journal says were running wait until a
  deadline for their worker to come back and are *adopted*, not started again;
  those whose worker does not come back are requeued (within their retries),
  cancelled (if asked) or marked lost.

Time arrives inside events: ``now`` (monotonic) for deadlines, ``wall`` (epoch) for
the journal. Commands are either for the scheduler (``Schedule``, ``Adopt``,
``Release``, ``CancelTask``, ``StopStrays``), for the journal (``JournalCommand``),
or a line for the log (``Say``). The service carries them out in order.

A run's state moves only along ``RUN_MOVES`` (``run_states``), here and in the
journal: anything else raises ``IllegalTransition``, because a run completing twice
or restarting after cancellation is a bug upstream.
"""

from __future__ import annotations

from collections.abc import Mapping

from apportion.core.resource_names import did_you_mean, suggestions
from apportion.core.resources import describe_amount, describe_resources
from apportion.runs import run_events as e
from apportion.runs.run_states import (
    CANCELLED,
    COMPLETED,
    FAILED,
    LOST,
    QUEUED,
    RUNNING,
    STAGED,
)
from apportion.runs.views import RunView

#: Why a run awaiting adoption is given up on.
NOT_BACK = "its worker did not come back after the scheduler restarted"
#: Why a run was requeued as preempted when the scheduler that asked for the stop
#: has restarted since (its worker said the run was stopped so).
PREEMPTED_BEFORE_RESTART = "preempted (the stop was asked before the scheduler restarted)"


class RunLifecycle:
    """Every decision of the job queue about the runs it serves; no I/O, no clock."""

    def __init__(self, adopt_grace: float, fixed_supply: Mapping[str, int] | None = None) -> None:
        #: After a restart, how long a run that was running waits for its worker.
        self.adopt_grace = adopt_grace
        #: The supply of a fixed cluster (``--run-once``); None: workers may join.
        self.fixed_supply = fixed_supply
        #: Every run served: exactly those in ``active`` or in ``awaiting``; each
        #: queued or running.
        self.runs: dict[int, RunView] = {}
        #: Runs with a live task in the scheduler.
        self.active: set[int] = set()
        #: Runs that were running when the scheduler stopped: id -> adoption deadline.
        #: Never also active.
        self.awaiting: dict[int, float] = {}
        #: How each active run's latest attempt ended, until it settles or starts again.
        self.ended: dict[int, e.Ended] = {}
        #: Staged runs a fixed cluster can never run, reported once each and left
        #: staged: id -> "run LABEL: why" (``--run-once`` names them as it ends).
        self.ignored: dict[int, str] = {}
        #: Active runs whose task was asked to be cancelled.
        self.cancelling: set[int] = set()
        #: Cancelled active runs whose processes are still being stopped: id -> (worker
        #: name, failure); settled on their ``Ended`` or their worker's leaving.
        self.stopping: dict[int, tuple[str, tuple[str, str]]] = {}
        #: Running runs the scheduler is stopping to let another share in: id -> why;
        #: requeued as preempted on their ``Ended``.
        self.preempting: dict[int, str] = {}
        #: Runs settled in this session that did not complete (``--run-once`` exit).
        self.failures = 0

    def idle(self) -> bool:
        """Nothing queued, running or awaiting adoption."""
        return not self.runs

    def handle(self, event: e.Event) -> list[e.Command]:
        """Apply one event; the commands to carry out, in order."""
        out: list[e.Command] = []
        match event:
            case e.Resumed():
                self._resumed(event, out)
            case e.Submitted():
                self._schedule(event.runs, out)
            case e.Polled():
                self._polled(event, out)
            case e.TaskDone():
                self._task_done(event, out)
            case e.Started():
                self._started(event, out)
            case e.Ended():
                self._ended(event, out)
            case e.Preempted():
                self._preempted(event, out)
            case e.WorkerGone():
                self._worker_gone(event, out)
            case e.WorkerBack():
                self._worker_back(event, out)
            case e.Tick():
                self._tick(event, out)
        return out

    # --- into the scheduler ---------------------------------------------------------

    def _resumed(self, event: e.Resumed, out: list[e.Command]) -> None:
        if event.queued:
            out.append(e.Say("info", f"resuming {len(event.queued)} queued runs"))
        self._schedule(event.queued, out)
        for view in event.running:
            self.runs[view.id] = view
            self.awaiting[view.id] = event.now + self.adopt_grace
            text = (
                f"run {view.label} was running on {view.worker or '?'}; "
                f"waiting {self.adopt_grace:g}s for it to be adopted"
            )
            out.append(e.Say("info", text))

    def _schedule(self, views: tuple[RunView, ...], out: list[e.Command]) -> None:
        for view in views:
            self.runs[view.id] = view
            self.active.add(view.id)
            out.append(e.Schedule(view.id, view.retries_left()))
            needs = view.resources or "nothing"
            out.append(e.Say("info", f"scheduling run {view.label} (requires {needs})"))

    def _polled(self, event: e.Polled, out: list[e.Command]) -> None:
        runnable = []
        for view in event.staged:
            if view.id in self.ignored or view.id in self.runs:
                continue
            problem = never_fits(view.demand, self.fixed_supply)
            if problem:
                text = f"ignoring staged run {view.label} ({problem}); it stays staged"
                out.append(e.Say("warning", text))
                cluster = describe_resources(dict(self.fixed_supply or {})) or "no resources"
                why = f"the --run-once cluster ({cluster}) cannot run it: {problem}"
                self.ignored[view.id] = f"run {view.label}: {why}"
                out.append(e.SetWaiting(view.id, why))
            else:
                view.move(QUEUED, only_from=STAGED)
                runnable.append(view)
        if runnable:
            out.append(e.MarkQueued(tuple(v.id for v in runnable), event.wall))
            self._schedule(tuple(runnable), out)
        for run_id in event.cancels:
            self._cancel(run_id, out)

    def _cancel(self, run_id: int, out: list[e.Command]) -> None:
        view = self.runs.get(run_id)
        if view is None:
            return
        view.cancel_requested = True
        if run_id in self.active and run_id not in self.cancelling:
            self.cancelling.add(run_id)
            out.append(e.CancelTask(run_id))
        # A run awaiting adoption is stopped when its worker comes back, or ends
        # cancelled when the grace runs out (``_not_adopted``).

    # --- what the scheduler says of a run's task ------------------------------------

    def _task_done(self, event: e.TaskDone, out: list[e.Command]) -> None:
        run_id, failure = event.run_id, event.failure
        view = self.runs.get(run_id)
        if view is None or run_id not in self.active or run_id in self.stopping:
            return
        cancelled = failure is not None and failure[0] == "cancelled"
        ended = self.ended.get(run_id)
        if cancelled and ended is not None and ended.reason == "completed":
            failure = None  # the cancel came after the command had completed
            cancelled = False
        if cancelled and view.state == RUNNING and ended is None:
            # The scheduler failed the task at once; the run is cancelled only once
            # its processes are gone (Ended), as its resources are freed. Its task is
            # kept meanwhile: the worker's notes about it come to the task's clients.
            self.stopping[run_id] = (view.worker, failure or ("", ""))
            return
        self._finish(view, event.wall, failure, out)

    def _finish(self, view: RunView, wall: float, failure: e.Failure, out: list[e.Command]) -> None:
        run_id = view.id
        out.append(e.Release(run_id))
        del self.runs[run_id]
        self.active.discard(run_id)
        self.cancelling.discard(run_id)
        self.stopping.pop(run_id, None)
        self.preempting.pop(run_id, None)
        ended = self.ended.pop(run_id, None)
        state, reason = final_state(failure, ended)
        code = None if ended is None or ended.exit_code < 0 else ended.exit_code
        sig = None if ended is None or not ended.signal else ended.signal
        if view.state == QUEUED and state in (COMPLETED, LOST):
            # Its start report never came (an adopted run that ended meanwhile, say):
            # the journal only lets a run that started complete or be lost.
            view.move(RUNNING)
            out.append(e.MarkRunning(run_id, "", "", wall))
        view.move(state)
        out.append(e.MarkEnded(run_id, state, code, sig, reason, wall))
        if state == COMPLETED:
            out.append(e.Say("info", f"run {view.label} completed"))
        else:
            self.failures += 1
            out.append(e.Say("warning", f"run {view.label} {state}: {reason}"))

    # --- what workers say ---------------------------------------------------------------

    def _started(self, event: e.Started, out: list[e.Command]) -> None:
        view = self.runs.get(event.run_id)
        if view is None or view.id not in self.active:
            return
        previous = self.ended.pop(view.id, None)
        if view.state == RUNNING and previous is not None and previous.reason == "preempted":
            # Its preemption was heard only after it was adopted as still running.
            why = f"attempt {view.attempts} {PREEMPTED_BEFORE_RESTART} ({previous.detail})"
            self._requeue(view, why, event.wall, out, preempted=True)
        elif view.state == RUNNING and previous is not None:
            # The last attempt ended and the scheduler runs it again (its retries).
            why = f"attempt {view.attempts} ended: {previous.detail}; retrying"
            self._requeue(view, why, event.wall, out)
            out.append(e.Say("warning", f"run {view.label}: {why}"))
        view.held = event.held
        if view.state == QUEUED:
            out.append(e.NewAttempt(view.id, view.attempts))
            self._mark_running(view, event.worker, event.wall, out)
            holding = f", holding {event.held}" if event.held else ""
            text = f"run {view.label} started on {event.worker} (pid {event.pid}{holding})"
            out.append(e.Say("info", text))

    def _ended(self, event: e.Ended, out: list[e.Command]) -> None:
        if event.run_id in self.active:
            if _same_end(self.ended.get(event.run_id), event):
                return  # heard already (a worker's notes may come again on reconnection)
            self.ended[event.run_id] = event
        stopping = self.stopping.get(event.run_id)
        if stopping is not None:
            self._finish(self.runs[event.run_id], event.wall, stopping[1], out)
            return
        why = self.preempting.pop(event.run_id, None)
        view = self.runs.get(event.run_id)
        if (
            event.reason != "preempted"
            or view is None
            or event.run_id not in self.active
            or view.state != RUNNING
            or event.run_id in self.cancelling
        ):
            # Ended by itself before the stop reached it (completed or failed: settled
            # as such), or a cancel settles it.
            return
        # The scheduler queues its task again, retries untouched (``preemption.py``);
        # one restarted since it asked for the stop hears so from the worker too.
        why = why or PREEMPTED_BEFORE_RESTART
        del self.ended[event.run_id]
        attempt = view.attempts
        self._requeue(view, f"{why} ({event.detail})", event.wall, out, preempted=True)
        out.append(e.Say("info", f"run {view.label}: attempt {attempt} {why}; queued again"))

    def _preempted(self, event: e.Preempted, out: list[e.Command]) -> None:
        view = self.runs.get(event.run_id)
        if (
            view is None
            or view.state != RUNNING
            or view.id not in self.active
            or view.id in self.cancelling
        ):
            return  # ended or cancelled meanwhile: that settles it
        self.preempting[view.id] = event.reason
        text = f"stopping it on {event.worker}: {event.reason}"
        out.append(e.Note(view.id, text, event.wall))

    def _worker_gone(self, event: e.WorkerGone, out: list[e.Command]) -> None:
        """Its cancelled runs are settled, its running ones requeued.

        The scheduler runs the lost worker's tasks again (or fails them as poison,
        which ``TaskDone`` then records as lost); the journal says so meanwhile.
        """
        name = event.name
        for run_id, (worker, failure) in list(self.stopping.items()):
            if worker == name:
                why = (failure[0], f"{failure[1]}; its worker left")
                self._finish(self.runs[run_id], event.wall, why, out)
        for run_id in sorted(self.active):
            view = self.runs[run_id]
            if view.state == RUNNING and view.worker == name:
                self.ended.pop(run_id, None)
                self.preempting.pop(run_id, None)
                self._requeue(view, f"its worker {name} left", event.wall, out)
                text = f"run {view.label} interrupted: its worker {name} left"
                out.append(e.Say("warning", text))

    # --- adoption after a restart -------------------------------------------------------

    def _worker_back(self, event: e.WorkerBack, out: list[e.Command]) -> None:
        """Adopt the runs this worker still runs that we wait for; stop the others."""
        stray: list[int] = []
        for run_id in event.live_runs:
            view = self.runs.get(run_id)
            task_state = event.task_states.get(run_id)
            if view is not None and run_id in self.active and task_state is not None:
                if task_state == "queued":
                    # Requeued when this worker was declared lost, not started again
                    # anywhere yet: its command still runs here, so keep it there.
                    self._adopt(event, view, out)
                else:
                    stray.append(run_id)  # it runs elsewhere now: stop this copy
                continue
            if run_id not in self.awaiting or view is None:
                stray.append(run_id)  # finished, cancelled, or not this journal's
                continue
            del self.awaiting[run_id]
            self._adopt(event, view, out)
        if stray:
            out.append(e.StopStrays(event.worker_id, tuple(stray)))

    def _adopt(self, event: e.WorkerBack, view: RunView, out: list[e.Command]) -> None:
        """Record the run as running on the worker whose command still runs it."""
        # Its latest attempt still runs: that one is not counted against its retries.
        left = max(0, view.retries - (view.attempts - view.preemptions) + 1)
        self.active.add(view.id)
        if view.state == QUEUED:  # requeued when its worker was declared lost
            self._mark_running(view, event.name, event.wall, out)
        out.append(e.Note(view.id, f"adopted: still running on {event.name}", event.wall))
        out.append(e.Say("info", f"run {view.label} adopted: still running on {event.name}"))
        out.append(e.Adopt(event.worker_id, view.id, left, view.held))

    def _tick(self, event: e.Tick, out: list[e.Command]) -> None:
        for run_id, deadline in list(self.awaiting.items()):
            if event.now >= deadline:
                del self.awaiting[run_id]
                self._not_adopted(self.runs[run_id], event.wall, out)

    def _not_adopted(self, view: RunView, wall: float, out: list[e.Command]) -> None:
        if view.cancel_requested:
            del self.runs[view.id]
            view.move(CANCELLED)
            out.append(e.MarkEnded(view.id, CANCELLED, None, None, f"cancelled; {NOT_BACK}", wall))
        elif view.attempts - view.preemptions > view.retries:
            # Preempted attempts are not failures: they use no retry here either.
            del self.runs[view.id]
            self.failures += 1
            view.move(LOST)
            out.append(e.MarkEnded(view.id, LOST, None, None, NOT_BACK, wall))
            out.append(e.Say("warning", f"run {view.label} lost: {NOT_BACK}"))
        else:
            self._requeue(view, NOT_BACK, wall, out)
            text = f"run {view.label} interrupted ({NOT_BACK}); queued again"
            out.append(e.Say("warning", text))
            self._schedule((view,), out)

    # --- moves, as the journal will have them -------------------------------------------

    def _mark_running(self, view: RunView, worker: str, wall: float, out: list[e.Command]) -> None:
        view.move(RUNNING)
        view.attempts += 1
        view.worker = worker
        out.append(e.MarkRunning(view.id, worker, view.held, wall))

    def _requeue(
        self, view: RunView, why: str, wall: float, out: list[e.Command], preempted: bool = False
    ) -> None:
        # ``held`` stays: a run adopted after its worker was declared lost holds
        # what its command held, though the journal forgets it meanwhile.
        view.move(QUEUED, only_from=RUNNING)
        view.worker = ""
        self.preempting.pop(view.id, None)
        if preempted:
            view.preemptions += 1
        out.append(e.Requeue(view.id, why, wall, preempted))


def _same_end(known: e.Ended | None, event: e.Ended) -> bool:
    """Whether ``event`` repeats the end already heard of the run's latest attempt."""
    return known is not None and (
        known.exit_code,
        known.signal,
        known.reason,
        known.detail,
    ) == (event.exit_code, event.signal, event.reason, event.detail)


def final_state(failure: e.Failure, ended: e.Ended | None) -> tuple[str, str]:
    """How a run's task ending maps to a run state, and the reason to record."""
    detail = ended.detail if ended is not None else ""
    if failure is None:
        return COMPLETED, ""
    if failure[0] == "cancelled":
        return CANCELLED, detail or "cancelled before it started"
    if failure[0] in ("crashed", "lost"):
        return LOST, failure[1]
    if ended is not None and ended.reason in ("timed out", "could not start"):
        return FAILED, f"{ended.reason}: {detail}"  # tables show "timed out" from this
    return FAILED, detail or failure[1]


def never_fits(demand: Mapping[str, int], supply: Mapping[str, int] | None) -> str:
    """Why a fixed cluster with ``supply`` can never run a demand; "" if it can (or if
    the cluster is not fixed)."""
    if supply is None:
        return ""
    undefined = sorted(name for name in demand if name not in supply)
    if undefined:
        slips = did_you_mean(suggestions(undefined, supply))
        text = "requires resources not defined for the cluster: " + ", ".join(undefined)
        return f"{text} ({slips})" if slips else text
    short = [f"{n}={describe_amount(n, t)}" for n, t in sorted(demand.items()) if t > supply[n]]
    if short:
        return "requires more than the cluster has: " + " ".join(short)
    return ""


def check_invariants(life: RunLifecycle) -> None:
    """Raise ``AssertionError`` naming the first broken invariant (for tests)."""
    assert set(life.runs) == life.active | set(life.awaiting), "runs vs active + awaiting"
    assert not life.active & set(life.awaiting), "a run both active and awaiting adoption"
    for run_id, view in life.runs.items():
        assert view.id == run_id, f"run {run_id} filed as {view.id}"
        assert view.state in (QUEUED, RUNNING), f"run {run_id} served while {view.state}"
        assert view.state != RUNNING or view.attempts >= 1, f"run {run_id} running, never started"
    for run_id in life.awaiting:
        assert life.runs[run_id].state == RUNNING, f"run {run_id} awaits adoption, not running"
    for name, ids in (("ended", life.ended), ("cancelling", life.cancelling)):
        assert set(ids) <= life.active, f"{name} holds runs without a task"
    assert set(life.stopping) <= life.active, "stopping a run without a task"
    for run_id in life.preempting:
        assert run_id in life.active, f"preempting run {run_id} without a task"
        assert life.runs[run_id].state == RUNNING, f"preempting run {run_id}, not running"
    assert not life.runs.keys() & life.ignored.keys(), "an ignored staged run is served"
