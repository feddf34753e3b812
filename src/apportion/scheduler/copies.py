"""Copies of results between workers: ``replicate``, ``rebalance``, and the copies
workers fetch for their tasks and keep (``copies_kept``).

The scheduler plans which worker gets a copy of which result and relays the bytes
as a drain does (``drain.py``), opaque: a ``GetData`` to one holder, a ``PutData``
to each receiver, and on each ``DataStored`` the receiver becomes a holder
(``holders.py``). A move (``rebalance``) then lets the source's copy go. The
client hears ``CopiesDone`` once every source answered and every receiver
confirmed, or left.

Rebalance rule: among the chosen workers, take the one holding the most bytes and
the one holding the fewest; move the largest chosen result the first holds and the
second does not that is smaller than the gap between them (so the gap shrinks);
repeat until no such result is left. A result counts at least one byte, so
results of unknown size even out by count.
"""

from __future__ import annotations

from collections import defaultdict

from apportion.core.payload import Pickled
from apportion.protocol.peer_data import DataReply, DataStored
from apportion.protocol.shared_data import CopiesDone, RebalanceKeys, ReplicateKeys
from apportion.protocol.worker import CopiesKept
from apportion.scheduler import actors
from apportion.scheduler.books import CopyJob, Plan
from apportion.scheduler.events import SendGetData, SendPutData
from apportion.scheduler.holders import add_holder, drop_holder, holds
from apportion.scheduler.records import (
    MEMORY,
    PROCESSING,
    ClientRecord,
    TaskRecord,
    WorkerRecord,
)
from apportion.scheduler.state import SchedulerState


def replicate(state: SchedulerState, client: ClientRecord, msg: ReplicateKeys) -> None:
    """Copy each key until ``n`` chosen workers hold it; drop copies beyond ``n``."""
    pool = chosen_workers(state, msg.workers)
    n = len(pool) if msg.n <= 0 else min(msg.n, len(pool))
    load = {w.id: w.nbytes for w in pool}
    plan: Plan = defaultdict(dict)
    dropped = 0
    for key in dict.fromkeys(msg.keys):
        task = state.tasks.get(key)
        if task is None or task.state != MEMORY or task.worker is None or not actors.movable(task):
            continue  # an actor stays where its state lives
        have = [w for w in pool if holds(task, w.id)]
        if len(have) > n:
            # The original holder goes last; then the fullest first.
            have.sort(key=lambda w: (w.id == task.worker, -load[w.id]))
            for worker in have[: len(have) - n]:
                if drop_holder(task, worker):
                    state.free_keys[worker.id].append(key)
                    load[worker.id] -= task.nbytes
                    dropped += 1
            continue
        others = sorted(
            (w for w in pool if not holds(task, w.id)), key=lambda w: (load[w.id], w.id)
        )
        for worker in others[: n - len(have)]:
            plan[task.worker].setdefault(key, []).append(worker.id)
            load[worker.id] += task.nbytes
    start(state, client.id, msg.request_id, dict(plan), move=False, dropped=dropped)


def rebalance(state: SchedulerState, client: ClientRecord, msg: RebalanceKeys) -> None:
    """Move results from the fullest chosen worker to the emptiest (module docstring)."""
    pool = chosen_workers(state, msg.workers)
    load = {w.id: w.nbytes for w in pool}
    tasks = (
        state.tasks.values()
        if msg.all_keys
        else [t for t in map(state.tasks.get, dict.fromkeys(msg.keys)) if t is not None]
    )
    movable: dict[str, list[TaskRecord]] = {w.id: [] for w in pool}
    for task in tasks:
        if task.state == MEMORY and actors.movable(task):
            for worker_id, candidates in movable.items():
                if holds(task, worker_id):
                    candidates.append(task)
    for candidates in movable.values():
        candidates.sort(key=lambda t: (_size(t), t.key))  # largest last: popped first
    plan: Plan = defaultdict(dict)
    moved: set[str] = set()
    while len(load) > 1:
        source = max(load, key=lambda w: (load[w], w))
        target = min(load, key=lambda w: (load[w], w))
        gap = load[source] - load[target]
        chosen = _largest_below(movable[source], gap, target, moved)
        if chosen is None:
            break
        moved.add(chosen.key)
        plan[source][chosen.key] = [target]
        load[source] -= _size(chosen)
        load[target] += _size(chosen)
    start(state, client.id, msg.request_id, dict(plan), move=True, dropped=0)


def _size(task: TaskRecord) -> int:
    return max(task.nbytes, 1)


def _largest_below(
    candidates: list[TaskRecord], gap: int, target: str, moved: set[str]
) -> TaskRecord | None:
    """The largest candidate smaller than ``gap`` that ``target`` lacks, taken off the list."""
    for i in range(len(candidates) - 1, -1, -1):
        task = candidates[i]
        if task.key in moved:
            del candidates[i]  # one move per result in one rebalance
            continue
        if holds(task, target):
            continue
        if _size(task) < gap:
            del candidates[i]
            return task
    return None


def chosen_workers(state: SchedulerState, names: list[str]) -> list[WorkerRecord]:
    """The staying workers named by name, address (with or without scheme) or host, as
    ``workers=`` names them everywhere (all staying ones if none named)."""
    staying = [w for w in state.workers.values() if w.leaving is None]
    if not names:
        return staying
    wanted = set(names)
    return [w for w in staying if w.aliases & wanted]


def start(
    state: SchedulerState, client_id: str, request_id: int, plan: Plan, *, move: bool, dropped: int
) -> None:
    """Ask each source for the keys it gives; answer at once if there is nothing to copy."""
    if not plan:
        state.reply(client_id, CopiesDone(request_id, 0, dropped))
        return
    rid = state.relays.new_id()
    state.shared.copies[rid] = CopyJob(client_id, request_id, plan, move, dropped=dropped)
    for source_id, keys in plan.items():
        state.emit(SendGetData(source_id, rid, sorted(keys)))


def source_reply(state: SchedulerState, worker: WorkerRecord, msg: DataReply) -> None:
    """A source sent the values: pass each on to its receivers."""
    job = state.shared.copies[msg.request_id]
    wanted = job.plan.pop(worker.id, None)
    if wanted is None:
        return
    parts: dict[str, dict[str, Pickled]] = defaultdict(dict)
    for key, blob in msg.data.items():
        for receiver_id in wanted.get(key, ()):
            if receiver_id in state.workers:
                parts[receiver_id][key] = blob
                job.origin[(key, receiver_id)] = worker.id
    for receiver_id, data in parts.items():
        job.puts[receiver_id] = job.puts.get(receiver_id, 0) + 1
        state.emit(SendPutData(receiver_id, msg.request_id, data))
    _maybe_done(state, msg.request_id)


def receiver_stored(state: SchedulerState, worker: WorkerRecord, msg: DataStored) -> None:
    """A receiver holds copies now: record them (and, for a move, let the source's go)."""
    job = state.shared.copies[msg.request_id]
    left = job.puts.pop(worker.id, 0)
    if not left:
        state.free_keys[worker.id].extend(msg.keys)  # not asked of it (any more)
        return
    if left > 1:
        job.puts[worker.id] = left - 1
    for key in msg.keys:
        source = state.workers.get(job.origin.pop((key, worker.id), ""))
        task = state.tasks.get(key)
        if task is None or task.state != MEMORY or worker.leaving is not None:
            # Released or lost meanwhile, or the receiver started leaving: its hand-off
            # may be over, so a copy there could be lost with it.
            state.free_keys[worker.id].append(key)
            continue
        if add_holder(task, worker):
            job.copied += 1
            how = "moved" if job.move else "copied"
            origin = source.name if source is not None else "a worker that left"
            state.log.append(
                (state.now, key, MEMORY, MEMORY, f"{how} from {origin} to {worker.name}")
            )
        if job.move and source is not None and source is not worker and drop_holder(task, source):
            state.free_keys[source.id].append(key)
            job.dropped += 1
    _maybe_done(state, msg.request_id)


def copies_kept(state: SchedulerState, worker: WorkerRecord, msg: CopiesKept) -> None:
    """``worker`` keeps the copies it fetched for its tasks: holders from now on, so
    placement counts them and their release frees them. A copy of a result that was
    released, lost or recomputed meanwhile, or on a worker on its way out, goes."""
    for key in msg.keys:
        task = state.tasks.get(key)
        if task is not None and task.state == PROCESSING and task.worker == worker.id:
            # Lost elsewhere and given to this very worker to compute again: the
            # ComputeTask crossed this report, and the worker answers it with the copy
            # it keeps ("held here"), so the copy is that result and must stay.
            continue
        if task is None or task.state != MEMORY or worker.leaving is not None or task.actor:
            state.free_keys[worker.id].append(key)
        else:
            add_holder(task, worker)


def worker_left(state: SchedulerState, worker_id: str) -> None:
    """Answers that will never come: from a source (not copied) or a receiver."""
    for rid, job in list(state.shared.copies.items()):
        job.plan.pop(worker_id, None)
        job.puts.pop(worker_id, None)
        _maybe_done(state, rid)


def _maybe_done(state: SchedulerState, rid: int) -> None:
    job = state.shared.copies[rid]
    if not job.plan and not job.puts:
        del state.shared.copies[rid]
        state.reply(job.client_id, CopiesDone(job.request_id, job.copied, job.dropped))
