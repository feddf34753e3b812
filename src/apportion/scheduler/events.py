"""Events the scheduler state machine takes and commands it gives back.

Events carry the time (``now``, seconds) so that the state machine never reads a
clock. Events in are wire messages as they arrived (``FromClient``,
``FromWorker``); commands out are not.

Commands come in three kinds:

* **Decisions** are one frozen dataclass per kind, each named for the message it
  becomes: ``Send`` and the message's name. Instructions to a worker
  (``SendComputeTask`` becomes ``ComputeTask``, ``SendFreeKeys``, ``SendGetData``
  ...) and notices to a client (``SendKeysDone``, ``SendTaskErred``, ``SendNotice``
  ...). Each says to whom, and what the scheduler decided in its own terms (an
  ``Allocation``, an ``Installation``); ``scheduler/wire.py`` builds the message
  from it, in the service and in the simulation, and no module of the state
  machine imports it.
* **Answers to questions** are one generic ``Reply`` wrapping the reply message a
  client's request asked for (``InfoReply``, ``WhyReply``, ``GatherReply`` ...):
  the request named its answer's shape, so there is no decision to model.
* **Effects on the service itself**: ``Log``, ``Disconnect``, ``PipeData``, and
  the people file and credentials (``SavePeople``, ``IssueCredential``).

The service sends everything addressed to one peer in one loop turn as one frame.
"""

from __future__ import annotations

from dataclasses import dataclass

from apportion.core.allocation import Allocation
from apportion.core.payload import Pickled
from apportion.core.people import Person
from apportion.protocol.base import Message
from apportion.protocol.worker import RegisterWorker, WorkerDied


@dataclass(frozen=True, slots=True)
class ClientJoined:
    client_id: str
    now: float
    #: Its work outlives a cluster restart (the job queue's runs are queued again,
    #: not cancelled, when a Dask client restarts the cluster).
    durable: bool = False
    #: The person it proved it speaks for in the handshake ("": the owner).
    person: str = ""
    #: The name it gave in the handshake (what the status calls its share).
    name: str = ""


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
class PipeEnded:
    """The service finished a ``PipeData``: the values of ``broken`` did not arrive
    whole (the worker went away while sending), and the client drops what it got of them."""

    relay_id: int
    worker_id: str
    broken: list[str]
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
    | PipeEnded
    | Tick
)


#: How a task failed: (kind, detail, traceback). ``kind`` "exception" carries the
#: pickled exception and traceback; "lost", "cancelled", "unsatisfiable",
#: "crashed", "memory" ... carry a text for users and no traceback.
TaskError = tuple[str, Pickled | str, Pickled]


# --- decisions: instructions to a worker --------------------------------------------


@dataclass(frozen=True, slots=True)
class SendLoadFunction:
    """The worker will run tasks of a function it does not have yet: give it the bytes."""

    worker_id: str
    func_id: str
    blob: bytes  #: the pickled function, unpickled only on the worker


@dataclass(frozen=True, slots=True)
class SendComputeTask:
    """Run ``key`` on the worker with ``allocation`` (its ``SendLoadFunction`` went first)."""

    worker_id: str
    key: str
    func_id: str
    args: Pickled
    #: every input key -> data addresses of the workers holding it
    who_has: dict[str, list[str]]
    priority: int
    allocation: Allocation
    #: every input key -> its size in bytes
    sizes: dict[str, int]
    #: its place in the start order within its priority (``TaskRecord.seq``)
    order: int


@dataclass(frozen=True, slots=True)
class SendFreeKeys:
    """Drop these results (or the result of these running tasks) from the worker."""

    worker_id: str
    keys: list[str]


@dataclass(frozen=True, slots=True)
class SendInterruptTasks:
    """Stop the work of these running tasks (preempted); the worker reports each as it
    ends, its resources held until then (``preemption.py``)."""

    worker_id: str
    keys: list[str]


@dataclass(frozen=True, slots=True)
class SendPrefetch:
    """The task that reserved the worker will run there next: fetch these inputs now."""

    worker_id: str
    who_has: dict[str, list[str]]
    sizes: dict[str, int]


@dataclass(frozen=True, slots=True)
class SendDropPrefetch:
    """The task inputs were prefetched for will not run on the worker: drop them."""

    worker_id: str
    keys: list[str]


@dataclass(frozen=True, slots=True)
class SendStealRequest:
    """Let these assigned tasks go unless they started: an idle worker takes them."""

    worker_id: str
    keys: list[str]


@dataclass(frozen=True, slots=True)
class SendGetData:
    """Send the values of ``keys`` to the scheduler, answering ``request_id``."""

    worker_id: str
    request_id: int  #: the scheduler's own id for the relay (gather, drain, copy)
    keys: list[str]


@dataclass(frozen=True, slots=True)
class SendPutData:
    """Keep these values and confirm under ``request_id``."""

    worker_id: str
    request_id: int
    data: dict[str, Pickled]


@dataclass(frozen=True, slots=True)
class SendRejoinGranted:
    """The seceded task ``key`` holds its resources on this worker again: it runs on."""

    worker_id: str
    key: str


@dataclass(frozen=True, slots=True)
class SendHeartbeatInterval:
    """Leave at least ``seconds`` between heartbeats (0: the worker's own interval)."""

    worker_id: str
    seconds: float


@dataclass(frozen=True, slots=True)
class SendRestartWorker:
    """Exit so that the supervisor starts a fresh process (a cluster restart)."""

    worker_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SendDrainDone:
    """The draining worker's results are safe elsewhere: it may close now."""

    worker_id: str
    handed_off: int  #: results copied to other workers


@dataclass(frozen=True, slots=True)
class SendRefused:
    """The registration is refused (its name is taken): the peer never became a worker."""

    worker_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Installation:
    """An upload or plugin every worker must have, joining ones included."""

    kind: str  #: "upload" or "plugin"
    name: str
    blob: bytes
    load: int  #: uploads: 1 imports (or reloads) what the file holds


@dataclass(frozen=True, slots=True)
class SendRemoteCall:
    """Run a client's pickled call on the worker, outside tasks."""

    worker_id: str
    request_id: int  #: ``NO_REPLY`` when nobody waits for the answer
    call: bytes


@dataclass(frozen=True, slots=True)
class SendInstall:
    """Install an upload or plugin on the worker."""

    worker_id: str
    request_id: int  #: ``NO_REPLY`` when nobody waits for the answer
    installation: Installation


@dataclass(frozen=True, slots=True)
class SendUninstall:
    """Tear a plugin down on the worker."""

    worker_id: str
    request_id: int
    name: str


# --- decisions: notices to a client --------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendKeysDone:
    """These keys the client wants are in memory, with their results' type names
    ("" where unknown), one for each key."""

    client_id: str
    keys: list[str]
    types: list[str]


@dataclass(frozen=True, slots=True)
class SendKeysPending:
    """These keys, said done or failed before, are on their way again: wait."""

    client_id: str
    keys: list[str]


@dataclass(frozen=True, slots=True)
class SendKeysFailed:
    """These keys will not be computed, for one reason that is not an exception."""

    client_id: str
    keys: list[str]
    kind: str  #: "unsatisfiable", "cancelled", "lost"
    text: str


@dataclass(frozen=True, slots=True)
class SendTaskErred:
    """``key`` raised: its exception and traceback, pickled by the worker."""

    client_id: str
    key: str
    exception: Pickled
    traceback: Pickled
    attempts: int  #: runs that raised, retries included


def failure_notice(
    client_id: str, key: str, error: TaskError, attempts: int
) -> SendTaskErred | SendKeysFailed:
    """The notice telling a client that ``key`` failed with ``error`` after ``attempts``
    runs: the exception it raised, or the scheduler's reason in words."""
    kind, detail, traceback = error
    if kind == "exception" and not isinstance(detail, str):
        return SendTaskErred(client_id, key, detail, traceback, attempts)
    return SendKeysFailed(client_id, [key], kind, str(detail))


@dataclass(frozen=True, slots=True)
class SendTopicMessage:
    """``data`` was published on ``topic``, to which the client subscribes."""

    client_id: str
    topic: str
    data: Pickled


@dataclass(frozen=True, slots=True)
class SendNotice:
    """Something the client should know and may show its user (no key fails)."""

    client_id: str
    level: str  #: "warning"
    text: str


# --- decisions: what a service client hears (``task_hooks.py``) -----------------------


@dataclass(frozen=True, slots=True)
class SendTaskNoted:
    """A worker's note about a running task, unread, for a client wanting the task."""

    client_id: str
    key: str
    worker: str  #: the name of the worker the note came from
    note: bytes


@dataclass(frozen=True, slots=True)
class SendTasksStillRunning:
    """A worker joined with these tasks still running: the service adopts or stops them."""

    client_id: str
    worker_id: str
    worker: str
    keys: list[str]
    states: dict[str, str]  #: the state of those the scheduler has a task for


@dataclass(frozen=True, slots=True)
class SendForwardedRequest:
    """A client's request (encoded, unread) for the service serving its kind."""

    client_id: str
    origin: str  #: the client that asked, to whom the answer is relayed
    request: bytes
    #: The person that client acts as ("": the owner): the service serves them
    #: only what is theirs (the job queue: their own runs).
    person: str = ""


@dataclass(frozen=True, slots=True)
class SendTaskPreempted:
    """A preemptible task a client wants is being stopped, to run again (``preemption.py``)."""

    client_id: str
    key: str
    worker: str  #: the name of the worker it is stopped on
    reason: str


@dataclass(frozen=True, slots=True)
class SendWorkerDeparted:
    """The last worker named ``name`` left (a service settles what it ran there)."""

    client_id: str
    name: str


# --- answers and effects on the service ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a client's request, in the shape the request asked for."""

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


@dataclass(frozen=True, slots=True)
class PipeData:
    """Forward the values of ``keys`` from the worker's data port to the client as they
    arrive, through a bounded buffer, as a ``DataReply`` answering the client's
    ``request_id``; then tell the state ``PipeEnded(relay_id, ...)``."""

    worker_id: str
    address: str  #: the worker's data address
    client_id: str
    request_id: int
    relay_id: int
    keys: list[str]


@dataclass(frozen=True, slots=True)
class SavePeople:
    """Store the people admitted now (the service keeps them, with their secrets, in
    its people file, so that they survive a restart), and forget the secrets of
    those no longer among them."""

    people: tuple[Person, ...]


@dataclass(frozen=True, slots=True)
class IssueCredential:
    """Answer ``request_id`` of client ``peer_id`` with ``PersonAdded``: person
    ``name``'s token, with a fresh secret the service makes (the state never holds
    a secret, nor makes a random one)."""

    peer_id: str
    request_id: int
    name: str


#: Instructions to a worker.
WorkerCommand = (
    SendLoadFunction
    | SendComputeTask
    | SendFreeKeys
    | SendInterruptTasks
    | SendGetData
    | SendPrefetch
    | SendDropPrefetch
    | SendStealRequest
    | SendPutData
    | SendRejoinGranted
    | SendRestartWorker
    | SendHeartbeatInterval
    | SendDrainDone
    | SendRefused
    | SendRemoteCall
    | SendInstall
    | SendUninstall
)

#: Notices to a client.
ClientCommand = (
    SendKeysDone
    | SendKeysPending
    | SendKeysFailed
    | SendTaskErred
    | SendNotice
    | SendTopicMessage
    | SendTaskNoted
    | SendTasksStillRunning
    | SendForwardedRequest
    | SendTaskPreempted
    | SendWorkerDeparted
)

#: What travels to a peer: ``wire.to_wire`` makes each a message.
PeerCommand = WorkerCommand | ClientCommand | Reply

#: What the service does itself instead of sending a message.
ServiceEffect = Log | Disconnect | PipeData | SavePeople | IssueCredential

Command = PeerCommand | ServiceEffect
