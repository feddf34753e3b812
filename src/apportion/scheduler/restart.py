"""Restarting the cluster (``Client.restart``): every task and result dropped at once.

Every client is told about each of its keys (``KeysPending`` turns a finished
future back into a waiting one, ``KeysFailed`` "cancelled" then settles it), the
task table is emptied, and every worker is removed as a departure (not a crash, so
no task is blamed for it). A worker with a supervisor (``apportion worker
--nworkers``, a ``LocalCluster``) is told to exit (``RestartWorker``), and its
supervisor starts a fresh process. One without is disconnected: it forgets its
whole session - running tasks, results - and registers afresh in the same process.

The work of durable clients (the job queue's runs) is not dropped: a run waiting
stays queued, and one running is queued again, as when its worker leaves
gracefully, so the queue records a new attempt instead of a cancellation.
Published datasets refer to results that no longer exist: they are dropped too, and
so are variables and queued items that refer to results.
"""

from __future__ import annotations

from collections import defaultdict
from heapq import heapify

from apportion.protocol.cluster import RestartReply, RestartRequest
from apportion.protocol.tasks import ScatterReply
from apportion.scheduler import coordination, membership
from apportion.scheduler.events import (
    Disconnect,
    SendKeysFailed,
    SendKeysPending,
    SendRestartWorker,
)
from apportion.scheduler.records import FORGOTTEN, PROCESSING, QUEUED, ClientRecord
from apportion.scheduler.shared_data import DATASET_OWNER
from apportion.scheduler.state import SchedulerState

#: ``WorkerRecord.leaving`` of the workers a restart removes.
RESTARTING = "restarting"


def restart(state: SchedulerState, client: ClientRecord, msg: RestartRequest) -> None:
    why = f" ({msg.reason})" if msg.reason else ""
    text = f"the cluster was restarted{why}; submit the work again"
    kept = _durable_work(state)
    by_client: dict[str, list[str]] = defaultdict(list)
    for key, task in state.tasks.items():
        if key in kept:
            continue
        for client_id in task.wanted_by or ():
            by_client[client_id].append(key)
        state.log.append((state.now, key, task.state, FORGOTTEN, text))
    for client_id, keys in by_client.items():
        if client_id in state.clients:
            state.emit(SendKeysPending(client_id, keys))
            state.emit(SendKeysFailed(client_id, keys, "cancelled", text))
    _cancel_scatters(state, text)
    _drop_datasets(state)
    _forget_tasks(state, kept)
    coordination.restarted(state)
    unsupervised = []
    workers = list(state.workers.values())
    for worker in workers:
        if not worker.supervisor:
            unsupervised.append(worker.name)
        # Kept tasks running there are queued again as the worker is removed.
        for key in [k for k in worker.processing if k not in kept]:
            del worker.processing[key]
            state.end_steal(key)
        worker.has_what.clear()
        worker.actors.clear()
        worker.nbytes = 0
        worker.leaving = RESTARTING
        membership.remove_worker(state, worker.id, text)
        if worker.supervisor:
            # Its supervisor starts a fresh process once it exits.
            state.emit(SendRestartWorker(worker.id, text))
        else:
            # Disconnected, it drops its tasks and data and registers afresh.
            state.emit(Disconnect(worker.id, text))
    state.log_info(f"the cluster was restarted{why}: {len(workers)} workers reset")
    state.reply(client.id, RestartReply(msg.request_id, len(workers), sorted(unsupervised)))


def _cancel_scatters(state: SchedulerState, text: str) -> None:
    """Scattered data not placed yet (no worker, or on its way): cancelled and answered,
    so the scattering client does not wait for it."""
    relays = state.relays
    pending = [(c, r.request_id, list(r.data)) for c, r in relays.parked]
    for scatter in relays.scatters.values():
        keys = scatter.keys + [k for part in scatter.pending.values() for k in part]
        pending.append((scatter.client_id, scatter.request_id, keys))
    relays.parked.clear()
    relays.scatters.clear()
    for client_id, request_id, keys in pending:
        if client_id in state.clients:
            state.emit(SendKeysFailed(client_id, keys, "cancelled", text))
            state.reply(client_id, ScatterReply(request_id, []))


def _durable_work(state: SchedulerState) -> set[str]:
    """Unfinished tasks only durable clients want, with no inputs (the job queue's runs)."""
    durable = {c.id for c in state.clients.values() if c.durable}
    if not durable:
        return set()
    return {
        key
        for key, task in state.tasks.items()
        if task.wanted_by
        and task.wanted_by <= durable
        and not task.deps
        and task.state in (QUEUED, PROCESSING)
    }


def _drop_datasets(state: SchedulerState) -> None:
    """Datasets naming results are gone with them; plain values stay published."""
    book = state.shared
    for name, (_, keys) in list(book.datasets.items()):
        if keys:
            del book.datasets[name]
            state.clients.pop(DATASET_OWNER + name, None)


def _forget_tasks(state: SchedulerState, kept: set[str]) -> None:
    """Every task but ``kept`` leaves the table, with everything said about it."""
    for key in [k for k in state.tasks if k not in kept]:
        task = state.tasks.pop(key)
        state.telemetry.moved(task, task.state, FORGOTTEN)
    users: dict[str, int] = defaultdict(int)
    for task in state.tasks.values():
        users[task.func_id] += 1
    state.function_users.clear()
    state.function_users.update(users)
    for func_id in [f for f in state.functions if f not in users]:
        del state.functions[func_id]
    for kind, heap in list(state.ready.items()):
        heap[:] = [entry for entry in heap if entry[2] in kept]
        heapify(heap)
        if not heap:
            del state.ready[kind]
    for book in (
        state.verdicts,
        state.deaths,
        state.retried,
        state.raised_on,
        state.fetch_failures,
    ):
        for key in [k for k in book if k not in kept]:
            del book[key]
    state.done_keys.clear()
    state.free_keys.clear()
    for record in state.clients.values():
        record.wanted.intersection_update(kept)
