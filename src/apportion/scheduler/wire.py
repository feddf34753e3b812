"""The scheduler's commands as wire messages: one function, ``to_wire``.

The state machine decides in domain values (``events.py`` lists them); this
module alone knows which message carries each decision to its peer. It builds
message dataclasses and nothing else, so it is pure like the state machine, but it
sits beside it, not inside: only the service and the simulation import it (the
import contracts check this), so a change of wire format never reaches a handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apportion.protocol import messages as m
from apportion.scheduler.events import (
    AnnounceDeparture,
    AssignTask,
    DeliverMessage,
    DrainFinished,
    DropPrefetch,
    FetchData,
    ForwardRequest,
    FreeData,
    GrantRejoin,
    NotifyClient,
    OfferRunningTasks,
    PassNote,
    PeerCommand,
    PrefetchInputs,
    RefuseWorker,
    RemoteCall,
    RemoteInstall,
    RemoteUninstall,
    Reply,
    RestartProcess,
    ShipFunction,
    StealTasks,
    StoreData,
    TaskError,
    TaskFailed,
    TasksDone,
    TasksFailed,
    TasksPending,
)


def to_wire(command: PeerCommand) -> tuple[str, m.Message]:
    """The peer ``command`` is for, and the message that tells it."""
    # One dict lookup per command: this runs for every task assigned and finished.
    return _CONVERTERS[type(command)](command)


def _error_message(key: str, error: TaskError, attempts: int) -> m.Message:
    """The message telling a client that ``key`` failed, after ``attempts`` runs."""
    kind, detail, traceback = error
    if kind == "exception" and not isinstance(detail, str):
        return m.TaskErred(key, detail, traceback, attempts)
    return m.KeysFailed([key], kind, str(detail))


def _assign(c: AssignTask) -> tuple[str, m.Message]:
    message = m.ComputeTask(
        c.key, c.func_id, c.args, c.who_has, c.priority, c.allocation, c.sizes, c.order
    )
    return c.worker_id, message


def _install(c: RemoteInstall) -> tuple[str, m.Message]:
    what = c.installation
    return c.worker_id, m.Install(c.request_id, what.kind, what.name, what.blob, what.load)


#: Command type -> its conversion; ``test_every_command_has_a_message`` keeps it whole.
_CONVERTERS: dict[type[Any], Callable[[Any], tuple[str, m.Message]]] = {
    AssignTask: _assign,
    ShipFunction: lambda c: (c.worker_id, m.LoadFunction(c.func_id, c.blob)),
    FreeData: lambda c: (c.worker_id, m.FreeKeys(c.keys)),
    FetchData: lambda c: (c.worker_id, m.GetData(c.request_id, c.keys)),
    PrefetchInputs: lambda c: (c.worker_id, m.Prefetch(c.who_has, c.sizes)),
    DropPrefetch: lambda c: (c.worker_id, m.DropPrefetch(c.keys)),
    StealTasks: lambda c: (c.worker_id, m.StealRequest(c.keys)),
    StoreData: lambda c: (c.worker_id, m.PutData(c.request_id, c.data)),
    GrantRejoin: lambda c: (c.worker_id, m.RejoinGranted([c.key])),
    RestartProcess: lambda c: (c.worker_id, m.RestartWorker(c.reason)),
    DrainFinished: lambda c: (c.worker_id, m.DrainDone(c.handed_off)),
    RefuseWorker: lambda c: (c.worker_id, m.Refused(c.reason)),
    RemoteCall: lambda c: (c.worker_id, m.RunCall(c.request_id, c.call)),
    RemoteInstall: _install,
    RemoteUninstall: lambda c: (c.worker_id, m.Uninstall(c.request_id, c.name)),
    TasksDone: lambda c: (c.client_id, m.KeysDone(c.keys)),
    TasksPending: lambda c: (c.client_id, m.KeysPending(c.keys)),
    TasksFailed: lambda c: (c.client_id, m.KeysFailed(c.keys, c.kind, c.text)),
    TaskFailed: lambda c: (c.client_id, _error_message(c.key, c.error, c.attempts)),
    NotifyClient: lambda c: (c.client_id, m.Notice(c.level, c.text)),
    DeliverMessage: lambda c: (c.client_id, m.TopicMessage(c.topic, c.data)),
    PassNote: lambda c: (c.client_id, m.TaskNoted(c.key, c.worker, c.note)),
    OfferRunningTasks: lambda c: (
        c.client_id,
        m.TasksStillRunning(c.worker_id, c.worker, c.keys, c.states),
    ),
    ForwardRequest: lambda c: (c.client_id, m.ForwardedRequest(c.origin, c.request)),
    AnnounceDeparture: lambda c: (c.client_id, m.WorkerDeparted(c.name)),
    Reply: lambda c: (c.peer_id, c.message),
}
