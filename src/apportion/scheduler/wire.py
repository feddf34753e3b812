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

from apportion.protocol import messages as m
from apportion.scheduler.events import (
    PeerCommand,
    Reply,
    SendComputeTask,
    SendDrainDone,
    SendDropPrefetch,
    SendForwardedRequest,
    SendFreeKeys,
    SendGetData,
    SendInstall,
    SendKeysDone,
    SendKeysFailed,
    SendKeysPending,
    SendLoadFunction,
    SendNotice,
    SendPrefetch,
    SendPutData,
    SendRefused,
    SendRejoinGranted,
    SendRestartWorker,
    SendRunCall,
    SendStealRequest,
    SendTaskErred,
    SendTaskNoted,
    SendTasksStillRunning,
    SendTopicMessage,
    SendUninstall,
    SendWorkerDeparted,
)


def to_wire(command: PeerCommand) -> tuple[str, m.Message]:
    """The peer ``command`` is for, and the message that tells it."""
    # One dict lookup per command: this runs for every task assigned and finished.
    return _CONVERTERS[type(command)](command)


def _compute_task(c: SendComputeTask) -> tuple[str, m.Message]:
    message = m.ComputeTask(
        c.key, c.func_id, c.args, c.who_has, c.priority, c.allocation, c.sizes, c.order
    )
    return c.worker_id, message


def _install(c: SendInstall) -> tuple[str, m.Message]:
    what = c.installation
    return c.worker_id, m.Install(c.request_id, what.kind, what.name, what.blob, what.load)


#: Command type -> its conversion; ``test_every_command_has_a_message`` keeps it whole.
_CONVERTERS: dict[type[Any], Callable[[Any], tuple[str, m.Message]]] = {
    SendComputeTask: _compute_task,
    SendLoadFunction: lambda c: (c.worker_id, m.LoadFunction(c.func_id, c.blob)),
    SendFreeKeys: lambda c: (c.worker_id, m.FreeKeys(c.keys)),
    SendGetData: lambda c: (c.worker_id, m.GetData(c.request_id, c.keys)),
    SendPrefetch: lambda c: (c.worker_id, m.Prefetch(c.who_has, c.sizes)),
    SendDropPrefetch: lambda c: (c.worker_id, m.DropPrefetch(c.keys)),
    SendStealRequest: lambda c: (c.worker_id, m.StealRequest(c.keys)),
    SendPutData: lambda c: (c.worker_id, m.PutData(c.request_id, c.data)),
    SendRejoinGranted: lambda c: (c.worker_id, m.RejoinGranted([c.key])),
    SendRestartWorker: lambda c: (c.worker_id, m.RestartWorker(c.reason)),
    SendDrainDone: lambda c: (c.worker_id, m.DrainDone(c.handed_off)),
    SendRefused: lambda c: (c.worker_id, m.Refused(c.reason)),
    SendRunCall: lambda c: (c.worker_id, m.RunCall(c.request_id, c.call)),
    SendInstall: _install,
    SendUninstall: lambda c: (c.worker_id, m.Uninstall(c.request_id, c.name)),
    SendKeysDone: lambda c: (c.client_id, m.KeysDone(c.keys)),
    SendKeysPending: lambda c: (c.client_id, m.KeysPending(c.keys)),
    SendKeysFailed: lambda c: (c.client_id, m.KeysFailed(c.keys, c.kind, c.text)),
    SendTaskErred: lambda c: (
        c.client_id,
        m.TaskErred(c.key, c.exception, c.traceback, c.attempts),
    ),
    SendNotice: lambda c: (c.client_id, m.Notice(c.level, c.text)),
    SendTopicMessage: lambda c: (c.client_id, m.TopicMessage(c.topic, c.data)),
    SendTaskNoted: lambda c: (c.client_id, m.TaskNoted(c.key, c.worker, c.note)),
    SendTasksStillRunning: lambda c: (
        c.client_id,
        m.TasksStillRunning(c.worker_id, c.worker, c.keys, c.states),
    ),
    SendForwardedRequest: lambda c: (c.client_id, m.ForwardedRequest(c.origin, c.request)),
    SendWorkerDeparted: lambda c: (c.client_id, m.WorkerDeparted(c.name)),
    Reply: lambda c: (c.peer_id, c.message),
}
