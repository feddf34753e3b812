"""Gather and scatter through the scheduler, for clients that cannot reach workers.

On a cluster the client often sits on a login node that sees only the scheduler
(seed 004: "the clients do not talk directly to the workers"). The scheduler relays
results and scattered data as opaque bytes: one ``GetData``/``PutData`` per worker
per request, one reply to the client when every worker has answered.

Results of ``PIPE_FROM`` bytes or more are not held here: the service forwards them
from the worker's data port to the client as they arrive (``PipeData``), through a
buffer of a few MiB whatever their size, and the reply follows once they are through.
"""

from __future__ import annotations

from collections import defaultdict

from apportion.core.demand import PLAIN
from apportion.core.payload import Pickled
from apportion.protocol.peer_data import DIRECT_PUT, DataReply, DataStored
from apportion.protocol.tasks import (
    GatherReply,
    GatherRequest,
    ScatterPlaced,
    ScatterReply,
    ScatterRequest,
    WhoHasReply,
    WhoHasRequest,
)
from apportion.scheduler import copies, drain
from apportion.scheduler.books import Gather, Scatter
from apportion.scheduler.client_requests import want
from apportion.scheduler.events import (
    PipeData,
    PipeEnded,
    SendFreeKeys,
    SendGetData,
    SendKeysFailed,
    SendPutData,
)
from apportion.scheduler.holders import holders, holds
from apportion.scheduler.records import (
    MEMORY,
    ClientRecord,
    TaskRecord,
    WorkerRecord,
)
from apportion.scheduler.state import SchedulerState

#: Relayed results of this many bytes or more are forwarded, not held (``PipeData``).
PIPE_FROM = 1 << 20


def worker_joined(state: SchedulerState) -> None:
    """Scatters parked while no worker was connected are placed now."""
    relays = state.relays
    parked, relays.parked = relays.parked, []
    for client_id, request in parked:
        client = state.clients.get(client_id)
        if client is not None:
            scatter(state, client, request)


def worker_left(state: SchedulerState, worker_id: str) -> None:
    """Answers that will never come count as missing (gather) or are re-placed (scatter)."""
    relays = state.relays
    for rid, gather_ in list(relays.gathers.items()):
        keys = gather_.pending.pop(worker_id, None)
        if keys is not None:
            gather_.missing.extend(keys)
            _maybe_finish_gather(state, rid)
    for rid, scatter_ in list(relays.scatters.items()):
        if worker_id in scatter_.pending:
            del relays.scatters[rid]
            state.emit(
                SendKeysFailed(
                    scatter_.client_id,
                    scatter_.pending[worker_id],
                    "lost",
                    "the worker receiving scattered data left; scatter again",
                )
            )
    drain.worker_left(state, worker_id)
    copies.worker_left(state, worker_id)


def gather(state: SchedulerState, client: ClientRecord, msg: GatherRequest) -> None:
    """Relay small results; name the holders of those of ``direct_from`` bytes or more,
    which the client fetches itself, so a large value never passes through here."""
    by_worker: dict[str, list[str]] = defaultdict(list)
    piping: dict[str, list[str]] = defaultdict(list)
    missing: list[str] = []
    elsewhere: dict[str, list[str]] = {}
    for key in msg.keys:
        task = state.tasks.get(key)
        if task is None or task.state != MEMORY or task.worker not in state.workers:
            missing.append(key)
        elif 0 < msg.direct_from <= task.nbytes:
            elsewhere[key] = [state.workers[w].address for w in holders(task)]
            state.served_directly.add(key)  # the client fetches it there (out_of_memory.py)
        elif task.nbytes >= PIPE_FROM:
            piping[task.worker].append(key)
        else:
            by_worker[task.worker].append(key)
    if not by_worker and not piping:
        state.reply(client.id, GatherReply(msg.request_id, {}, missing, {}, elsewhere))
        return
    rid = state.relays.new_id()
    state.relays.gathers[rid] = Gather(
        client.id, msg.request_id, dict(by_worker), {}, dict(piping), missing, elsewhere=elsewhere
    )
    for worker_id, keys in by_worker.items():
        state.emit(SendGetData(worker_id, rid, keys))
    for worker_id, keys in piping.items():
        address = state.workers[worker_id].address
        state.emit(PipeData(worker_id, address, client.id, msg.request_id, rid, keys))


def pipe_ended(state: SchedulerState, event: PipeEnded) -> None:
    """Forwarded results are through (those ``broken`` only in part: missing)."""
    gather_ = state.relays.gathers.get(event.relay_id)
    if gather_ is None or gather_.piping.pop(event.worker_id, None) is None:
        return
    gather_.missing.extend(event.broken)
    _maybe_finish_gather(state, event.relay_id)


def data_reply(state: SchedulerState, worker: WorkerRecord, msg: DataReply) -> None:
    if msg.request_id in state.relays.handoffs:
        drain.source_reply(state, worker, msg)
        return
    if msg.request_id in state.shared.copies:
        copies.source_reply(state, worker, msg)
        return
    gather_ = state.relays.gathers.get(msg.request_id)
    if gather_ is None or gather_.pending.pop(worker.id, None) is None:
        return
    gather_.data.update(msg.data)
    gather_.missing.extend(msg.missing)
    gather_.errors.update(msg.errors)
    _maybe_finish_gather(state, msg.request_id)


def _maybe_finish_gather(state: SchedulerState, rid: int) -> None:
    gather_ = state.relays.gathers[rid]
    if not gather_.pending and not gather_.piping:
        del state.relays.gathers[rid]
        reply = GatherReply(
            gather_.request_id, gather_.data, gather_.missing, gather_.errors, gather_.elsewhere
        )
        state.reply(gather_.client_id, reply)


def scatter(state: SchedulerState, client: ClientRecord, msg: ScatterRequest) -> None:
    allowed = set(msg.workers)
    chosen = [w for w in state.workers.values() if not allowed or w.aliases & allowed]
    if not chosen and allowed and state.workers and state.config.fail_unsatisfiable:
        # A cluster that cannot grow will never have such a worker: say so now.
        names = ", ".join(sorted(allowed))
        text = f"no worker matches {names}, and this cluster cannot grow"
        state.emit(SendKeysFailed(client.id, list(msg.data), "unsatisfiable", text))
        state.reply(client.id, ScatterReply(msg.request_id, []))
        return
    if not chosen:
        state.relays.parked.append((client.id, msg))
        return
    # Spread keys over workers, fewest stored bytes first, so scatter balances memory.
    order = sorted(chosen, key=lambda w: (w.nbytes, len(w.has_what)))
    parts: dict[str, dict[str, Pickled]] = defaultdict(dict)
    for i, (key, blob) in enumerate(msg.data.items()):
        parts[order[i % len(order)].id][key] = blob
    rid = state.relays.new_id()
    pending = {worker_id: list(data) for worker_id, data in parts.items()}
    state.relays.scatters[rid] = Scatter(client.id, msg.request_id, pending)
    for worker_id, data in parts.items():
        state.emit(SendPutData(worker_id, rid, data))


def data_stored(state: SchedulerState, worker: WorkerRecord, msg: DataStored) -> None:
    if msg.request_id == DIRECT_PUT:
        return  # a client put it there and reports it with ScatterPlaced
    if msg.request_id in state.relays.handoffs:
        drain.receiver_stored(state, worker, msg)
        return
    if msg.request_id in state.shared.copies:
        copies.receiver_stored(state, worker, msg)
        return
    scatter_ = state.relays.scatters.get(msg.request_id)
    if scatter_ is None or scatter_.pending.pop(worker.id, None) is None:
        state.emit(SendFreeKeys(worker.id, msg.keys))
        return
    client = state.clients.get(scatter_.client_id)
    for key in msg.keys:
        scatter_.keys.append(key)
        _adopt(state, worker, client, key, msg.nbytes.get(key, 0))
    if not scatter_.pending:
        del state.relays.scatters[msg.request_id]
        if client is not None:
            state.reply(client.id, ScatterReply(scatter_.request_id, scatter_.keys))


def scatter_placed(state: SchedulerState, client: ClientRecord, msg: ScatterPlaced) -> None:
    """The client put data on workers itself (``direct_to_workers``): record where."""
    by_address = {w.address: w for w in state.workers.values()}
    placed, lost = [], []
    for key, (address, nbytes) in msg.placed.items():
        worker = by_address.get(address)
        if worker is None:
            lost.append(key)
            continue
        placed.append(key)
        _adopt(state, worker, client, key, int(nbytes))
    if lost:
        text = "the worker holding scattered data left before the scheduler heard of it"
        state.emit(SendKeysFailed(client.id, lost, "lost", text))
    state.reply(client.id, ScatterReply(msg.request_id, placed))


def _adopt(
    state: SchedulerState,
    worker: WorkerRecord,
    client: ClientRecord | None,
    key: str,
    nbytes: int,
) -> None:
    """Scattered data for ``key`` now lives on ``worker``; ``client`` holds a future."""
    task = state.tasks.get(key)
    if task is not None:
        # Same key scattered twice: keep the first copy, drop this one.
        if not holds(task, worker.id):
            state.emit(SendFreeKeys(worker.id, [key]))
        if client is not None:
            want(state, client, key)
        return
    task = TaskRecord(key, "", b"", (), PLAIN, 0, 0, state.next_seq())
    state.tasks[key] = task
    if client is not None:
        task.wanted_by = client.alone
        client.wanted.add(key)
    state.complete(task, worker, nbytes, "scattered")


def who_has(state: SchedulerState, client: ClientRecord, msg: WhoHasRequest) -> None:
    out: dict[str, list[str]] = {}
    for key in msg.keys:
        task: TaskRecord | None = state.tasks.get(key)
        if task is not None and task.state == MEMORY and task.worker in state.workers:
            out[key] = [state.workers[w].address for w in holders(task)]
    state.reply(client.id, WhoHasReply(msg.request_id, out))
