"""Preemption: stop a preemptible run so that a share kept below its fair share gets in.

Theory of operation
-------------------
Off unless ``SchedulerConfig.preempt_after`` is set. At every tick (about twice a
second; the time comes in the event) ``check`` looks at the shares (``shares.py``):

- A share *waits below its fair share* while a task of it is queued and its dominant
  share (``FairPass.dominant``: the largest fraction it holds of any resource,
  threads included, over its weight) is below ``1 / W``, ``W`` being the sum of the
  weights of the shares that hold something or wait. ``waiting_since`` keeps when
  that began; a break (nothing queued, or a fair share reached) starts it again.
- Once a share has waited so for ``preempt_after`` seconds, and no stop for it is
  under way, its queued tasks are looked at in start order (priority, then age).
  For the first that fits nowhere now, is not held back by its share's quota, and
  would fit on some worker where preemptible tasks were stopped, those tasks are
  stopped. A task that fits now causes none: the next placement pass starts it.
- A victim is a *preemptible* task (``TaskSpec.preemptible`` from a service: the job
  queue's ``--preemptible`` runs; never a Python task), of another share *above*
  its fair share (dominant share over ``1 / W``), that has run for
  ``preempt_after`` at least, so that a run just started or started again is not
  stopped at once. They are taken from the share furthest above its fair share
  first and, within a share, youngest first (the least work lost), until the task
  would fit (``choose``); the worker needing the fewest stops wins. A worker
  where a stop is under way is left alone until it settles, and one stop at a
  time is made for a share.
- The victims' worker is told to stop them (``InterruptTasks``: a run's process
  group gets SIGTERM, then SIGKILL after the worker's kill grace, as a cancel),
  and the clients wanting them are told (``TaskPreempted``: the job queue writes it
  in the run's history). The waiting task takes that worker's reservation, so that
  what the stops free is kept for it, not taken back by the stopped tasks, which
  are older work (nor is a worker chosen whose reservation an older task of the
  same share holds: what is freed there would be kept for that one). Their
  resources stay held until the worker reports them ended; then each goes back to
  its queue, its retries untouched (``settle``), to start again as a new attempt.
  One that completed meanwhile simply completes.

So a stop is made only for a share that waits, is below its fair share, and has
work that the stop lets in; only of work its submitter said may be stopped; only
from a share above its own fair share. Two shares whose work is all preemptible,
each able to fill the cluster alone, take turns of ``preempt_after`` at least:
time-slicing, by design. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from apportion.core.ledger import Ledger
from apportion.core.resources import Amounts, Units, describe_resources
from apportion.scheduler.events import SendInterruptTasks, SendTaskPreempted
from apportion.scheduler.placement import fits_now, pools, queue_head
from apportion.scheduler.preempt_book import Preempting
from apportion.scheduler.records import (
    NO_SHARE,
    PROCESSING,
    QUEUED,
    TaskRecord,
    WorkerRecord,
    share_of,
)
from apportion.scheduler.shares import FairPass
from apportion.scheduler.state import SchedulerState


@dataclass(frozen=True, slots=True)
class Victim:
    """A task that may be stopped, as ``choose`` weighs it."""

    key: str
    worker_id: str
    #: What it holds there: given back to a scratch copy of the worker's ledger.
    amounts: Amounts
    units: Units


@dataclass(frozen=True, slots=True)
class Room:
    """A worker the waiting task could ever run on: its ledger and threads now."""

    worker_id: str
    ledger: Ledger
    #: Threads free now (a stop frees one more).
    threads_free: int


def choose(
    alternatives: Sequence[Amounts], rooms: Sequence[Room], victims: Sequence[Victim]
) -> Choice | None:
    """The worker and the tasks to stop there so that one of ``alternatives`` fits.

    ``victims`` come best first; on each worker they are taken in that order until
    an alternative fits what is free plus what they hold, and a thread is free. The
    worker needing the fewest stops wins (ties: the first in ``rooms``); None when
    no worker can make room.
    """
    best: Choice | None = None
    for room in rooms:
        here = [v for v in victims if v.worker_id == room.worker_id]
        found = _enough(alternatives, room, here)
        if found is not None and (best is None or len(found.keys) < len(best.keys)):
            best = found
    return best


class Choice(NamedTuple):
    """What ``choose`` chose: stop ``keys`` on ``worker_id``, and the waiting task
    fits there with ``alternatives[alternative]``."""

    worker_id: str
    keys: list[str]
    alternative: int


def _enough(
    alternatives: Sequence[Amounts], room: Room, victims: Sequence[Victim]
) -> Choice | None:
    """The fewest of ``victims`` (a prefix, in order) whose stop lets an alternative in."""
    scratch = Ledger(room.ledger.total)
    scratch.free = dict(room.ledger.free)
    scratch.units = {name: dict(units) for name, units in room.ledger.units.items()}
    taken: list[str] = []
    for victim in victims:
        scratch.give(victim.amounts, victim.units)
        taken.append(victim.key)
        if room.threads_free + len(taken) < 1:
            continue
        for index, amounts in enumerate(alternatives):
            if scratch.can_take(amounts, None):
                return Choice(room.worker_id, taken, index)
    return None


# --- the scheduler's side ---------------------------------------------------------------


def check(state: SchedulerState) -> None:
    """Time passed: note which shares wait below their fair share, and stop what lets
    in the one that has waited long enough (see the module)."""
    after = state.config.preempt_after
    book = state.preemption
    if after is None or not state.workers:
        return
    _forget_stale(state)
    queued = _queued_heads(state)
    if not queued and not book.waiting_since:
        return
    fair = FairPass(state.shares, state.workers, state.tasks)
    active = set(fair.held) | set(queued)
    active.discard(NO_SHARE)
    fair_share = 1.0 / sum(state.shares.weight(share) for share in active) if active else 0.0
    now = state.now
    below = {share for share in queued if share != NO_SHARE and fair.dominant(share) < fair_share}
    for share in list(book.waiting_since):
        if share not in below:
            del book.waiting_since[share]
    for share in below:
        book.waiting_since.setdefault(share, now)
    if not book.preemptible:
        return
    # The longest waiting first (ties by name, the same in every run).
    for share in sorted(below, key=lambda s: (book.waiting_since[s], s)):
        waited = now - book.waiting_since[share]
        if waited < after or any(stop.for_share == share for stop in book.stopping.values()):
            continue
        for task in queued[share]:
            if _preempt_for(state, fair, fair_share, task, waited):
                break


def _forget_stale(state: SchedulerState) -> None:
    """Stops whose task no longer runs where it was stopped (cancelled and settled,
    its worker lost): nothing is under way for them any more."""
    stopping = state.preemption.stopping
    for key, stop in list(stopping.items()):
        task = state.tasks.get(key)
        if task is None or task.state != PROCESSING or task.worker != stop.worker_id:
            del stopping[key]


def _queued_heads(state: SchedulerState) -> dict[str, list[TaskRecord]]:
    """Each share's first queued task of every kind, in start order."""
    heads: dict[str, list[TaskRecord]] = {}
    for kind, heap in state.ready.items():
        task = queue_head(state, heap)
        if task is not None:
            heads.setdefault(share_of(kind), []).append(task)
    for tasks in heads.values():
        tasks.sort(key=TaskRecord.order)
    return heads


def _preempt_for(
    state: SchedulerState, fair: FairPass, fair_share: float, task: TaskRecord, waited: float
) -> bool:
    """Stop what lets ``task`` in, if anything can; whether something was stopped."""
    share = share_of(task.queue)
    alternatives = [a for a in task.demand.alternatives if fair.over_quota(share, a) is None]
    if not alternatives:
        return False  # its quota holds it back: a stop would not let it in
    # A worker where a stop is under way is left alone until it settles: the task
    # the stop is for holds its reservation, which a second stop would take away.
    stopping = {stop.worker_id for stop in state.preemption.stopping.values()}
    workers: dict[str, WorkerRecord] = {}
    for pool in pools(state, task.queue):
        for worker in pool:
            if (
                not worker.paused
                and worker.id not in stopping
                and _may_reserve(state, worker, task)
            ):
                workers[worker.id] = worker
    if any(
        fits_now(state, worker, task, amounts)
        for worker in workers.values()
        for amounts in alternatives
    ):
        return False  # it starts at the next placement pass, with nothing stopped
    victims = _victims(state, fair, fair_share, share, set(workers))
    if not victims:
        return False
    rooms = [Room(w.id, w.ledger, w.nthreads - w.running() - w.incoming) for w in workers.values()]
    chosen = choose(alternatives, rooms, victims)
    if chosen is None:
        return False
    worker = state.workers[chosen.worker_id]
    _reserve_for(
        state, task, worker, task.demand.alternatives.index(alternatives[chosen.alternative])
    )
    _stop(state, worker, chosen.keys, share, task, waited)
    return True


def _may_reserve(state: SchedulerState, worker: WorkerRecord, task: TaskRecord) -> bool:
    """``worker``'s reservation is free, ``task``'s, or another share's: not held by an
    older task of ``task``'s own share, which would keep what a stop frees there."""
    holder = state.tasks.get(worker.reserved_by or "")
    return (
        holder is None
        or holder is task
        or share_of(holder.queue) != share_of(task.queue)
        or task.order() < holder.order()
    )


def _reserve_for(
    state: SchedulerState, task: TaskRecord, worker: WorkerRecord, choice: int
) -> None:
    """``task`` holds the reservation of the worker where room is made for it, so that
    what the stops free is kept for it, not taken back by the stopped tasks (older
    work, queued again) or anyone not further below their fair share."""
    if task.reserved_on == worker.id and task.choice == choice:
        return
    if task.reserved_on is not None:
        state.drop_reservation(task)
    holder = state.tasks.get(worker.reserved_by or "")
    if holder is not None:
        state.drop_reservation(holder)
        state.log.append(
            (
                state.now,
                holder.key,
                QUEUED,
                QUEUED,
                f"reservation on {worker.name} given to {task.key}, for which it stops runs",
            )
        )
    task.choice = choice
    state.reserve(task, worker)
    state.log.append(
        (
            state.now,
            task.key,
            QUEUED,
            QUEUED,
            f"reserved {worker.name}, where runs are stopped for it",
        )
    )


def _victims(
    state: SchedulerState, fair: FairPass, fair_share: float, share: str, workers: set[str]
) -> list[Victim]:
    """The tasks that may be stopped for ``share`` on ``workers``, best first: from
    the share furthest above its fair share, then the youngest."""
    after = state.config.preempt_after or 0.0
    book = state.preemption
    ranked: list[tuple[float, float, str, Victim]] = []
    for key in book.preemptible:
        task = state.tasks.get(key)
        if task is None or task.state != PROCESSING or key in book.stopping:
            continue
        owner = share_of(task.queue)
        worker = state.workers.get(task.worker or "")
        if owner == share or worker is None or worker.id not in workers or key in worker.seceded:
            continue
        dominant = fair.dominant(owner)
        started = worker.processing[key][0]
        if dominant <= fair_share or state.now - started < after:
            continue
        allocation = task.allocation
        amounts = allocation.resources if allocation is not None else {}
        units = allocation.units if allocation is not None else {}
        ranked.append((-dominant, -started, key, Victim(key, worker.id, amounts, units)))
    ranked.sort(key=lambda entry: entry[:3])
    return [entry[3] for entry in ranked]


def _stop(
    state: SchedulerState,
    worker: WorkerRecord,
    keys: list[str],
    share: str,
    task: TaskRecord,
    waited: float,
) -> None:
    needs = describe_resources(task.resources) or "a thread"
    reason = (
        f"preempted for share {share!r}, which waited {waited:.1f}s below its fair share "
        f"for {needs}"
    )
    state.emit(SendInterruptTasks(worker.id, keys))
    for key in keys:
        victim = state.tasks[key]
        state.preemption.stopping[key] = Preempting(worker.id, share, reason)
        state.log.append((state.now, key, PROCESSING, PROCESSING, f"{reason}; stopping it"))
        for client_id in victim.wanted_by or ():
            state.emit(SendTaskPreempted(client_id, key, worker.name, reason))
    state.log_info(f"{', '.join(keys)} on {worker.name}: {reason}")


def settle(state: SchedulerState, worker: WorkerRecord, key: str) -> Preempting | None:
    """``worker`` reported ``key`` ended: the stop under way there, if it was stopped."""
    if not state.preemption.stopping:
        return None
    return state.preemption.settle(key, worker.id)
