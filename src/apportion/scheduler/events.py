"""Events the scheduler state machine takes and commands it gives back.

Events carry the time (``now``, seconds) so that the state machine never reads a
clock. Commands are addressed to a peer id; the service turns them into sends,
and everything sent to one peer in one loop turn leaves as one frame.
"""

from __future__ import annotations

from dataclasses import dataclass

from apportion.protocol.messages import Message, RegisterWorker, WorkerDied


@dataclass(frozen=True, slots=True)
class ClientJoined:
    client_id: str
    now: float
    #: Its work outlives a cluster restart (the job queue's runs are queued again,
    #: not cancelled, when a Dask client restarts the cluster).
    durable: bool = False


@dataclass(frozen=True, slots=True)
class ClientLeft:
    client_id: str
    now: float


@dataclass(frozen=True, slots=True)
class WorkerJoined:
    worker_id: str
    registration: RegisterWorker
    now: float


@dataclass(frozen=True, slots=True)
class WorkerLeft:
    worker_id: str
    now: float


@dataclass(frozen=True, slots=True)
class FromClient:
    """The messages of one frame from a client."""

    client_id: str
    messages: list[Message]
    now: float


@dataclass(frozen=True, slots=True)
class FromWorker:
    """The messages of one frame from a worker."""

    worker_id: str
    messages: list[Message]
    now: float


@dataclass(frozen=True, slots=True)
class WorkerDeathReport:
    """A supervisor said how one of its worker processes ended."""

    report: WorkerDied
    now: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passes (the service sends one about twice a second): find silent workers."""

    now: float


@dataclass(frozen=True, slots=True)
class PlacementDue:
    """Run the batched placement pass (the service sends this once per loop turn)."""

    now: float


Event = (
    ClientJoined
    | ClientLeft
    | WorkerJoined
    | WorkerLeft
    | WorkerDeathReport
    | FromClient
    | FromWorker
    | PlacementDue
    | Tick
)


@dataclass(frozen=True, slots=True)
class Send:
    peer_id: str
    message: Message


@dataclass(frozen=True, slots=True)
class Log:
    level: str  #: "info" or "warning"
    text: str


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the connection to this peer: the scheduler already treats it as gone."""

    peer_id: str
    reason: str


Command = Send | Log | Disconnect
