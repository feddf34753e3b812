"""Results too large for their workers' memory: the verdicts that fail them.

A result can show two ways that it is too large, and both end the same: the task
fails with kind ``"memory"`` (``OutOfMemoryError`` on the client, a
``MemoryError``), saying out of memory, the result's size and the workers' limit,
instead of killing worker after worker and ending as lost data.

- The worker that computed it says so (``ResultTooLarge``): the value alone was
  above what the worker keeps (``MemoryLimits.largest_result``), and was dropped.
  Retries do not apply: running it again makes a result of the same size.
- Its holders die out of memory while serving it, ``max_worker_deaths`` times.
  Sending a result takes a few copies of it (pickled, framed, buffered), so one
  that fitted in a worker may not fit while it travels; each such death loses the
  result, which is computed again, served again, and kills the next holder.

*Serving* is the simplest rule the scheduler can state from what it knows when the
holder dies: (1) a dependent runs on another worker, which fetches its inputs from
the holders (whether that fetch is over is the worker's business); (2) a gather
relayed through the scheduler waits for this holder's answer for it, or is being
forwarded from the holder to the client (``Gather.piping``); (3) a client
was told to fetch it from its holders itself (``GatherReply.elsewhere``) since it
was computed. The end of such a direct fetch is never reported, so mark (3) lasts
until the result leaves memory: a stale mark can count one unrelated death, but
reaching the limit takes ``max_worker_deaths`` of them, each after the result was
computed again and asked for again. Only the death of the *only* holder counts: a
result that has a copy left is not lost, so there is no loop to break.

Only deaths out of memory count: the supervisor's report says so
(``WorkerDied.out_of_memory``), or the worker's last heartbeat was at
``NEAR_LIMIT`` of its limit or more, as for running tasks (``membership``). A
supervised worker's report usually comes after its connection closed: the result
is computed again at once, and its deaths wait up to ``death_report_wait`` for the
word (``unclassified``); one counted late fails the task wherever it is by then.
Any other death - a healthy worker killed, a lost connection - costs only the
recomputation, as it always did.
"""

from __future__ import annotations

from apportion.core.sizes import format_bytes
from apportion.protocol.worker import ResultTooLarge, WorkerDied
from apportion.scheduler import worker_reports
from apportion.scheduler.holders import holders
from apportion.scheduler.records import (
    MEMORY,
    PROCESSING,
    QUEUED,
    WAITING,
    ServingDeath,
    WorkerRecord,
)
from apportion.scheduler.state import SchedulerState

#: A worker lost with its last reported memory at this share of its limit or more
#: most likely died of it (the supervisor's ``NEAR_LIMIT`` too).
NEAR_LIMIT = 0.9

#: What to do about a result too large for its workers, in every such error.
ADVICE = (
    "Run it on workers with more memory (apportion worker --memory-limit, "
    "LocalCluster(memory_limit=...)), or split the result into smaller pieces."
)


def near_limit(worker: WorkerRecord) -> str:
    """``"its memory at 96% of its limit"`` if its last heartbeat says it was near; else ""."""
    if worker.memory_limit and worker.memory >= NEAR_LIMIT * worker.memory_limit:
        return f"its memory at {worker.memory / worker.memory_limit:.0%} of its limit"
    return ""


# --- the worker's verdict ----------------------------------------------------------


def result_too_large(state: SchedulerState, worker: WorkerRecord, msg: ResultTooLarge) -> None:
    """The worker dropped the result as too large to keep: the task fails."""
    task = worker_reports.running_task(state, worker, msg.key)
    if task is None:
        return
    state.placement_due = True
    if task.discard_result:
        worker_reports.settle_discarded(state, task, f"too large on {worker.name}, discarded")
        return
    kills = (
        f", and it is killed above {format_bytes(msg.largest)}" if msg.largest < msg.limit else ""
    )
    text = (
        f"out of memory: the result of {msg.key!r} ({msg.type_name} of "
        f"{format_bytes(msg.nbytes)}) is too large for worker {worker.name}: its memory "
        f"limit is {format_bytes(msg.limit)}{kills}. The result was dropped. {ADVICE}"
    )
    state.fail(task, ("memory", text, b""), f"result too large for {worker.name}")


# --- deaths while serving ------------------------------------------------------------


def served_by(state: SchedulerState, worker: WorkerRecord) -> list[str]:
    """The results only ``worker`` holds that it was serving (see the module docstring).

    Called as the worker is lost, before its results are: afterwards nothing says
    where they were.
    """
    if not worker.memory_limit:
        return []  # nothing says a worker without a limit died of its memory
    relayed = {
        key
        for gather_ in state.relays.gathers.values()
        for keys in (gather_.pending.get(worker.id, ()), gather_.piping.get(worker.id, ()))
        for key in keys
    }
    served = []
    for key in sorted(worker.has_what):
        task = state.tasks[key]
        if holders(task) != [worker.id]:
            continue
        fetched = any(
            state.tasks[d].state == PROCESSING and state.tasks[d].worker not in (None, worker.id)
            for d in task.dependents or ()
        )
        if fetched or key in relayed or key in state.served_directly:
            served.append(key)
    return served


def worker_died(state: SchedulerState, worker: WorkerRecord, served: list[str]) -> None:
    """``worker`` crashed while serving ``served`` (``served_by``), which are lost now:
    count the death against them if it was out of memory, or wait for the word."""
    # Only those being computed again count: a result nobody needs any more, or one
    # failed with the task that was running there, is no loop.
    recomputed = [state.tasks[k] for k in served if k in state.tasks]
    deaths = [
        ServingDeath(task.key, task.nbytes, worker.name, worker.pid, worker.memory_limit, "")
        for task in recomputed
        if task.state in (WAITING, QUEUED)
    ]
    if not deaths:
        return
    report = state.death_causes.get((worker.name, worker.pid))
    near = near_limit(worker)
    if report is not None:
        if report.out_of_memory:
            _count(state, deaths, report.description)
    elif near:
        _count(state, deaths, f"{near} - likely out of memory")
    elif worker.supervisor:
        deadline = state.now + state.config.death_report_wait
        state.unclassified[(worker.name, worker.pid)] = (deadline, deaths)


def death_reported(state: SchedulerState, report: WorkerDied) -> None:
    """The supervisor said how a worker died: count it if memory killed it."""
    _, deaths = state.unclassified.pop((report.name, report.pid), (0.0, []))
    if deaths and report.out_of_memory:
        _count(state, deaths, report.description)


def expire(state: SchedulerState) -> None:
    """Deaths whose report did not come in time are not counted: nothing says memory."""
    for died, (deadline, _) in list(state.unclassified.items()):
        if state.now >= deadline:
            del state.unclassified[died]


def _count(state: SchedulerState, deaths: list[ServingDeath], how: str) -> None:
    for death in deaths:
        task = state.tasks.get(death.key)
        if task is None:
            continue  # forgotten meanwhile: nobody needs a verdict
        seen = state.serving_deaths.setdefault(death.key, [])
        seen.append(death._replace(how=how))
        # Not while RELEASED (nobody needs it now) or ERRED: a later death decides.
        if len(seen) >= state.config.max_worker_deaths and task.state in (
            WAITING,
            QUEUED,
            PROCESSING,
            MEMORY,
        ):
            if task.state == MEMORY:
                state.drop_result(task)  # computed again before the word came
            error = ("memory", _serving_text(state.serving_deaths.pop(death.key)), b"")
            state.fail(task, error, "its holders died out of memory while serving it")


def _serving_text(deaths: list[ServingDeath]) -> str:
    last = deaths[-1]
    limits = sorted({d.limit for d in deaths})
    limit = " or ".join(format_bytes(x) for x in limits)
    each = "; ".join(f"{d.worker} (pid {d.pid}: {d.how})" for d in deaths)
    return (
        f"out of memory: the result of {last.key!r} ({format_bytes(last.nbytes)}) is too "
        f"large to send from a worker with a {limit} memory limit: the {len(deaths)} "
        f"workers holding it died out of memory while serving it: {each}. {ADVICE}"
    )
