"""The scheduler's commands as wire messages: one function, ``to_wire``.

Each command is named for the message it becomes (``SendComputeTask`` becomes
``ComputeTask``), so that one name stands for one thing from the state machine to the
peer. The state machine decides in domain values (an ``Allocation``, an
``Installation``) and says to whom; this module alone builds the message from them.
It is pure like the state machine, but sits beside it, not inside: only the service
and the simulation import it (the import contracts check this), so a change of wire
format never reaches a handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apportion.protocol.base import Message
from apportion.protocol.coordination import TopicMessage
from apportion.protocol.handshake import Refused
from apportion.protocol.peer_data import GetData, PutData
from apportion.protocol.remote_calls import Install, RemoteCall, Uninstall
from apportion.protocol.services import (
    ForwardedRequest,
    TaskNoted,
    TasksStillRunning,
    WorkerDeparted,
)
from apportion.protocol.tasks import (
    KeysDone,
    KeysFailed,
    KeysPending,
    Notice,
    TaskErred,
    TaskPreempted,
)
from apportion.protocol.worker import (
    ComputeTask,
    DrainDone,
    DropPrefetch,
    FreeKeys,
    HeartbeatInterval,
    InterruptTasks,
    LoadFunction,
    Prefetch,
    RejoinGranted,
    RestartWorker,
    StealRequest,
)
from apportion.scheduler.events import (
    PeerCommand,
    Reply,
    SendComputeTask,
    SendDrainDone,
    SendDropPrefetch,
    SendForwardedRequest,
    SendFreeKeys,
    SendGetData,
    SendHeartbeatInterval,
    SendInstall,
    SendInterruptTasks,
    SendKeysDone,
    SendKeysFailed,
    SendKeysPending,
    SendLoadFunction,
    SendNotice,
    SendPrefetch,
    SendPutData,
    SendRefused,
    SendRejoinGranted,
    SendRemoteCall,
    SendRestartWorker,
    SendStealRequest,
    SendTaskErred,
    SendTaskNoted,
    SendTaskPreempted,
    SendTasksStillRunning,
    SendTopicMessage,
    SendUninstall,
    SendWorkerDeparted,
)


def to_wire(command: PeerCommand) -> tuple[str, Message]:
    """The peer ``command`` is for, and the message that tells it."""
    # One dict lookup per command: this runs for every task assigned and finished.
    return _CONVERTERS[type(command)](command)


def _compute_task(c: SendComputeTask) -> tuple[str, Message]:
    message = ComputeTask(
        c.key, c.func_id, c.args, c.who_has, c.priority, c.allocation, c.sizes, c.order
    )
    return c.worker_id, message


def _install(c: SendInstall) -> tuple[str, Message]:
    what = c.installation
    return c.worker_id, Install(c.request_id, what.kind, what.name, what.blob, what.load)


#: Command type -> its conversion; ``test_every_command_has_a_message`` keeps it whole.
_CONVERTERS: dict[type[Any], Callable[[Any], tuple[str, Message]]] = {
    SendComputeTask: _compute_task,
    SendLoadFunction: lambda c: (c.worker_id, LoadFunction(c.func_id, c.blob)),
    SendFreeKeys: lambda c: (c.worker_id, FreeKeys(c.keys)),
    SendInterruptTasks: lambda c: (c.worker_id, InterruptTasks(c.keys)),
    SendGetData: lambda c: (c.worker_id, GetData(c.request_id, c.keys)),
    SendPrefetch: lambda c: (c.worker_id, Prefetch(c.who_has, c.sizes)),
    SendDropPrefetch: lambda c: (c.worker_id, DropPrefetch(c.keys)),
    SendStealRequest: lambda c: (c.worker_id, StealRequest(c.keys)),
    SendPutData: lambda c: (c.worker_id, PutData(c.request_id, c.data)),
    SendRejoinGranted: lambda c: (c.worker_id, RejoinGranted([c.key])),
    SendRestartWorker: lambda c: (c.worker_id, RestartWorker(c.reason)),
    SendHeartbeatInterval: lambda c: (c.worker_id, HeartbeatInterval(c.seconds)),
    SendDrainDone: lambda c: (c.worker_id, DrainDone(c.handed_off)),
    SendRefused: lambda c: (c.worker_id, Refused(c.reason)),
    SendRemoteCall: lambda c: (c.worker_id, RemoteCall(c.request_id, c.call)),
    SendInstall: _install,
    SendUninstall: lambda c: (c.worker_id, Uninstall(c.request_id, c.name)),
    SendKeysDone: lambda c: (c.client_id, KeysDone(c.keys, c.types)),
    SendKeysPending: lambda c: (c.client_id, KeysPending(c.keys)),
    SendKeysFailed: lambda c: (c.client_id, KeysFailed(c.keys, c.kind, c.text)),
    SendTaskErred: lambda c: (
        c.client_id,
        TaskErred(c.key, c.exception, c.traceback, c.attempts),
    ),
    SendNotice: lambda c: (c.client_id, Notice(c.level, c.text)),
    SendTopicMessage: lambda c: (c.client_id, TopicMessage(c.topic, c.data)),
    SendTaskNoted: lambda c: (c.client_id, TaskNoted(c.key, c.worker, c.note)),
    SendTasksStillRunning: lambda c: (
        c.client_id,
        TasksStillRunning(c.worker_id, c.worker, c.keys, c.states),
    ),
    SendForwardedRequest: lambda c: (c.client_id, ForwardedRequest(c.origin, c.request, c.person)),
    SendTaskPreempted: lambda c: (c.client_id, TaskPreempted(c.key, c.worker, c.reason)),
    SendWorkerDeparted: lambda c: (c.client_id, WorkerDeparted(c.name)),
    Reply: lambda c: (c.peer_id, c.message),
}
