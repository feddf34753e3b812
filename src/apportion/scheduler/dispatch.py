"""The scheduler's state machine: events in, commands out, no I/O and no clock.

``handle(state, event)`` is the one entry: each event type and each message type
has one handler function in a module above the state (``membership``,
``client_requests``, ``worker_reports``, ``relay`` ...), and ``handle`` returns the
commands the state gathered meanwhile: decisions as domain values
(``SendComputeTask``, ``SendKeysDone`` ...) and answers to client requests as
``Reply`` (``events.py``); the service makes them messages (``wire.py``). The
records and their low-level changes are in ``state.py``; its header tells the
theory of operation.

A function, not a method of ``SchedulerState``: the handlers import the state, so
the state cannot import them back. Unlike Dask's ``Scheduler(SchedulerState,
ServerNode)``, nothing here does I/O: the service owns a ``SchedulerState``, it is
not one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apportion.protocol.base import Message
from apportion.protocol.cluster import (
    BacklogRequest,
    CheckDemands,
    ClusterFactsRequest,
    DumpRequest,
    InfoRequest,
    LogsRequest,
    NbytesRequest,
    RestartRequest,
    StatusRequest,
    StoryRequest,
    VersionsRequest,
    WhyRequest,
)
from apportion.protocol.coordination import (
    EventRequest,
    LeaseRequest,
    Publish,
    RefreshLeases,
    Subscribe,
    Unsubscribe,
    ValueRequest,
)
from apportion.protocol.peer_data import DataReply, DataStored
from apportion.protocol.people import AddPerson, ListPeople, RemovePerson
from apportion.protocol.remote_calls import (
    CallAnswered,
    CallOnWorkers,
    InstallOnWorkers,
    UninstallFromWorkers,
)
from apportion.protocol.services import (
    AdoptTask,
    ForwardedReply,
    RegisterService,
    StopTasks,
    TaskNote,
)
from apportion.protocol.shared_data import (
    DatasetRequest,
    MetadataRequest,
    PublishDataset,
    RebalanceKeys,
    ReplicateKeys,
    SetMetadata,
    UnpublishDataset,
)
from apportion.protocol.tasks import (
    CancelKeys,
    FireAndForget,
    GatherRequest,
    RecipeRequest,
    ReleaseKeys,
    RetryKeys,
    ScatterPlaced,
    ScatterRequest,
    SubmitTasks,
    WhoHasRequest,
)
from apportion.protocol.worker import (
    CopiesKept,
    Heartbeat,
    MissingDependency,
    ResultTooLarge,
    StealResponse,
    TaskFinished,
    TaskRaised,
    TaskRejoining,
    TasksDropped,
    TaskSeceded,
    WorkerClosing,
    WorkerDraining,
)
from apportion.scheduler import (
    channels,
    client_requests,
    coordination,
    copies,
    drain,
    leases,
    membership,
    out_of_memory,
    people,
    people_gate,
    placement,
    preemption,
    recipes,
    relay,
    remote_calls,
    restart,
    seceding,
    shared_data,
    stealing,
    task_hooks,
    worker_reports,
)
from apportion.scheduler.events import (
    ClientJoined,
    ClientLeft,
    Command,
    Event,
    FromClient,
    FromWorker,
    PipeEnded,
    PlacementDue,
    Tick,
    WorkerDeathReport,
    WorkerJoined,
    WorkerLeft,
)
from apportion.scheduler.records import ClientRecord, WorkerRecord
from apportion.scheduler.state import SchedulerState


def handle(state: SchedulerState, event: Event) -> list[Command]:
    """Apply one event; return the decisions, replies and log lines it led to."""
    state.now = event.now
    EVENT_HANDLERS[type(event)](state, event)
    task_hooks.flush(state)
    return coordination.read_notices(state, state.take_commands())


def _placement_due(state: SchedulerState, event: PlacementDue) -> None:
    state.placement_due = False
    placement.place(state)
    stealing.balance(state)  # what the pass left idle takes work queued elsewhere


def _tick(state: SchedulerState, event: Tick) -> None:
    membership.tick(state, event)
    preemption.check(state)
    if not state.placement_due:  # else the pass that is due balances after placing
        # Time alone changes what a move is worth: a task that runs past what its
        # group takes is expected to run on, and what waits behind it should move.
        stealing.balance(state)


def _from_client(state: SchedulerState, event: FromClient) -> None:
    client = state.clients[event.client_id]
    # A person's requests are narrowed to their own work first; the owner's are not.
    messages = people_gate.admit(state, client, event.messages) if client.person else event.messages
    _dispatch(state, CLIENT_HANDLERS, client, messages, f"client {client.id}")


def _from_worker(state: SchedulerState, event: FromWorker) -> None:
    worker = state.workers.get(event.worker_id)
    if worker is not None:
        worker.last_seen = event.now
        _dispatch(state, WORKER_HANDLERS, worker, event.messages, f"worker {worker.name}")
        if worker.draining:
            drain.check(state, worker)


def _dispatch(
    state: SchedulerState,
    handlers: dict[type[Message], Callable[[SchedulerState, Any, Any], None]],
    peer: ClientRecord | WorkerRecord,
    messages: list[Message],
    who: str,
) -> None:
    """One handler per message type; a type not served from this peer is said, not run."""
    for msg in messages:
        handler = handlers.get(type(msg))
        if handler is None:
            if task_hooks.forward(state, peer, msg):
                continue  # a request another client serves
            state.warn(f"{who} sent unexpected {type(msg).__name__}; ignored")
        else:
            handler(state, peer, msg)


EVENT_HANDLERS: dict[type[Any], Callable[[SchedulerState, Any], None]] = {
    ClientJoined: membership.client_joined,
    ClientLeft: membership.client_left,
    WorkerJoined: membership.worker_joined,
    WorkerLeft: membership.worker_left,
    WorkerDeathReport: membership.death_report,
    FromClient: _from_client,
    FromWorker: _from_worker,
    Tick: _tick,
    PlacementDue: _placement_due,
    PipeEnded: relay.pipe_ended,
}

CLIENT_HANDLERS: dict[type[Message], Callable[[SchedulerState, ClientRecord, Any], None]] = {
    SubmitTasks: client_requests.submit,
    ReleaseKeys: client_requests.release_keys,
    CancelKeys: client_requests.cancel_keys,
    GatherRequest: relay.gather,
    ScatterRequest: relay.scatter,
    ScatterPlaced: relay.scatter_placed,
    WhoHasRequest: relay.who_has,
    WhyRequest: client_requests.why,
    InfoRequest: client_requests.info,
    BacklogRequest: client_requests.waiting_work,
    CheckDemands: client_requests.check_demands,
    StatusRequest: client_requests.cluster_status,
    StoryRequest: client_requests.story,
    DumpRequest: client_requests.dump,
    CallOnWorkers: remote_calls.run,
    InstallOnWorkers: remote_calls.install,
    UninstallFromWorkers: remote_calls.uninstall,
    VersionsRequest: remote_calls.versions,
    LogsRequest: remote_calls.logs,
    PublishDataset: shared_data.publish,
    UnpublishDataset: shared_data.unpublish,
    DatasetRequest: shared_data.get_dataset,
    SetMetadata: shared_data.set_metadata,
    MetadataRequest: shared_data.get_metadata,
    ClusterFactsRequest: shared_data.cluster_facts,
    NbytesRequest: shared_data.nbytes,
    RecipeRequest: recipes.recipe,
    RetryKeys: shared_data.retry,
    ReplicateKeys: shared_data.replicate,
    RebalanceKeys: shared_data.rebalance,
    RestartRequest: restart.restart,
    RegisterService: task_hooks.register_service,
    ForwardedReply: task_hooks.forwarded_reply,
    AdoptTask: task_hooks.adopt_task,
    StopTasks: task_hooks.stop_tasks,
    LeaseRequest: leases.lease_request,
    RefreshLeases: leases.refresh,
    EventRequest: channels.event_request,
    ValueRequest: channels.value_request,
    Subscribe: channels.subscribe,
    Unsubscribe: channels.unsubscribe,
    Publish: channels.publish,
    FireAndForget: coordination.fire_and_forget,
    AddPerson: people.add_person,
    ListPeople: people.list_people,
    RemovePerson: people.remove_person,
}

WORKER_HANDLERS: dict[type[Message], Callable[[SchedulerState, WorkerRecord, Any], None]] = {
    TaskFinished: worker_reports.task_finished,
    TaskSeceded: seceding.task_seceded,
    TaskRejoining: seceding.task_rejoining,
    TaskRaised: worker_reports.task_raised,
    ResultTooLarge: out_of_memory.result_too_large,
    MissingDependency: worker_reports.missing_dependency,
    TasksDropped: worker_reports.tasks_dropped,
    StealResponse: stealing.steal_answered,
    CopiesKept: copies.copies_kept,
    WorkerClosing: worker_reports.worker_closing,
    WorkerDraining: drain.worker_draining,
    Heartbeat: worker_reports.heartbeat,
    DataReply: relay.data_reply,
    DataStored: relay.data_stored,
    CallAnswered: remote_calls.call_answered,
    TaskNote: task_hooks.task_note,
    Publish: channels.publish,  # what tasks print and warn (worker/printing.py)
}
