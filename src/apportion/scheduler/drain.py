"""Draining a worker: finish its tasks, hand its needed results to others, let it go.

A worker stopped with SIGTERM sends ``WorkerDraining``. From then on placement
gives it nothing (``leaving`` is set), the tasks it runs finish where they are,
and once none is left the results that clients or unfinished tasks still need
are copied to the other workers through the scheduler, as opaque bytes: a
``GetData`` to the draining worker, a ``PutData`` to each receiver, ownership
moved on each ``DataStored``. Then ``DrainDone`` tells the worker to go, and its
departure costs no recomputation. Results that cannot be handed off (no other
worker, a value that cannot travel) are recomputed as after any loss.

``WorkerRecord.handoff`` is None until the hand-off starts, the relay's request id
while it is in flight, and 0 once ``DrainDone`` was sent.
"""

from __future__ import annotations

from collections import defaultdict

from apportion.core.payload import Pickled
from apportion.protocol.peer_data import DataReply, DataStored
from apportion.protocol.worker import WorkerDraining
from apportion.scheduler import actors
from apportion.scheduler.books import Handoff
from apportion.scheduler.events import SendDrainDone, SendGetData, SendPutData
from apportion.scheduler.holders import add_holder, drop_holder, holds
from apportion.scheduler.records import MEMORY, WorkerRecord
from apportion.scheduler.state import SchedulerState

#: ``WorkerRecord.handoff`` once the draining worker was told to go.
DONE = 0


def worker_draining(state: SchedulerState, worker: WorkerRecord, msg: WorkerDraining) -> None:
    if worker.draining:
        return
    worker.draining = True
    worker.leaving = "draining"
    reserved = state.tasks.get(worker.reserved_by or "")
    if reserved is not None:
        state.drop_reservation(reserved)  # it can reserve a worker that stays instead
        state.placement_due = True
    state.log_info(
        f"worker {worker.name} is draining (leaves within {msg.grace:g}s): "
        f"{len(worker.processing)} tasks running, {len(worker.has_what)} results held"
    )
    check(state, worker)


def check(state: SchedulerState, worker: WorkerRecord) -> None:
    """After any report of a draining worker: start the hand-off once nothing runs there."""
    if not worker.draining or worker.processing or worker.handoff is not None:
        return
    for key in sorted(worker.has_what):
        if drop_holder(state.tasks[key], worker):  # another worker holds a copy
            state.free_keys[worker.id].append(key)
    keys = sorted(
        k for k in worker.has_what if state.tasks[k].needed() and actors.movable(state.tasks[k])
    )
    if worker.actors:
        state.warn(
            f"worker {worker.name} is draining: its {len(worker.actors)} actors cannot move "
            "and fail when it leaves"
        )
    if keys and _receivers(state):
        rid = state.relays.new_id()
        state.relays.handoffs[rid] = Handoff(worker.id)
        worker.handoff = rid
        state.emit(SendGetData(worker.id, rid, keys))
        return
    if keys:
        state.warn(
            f"worker {worker.name} is draining and no other worker can take its "
            f"{len(keys)} needed results; they will be computed again"
        )
    _done(state, worker, 0)


def source_reply(state: SchedulerState, worker: WorkerRecord, msg: DataReply) -> None:
    """The draining worker sent its results: spread them over the receivers."""
    handoff = state.relays.handoffs.get(msg.request_id)
    if handoff is None or handoff.source != worker.id:
        return
    receivers = _receivers(state)
    if not receivers or not msg.data:
        _finish(state, msg.request_id)
        return
    parts: dict[str, dict[str, Pickled]] = defaultdict(dict)
    for i, (key, blob) in enumerate(sorted(msg.data.items())):
        parts[receivers[i % len(receivers)].id][key] = blob
    for receiver_id, data in parts.items():
        handoff.pending[receiver_id] = list(data)
        state.emit(SendPutData(receiver_id, msg.request_id, data))


def receiver_stored(state: SchedulerState, worker: WorkerRecord, msg: DataStored) -> None:
    """A receiver holds copies now: the results are its own from here on."""
    handoff = state.relays.handoffs[msg.request_id]
    if handoff.pending.pop(worker.id, None) is None:
        state.free_keys[worker.id].extend(msg.keys)
        return
    source = state.workers.get(handoff.source)
    for key in msg.keys:
        task = state.tasks.get(key)
        if task is None or task.state != MEMORY or source is None or not holds(task, source.id):
            if task is None or not holds(task, worker.id):  # not its own copy since
                state.free_keys[worker.id].append(key)  # released (or lost) meanwhile
            continue
        add_holder(task, worker)
        drop_holder(task, source)
        state.free_keys[source.id].append(key)
        handoff.moved += 1
        state.log.append(
            (state.now, key, MEMORY, MEMORY, f"handed from {source.name} to {worker.name}")
        )
    if not handoff.pending:
        _finish(state, msg.request_id)


def worker_left(state: SchedulerState, worker_id: str) -> None:
    """A hand-off loses its source (abandoned) or a receiver (its keys stay put)."""
    for rid, handoff in list(state.relays.handoffs.items()):
        if handoff.source == worker_id:
            del state.relays.handoffs[rid]
        elif handoff.pending.pop(worker_id, None) is not None and not handoff.pending:
            _finish(state, rid)


def _receivers(state: SchedulerState) -> list[WorkerRecord]:
    """Workers that stay, fewest stored bytes first, so a hand-off balances memory."""
    staying = [w for w in state.workers.values() if w.leaving is None]
    return sorted(staying, key=lambda w: (w.nbytes, len(w.has_what)))


def _finish(state: SchedulerState, rid: int) -> None:
    handoff = state.relays.handoffs.pop(rid)
    source = state.workers.get(handoff.source)
    if source is not None:
        _done(state, source, handoff.moved)


def _done(state: SchedulerState, worker: WorkerRecord, moved: int) -> None:
    worker.handoff = DONE
    state.log_info(f"worker {worker.name} drained; {moved} results handed to other workers")
    state.emit(SendDrainDone(worker.id, moved))
