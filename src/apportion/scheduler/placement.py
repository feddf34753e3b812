"""The placement pass: which ready task starts where, decided in one batch.

Rules (documented for users in docs/scheduling.md):

1. A task that declares resources is assigned only to a worker where every amount
   it asks for is free *now*, and a thread is free. Among those, the worker holding
   most of its input bytes wins, then one short of its memory target, then the
   least loaded.
2. Ready tasks are considered oldest first (higher priority first, then submission
   order). A task that does not fit does not stop the pass: later tasks that fit
   elsewhere, or on other resources, start (backfill, no head-of-line blocking).
3. No starvation: when the oldest ready task of a given request fits nowhere, it
   *reserves* the worker closest to fitting it. From then on, other tasks may not
   take that worker's free amounts of the resources it needs, nor (once it waits
   only for a thread) that worker's threads. As running tasks finish, what they
   free accumulates for the reserved task until it fits. A worker holds at most
   one reservation; a reservation is kept until its task starts, or until an older
   task that became ready later (its inputs arrived, or it is retried) blocks and
   takes it over: the oldest blocked task holds it (and starts at once when what
   the worker kept for the task it took it from is all it lacked).
4. Plain tasks (no resources) only need a thread. Short ones may be queued a little
   ahead on a worker (``pipeline_seconds`` of work per thread) to hide the round
   trip, counted by their group's expected duration; a task of a group expected to
   run longer than ``queue_ahead_below`` never waits behind another task on a worker
   (what waits there anyway, an idle worker takes: ``stealing.py``). Not ahead,
   while resource tasks wait, on workers that offer resources. A worker past its
   memory target (``memory_target``) gets plain tasks after every other. A short one whose
   inputs are mostly on one worker goes there; further ahead than that when the
   worker's expected work would clear before its inputs could move elsewhere (at
   ``transfer_bandwidth``), as moving a large input costs more than waiting for it
   (long work too: only then does it wait behind another task).
   A root (no inputs, feeds others: it makes new data) goes to a worker only while
   it has fewer than ``ceil(threads x root_saturation)`` tasks, so a worker makes
   new data only as it gets through the old, and preferably to the worker given
   its siblings (the other inputs of the task it feeds). Roots measured to make
   tiny results (under ``root_output_below``) are queued ahead as any short task.
5. A task with alternative demands runs with the first that fits somewhere now.
6. A worker that announced it is closing gets nothing new, nor does one paused
   for its memory (until it resumes). A paused worker still counts among those
   that could ever run a task: the task waits for it rather than failing.
7. A task restricted to some workers (Dask's ``workers=``) is considered only for
   those, by rules 1-3 as any task: it queues under its own key (demand plus
   restriction), so it waits for them without holding up anyone else, and reserves
   only among them. A loose one (``allow_other_workers``) is restricted the same way
   while some connected, open named worker could ever hold its demand; when none
   could, any worker may take it.

8. A task retried after raising goes first where it raised least often, among the
   workers where it may start now by the rules above (``retry_cause``): a failure
   is often the worker's. Only when no other can take it now does it run again
   where it failed.

Cost: one pass per loop turn, O(started tasks x candidate workers + request kinds),
never a walk over everything queued. A restricted kind finds its workers through an
index of worker aliases built once per pass, not by a walk over every worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from heapq import heapify, heappop, heappush, heapreplace

from apportion.core.demand import PLAIN, Demand
from apportion.core.resources import Amounts
from apportion.scheduler.records import (
    QUEUED,
    QueueKey,
    TaskRecord,
    WorkerRecord,
    demand_of,
    kind_of,
    needs_resources,
    restriction_of,
    share_of,
)
from apportion.scheduler.seceding import grant_rejoins, kept_for_rejoin
from apportion.scheduler.shares import FairPass
from apportion.scheduler.state import SchedulerState
from apportion.scheduler.unsatisfiable import fail_or_warn, fail_or_warn_pinned, pinned_by_inputs


def place(state: SchedulerState) -> None:
    """Start every ready task that can start now."""
    if not state.workers:
        return
    grant_rejoins(state)
    fair = state.fair = _fair_pass(state)
    try:
        while True:
            taken = 0
            if fair is not None:
                fair.kept_out, fair.released, taken = False, False, fair.taken
            _place_resource_tasks(state)
            _place_plain_tasks(state)
            if fair is None or not ((fair.kept_out and fair.taken != taken) or fair.released):
                break
            # Another share's reservation kept a task out, and shares took more since:
            # one that took more may no longer be as far below its fair share as the
            # share it kept out, which may now use what is kept (its plain tasks,
            # placed after every resource task, count too). Or a reservation was given
            # up for its share's quota after a task it kept out was tried. Again, until
            # nothing starts: a task over its quota reserves nothing, so a pass that
            # starts nothing gives no reservation up for the next one to.
    finally:
        state.fair = None


def _fair_pass(state: SchedulerState) -> FairPass | None:
    """The shares' holdings, when this pass must serve shares fairly: tasks of more
    than one share wait, or of one with a quota (``shares.py``). None otherwise, so
    that one user's work pays nothing for fairness: a look at each kind's head."""
    first: str | None = None
    quotas = state.shares.quotas
    for kind, heap in state.ready.items():
        if queue_head(state, heap) is None:
            continue
        share = share_of(kind)
        if first is None:
            first = share
        if share != first or (quotas and share in quotas):
            return FairPass(state.shares, state.workers, state.tasks)
    return None


def _is_plain(kind: QueueKey) -> bool:
    """Tasks of ``kind`` need only a thread, anywhere (the plain pass places them)."""
    return kind_of(kind) == PLAIN


def candidates(state: SchedulerState, demand: Demand) -> list[list[WorkerRecord]]:
    """For each alternative of ``demand``, the open workers whose declared supply could
    ever hold it."""
    open_workers = [w for w in state.workers.values() if w.leaving is None]
    return [
        [w for w in open_workers if w.ledger.could_hold(amounts)] for amounts in demand.alternatives
    ]


AliasIndex = dict[str, list[tuple[int, WorkerRecord]]]
"""Worker name, address or host -> the workers it names, with their join order."""


def alias_index(state: SchedulerState) -> AliasIndex:
    """Every worker by each of its aliases, so that a restriction finds its workers
    without a walk over the whole cluster."""
    index: AliasIndex = {}
    for position, worker in enumerate(state.workers.values()):
        for alias in worker.aliases:
            index.setdefault(alias, []).append((position, worker))
    return index


def pools(
    state: SchedulerState,
    key: QueueKey,
    index: AliasIndex | None = None,
    every: Callable[[Demand], list[list[WorkerRecord]]] | None = None,
) -> list[list[WorkerRecord]]:
    """For each alternative of a queue's demand (in order), the open workers that could
    ever run it, its restriction applied: a loose one falls back to every worker only
    when no named worker could run any alternative. ``every`` is ``candidates`` (cached
    by the caller, as queues share demands)."""
    demand = demand_of(key)
    restriction = restriction_of(key)
    if every is None:
        every = partial(candidates, state)
    if restriction is None:
        return every(demand)
    index = alias_index(state) if index is None else index
    named = sorted(
        {position: w for name in restriction.workers for position, w in index.get(name, ())}.items()
    )
    allowed = [
        [w for _, w in named if w.leaving is None and w.ledger.could_hold(amounts)]
        for amounts in demand.alternatives
    ]
    if restriction.loose and not any(allowed):
        return every(demand)
    return allowed


def holder_of(state: SchedulerState, worker: WorkerRecord, task: TaskRecord) -> TaskRecord | None:
    """The task holding a reservation on ``worker`` if it is not ``task`` itself."""
    if worker.reserved_by is None or worker.reserved_by == task.key:
        return None
    return state.tasks.get(worker.reserved_by)


def held_back(state: SchedulerState, worker: WorkerRecord, task: TaskRecord) -> Amounts | None:
    """What ``worker`` keeps for the reservation of a task other than ``task``, and
    for its oldest task waiting to rejoin, if any."""
    holder = holder_of(state, worker, task)
    fair = state.fair
    if (
        holder is not None
        and fair is not None
        and fair.needier(share_of(task.queue), share_of(holder.queue))
    ):
        holder = None  # a share further below its fair share may use what it keeps
    elif holder is not None and fair is not None and share_of(task.queue) != share_of(holder.queue):
        fair.kept_out = True  # until the holder's share takes more (``place``)
    kept = None if holder is None else holder.resources
    if worker.rejoining:
        rejoin = kept_for_rejoin(state, worker) or {}
        if kept is None:
            return rejoin
        return {n: kept.get(n, 0) + rejoin.get(n, 0) for n in kept.keys() | rejoin.keys()}
    return kept


def fits_now(
    state: SchedulerState,
    worker: WorkerRecord,
    task: TaskRecord,
    demand: dict[str, int],
) -> bool:
    """Could ``task``, asking ``demand``, start on ``worker`` right now?"""
    if not _has_thread(worker):
        return False
    return worker.ledger.can_take(demand, held_back(state, worker, task))


def _input_bytes(state: SchedulerState, task: TaskRecord) -> dict[str, int]:
    by_worker: dict[str, int] = {}
    for dep in task.deps:
        record = state.tasks[dep]
        if record.worker is not None:
            by_worker[record.worker] = by_worker.get(record.worker, 0) + record.nbytes
            for copy in record.replicas or ():  # copies made by replicate or rebalance
                by_worker[copy] = by_worker.get(copy, 0) + record.nbytes
    return by_worker


def best_worker(
    state: SchedulerState,
    task: TaskRecord,
    room: dict[str, WorkerRecord],
    demand: dict[str, int],
) -> WorkerRecord | None:
    """Of ``room`` (a pool's workers with a free thread, ``_PassPools.room``), the
    fitting worker where a retried task raised least often (``retry_cause``), then
    with most input bytes, then one short of its memory target (the task makes new
    data), then least load; None if none fits. Workers found full, or short of
    ``demand`` with nothing kept, leave ``room``: a pass only takes more."""
    local = _input_bytes(state, task) if task.deps else {}
    raised = state.raised_on.get(task.key, ()) if state.raised_on else ()
    best: WorkerRecord | None = None
    best_score: tuple[int, int, bool, float] | None = None
    out: list[str] = []
    for worker in room.values():
        if not _has_thread(worker):
            out.append(worker.id)
            continue
        held = held_back(state, worker, task)
        if not worker.ledger.can_take(demand, held):
            # Short of ``demand`` even with nothing kept for others: so it stays for
            # the rest of the pass. Kept for another task only, it may fit that one.
            if held is None or not worker.ledger.can_take(demand, None):
                out.append(worker.id)
            continue
        score = (
            raised.count(worker.id) if raised else 0,
            -local.get(worker.id, 0),
            _past_memory_target(state, worker),
            worker.running() / worker.nthreads,
        )
        if best_score is None or score < best_score:
            best, best_score = worker, score
    for gone in out:
        del room[gone]
    return best


def _reserve(state: SchedulerState, task: TaskRecord, pool: list[WorkerRecord]) -> None:
    """Hold the worker closest to fitting ``task`` so backfill cannot starve it.

    The reservation belongs to the oldest blocked task, so a worker reserved by a task
    behind ``task`` in the queue is taken over from it. That task reserved first
    because ``task`` was not queued then: it was waiting for its inputs, or running
    an attempt that failed and is now retried. The one displaced reserves again, a
    worker free of reservations or held by a task behind it, in this pass or later.
    Orders are unique, so a reservation only ever moves to an older task.
    """
    best: WorkerRecord | None = None
    best_score: tuple[float, bool, int] | None = None
    for worker in pool:
        holder = state.tasks.get(worker.reserved_by) if worker.reserved_by else None
        if worker.reserved_by is not None and (
            holder is None or not _may_take_over(state, holder, task)
        ):
            continue
        closeness = sum(
            min(worker.ledger.free.get(n, 0), need) / need for n, need in task.resources.items()
        )
        # A free worker before a taken-over one as close: fewer reservations move.
        score = (-closeness, holder is not None, worker.running())
        if best_score is None or score < best_score:
            best, best_score = worker, score
    if best is None:
        return
    displaced = state.tasks.get(best.reserved_by) if best.reserved_by else None
    if displaced is not None:
        state.drop_reservation(displaced)
        if share_of(displaced.queue) == share_of(task.queue):
            cause = f"reservation on {best.name} taken over by older task {task.key}"
        else:
            cause = (
                f"reservation on {best.name} taken over by task {task.key}, of a share "
                "further below its fair share"
            )
        state.log.append((state.now, displaced.key, QUEUED, QUEUED, cause))
    state.reserve(task, best)
    state.log.append((state.now, task.key, QUEUED, QUEUED, f"reserved {best.name}"))


def _may_take_over(state: SchedulerState, holder: TaskRecord, task: TaskRecord) -> bool:
    """May ``task`` take the reservation ``holder`` has? Within a share, the older
    task has it; across shares, the share further below its fair share (``shares.py``)."""
    fair = state.fair
    if fair is not None:
        mine, theirs = share_of(task.queue), share_of(holder.queue)
        if mine != theirs:
            return fair.needier(mine, theirs)
    return task.order() < holder.order()


def queue_head(state: SchedulerState, heap: list[tuple[int, int, str]]) -> TaskRecord | None:
    """First live entry of ``heap``, discarding stale ones (tasks no longer queued)."""
    while heap:
        task = state.tasks.get(heap[0][2])
        if task is not None and task.state == QUEUED and task.seq == heap[0][1]:
            return task
        heappop(heap)
    return None


class _PassPools:
    """The workers each queue could ever run on, found once per placement pass (queues
    share demands), and of each such pool the workers that may take its amounts now.

    Called with a queue's key: its pools (``pools``), one per alternative of its
    demand. ``room(pool)``: the pool's workers not yet seen unable to take that
    alternative in this pass. A pass only assigns, so a worker without a free thread,
    or short of the amounts with nothing kept for others, stays so until the pass
    ends: dropped the first time it is seen, it is not looked at again by the pass's
    later tasks, and a task's search costs what the workers with room number, not the
    whole cluster."""

    __slots__ = ("_by_demand", "_index", "_known", "_ranks", "_rooms", "_state")

    def __init__(self, state: SchedulerState) -> None:
        self._state = state
        self._known: dict[QueueKey, list[list[WorkerRecord]]] = {}
        self._by_demand: dict[Demand, list[list[WorkerRecord]]] = {}
        self._index: AliasIndex | None = None  # built once a restricted queue needs it
        #: By ``id`` of a pool: ``_known`` and ``_by_demand`` keep every pool alive.
        self._rooms: dict[int, dict[str, WorkerRecord]] = {}
        self._ranks: dict[int, list[_Rank]] = {}

    def _every(self, demand: Demand) -> list[list[WorkerRecord]]:
        if demand not in self._by_demand:
            self._by_demand[demand] = candidates(self._state, demand)
        return self._by_demand[demand]

    def __call__(self, key: QueueKey) -> list[list[WorkerRecord]]:
        if key not in self._known:
            if self._index is None and restriction_of(key) is not None:
                self._index = alias_index(self._state)
            self._known[key] = pools(self._state, key, self._index, self._every)
        return self._known[key]

    def room(self, pool: list[WorkerRecord]) -> dict[str, WorkerRecord]:
        """``pool``'s workers that may have a free thread (join order kept)."""
        room = self._rooms.get(id(pool))
        if room is None:
            room = self._rooms[id(pool)] = {w.id: w for w in pool if _has_thread(w)}
        return room

    def ranked(self, pool: list[WorkerRecord]) -> list[_Rank]:
        """``room(pool)`` as a heap, least loaded first (``_least_loaded``)."""
        ranks = self._ranks.get(id(pool))
        if ranks is None:
            state = self._state
            ranks = self._ranks[id(pool)] = [
                (_past_memory_target(state, w), w.running() / w.nthreads, i, w)
                for i, w in enumerate(self.room(pool).values())
            ]
            heapify(ranks)
        return ranks


#: A worker's place in ``_PassPools.ranked``: past its memory target, load, and its
#: position in the pool (ties go to the first, as in ``best_worker``).
_Rank = tuple[bool, float, int, WorkerRecord]


def _least_loaded(
    state: SchedulerState, task: TaskRecord, ranks: list[_Rank], demand: dict[str, int]
) -> WorkerRecord | None:
    """``best_worker``'s choice for a task without inputs or failed attempts (one
    short of its memory target, then least load, then first), taken from a heap
    instead of a walk over every worker with room: a task costs the log of their
    number. An entry whose worker took tasks since is put back at its new load;
    workers that can no longer take the amounts leave, as they leave ``room``."""
    kept: list[_Rank] = []  # fit but for what is kept for another task: put back
    found = None
    while ranks:
        past, load, position, worker = ranks[0]
        now = _past_memory_target(state, worker), worker.running() / worker.nthreads
        if now != (past, load):
            heapreplace(ranks, (*now, position, worker))
            continue
        if not _has_thread(worker):
            heappop(ranks)
            continue
        held = held_back(state, worker, task)
        if worker.ledger.can_take(demand, held):
            found = worker
            break
        entry = heappop(ranks)
        if held is not None and worker.ledger.can_take(demand, None):
            kept.append(entry)
    for entry in kept:
        heappush(ranks, entry)
    return found


def _has_thread(worker: WorkerRecord) -> bool:
    """A thread free for a task now: the first thing ``fits_now`` asks."""
    return not worker.paused and worker.running() + worker.incoming < worker.nthreads


def _place_resource_tasks(state: SchedulerState) -> None:
    # No early return when every thread is busy: a blocked head must still take its
    # reservation then, or plain tasks pipelined ahead keep every thread busy forever
    # and the resource task starves behind newer work.
    pool_for = _PassPools(state)
    holders = _holders(state, pool_for)
    fair = state.fair
    if fair is None:
        for held in holders:
            _start_if_it_fits(state, held, pool_for)
        _place_by_age(state, pool_for)
    else:
        _place_fairly(state, fair, holders, pool_for)
    _drop_empty(state, state.ready)


def _holders(state: SchedulerState, pool_for: _PassPools) -> list[TaskRecord]:
    """The tasks holding a reservation that still hold it rightly: they go first,
    as the oldest of their kind that could not fit."""
    holders: list[TaskRecord] = []
    for worker in list(state.workers.values()):
        held = state.tasks.get(worker.reserved_by or "")
        if held is None or held.state != QUEUED:
            continue
        if held.restriction is not None and all(worker not in p for p in pool_for(held.queue)):
            # It may no longer run here: a loose task that fell back here while its
            # named workers were away (one is back), or this worker is closing. Its
            # amounts are not kept for a task that will start elsewhere.
            state.drop_reservation(held)
            continue
        head = queue_head(state, state.ready.get(held.queue, []))
        if head is not None and head.order() < held.order():
            # An older task of its kind was queued since (an attempt that failed and
            # is retried): it goes first, by age, and reserves if it cannot start.
            state.drop_reservation(held)
            continue
        holders.append(held)
    return holders


def _place_by_age(state: SchedulerState, pool_for: _PassPools) -> None:
    """Merge the request kinds' queues oldest first; a kind that blocks is done for this pass.

    Tasks with the same demand fit in the same places, so once the oldest of a kind
    fits nowhere, none of the younger ones of that kind can: they are not looked at.
    """
    heads: list[tuple[tuple[int, int], QueueKey]] = []
    for kind, heap in state.ready.items():
        task = queue_head(state, heap) if not _is_plain(kind) else None
        if task is not None:
            heads.append((task.order(), kind))
    heapify(heads)
    while heads:
        _, kind = heappop(heads)
        heap = state.ready[kind]
        task = queue_head(state, heap)
        if task is None:
            continue
        if _start_if_it_fits(state, task, pool_for):
            heappop(heap)
            nxt = queue_head(state, heap)
            if nxt is not None:
                heappush(heads, (nxt.order(), kind))
            continue
        nxt = _blocked(state, task, kind, heap, pool_for)
        if nxt is not None:
            heappush(heads, (nxt.order(), kind))


def _blocked(
    state: SchedulerState,
    task: TaskRecord,
    kind: QueueKey,
    heap: list[tuple[int, int, str]],
    pool_for: _PassPools,
) -> TaskRecord | None:
    """``task``, the head of ``kind``, fits nowhere now: warn or fail if it never
    could, else reserve. Returns the next of its kind to consider in this pass, if
    this one failed or started (the others of a kind that blocks wait with it).

    It starts when the reservation it takes over was all that kept it out: a
    younger task of its share held the worker, and what the worker frees is kept
    for the holder, the older task now. Left queued, it would wait a pass with
    everything it needs free."""
    found = next(((i, p) for i, p in enumerate(pool_for(kind)) if p), None)
    if found is None:
        fail_or_warn(state, kind, heap)
        return None
    pinned = pinned_by_inputs(state, task, pool_for(kind))
    if pinned:
        fail_or_warn_pinned(state, task, pinned)
        nxt = queue_head(state, heap)  # the next of its kind, if this one failed
        return nxt if nxt is not task else None
    if task.reserved_on is None:
        task.choice, pool = found  # reserve for the first it could ever run with
        _reserve(state, task, pool)
        if task.reserved_on is not None and _start_if_it_fits(state, task, pool_for):
            heappop(heap)
            return queue_head(state, heap)
    return None


class _ShareQueue:
    """One share's resource work in a fair pass: its reservation holders, then the
    heads of its kinds, oldest first (today's order, within the share)."""

    __slots__ = ("done", "heads", "holders")

    def __init__(self) -> None:
        self.holders: list[TaskRecord] = []
        self.heads: list[tuple[tuple[int, int], QueueKey]] = []
        #: Kinds that blocked in this pass (their holder could not start, or the quota).
        self.done: set[QueueKey] = set()

    def first(self) -> tuple[int, int]:
        """The order of its first task (ties between shares go to the oldest work)."""
        if self.holders:
            return self.holders[0].order()
        return self.heads[0][0]


def _next_of_share(
    state: SchedulerState, queue: _ShareQueue
) -> tuple[TaskRecord, QueueKey, bool] | None:
    """The share's next task to try, its kind, and whether it holds a reservation;
    None when the entry looked at was stale (look again, or the share is done)."""
    if queue.holders:
        held = queue.holders.pop(0)
        return (held, held.queue, True) if held.state == QUEUED else None
    order, kind = heappop(queue.heads)
    task = None if kind in queue.done else queue_head(state, state.ready[kind])
    if task is None:
        return None
    if task.order() != order:
        heappush(queue.heads, (task.order(), kind))  # its holder started before it
        return None
    return task, kind, False


def _place_fairly(
    state: SchedulerState,
    fair: FairPass,
    holders: list[TaskRecord],
    pool_for: _PassPools,
) -> None:
    """Serve the shares one task at a time, the one furthest below its fair share
    first (``shares.py``); within a share, as ``_place_by_age`` does: reservation
    holders, then the kinds' heads oldest first, a kind that blocks done for the pass.
    A task its share's quota holds back neither starts nor reserves."""
    queues: dict[str, _ShareQueue] = {}
    for held in sorted(holders, key=TaskRecord.order):
        queues.setdefault(share_of(held.queue), _ShareQueue()).holders.append(held)
    for kind, heap in state.ready.items():
        if _is_plain(kind):
            continue
        task = queue_head(state, heap)
        if task is not None:
            queues.setdefault(share_of(kind), _ShareQueue()).heads.append((task.order(), kind))
    for queue in queues.values():
        heapify(queue.heads)
    while queues:
        share = min(queues, key=lambda s: (fair.dominant(s), queues[s].first()))
        queue = queues[share]
        picked = _next_of_share(state, queue)
        if picked is None:
            if not queue.heads and not queue.holders:
                del queues[share]
            continue
        _try_fairly(state, fair, queue, picked, pool_for)
        if not queue.heads and not queue.holders:
            del queues[share]


def _try_fairly(
    state: SchedulerState,
    fair: FairPass,
    queue: _ShareQueue,
    picked: tuple[TaskRecord, QueueKey, bool],
    pool_for: _PassPools,
) -> None:
    """Start a share's next task if it fits and its quota allows; else its kind is
    done for the pass (reserving as ``_place_by_age`` does, unless the quota holds it)."""
    task, kind, from_holder = picked
    nxt: TaskRecord | None = None
    if all(fair.over_quota(share_of(kind), a) for a in task.demand.alternatives):
        if task.reserved_on is not None:
            state.drop_reservation(task)  # held by its share's quota: it keeps no worker
            fair.released = True
    elif _start_if_it_fits(state, task, pool_for):
        if from_holder:
            return  # its kind's entry in ``heads`` finds the next one
        heap = state.ready[kind]
        heappop(heap)
        nxt = queue_head(state, heap)
    elif not from_holder:  # a holder keeps its reservation; its kind waits with it
        nxt = _blocked(state, task, kind, state.ready[kind], pool_for)
    if nxt is None:
        queue.done.add(kind)
    else:
        heappush(queue.heads, (nxt.order(), kind))


def _start_if_it_fits(
    state: SchedulerState,
    task: TaskRecord,
    pool_for: _PassPools,
) -> bool:
    """Assign ``task`` with the first of its alternatives that fits somewhere now."""
    alternatives = task.demand.alternatives
    fair = state.fair
    for choice, pool in enumerate(pool_for(task.queue)):
        if fair is not None and fair.over_quota(share_of(task.queue), alternatives[choice]):
            continue  # never past its share's quota, even where it fits
        if fair is None and not task.deps and not (state.raised_on and task.key in state.raised_on):
            target = _least_loaded(state, task, pool_for.ranked(pool), alternatives[choice])
        else:
            target = best_worker(state, task, pool_for.room(pool), alternatives[choice])
        if target is not None:
            task.choice = choice
            state.assign(
                task, target, cause=_outside(task, target) or retry_cause(state, task, target)
            )
            return True
    return False


def retry_cause(state: SchedulerState, task: TaskRecord, target: WorkerRecord) -> str:
    """The story's cause when a retried task is assigned ('' for any other task).

    A retried task goes preferably where it raised least often: a failure is often
    the worker's (a broken GPU, a full disk), and another worker's attempt tells
    the two apart. Among workers where it fits now (or, plain, has room now), the
    fewest failures there come first, then the usual order; so it runs where it
    failed only when no other worker can take it now, and of two it failed on once
    each, the usual order picks (the same in every run).
    """
    raised = state.raised_on.get(task.key) if state.raised_on else None
    if not raised:
        return ""
    names = sorted({state.workers[w].name for w in raised if w in state.workers and w != target.id})
    if target.id in raised:
        times = raised.count(target.id)
        again = "once" if times == 1 else f"{times} times"
        return (
            f"assigned to {target.name}, where it raised {again} before: no worker where it "
            "raised less often could take it now"
        )
    if not names:
        return f"assigned to {target.name}; the workers it raised on have left"
    return f"assigned to {target.name}, not where it raised before ({', '.join(names)})"


def _outside(task: TaskRecord, target: WorkerRecord) -> str:
    """The story's cause when a loose task runs away from its named workers ('' if not)."""
    restriction = task.restriction
    if restriction is None or restriction.allows(target):
        return ""
    return (
        f"assigned to {target.name}, not one of its preferred workers "
        f"({restriction.describe()}): none connected could ever run it"
    )


def ahead_per_thread(state: SchedulerState, expected: float) -> int:
    """How many plain tasks expected to run ``expected`` seconds each thread may have
    queued behind the task it runs: enough to cover ``pipeline_seconds``, and none
    for work longer than ``queue_ahead_below``, which waits for a free thread."""
    config = state.config
    if expected > config.queue_ahead_below:
        return 0
    if expected * config.max_pipeline <= config.pipeline_seconds:
        return config.max_pipeline  # also keeps the division below away from zero
    return max(1, min(config.max_pipeline, math.ceil(config.pipeline_seconds / expected)))


def _load(state: SchedulerState, worker: WorkerRecord) -> tuple[bool, float, float]:
    """How busy ``worker`` is, least first: whether its memory is past its target
    (new work, which makes new data, goes there last), tasks per thread (those on their
    way to it included), then seconds of work per thread as expected, so that of two
    workers running one task each, the one whose task is shorter gets the next."""
    return (
        _past_memory_target(state, worker),
        (worker.running() + worker.incoming) / worker.nthreads,
        worker.occupancy / worker.nthreads,
    )


def _past_memory_target(state: SchedulerState, worker: WorkerRecord) -> bool:
    """The results ``worker`` holds, or its process, are past its memory target: by the
    sizes the scheduler knows (exact, at once) or its last heartbeat."""
    limit = worker.memory_limit
    return bool(limit) and max(worker.nbytes, worker.memory) >= state.config.memory_target * limit


def closed_to_plain(
    state: SchedulerState, worker: WorkerRecord, resource_work_waiting: bool
) -> bool:
    """Whether ``worker`` takes no plain task now, however many threads are free."""
    if worker.leaving is not None or worker.paused:
        return True  # it said it is closing, or it is short of memory
    holder = state.tasks.get(worker.reserved_by or "")
    # The reserved task waits only for a thread: let the threads drain.
    return holder is not None and worker.ledger.fits(holder.resources)


def resource_work_waiting(state: SchedulerState) -> bool:
    """A task asking for resources waits in the scheduler's queues (after the resource
    pass, a non-empty resource queue holds only tasks that could not start)."""
    return any(queue and needs_resources(key) for key, queue in state.ready.items())


def _place_plain_tasks(state: SchedulerState) -> None:
    """Give each plain task, oldest first, to the least busy open worker: one with a
    free thread, or for short work one whose queue has room for it. Stops at the
    first task no worker can take now (the rest are no older).

    While several shares' plain tasks wait (``state.fair``), each next task is the
    oldest of the share furthest below its fair share (``shares.py``)."""
    heaps = {kind: heap for kind, heap in state.ready.items() if heap and _is_plain(kind)}
    if not heaps:
        return
    heap = next(iter(heaps.values()))
    # One share's plain work: nothing to choose between.
    fair = state.fair if len(heaps) > 1 else None
    # Shares whose quota of threads holds their plain work leave ``open_heaps``.
    capping = state.fair if state.shares.quotas else None
    open_heaps = dict(heaps)
    workers = state.workers
    waiting = resource_work_waiting(state)
    loads: list[tuple[bool, float, float, int, str]] = []
    shapes: set[tuple[int, bool]] = set()  # (threads, offers resources) of open workers
    for i, worker in enumerate(workers.values()):
        if not closed_to_plain(state, worker, waiting):
            loads.append((*_load(state, worker), i, worker.id))
            shapes.add((worker.nthreads, bool(worker.ledger.total)))
    heapify(loads)
    aheads: dict[object, int] = {}  # by task group: its tasks come in runs
    # The head task whose own choices (retry, inputs, siblings) found nothing: while
    # it stays the head, nothing was assigned, so they would find nothing again. Only
    # the least busy workers are tried for it, one after the other.
    tried: TaskRecord | None = None
    ahead, root = 0, False
    while loads:
        task, heap = _next_plain(state, fair, capping, heap, open_heaps)
        if task is None:
            break
        if task is not tried:
            ahead = aheads.get(task.group, -1)
            if ahead < 0:
                ahead = aheads[task.group] = ahead_per_thread(state, state.expected(task))
            root = makes_new_data(state, task)
            target, cause = _own_choice(state, task, ahead, waiting, root)
            if target is not None:
                heappop(heap)
                state.assign(task, target, cause=cause)
                continue  # its entry in ``loads`` is stale now: sorted again when on top
            tried = task
        entry = loads[0]
        worker = workers[entry[4]]
        load = _load(state, worker)
        if entry[:3] != load:
            heapreplace(loads, (*load, entry[3], entry[4]))  # assigned to meanwhile
            continue
        if not _has_room(state, worker, ahead, waiting, root):
            if entry[0] or not _fullest_room(state, worker, shapes, ahead, waiting, root):
                heappop(loads)  # full for this task; the next one is no shorter, in general
                continue
            # No worker short of its memory target is less busy for its threads, nor
            # has more room per thread: none of them has room. Those past it may.
            loads = [other for other in loads if other[0]]
            heapify(loads)
            continue
        heappop(heap)
        state.assign(task, worker)
        heapreplace(loads, (*_load(state, worker), entry[3], entry[4]))
    _drop_empty(state, heaps)


def _own_choice(
    state: SchedulerState, task: TaskRecord, ahead: int, waiting: bool, root: bool
) -> tuple[WorkerRecord | None, str]:
    """Where ``task`` goes for reasons of its own, if anywhere, and the story's cause
    ('' for the usual): where it raised least (retried), where its inputs are, or
    where its siblings went (a root)."""
    if state.raised_on and task.key in state.raised_on:
        target = _retry_choice(state, task, ahead, waiting, root)
        if target is not None:
            return target, retry_cause(state, task, target)
    if task.deps:
        return _local_choice(state, task, ahead, waiting), ""
    if root:
        return _sibling_choice(state, task, ahead, waiting), ""
    return None, ""


def _next_plain(
    state: SchedulerState,
    fair: FairPass | None,
    capping: FairPass | None,
    heap: list[tuple[int, int, str]],
    open_heaps: dict[QueueKey, list[tuple[int, int, str]]],
) -> tuple[TaskRecord | None, list[tuple[int, int, str]]]:
    """The next plain task and its heap: the oldest of ``heap``, or while several
    shares wait (``fair``), of the share furthest below its fair share. A share at
    its quota of threads (``capping``) leaves ``open_heaps``: none of its plain tasks
    starts in this pass."""
    while True:
        if fair is not None:
            heap = _neediest_plain(state, fair, open_heaps)
        task = queue_head(state, heap)
        if task is None or capping is None or not capping.over_quota(share_of(task.queue), {}):
            return task, heap
        if fair is None:
            return None, heap
        del open_heaps[task.queue]


def _drop_empty(state: SchedulerState, heaps: dict[QueueKey, list[tuple[int, int, str]]]) -> None:
    """Queues emptied by the pass leave ``state.ready``."""
    for kind in [kind for kind, heap in heaps.items() if not heap]:
        del state.ready[kind]


def _neediest_plain(
    state: SchedulerState, fair: FairPass, heaps: dict[QueueKey, list[tuple[int, int, str]]]
) -> list[tuple[int, int, str]]:
    """The plain queue of the share furthest below its fair share that has a task
    waiting (ties: the oldest task); an empty one when none has."""
    best: list[tuple[int, int, str]] = []
    best_score: tuple[float, tuple[int, int]] | None = None
    for kind, heap in heaps.items():
        task = queue_head(state, heap)
        if task is None:
            continue
        score = (fair.dominant(share_of(kind)), task.order())
        if best_score is None or score < best_score:
            best, best_score = heap, score
    return best


def _retry_choice(
    state: SchedulerState, task: TaskRecord, ahead: int, waiting: bool, root: bool
) -> WorkerRecord | None:
    """For a plain task retried after raising, the worker with room for it now where
    it raised least often, then by input bytes, then least busy (``retry_cause``).
    A walk over the workers: retried tasks are few."""
    raised = state.raised_on[task.key]
    local = _input_bytes(state, task) if task.deps else {}
    best: WorkerRecord | None = None
    best_score: tuple[int, int, tuple[bool, float, float], int] | None = None
    for position, worker in enumerate(state.workers.values()):
        if closed_to_plain(state, worker, waiting) or not _has_room(
            state, worker, ahead, waiting, root
        ):
            continue
        score = (
            raised.count(worker.id),
            -local.get(worker.id, 0),
            _load(state, worker),
            position,
        )
        if best_score is None or score < best_score:
            best, best_score = worker, score
    return best


def _has_room(
    state: SchedulerState, worker: WorkerRecord, ahead: int, waiting: bool, root: bool = False
) -> bool:
    """Whether ``worker`` may take one more plain task, ``ahead`` allowed per thread
    behind the one it runs, or for a ``root`` (``makes_new_data``) a tenth of its
    threads at most (open to plain tasks is checked by the caller)."""
    room = _room(state, worker.nthreads, bool(worker.ledger.total), ahead, waiting, root)
    return worker.running() + worker.incoming < room


def _room(
    state: SchedulerState, nthreads: int, offers: bool, ahead: int, waiting: bool, root: bool
) -> int:
    """How many plain tasks a worker of ``nthreads`` may run and queue (``_has_room``);
    ``offers``: it offers resources."""
    if waiting and offers:
        # A plain task queued ahead here would take the thread a GPU (say) frees next,
        # leaving the GPU idle while work for it waits: fill free threads only.
        ahead = 0
    room = nthreads * (1 + ahead)
    if root:
        room = min(room, math.ceil(nthreads * state.config.root_saturation))
    return room


def _fullest_room(
    state: SchedulerState,
    worker: WorkerRecord,
    shapes: set[tuple[int, bool]],
    ahead: int,
    waiting: bool,
    root: bool,
) -> bool:
    """Whether ``worker`` may queue as many tasks per thread as any worker of the
    pass (of ``shapes``: threads, offers resources) may: then a worker with no room
    that is the least busy per thread means none has room."""
    mine = _room(state, worker.nthreads, bool(worker.ledger.total), ahead, waiting, root)
    return all(
        mine * nthreads >= _room(state, nthreads, offers, ahead, waiting, root) * worker.nthreads
        for nthreads, offers in shapes
    )


def makes_new_data(state: SchedulerState, task: TaskRecord) -> bool:
    """A root: a task with no inputs whose result feeds another task, and whose group
    has not been measured to make results smaller than ``root_output_below``.

    Roots are what make a graph's data (the chunks a reduction then shrinks). Handed
    out only as threads free up, in the graph's order, a worker makes new chunks
    only as fast as it reduces the old ones; queued far ahead, it makes them all
    first and holds them (Dask's root-task queuing)."""
    if task.deps or not task.dependents:
        return False
    size = None if task.group is None else task.group.output
    return size is None or size >= state.config.root_output_below


#: A root's siblings are looked for only among the inputs of a dependent with at
#: most this many: past it the dependent gathers from everywhere (an all-to-all),
#: and a walk over its inputs per root would cost more than it saves.
SIBLINGS_LOOKED_AT = 32
#: ... and only for a root feeding at most this many tasks.
SIBLINGS_FROM = 4


def _sibling_choice(
    state: SchedulerState, task: TaskRecord, ahead: int, waiting: bool
) -> WorkerRecord | None:
    """For a root, the worker given most of its siblings (the other inputs of the
    task it feeds), if it has room: its result is then made where it is used, and
    neither moved nor copied."""
    dependents = task.dependents
    if not dependents or len(dependents) > SIBLINGS_FROM:
        return None  # a chunk many tasks read: no one group of siblings to join
    dependent = state.tasks.get(min(dependents))  # min: the same in every run
    if dependent is None or len(dependent.deps) > SIBLINGS_LOOKED_AT:
        return None
    given: dict[str, int] = {}
    for key in dependent.deps:
        sibling = state.tasks.get(key)
        if sibling is not None and sibling.worker is not None:
            given[sibling.worker] = given.get(sibling.worker, 0) + 1
    for worker_id in sorted(given, key=given.__getitem__, reverse=True):
        worker = state.workers.get(worker_id)
        if (
            worker is not None
            and not closed_to_plain(state, worker, waiting)
            and _has_room(state, worker, ahead, waiting, True)
        ):
            return worker
    return None


def _local_choice(
    state: SchedulerState, task: TaskRecord, ahead: int, waiting: bool
) -> WorkerRecord | None:
    """The worker holding most input bytes, if it has room for the task now, or if
    its queue would clear before those bytes could move elsewhere: then even long
    work waits there, as its inputs would take longer to come to a free thread."""
    local = _input_bytes(state, task)
    holding = [state.workers[w] for w in local if w in state.workers]
    # Most input bytes first; among equal holders (copies), the least busy.
    for worker in sorted(holding, key=lambda w: (-local[w.id], _load(state, w))):
        if not closed_to_plain(state, worker, waiting) and _has_room(state, worker, ahead, waiting):
            return worker
    if not local:
        return None
    holder_id = max(local, key=lambda w: local[w])
    holder = state.workers.get(holder_id)
    if holder is None or closed_to_plain(state, holder, waiting):
        return None
    if waiting and holder.ledger.total:
        return None  # its next free thread is for the resource task waiting
    wait = holder.occupancy / holder.nthreads  # its work as expected, shared by its threads
    return holder if wait < local[holder_id] / state.config.transfer_bandwidth else None
