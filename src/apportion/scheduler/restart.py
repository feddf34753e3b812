"""Restarting the cluster (``Client.restart``): every task and result dropped at once.

Every client is told about each of its keys (``KeysPending`` turns a finished
future back into a waiting one, ``KeysFailed`` "cancelled" then settles it), the
task table is emptied, and every worker is removed as a departure (not a crash, so
no task is blamed for it). A worker with a supervisor (``apportion worker
--nworkers``, a ``LocalCluster``) is told to exit (``RestartWorker``), and its
supervisor starts a fresh process. One without is disconnected: it forgets its
whole session - running tasks, results - and registers afresh in the same process.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from apportion.protocol import messages as m
from apportion.scheduler.events import Disconnect
from apportion.scheduler.records import ClientRecord

if TYPE_CHECKING:
    from apportion.scheduler.state import SchedulerState

#: ``WorkerRecord.leaving`` of the workers a restart removes.
RESTARTING = "restarting"


def restart(state: SchedulerState, client: ClientRecord, msg: m.RestartRequest) -> None:
    why = f" ({msg.reason})" if msg.reason else ""
    text = f"the cluster was restarted{why}; submit the work again"
    by_client: dict[str, list[str]] = defaultdict(list)
    for key, task in state.tasks.items():
        for client_id in task.wanted_by or ():
            by_client[client_id].append(key)
        state.log.append((state.now, key, task.state, "forgotten", text))
    for client_id, keys in by_client.items():
        if client_id in state.clients:
            state.send(client_id, m.KeysPending(keys))
            state.send(client_id, m.KeysFailed(keys, "cancelled", text))
    _cancel_scatters(state, text)
    _forget_all_tasks(state)
    unsupervised = []
    workers = list(state.workers.values())
    for worker in workers:
        if not worker.supervisor:
            unsupervised.append(worker.name)
        worker.processing.clear()
        worker.has_what.clear()
        worker.nbytes = 0
        worker.leaving = RESTARTING
        state._remove_worker(worker.id, text)
        if worker.supervisor:
            # Its supervisor starts a fresh process once it exits.
            state.send(worker.id, m.RestartWorker(text))
        else:
            # Disconnected, it drops its tasks and data and registers afresh.
            state._out.append(Disconnect(worker.id, text))
    state.log_info(f"the cluster was restarted{why}: {len(workers)} workers reset")
    state.send(client.id, m.RestartReply(msg.request_id, len(workers), sorted(unsupervised)))


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
            state.send(client_id, m.KeysFailed(keys, "cancelled", text))
            state.send(client_id, m.ScatterReply(request_id, []))


def _forget_all_tasks(state: SchedulerState) -> None:
    state.tasks.clear()
    state.ready.clear()
    state.functions.clear()
    state.function_users.clear()
    state.verdicts.clear()
    state.deaths.clear()
    state.retried.clear()
    state.fetch_failures.clear()
    state.done_keys.clear()
    state.free_keys.clear()
    for record in state.clients.values():
        record.wanted.clear()
