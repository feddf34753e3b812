"""Workers and clients joining and leaving, death verdicts and the passing of time.

Handlers of the membership events (``state.py`` dispatches them here). A worker
that is lost costs recomputation, not results: its running tasks run again, the
results only it held are recomputed (``SchedulerState.lose_result``), and a task
that was running on ``max_worker_deaths`` workers that died is failed as the
likely cause, once its last worker's supervisor says how it died (or after
``death_report_wait``). A result whose holders die out of memory while serving it
is counted the same way (``out_of_memory``).
"""

from __future__ import annotations

import math

from apportion.core.ledger import matching_units
from apportion.core.resources import describe_resources
from apportion.protocol.worker import RegisterWorker
from apportion.scheduler import (
    client_requests,
    coordination,
    drain,
    out_of_memory,
    relay,
    remote_calls,
    task_hooks,
    worker_reports,
)
from apportion.scheduler.events import (
    ClientJoined,
    ClientLeft,
    Disconnect,
    Log,
    SendHeartbeatInterval,
    SendRefused,
    Tick,
    WorkerDeathReport,
    WorkerJoined,
    WorkerLeft,
)
from apportion.scheduler.holders import drop_holder
from apportion.scheduler.records import MEMORY, QUEUED, ClientRecord, TaskRecord, WorkerRecord
from apportion.scheduler.state import MAX_DEATH_CAUSES, SchedulerState


def client_joined(state: SchedulerState, event: ClientJoined) -> None:
    state.clients[event.client_id] = ClientRecord(
        event.client_id, event.durable, event.person, event.name
    )


def client_left(state: SchedulerState, event: ClientLeft) -> None:
    client = state.clients.pop(event.client_id, None)
    if client is not None and not client.durable:  # a durable client's work stays
        client_requests.release(state, client, list(client.wanted))
    state.relays.drop_client(event.client_id)
    state.remote.drop_client(event.client_id)
    coordination.client_left(state, event.client_id)


def worker_joined(state: SchedulerState, event: WorkerJoined) -> None:
    reg = event.registration
    if not _claim_name(state, event.worker_id, reg):
        return
    units = matching_units(reg.resources, reg.units)
    if len(units) != len(reg.units):
        state.warn(f"worker {reg.name}: unit lists that do not match its pools were ignored")
    state.workers[event.worker_id] = WorkerRecord(
        event.worker_id,
        reg.name or event.worker_id,
        reg.address,
        max(1, reg.nthreads),
        reg.resources,
        reg.pid,
        reg.memory_limit,
        units,
    )
    state.workers[event.worker_id].last_seen = event.now
    state.workers[event.worker_id].supervisor = reg.supervisor
    state.emit(
        Log(
            "info",
            f"worker {reg.name} joined at {reg.address}: {reg.nthreads} threads, "
            f"resources {describe_resources(reg.resources, units) or '(none)'}",
        )
    )
    _supply_changed(state)
    _pace_heartbeats(state, event.worker_id)
    relay.worker_joined(state)
    remote_calls.worker_joined(state, event.worker_id)
    task_hooks.worker_joined(state, event.worker_id, reg)


def heartbeat_floor(state: SchedulerState) -> float:
    """Seconds each worker should leave at least between heartbeats now: none up to
    ``heartbeats_per_second`` workers, then whole seconds, so that it changes only
    every that many workers; at most a fifth of ``worker_timeout``, so that a
    worker's silence still means something."""
    per_second = max(1, state.config.heartbeats_per_second)
    if len(state.workers) <= per_second:
        return 0.0
    return min(float(math.ceil(len(state.workers) / per_second)), state.config.worker_timeout / 5)


def _pace_heartbeats(state: SchedulerState, joined: str | None = None) -> None:
    """Tell every worker the floor when it changed, else the worker that ``joined``
    (unless there is none)."""
    floor = heartbeat_floor(state)
    if floor != state.heartbeat_floor:
        state.heartbeat_floor = floor
        for worker_id in state.workers:
            state.emit(SendHeartbeatInterval(worker_id, floor))
    elif joined is not None and floor:
        state.emit(SendHeartbeatInterval(joined, floor))


def _claim_name(state: SchedulerState, worker_id: str, reg: RegisterWorker) -> bool:
    """Whether ``reg`` may take its name: refuse a second worker under a live one's name.

    Names are how people and the job queue tell workers apart, so two live workers
    never share one (Dask refuses the second too). A registration from the same
    worker (same data address: it reconnected before its old connection's end was
    seen) or from its supervisor's replacement (same supervisor on the same host:
    the old process is dead) takes the name over; the stale record is dropped as
    lost, so its tasks run again.
    """
    holder = next((w for w in state.workers.values() if reg.name and w.name == reg.name), None)
    if holder is None:
        return True
    same_host = _host(holder.address) == _host(reg.address)
    if holder.address == reg.address or (
        reg.supervisor and holder.supervisor == reg.supervisor and same_host
    ):
        remove_worker(state, holder.id, f"replaced by a new registration as {reg.name}")
        state.emit(Disconnect(holder.id, "replaced by a new registration"))
        return True
    reason = (
        f"a worker named {reg.name!r} is already connected from {holder.address}; "
        "give each worker its own --name"
    )
    state.warn(f"refused the worker at {reg.address}: {reason}")
    state.emit(SendRefused(worker_id, reason))
    return False


def worker_left(state: SchedulerState, event: WorkerLeft) -> None:
    remove_worker(state, event.worker_id, "its connection closed")


def tick(state: SchedulerState, event: Tick) -> None:
    """Declare lost the workers silent for longer than the timeout; answer what waited
    for a lock, a value or an event past its deadline, end leases not refreshed."""
    _settle_verdicts(state)
    coordination.tick(state)
    limit = state.config.worker_timeout
    for worker in [w for w in state.workers.values() if event.now - w.last_seen > limit]:
        silent = f"silent for {event.now - worker.last_seen:.0f}s (stopped, frozen or cut off)"
        remove_worker(state, worker.id, silent)
        state.emit(Disconnect(worker.id, silent))


def remove_worker(state: SchedulerState, worker_id: str, how: str) -> None:
    """The worker is gone: its running tasks run again, its results are recomputed."""
    worker = state.workers.pop(worker_id, None)
    if worker is None:
        return
    state.telemetry.worker_left(worker)
    crashed = worker.leaving is None
    served = out_of_memory.served_by(state, worker) if crashed else []
    if crashed:
        state.warn(f"lost worker {worker.name} ({worker.address}): {how}")
    else:
        state.emit(Log("info", f"worker {worker.name} closed ({worker.leaving})"))
    if worker.reserved_by is not None:
        reserved = state.tasks.get(worker.reserved_by)
        if reserved is not None:
            state.drop_reservation(reserved)
    for key in sorted(worker.processing, key=lambda k: state.tasks[k].seq):
        state.end_steal(key)
        task = state.tasks[key]
        task.worker = None
        task.allocation = None  # it held that worker's resources, gone with its ledger
        if task.discard_result:
            worker_reports.settle_discarded(state, task, f"worker {worker.name} lost")
        elif crashed and _too_many_deaths(state, task, worker, how):
            if worker.supervisor and (worker.name, worker.pid) not in state.death_causes:
                # Its supervisor is about to say how it died: wait for that.
                state.move(task, QUEUED, f"worker {worker.name} lost: {how}; held for a verdict")
                state.verdicts[task.key] = state.now + state.config.death_report_wait
                # A new number makes its old heap entry stale: placement skips it.
                task.seq = state.next_seq()
            else:
                _fail_poisoned(state, task)
        else:
            state.requeue(task, f"worker {worker.name} lost while running it: {how}")
    _lose_results_on(state, worker)
    out_of_memory.worker_died(state, worker, served)
    relay.worker_left(state, worker.id)
    remote_calls.worker_left(state, worker.id, how)
    task_hooks.worker_left(state, worker)
    _pace_heartbeats(state)
    for other in state.workers.values():
        drain.check(state, other)  # a draining worker may wait for nobody now
    _supply_changed(state)


def _lose_results_on(state: SchedulerState, worker: WorkerRecord) -> None:
    """The results ``worker`` held are gone; a copy elsewhere keeps a result."""
    for key in list(worker.has_what):
        held = state.tasks.get(key)
        if held is not None and held.state == MEMORY and not drop_holder(held, worker):
            state.lose_result(held, f"its result was on worker {worker.name}, which left")


def _too_many_deaths(
    state: SchedulerState, task: TaskRecord, worker: WorkerRecord, how: str
) -> bool:
    """Count a worker death during ``task``; True once it reaches the limit."""
    near = out_of_memory.near_limit(worker)
    if near:
        how += f", {near} - likely out of memory"
    seen = state.deaths.setdefault(task.key, [])
    seen.append((worker.name, worker.pid, how, bool(near)))
    return len(seen) >= state.config.max_worker_deaths


def _fail_poisoned(state: SchedulerState, task: TaskRecord) -> None:
    seen = state.deaths.pop(task.key)
    deaths = "; ".join(f"{name} ({_cause(state, name, pid, how)})" for name, pid, how, _ in seen)
    text = (
        f"{task.key!r} was running on {state.config.max_worker_deaths} workers that "
        f"died, so it is likely the cause: {deaths}"
    )
    if all(_of_memory(state, name, pid, near) for name, pid, _, near in seen):
        # Still a crash (Dask's KilledWorker), but the user needs to hear what to do.
        text += f". Each of them ran out of memory. {out_of_memory.ADVICE}"
    state.warn(text)
    state.fail(task, ("crashed", text, b""), "too many worker deaths")


def _of_memory(state: SchedulerState, name: str, pid: int, near: bool) -> bool:
    """Whether that worker died of its memory: its supervisor's word, else its readings."""
    report = state.death_causes.get((name, pid))
    return bool(report.out_of_memory) if report is not None else near


def _cause(state: SchedulerState, name: str, pid: int, how: str) -> str:
    """How a worker died: its supervisor's word if it came, else what was seen."""
    report = state.death_causes.get((name, pid))
    return report.description if report is not None else how


def death_report(state: SchedulerState, event: WorkerDeathReport) -> None:
    report = event.report
    state.death_causes[(report.name, report.pid)] = report
    while len(state.death_causes) > MAX_DEATH_CAUSES:
        del state.death_causes[next(iter(state.death_causes))]
    state.warn(f"worker {report.name} (pid {report.pid}) {report.description}")
    _settle_verdicts(state)
    out_of_memory.death_reported(state, report)


def _settle_verdicts(state: SchedulerState) -> None:
    """Fail the held poison tasks whose last death is explained, or waited enough;
    forget serving deaths whose report did not come in time."""
    out_of_memory.expire(state)
    for key, deadline in list(state.verdicts.items()):
        name, pid, _, _ = state.deaths[key][-1]
        if state.now >= deadline or (name, pid) in state.death_causes:
            del state.verdicts[key]
            _fail_poisoned(state, state.tasks[key])


def _host(address: str) -> str:
    """The host part of ``tcp://host:port`` (the whole text if it has no port)."""
    return address.rpartition(":")[0] or address


def _supply_changed(state: SchedulerState) -> None:
    """A worker came or went: what can run where, and what nobody can run, is new."""
    state.satisfiable_cache.clear()
    state.misnamed_cache.clear()
    state.warned.clear()
    state.notified.clear()
    state.placement_due = True
