"""Consistency checks over the whole scheduler state, for tests and debugging.

Called after every test that builds a ``SchedulerState`` and after every step of
the Hypothesis stateful tests. O(everything): never on a hot path.
"""

from __future__ import annotations

from collections import Counter

from apportion.core.resources import SCALE
from apportion.scheduler.coordination import check_book as check_coordination
from apportion.scheduler.holders import holds
from apportion.scheduler.records import (
    ERRED,
    MEMORY,
    PROCESSING,
    QUEUED,
    RELEASED,
    WAITING,
    TaskRecord,
    WorkerRecord,
)
from apportion.scheduler.remote_calls import check_book
from apportion.scheduler.state import SchedulerState


def check_invariants(state: SchedulerState) -> None:
    """Raise ``AssertionError`` naming the first broken invariant."""
    _check_ledger(state)
    _check_units(state)
    _check_tasks(state)
    _check_reservations(state)
    _check_restrictions(state)
    _check_steals(state)
    _check_memory_verdicts(state)
    _check_side_books(state)
    _check_telemetry(state)
    check_book(state)
    check_coordination(state)


def _check_ledger(state: SchedulerState) -> None:
    for worker in state.workers.values():
        used: Counter[str] = Counter()
        resource_tasks = 0
        _check_seceded(worker)
        for key in worker.processing:
            task = state.tasks.get(key)
            assert task is not None, f"{worker.name} processes unknown {key}"
            assert task.state == PROCESSING and task.worker == worker.id, (
                f"{key} not on {worker.name}"
            )
            if not worker.seceded.get(key, False):  # else given back while it waits
                used.update(task.resources)
            counted = key not in worker.seceded and key not in worker.rejoined
            resource_tasks += bool(task.resources) and counted
        for key in worker.actors:
            task = state.tasks.get(key)
            assert task is not None and task.actor, f"{worker.name} hosts unknown actor {key}"
            assert task.state == MEMORY and task.worker == worker.id, f"actor {key} elsewhere"
            assert key in worker.has_what and not task.replicas, f"actor {key} copied or gone"
            used.update(task.allocation.resources if task.allocation is not None else {})
        ledger = worker.ledger
        ledger.check()
        for name, total in ledger.total.items():
            assert ledger.free[name] == total - used[name], f"{worker.name}: {name} ledger drifted"
        assert not set(used) - set(ledger.total), f"{worker.name}: uses undeclared resources"
        assert resource_tasks <= worker.nthreads, f"{worker.name}: resource tasks beyond threads"
        for key in worker.has_what:
            task = state.tasks.get(key)
            assert task is not None and task.state == MEMORY and holds(task, worker.id)
        held = sum(state.tasks[key].nbytes for key in worker.has_what)
        assert worker.nbytes == held, f"{worker.name}: nbytes {worker.nbytes} != {held} held"


def _check_seceded(worker: WorkerRecord) -> None:
    """Seceded tasks run here; only those that gave back their resources wait to rejoin."""
    assert worker.seceded.keys() <= worker.processing.keys(), f"{worker.name}: seceded elsewhere"
    rejoining = set(worker.rejoining)
    assert len(rejoining) == len(worker.rejoining), f"{worker.name}: rejoins twice"
    assert all(worker.seceded.get(key) for key in rejoining), f"{worker.name}: rejoin holds"
    counted = worker.processing.keys() - worker.seceded.keys()
    assert worker.rejoined <= counted, f"{worker.name}: rejoined"


def _check_tasks(state: SchedulerState) -> None:
    queued_keys = {key for heap in state.ready.values() for _, _, key in heap}
    lineage: Counter[str] = Counter(dep for task in state.tasks.values() for dep in task.deps)
    for key, task in state.tasks.items():
        assert task.key == key
        assert task.state in (WAITING, QUEUED, PROCESSING, MEMORY, ERRED, RELEASED), task.state
        assert lineage[key] >= task.lineage >= 0, f"{key}: lineage {task.lineage} overcounted"
        if task.state == RELEASED:
            assert task.lineage > 0 and not task.needed(), f"{key}: released but needed"
            assert task.worker is None
        not_ready = sum(1 for d in task.deps if d in state.tasks and state.tasks[d].state != MEMORY)
        if task.state == WAITING:
            assert task.missing_deps == not_ready > 0, f"{key}: waiting with wrong count"
        if task.state == QUEUED:
            assert task.missing_deps == 0 == not_ready, f"{key}: queued with inputs missing"
            assert key in queued_keys or key in state.verdicts, f"{key}: queued but in no heap"
        if task.state == PROCESSING and task.worker is not None:
            assert key in state.workers[task.worker].processing, f"{key}: lost its worker"
        if task.allocation is not None:
            holding = task.state == PROCESSING or (task.state == MEMORY and task.actor)
            assert holding and task.worker, f"{key}: holds resources off a worker"
            assert task.allocation.resources == task.resources, f"{key}: allocation drifted"
            assert task.allocation.alternative == task.choice, f"{key}: alternative drifted"
        if task.actor and task.state == MEMORY:
            assert key in state.workers[task.worker or ""].actors, f"{key}: actor not hosted"
        _check_holders(state, task)
        for dep_key in task.dependents or ():
            dependent = state.tasks.get(dep_key)
            assert dependent is not None, f"{key}: dependent {dep_key} forgotten"
            assert key in dependent.deps
            assert dependent.state in (WAITING, QUEUED, PROCESSING), f"{dep_key} finished"
        if task.state in (WAITING, QUEUED) or (task.state == PROCESSING and task.worker):
            for dep_key in task.deps:
                dep = state.tasks.get(dep_key)
                assert dep is not None, f"{key}: input {dep_key} forgotten while needed"
                assert dep.state != RELEASED, f"{key}: input {dep_key} released while needed"
                assert key in (dep.dependents or ()), f"{key}: not registered with {dep_key}"
        for client_id in task.wanted_by or ():
            assert key in state.clients[client_id].wanted


def _check_holders(state: SchedulerState, task: TaskRecord) -> None:
    """A result in memory is on its worker and on every copy's; nothing else has copies."""
    key = task.key
    if task.state != MEMORY:
        assert task.replicas is None, f"{key}: copies of a result not in memory"
        return
    worker = state.workers.get(task.worker or "")
    assert worker is not None and key in worker.has_what, f"{key}: result nowhere"
    for copy in task.replicas or ():
        assert copy != task.worker, f"{key}: its holder is listed as a copy too"
        holder = state.workers.get(copy)
        assert holder is not None and key in holder.has_what, f"{key}: copy on {copy} gone"


def _check_reservations(state: SchedulerState) -> None:
    for worker in state.workers.values():
        if worker.reserved_by is not None:
            task = state.tasks.get(worker.reserved_by)
            assert task is not None and task.state == QUEUED, f"stale reservation on {worker.name}"
            assert task.reserved_on == worker.id
    for task in state.tasks.values():
        if task.reserved_on is not None:
            worker = state.workers[task.reserved_on]
            assert worker.reserved_by == task.key
    for key, (worker_id, _) in state.prefetches.items():
        task = state.tasks.get(key)
        assert task is not None and task.reserved_on == worker_id, f"stale prefetch for {key}"


def _check_restrictions(state: SchedulerState) -> None:
    """A task under a hard restriction runs, and holds a reservation, only on a worker
    it may run on."""
    for worker in state.workers.values():
        for key in worker.processing:
            restriction = state.tasks[key].restriction
            if restriction is not None and not restriction.loose:
                assert restriction.allows(worker), f"{key} runs on {worker.name}, not allowed"
        held = state.tasks.get(worker.reserved_by or "")
        if held is not None and held.restriction is not None and not held.restriction.loose:
            assert held.restriction.allows(worker), f"{held.key} reserved disallowed {worker.name}"


def _check_steals(state: SchedulerState) -> None:
    """A task being moved runs (or waits) on the worker asked to let it go, until that
    worker answers; the idle worker counts each move on its way, and nothing else."""
    incoming: Counter[str] = Counter()
    for key, (victim, thief) in state.steals.items():
        task = state.tasks.get(key)
        assert task is not None and task.state == PROCESSING, f"moving {key}, not processing"
        assert task.worker == victim != thief, f"moving {key} from where it is not"
        assert not task.actor and key not in state.workers[victim].started, f"moving {key}"
        incoming[thief] += 1
    for worker in state.workers.values():
        assert worker.incoming == incoming[worker.id], f"{worker.name}: moves on their way"
        assert worker.started <= worker.processing.keys(), f"{worker.name}: started elsewhere"
        work = sum(expected for _, expected in worker.processing.values())
        assert abs(worker.occupancy - work) <= 1e-6 * max(1.0, work), f"{worker.name}: occupancy"


def _check_units(state: SchedulerState) -> None:
    """Each unit's free share accounts for exactly the tasks holding it (``Ledger.check``
    has checked the units against the amounts)."""
    for worker in state.workers.values():
        for name, unit_free in worker.ledger.units.items():
            used: Counter[str] = Counter()
            for key in worker.processing.keys() | worker.actors:
                if worker.seceded.get(key, False):
                    continue  # gave its units back while it waits
                task = state.tasks[key]
                held = task.allocation.units if task.allocation is not None else {}
                if name in task.resources:
                    assert name in held, f"{key} holds no {name} units"
                    share = min(task.resources[name], SCALE)
                    used.update(dict.fromkeys(held[name], share))
            for label, free in unit_free.items():
                assert free == SCALE - used[label], f"{worker.name}: {name}[{label}] drifted"


def _check_memory_verdicts(state: SchedulerState) -> None:
    """Serving deaths are counted for known tasks only; direct-fetch marks are results'."""
    for key in state.serving_deaths:
        assert key in state.tasks, f"serving deaths counted for forgotten {key}"
    for key in state.served_directly:
        task = state.tasks.get(key)
        assert task is not None and task.state == MEMORY, f"{key}: marked served, not in memory"


def _check_side_books(state: SchedulerState) -> None:
    """Sparse per-task data goes with its task: where a retried task raised, while it
    is known; the type of a result apart from its group's, while it is in memory."""
    for key in state.raised_on:
        assert key in state.tasks, f"failures remembered for forgotten {key}"
    for key in state.result_types:
        task = state.tasks.get(key)
        assert task is not None and task.state == MEMORY, f"{key}: a type kept, not in memory"
    for key in state.preemption.preemptible:
        assert key in state.tasks, f"forgotten {key} still marked preemptible"
    for key in state.preemption.stopping:
        assert key in state.preemption.preemptible, f"{key} stopped, not preemptible"


def _check_telemetry(state: SchedulerState) -> None:
    """The counts the views read match the records they count."""
    by_group: Counter[tuple[str | None, str]] = Counter()
    kinds: Counter[object] = Counter()
    for task in state.tasks.values():
        by_group[(task.group.name if task.group else None, task.state)] += 1
        if task.state == QUEUED:
            kinds[task.queue] += 1
    counted: Counter[tuple[str | None, str]] = Counter()
    for name, tally in state.telemetry.groups.items():
        assert tally.live == sum(tally.states.values()), f"group {name} miscounts its records"
        for task_state, n in tally.states.items():
            if n:
                counted[(name, task_state)] = n
    assert counted == by_group, f"group counts {dict(counted)} != records {dict(by_group)}"
    assert Counter(state.telemetry.queued_kinds) == kinds, "queued counts by kind are off"
