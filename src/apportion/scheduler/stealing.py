"""Work stealing: a task waiting in a busy worker's queue moves to an idle worker.

A worker is given a little more than it can start at once (short plain tasks queued
ahead, to hide the round trip; tasks whose inputs it is fetching), and a task given
to it starts only when one of its threads frees. When a thread idles elsewhere
meanwhile, with nothing queued in the scheduler for it, a task still waiting on the
busy worker would start sooner on the idle one. The pass below asks the busy worker
to let it go (``SendStealRequest``).

The move is safe because the busy worker decides. It lets a task go only if it has
not started it, and answers with those it let go and those that had started
(``StealResponse``). Until it answers, the task stays PROCESSING there, holding
whatever it holds. A task let go gives its resources back on that worker and only
then takes them on the idle one, or waits in the queue if that one can no longer
take it: held in one place at a time, never in two. Messages between the scheduler
and a worker arrive in order, so an answer concerns the assignment that was current
when the request left: a task that finished, failed or was dropped before the
request arrived was reported before the answer, and its move ended with the report.
A move ends, too, when either worker is lost.

Which tasks wait? The scheduler does not hear when a task starts (a message per
task would cost tiny tasks their throughput). It assumes a worker runs the tasks it
knows started (seceded, adopted, or named in a refusal), then the ones given to it
first, on its ``nthreads`` threads; the others wait, in the order the worker starts
them (resource tasks first, then priority, then the scheduler's order). A wrong guess costs one
refusal, and the refusal says which had started, so it is not asked again. A task
presumed running started when it was given out, or when the worker last reported a
task ended, whichever came later (it may have waited in the queue till then).

Is a move worth it? A waiting task starts when a thread frees for it. A running
task is expected to end at its group's expected duration after it started;
one that has run past that is expected to run as long again as it has run (a task
blocked on the cluster, or an unusually long one of a short group: the expectation
is no guide any more). Waiting tasks ahead of it run at their group's pace. The
task moves when that wait is longer than the move costs: ``steal_latency`` plus
moving the inputs the idle worker lacks, at ``transfer_bandwidth``.

Never moved: actors, tasks known to have started, tasks being freed, tasks whose
restriction (``workers=``) or demand the idle worker does not meet now, and retried
tasks to a worker they raised on more often than on their own (``retry_cause``).

Cost: one pass after each placement pass and at each tick. It stops at once unless
some worker has an idle thread and some other has more tasks than threads; then it
costs O(tasks given to those workers).
"""

from __future__ import annotations

from heapq import heappop, heappush

from apportion.protocol.worker import StealResponse
from apportion.scheduler.events import SendStealRequest
from apportion.scheduler.holders import holders, holds
from apportion.scheduler.placement import closed_to_plain, fits_now, resource_work_waiting
from apportion.scheduler.records import (
    PROCESSING,
    QUEUED,
    TaskRecord,
    WorkerRecord,
)
from apportion.scheduler.state import SchedulerState
from apportion.scheduler.worker_reports import running_task, settle_discarded


def balance(state: SchedulerState) -> None:
    """Ask busy workers to let waiting tasks go to idle threads, where they start sooner."""
    if len(state.workers) < 2:
        return
    free = _idle_threads(state)
    if not free:
        return
    busy = _busy(state)
    if not busy:
        return
    waiting = resource_work_waiting(state)
    order = {worker_id: i for i, worker_id in enumerate(free)}  # ties: the first
    requests: dict[str, list[str]] = {}
    for victim in busy:
        for task, wait in reversed(_waits(state, victim)):
            if task.key in state.steals:
                continue
            thief, cost = _cheapest(state, task, victim, free, order, waiting)
            if thief is None or wait <= cost:
                continue
            requests.setdefault(victim.id, []).append(task.key)
            _ask(
                state,
                task,
                victim,
                thief,
                f"it would wait {wait:.3g}s there, moving costs {cost:.3g}s",
            )
            free[thief.id] -= 1
            if not free[thief.id]:
                del free[thief.id]
                if not free:
                    break
        if not free:
            break
    for victim_id, keys in requests.items():
        state.emit(SendStealRequest(victim_id, keys))


def _ask(
    state: SchedulerState, task: TaskRecord, victim: WorkerRecord, thief: WorkerRecord, why: str
) -> None:
    """Record that ``victim`` is asked to let ``task`` go to ``thief``."""
    state.steals[task.key] = (victim.id, thief.id)
    thief.incoming += 1
    cause = f"asked {victim.name} to let it go to idle {thief.name}: {why}"
    state.log.append((state.now, task.key, PROCESSING, PROCESSING, cause))


def steal_answered(state: SchedulerState, worker: WorkerRecord, msg: StealResponse) -> None:
    """``worker`` let go of the tasks that had not started, and kept the others."""
    for key in msg.started:
        if state.steals.get(key, ("",))[0] == worker.id:
            state.end_steal(key)
        task = state.tasks.get(key)
        if task is not None and task.state == PROCESSING and task.worker == worker.id:
            worker.started.add(key)
            state.log.append(
                (state.now, key, PROCESSING, PROCESSING, f"had started on {worker.name}; stays")
            )
    for key in msg.released:
        steal = state.steals.get(key)
        thief_id = steal[1] if steal is not None and steal[0] == worker.id else ""
        task = running_task(state, worker, key)  # gives back what it held there
        if task is None:
            continue
        state.placement_due = True
        if task.discard_result:
            settle_discarded(state, task, f"let go by {worker.name} before it started")
            continue
        state.requeue(task, f"let go by {worker.name} before it started there")
        thief = state.workers.get(thief_id)
        waiting = resource_work_waiting(state)
        if task.state == QUEUED and thief is not None and _may_take(state, thief, task, waiting):
            cause = f"moved from {worker.name}, where it waited, to idle {thief.name}"
            state.assign(task, thief, cause=cause)


def _idle_threads(state: SchedulerState) -> dict[str, int]:
    """Worker id -> its threads that nothing runs on and nothing is on its way to."""
    free: dict[str, int] = {}
    for w in state.workers.values():  # inlined, no call per worker: this runs every pass
        if w.leaving is None and not w.paused:
            idle = w.nthreads - (len(w.processing) - len(w.seceded)) - w.incoming
            if idle > 0:
                free[w.id] = idle
    return free


def _busy(state: SchedulerState) -> list[WorkerRecord]:
    """Workers with tasks beyond their threads (not counting those being moved away),
    and workers paused for their memory with tasks: some of their tasks wait."""
    leaving: dict[str, int] = {}
    for victim, _ in state.steals.values():
        leaving[victim] = leaving.get(victim, 0) + 1
    return [
        w
        for w in state.workers.values()
        if w.running() - leaving.get(w.id, 0) > w.nthreads or (w.paused and w.processing)
    ]


def _waits(state: SchedulerState, worker: WorkerRecord) -> list[tuple[TaskRecord, float]]:
    """The tasks presumably waiting on ``worker``, each with the seconds until it would
    start there, in the order the worker would start them (see the module)."""
    now = state.now
    counted = [k for k in worker.processing if k not in worker.seceded]
    started = [k for k in counted if k in worker.started]
    others = [k for k in counted if k not in worker.started]
    threads = 0 if worker.paused else worker.nthreads
    presumed = others[: max(0, threads - len(started))]
    ends: list[float] = []
    for key in started + presumed:
        given, expected = worker.processing[key]
        if key not in worker.started:
            # It may have waited in the queue, so it started no earlier than the
            # last task there ended: never judged overdue for its wait alone.
            given = max(given, worker.thread_freed)
        ran = now - given
        heappush(ends, expected - ran if ran < expected else ran)
    while len(ends) < threads:
        heappush(ends, 0.0)
    queued = [state.tasks[k] for k in others[len(presumed) :]]
    queued.sort(key=lambda t: (not t.resources, -t.priority, t.seq))  # as the worker does
    if not threads:
        return [(task, _FOREVER) for task in queued]  # paused: nothing starts there now
    waits = []
    for task in queued:
        start = heappop(ends)
        heappush(ends, start + state.expected(task))
        if not task.actor and not task.discard_result:
            waits.append((task, start))
    return waits


#: How long a task waits on a worker paused for its memory: until it resumes.
_FOREVER = float("inf")


def _cheapest(
    state: SchedulerState,
    task: TaskRecord,
    victim: WorkerRecord,
    free: dict[str, int],
    order: dict[str, int],
    waiting: bool,
) -> tuple[WorkerRecord | None, float]:
    """The idle worker that could start ``task`` soonest, and what moving it costs;
    of equal costs, the first in ``order``.

    Moving costs the same to every idle worker holding none of its inputs, so of
    those only the first that may take it is looked at, with the idle ones holding
    some input: not every idle worker of a large cluster."""
    raised = state.raised_on.get(task.key) if state.raised_on else None

    def may_take(thief: WorkerRecord) -> bool:
        if thief is victim or not _may_take(state, thief, task, waiting):
            return False
        # A retried task waits away from where it raised (placement's rule).
        return not (raised and raised.count(thief.id) > raised.count(victim.id))

    holding = {h for dep in task.deps for h in holders(state.tasks[dep]) if h in free}
    workers = state.workers
    candidates = [workers[w] for w in holding if may_take(workers[w])]
    other = next((workers[w] for w in free if w not in holding and may_take(workers[w])), None)
    if other is not None:
        candidates.append(other)
    if not candidates:
        return None, 0.0
    # ``order`` is unique per worker: ties of cost go to the first, never further.
    cost, _, best = min(
        (_move_cost(state, task, thief), order[thief.id], thief) for thief in candidates
    )
    return best, cost


def _may_take(state: SchedulerState, thief: WorkerRecord, task: TaskRecord, waiting: bool) -> bool:
    """Whether ``thief`` may start ``task`` now, as placement would allow it."""
    if thief.leaving is not None:
        return False  # it said it is closing: it gets nothing new
    restriction = task.restriction
    if restriction is not None and not restriction.allows(thief):
        return False
    if task.resources:
        return fits_now(state, thief, task, task.resources)
    if closed_to_plain(state, thief, waiting):
        return False
    return thief.running() + thief.incoming < thief.nthreads


def _move_cost(state: SchedulerState, task: TaskRecord, thief: WorkerRecord) -> float:
    """Seconds moving ``task`` to ``thief`` costs: the round trips, and its inputs
    ``thief`` does not hold."""
    missing = 0
    for dep in task.deps:
        record = state.tasks[dep]
        if not holds(record, thief.id):
            missing += record.nbytes
    return state.config.steal_latency + missing / state.config.transfer_bandwidth
