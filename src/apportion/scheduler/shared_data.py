"""Data and facts the scheduler keeps for clients: datasets, metadata, who has what,
retrying failed tasks; ``copies.py`` does replicate and rebalance.

A published dataset is an opaque pickled object and the keys its futures refer
to. The keys are wanted by a pseudo-client of the dataset's own (as Dask's
``published-<name>``), so they outlive the publishing client until unpublished;
the scheduler never opens the bytes. Metadata are plain msgpack values in nested
dictionaries, addressed by a path of keys, as Dask's ``task_metadata``.

A retry runs a failed task again, with the failed inputs it needs, inputs
first. A failed input is kept (ERRED) while a record computed from it exists
(``SchedulerState.forget``), so a failed chain can be retried from its root.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apportion.protocol.cluster import (
    ClusterFactsReply,
    ClusterFactsRequest,
    NbytesReply,
    NbytesRequest,
)
from apportion.protocol.shared_data import (
    DatasetReply,
    DatasetRequest,
    MetadataReply,
    MetadataRequest,
    PublishDataset,
    SetMetadata,
    SharedDataAck,
    UnpublishDataset,
)
from apportion.protocol.tasks import RetryKeys
from apportion.scheduler import copies
from apportion.scheduler.client_requests import release, want
from apportion.scheduler.events import SendKeysFailed, SendKeysPending, failure_notice
from apportion.scheduler.holders import holders
from apportion.scheduler.records import ERRED, MEMORY, RELEASED, ClientRecord, TaskRecord, sees
from apportion.scheduler.state import SchedulerState

#: Prefix of the pseudo-client that holds a dataset's keys.
DATASET_OWNER = "dataset:"

replicate = copies.replicate
rebalance = copies.rebalance


# --- datasets -------------------------------------------------------------------------


def publish(state: SchedulerState, client: ClientRecord, msg: PublishDataset) -> None:
    """Keep a dataset; its keys are wanted by its pseudo-client from now on."""
    book = state.shared
    if msg.name in book.datasets and not msg.override:
        state.reply(client.id, SharedDataAck(msg.request_id, f"Dataset {msg.name} already exists"))
        return
    refusal = _publish_refusal(state, client, msg)
    if refusal:
        state.reply(client.id, SharedDataAck(msg.request_id, refusal))
        return
    owner_id = DATASET_OWNER + msg.name
    owner = state.clients.get(owner_id)
    if owner is None:
        owner = state.clients[owner_id] = ClientRecord(owner_id)
    # Replacing: one owner keeps its id, so keys in both versions must not be
    # released; only those the new version no longer has go, after the new ones are
    # wanted (one of them may be computed from an old one).
    dropped = sorted(owner.wanted - set(msg.keys))
    for key in msg.keys:
        want(state, owner, key)
    release(state, owner, dropped)
    book.datasets[msg.name] = (msg.data, list(msg.keys))
    if client.person:
        book.publishers[msg.name] = client.person
    else:
        book.publishers.pop(msg.name, None)
    state.reply(client.id, SharedDataAck(msg.request_id, ""))


def _publish_refusal(state: SchedulerState, client: ClientRecord, msg: PublishDataset) -> str:
    """Why a person may not publish this ("" if they may): a dataset of that name is
    another's, or one of its keys is."""
    if not client.person:
        return ""
    if msg.name in state.shared.datasets and not _sees_dataset(state, client, msg.name):
        return f"dataset {msg.name} is another person's"
    tasks = state.tasks
    foreign = [k for k in msg.keys if k in tasks and not sees(client, tasks[k])]
    return (
        f"{client.person} may not publish another person's tasks: {foreign[0]!r}" if foreign else ""
    )


def _sees_dataset(state: SchedulerState, client: ClientRecord, name: str) -> bool:
    """The owner sees every dataset; a person those they published."""
    return not client.person or state.shared.publishers.get(name, "") == client.person


def unpublish(state: SchedulerState, client: ClientRecord, msg: UnpublishDataset) -> None:
    """Forget datasets (unknown names are no error, as in Dask); their keys may go. A
    person's names of datasets not theirs are left alone, as unknown ones are."""
    for name in msg.names:
        if not _sees_dataset(state, client, name):
            continue
        if state.shared.datasets.pop(name, None) is not None:
            state.shared.publishers.pop(name, None)
            owner = state.clients.pop(DATASET_OWNER + name)
            release(state, owner, sorted(owner.wanted))
    state.reply(client.id, SharedDataAck(msg.request_id, ""))


def get_dataset(state: SchedulerState, client: ClientRecord, msg: DatasetRequest) -> None:
    """The dataset's bytes and keys, with every published name (for the error, the
    list); a person's own only, another's as if there were none."""
    mine = _sees_dataset(state, client, msg.name)
    found = state.shared.datasets.get(msg.name) if mine else None
    data, keys = found or (b"", [])
    names = sorted(n for n in state.shared.datasets if _sees_dataset(state, client, n))
    state.reply(client.id, DatasetReply(msg.request_id, int(found is not None), data, keys, names))


# --- metadata -------------------------------------------------------------------------


def set_metadata(state: SchedulerState, client: ClientRecord, msg: SetMetadata) -> None:
    """As Dask's: missing (or non-dictionary) levels on the way become dictionaries."""
    if not msg.path:
        state.reply(client.id, SharedDataAck(msg.request_id, "a metadata key is needed"))
        return
    level = state.shared.metadata
    for key in msg.path[:-1]:
        if not isinstance(level.get(key), dict):
            level[key] = {}
        level = level[key]
    level[msg.path[-1]] = msg.value
    state.reply(client.id, SharedDataAck(msg.request_id, ""))


def get_metadata(state: SchedulerState, client: ClientRecord, msg: MetadataRequest) -> None:
    """The value at the path, or ``found`` 0 where a level on the way is missing."""
    value: Any = state.shared.metadata
    for key in msg.path:
        if not isinstance(value, dict) or key not in value:
            state.reply(client.id, MetadataReply(msg.request_id, 0, None))
            return
        value = value[key]
    state.reply(client.id, MetadataReply(msg.request_id, 1, value))


# --- who has what ---------------------------------------------------------------------


def cluster_facts(state: SchedulerState, client: ClientRecord, msg: ClusterFactsRequest) -> None:
    """Who holds what, threads and assigned tasks, keyed by worker address as in Dask."""
    address = {w.id: w.address for w in state.workers.values()}
    tasks = state.tasks
    who_has = {
        key: [address[w] for w in holders(task)] if task.state == MEMORY else []
        for key, task in tasks.items()
        if sees(client, task)
    }
    workers = state.workers.values()

    def shown(keys: Iterable[str]) -> list[str]:  # a person sees their own keys only
        return sorted(k for k in keys if k in tasks and sees(client, tasks[k]))

    state.reply(
        client.id,
        ClusterFactsReply(
            msg.request_id,
            who_has,
            {w.address: shown(w.has_what) for w in workers},
            {w.address: w.nthreads for w in workers},
            {w.address: shown(state.assigned(w)) for w in workers},
        ),
    )


def nbytes(state: SchedulerState, client: ClientRecord, msg: NbytesRequest) -> None:
    """The size of each result in memory (as its worker measured it): of every key,
    or of the keys asked of that have one (Dask's ``nbytes``)."""
    tasks = state.tasks
    chosen = tasks.values() if msg.every else [tasks[k] for k in msg.keys if k in tasks]
    chosen = [task for task in chosen if sees(client, task)]
    sizes = {task.key: task.nbytes for task in chosen if task.state == MEMORY}
    state.reply(client.id, NbytesReply(msg.request_id, sizes))


# --- retry ----------------------------------------------------------------------------


def retry(state: SchedulerState, client: ClientRecord, msg: RetryKeys) -> None:
    """Run failed keys again; a finished one is said to be done, a pending one goes on."""
    for key in msg.keys:
        task = state.tasks.get(key)
        if task is None:
            text = f"{key!r} cannot be retried: the scheduler no longer knows it; submit it again"
            state.emit(SendKeysFailed(client.id, [key], "lost", text))
        elif task.state == ERRED:
            for failed in _failed_chain(state, task):
                _run_again(state, failed, client.id)
        elif task.state == MEMORY:
            state.done_keys[client.id].append(key)
        elif task.error is not None:
            # Failed while still running (its input failed): it cannot run again until
            # its worker gives it back, so the client hears the failure again rather
            # than waiting on a future nothing will settle.
            state.emit(failure_notice(client.id, key, task.error, 1))


def _failed_chain(state: SchedulerState, task: TaskRecord) -> list[TaskRecord]:
    """``task`` and the failed inputs it needs, transitively, inputs before dependents."""
    order: list[TaskRecord] = []
    seen = {task.key}
    stack: list[tuple[TaskRecord, bool]] = [(task, False)]
    while stack:
        current, inputs_done = stack.pop()
        if inputs_done:
            order.append(current)
            continue
        stack.append((current, True))
        for dep_key in current.deps:
            dep = state.tasks.get(dep_key)
            if dep is not None and dep.state == ERRED and dep_key not in seen:
                seen.add(dep_key)
                stack.append((dep, False))
    return order


def _run_again(state: SchedulerState, task: TaskRecord, client_id: str) -> None:
    cause = f"retried by client {client_id}"
    for dep_key in task.deps:
        dep = state.tasks.get(dep_key)
        if dep is not None and dep.state == RELEASED:
            state.recompute(dep, f"needed to retry {task.key}")
    blocked = next(
        (d for d in task.deps if d not in state.tasks or state.tasks[d].state == ERRED), None
    )
    if blocked is not None:
        dep = state.tasks.get(blocked)
        error = (
            dep.error
            if dep is not None and dep.error is not None
            else ("lost", f"{task.key!r} cannot be retried: input {blocked!r} is gone", b"")
        )
        task.error = error
        for wanter in task.wanted_by or ():
            state.emit(failure_notice(wanter, task.key, error, 1))
        for dep_key in task.deps:  # inputs recomputed above for nothing: let them go
            if dep_key in state.tasks:
                state.release_if_unneeded(state.tasks[dep_key])
        return
    task.error = None
    task.cancelled = False
    state.retried.pop(task.key, None)
    state.raised_on.pop(task.key, None)
    for wanter in task.wanted_by or ():
        # Futures of failed inputs retried along with the asked key wait again too.
        state.emit(SendKeysPending(wanter, [task.key]))
    state.start_again(task, cause)  # its released inputs are on their way already
