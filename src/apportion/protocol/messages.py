"""One frozen dataclass per wire message.

On the wire a message is a msgpack array ``[tag, field, field, ...]`` in field order;
a frame carries a list of them (everything one peer had to say in one loop turn).
Fields are msgpack primitives only: ``str``, ``int``, ``float``, ``bytes``, lists and
dicts of those, and ``Pickled`` values. Payloads produced by user code (pickled
arguments, results, exceptions) are ``Pickled``: ``bytes`` when small, a ``Payload``
of frames sent out of band when large (``protocol/codec.py``); the scheduler forwards
them without unpickling. Pickled functions and code stay ``bytes``.

Resource amounts travel in fixed-point ticks (see ``apportion.core.resources``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, NamedTuple, TypeVar, cast, dataclass_transform

from apportion.core.allocation import Allocation
from apportion.core.payload import Pickled

#: Bumped whenever a message changes shape. Peers with another version are refused
#: in the handshake, naming both versions, instead of failing later on a bad field.
PROTOCOL_VERSION = 14


class Message:
    """Base of every wire message; ``@message(tag)`` gives each subclass its ``TAG``."""

    __slots__ = ()
    TAG: ClassVar[int]
    _field_names: ClassVar[tuple[str, ...]]

    def to_wire(self) -> list[Any]:
        """``[tag, *fields]``, ready for msgpack."""
        return [self.TAG, *(getattr(self, name) for name in self._field_names)]

    @classmethod
    def from_fields(cls, values: list[Any]) -> Message:
        """Build from decoded fields; messages with nested records override this."""
        return cls(*values)


_REGISTRY: dict[int, type[Message]] = {}
#: Class name -> class: a service registers for requests by class name
#: (``RegisterService``), so a name stands for one message only.
_BY_NAME: dict[str, type[Message]] = {}

_M = TypeVar("_M", bound=type[Message])


@dataclass_transform(frozen_default=True)
def message(tag: int) -> Callable[[_M], _M]:
    """Decorator: a frozen, slotted dataclass registered as the wire message ``tag``.

    Each message states its tag, so that moving a class to another module changes
    nothing on the wire; a tag or a name taken twice fails at import, before any
    peer could be misread. A message that changes shape bumps ``PROTOCOL_VERSION``.
    """
    if type(tag) is not int or tag < 1:
        raise TypeError(f"a message tag is a positive int, not {tag!r}")

    def register(cls: _M) -> _M:
        taken = _REGISTRY.get(tag)
        if taken is not None:
            raise ValueError(f"message tag {tag} of {cls.__name__} is taken by {taken.__name__}")
        if cls.__name__ in _BY_NAME:
            raise ValueError(f"two messages are named {cls.__name__}")
        dc: Any = dataclass(frozen=True, slots=True)(cls)
        dc.TAG = tag
        dc._field_names = tuple(f.name for f in fields(dc))
        _REGISTRY[tag] = _BY_NAME[dc.__name__] = dc
        return cast(_M, dc)

    return register


def message_class(tag: int) -> type[Message] | None:
    """The message class for ``tag``, or None if no such message exists."""
    return _REGISTRY.get(tag)


def registered() -> dict[int, type[Message]]:
    """Every message registered so far, by tag (the modules defining them imported)."""
    return dict(_REGISTRY)


# --- handshake ----------------------------------------------------------------------


@message(1)
class Hello(Message):
    """First message of the connecting side. Nothing else is read before it is checked."""

    protocol: int
    role: str  #: "client", "worker" or "peer" (worker-to-worker and direct client data)
    name: str


@message(2)
class Welcome(Message):
    """The listener's answer to an acceptable ``Hello``."""

    protocol: int
    peer_id: str  #: how the listener will name this connection in logs and views
    info: dict[str, Any]


@message(3)
class Refused(Message):
    """The listener's answer to an unacceptable ``Hello``; the connection closes after it."""

    reason: str


# Tags of the three messages above never change, so that a peer of another version is
# still told so in words. Authentication follows them (``net/auth.py``).


@message(4)
class AuthHello(Message):
    """Connecting side -> listener, in the frame of its ``Hello``: my fresh nonce."""

    nonce: bytes


@message(5)
class AuthChallenge(Message):
    """Listener -> connecting side: my nonce, and my proof that I know the secret."""

    nonce: bytes
    proof: bytes


@message(6)
class AuthProof(Message):
    """Connecting side -> listener: my proof that I know the secret; then ``Welcome``."""

    proof: bytes


# --- same-machine lending (``net/lending.py``), handled by ``Connection`` itself ----


@message(7)
class LendBuffers(Message):
    """Receiver -> data port: I can read your memory (your ``Welcome`` probe was
    there); send the address of each buffer of ``from_bytes`` or more, not its bytes."""

    from_bytes: int


@message(8)
class BuffersReturned(Message):
    """Receiver -> data port: the buffers lent in your next ``frames`` lending frames
    (in the order sent) are read; they need not stay alive for me any longer."""

    frames: int


# --- client -> scheduler ------------------------------------------------------------


class TaskSpec(NamedTuple):
    """One task as a client submits it."""

    key: str
    func_id: str  #: hash of the pickled function; its bytes travel once per batch
    args: Pickled  #: (args, kwargs) with dependencies as placeholders
    deps: list[str]
    resources: dict[str, int]  #: demand in ticks; empty for plain tasks
    priority: int  #: higher runs earlier, as in Dask
    retries: int
    #: Alternative demands in order of preference (empty unless there are two or more;
    #: then ``resources`` is the first). The scheduler runs the first that fits now.
    variants: list[dict[str, int]] = []
    #: Dask's ``workers=``: addresses, names or hosts of the workers it may run on
    #: (empty: any worker).
    workers: list[str] = []
    #: 1 makes ``workers`` a preference (Dask's ``allow_other_workers``), 0 a hard
    #: restriction; an int because the wire has no booleans.
    allow_other_workers: int = 0
    #: 1: the result is an actor, an object that stays on its worker and takes method
    #: calls; the task's resources stay held until the actor is released.
    actor: int = 0


@message(9)
class SubmitTasks(Message):
    """New tasks and the keys whose results the client holds futures for."""

    tasks: list[TaskSpec]
    functions: dict[str, bytes]  #: func_id -> pickled function, only ids new to the batch
    wanted: list[str]

    @classmethod
    def from_fields(cls, values: list[Any]) -> Message:
        tasks, functions, wanted = values
        return cls([TaskSpec(*t) for t in tasks], functions, wanted)


@message(10)
class ReleaseKeys(Message):
    """The client dropped its futures for these keys."""

    keys: list[str]


@message(11)
class CancelKeys(Message):
    """Stop these tasks if they have not finished; dependents fail as cancelled."""

    keys: list[str]


@message(12)
class GatherRequest(Message):
    """Ask the scheduler for the results of ``keys``: relayed, or where to fetch them."""

    request_id: int
    keys: list[str]
    #: Results of this many bytes or more are not relayed: the reply names their
    #: holders and the client fetches them from the workers. 0: relay every result.
    direct_from: int = 0


@message(13)
class ScatterRequest(Message):
    """Place client data on workers; the client holds futures for the keys."""

    request_id: int
    data: dict[str, Pickled]
    #: Only on workers with one of these names, addresses or hosts; empty: any.
    #: While none is connected the request waits, as it does for no workers at all.
    workers: list[str] = field(default_factory=list)


@message(14)
class WhoHasRequest(Message):
    """Which worker data addresses hold each key (for ``direct_to_workers``)."""

    request_id: int
    keys: list[str]


@message(15)
class WhyRequest(Message):
    """Explain why each key is not running."""

    request_id: int
    keys: list[str]


@message(16)
class InfoRequest(Message):
    """The cluster's identity, workers and their pools."""

    request_id: int


@message(17)
class StoryRequest(Message):
    """The transitions of one task with their causes."""

    request_id: int
    key: str


# --- scheduler -> client ------------------------------------------------------------


@message(18)
class KeysDone(Message):
    """These keys now have results in the cluster."""

    keys: list[str]


@message(19)
class TaskErred(Message):
    """A task raised. ``exception`` and ``traceback`` are pickled by the worker."""

    key: str
    exception: Pickled
    traceback: Pickled
    attempts: int  #: runs that raised, retries included; the exception is the last one


@message(20)
class KeysFailed(Message):
    """The scheduler itself failed these keys (no user exception to forward)."""

    keys: list[str]
    #: "unsatisfiable", "misnamed", "cancelled", "lost", "unserializable", "crashed", "memory"
    kind: str
    message: str


@message(21)
class GatherReply(Message):
    request_id: int
    data: dict[str, Pickled]
    missing: list[str]
    errors: dict[str, str]  #: key -> why its value could not be sent (e.g. unpicklable)
    #: Results left to fetch directly (``direct_from``): key -> its holders' data addresses.
    elsewhere: dict[str, list[str]] = field(default_factory=dict)


@message(22)
class ScatterReply(Message):
    request_id: int
    keys: list[str]


@message(23)
class WhoHasReply(Message):
    request_id: int
    who_has: dict[str, list[str]]


@message(24)
class WhyReply(Message):
    request_id: int
    reasons: dict[str, str]


@message(25)
class InfoReply(Message):
    request_id: int
    info: dict[str, Any]


@message(26)
class StoryReply(Message):
    request_id: int
    story: list[list[Any]]  #: [time, key, from_state, to_state, cause]


@message(27)
class Notice(Message):
    """A warning the client should show its user (e.g. a request nobody can meet)."""

    level: str
    text: str


# --- worker -> scheduler ------------------------------------------------------------


@message(28)
class RegisterWorker(Message):
    """Sent once after the handshake: who this worker is and what it offers."""

    name: str
    address: str  #: where peers and direct clients fetch data, "tcp://host:port"
    nthreads: int
    resources: dict[str, int]  #: supply in ticks (an indexed pool counts its units)
    pid: int
    memory_limit: int
    units: dict[str, list[str]]  #: indexed pools: name -> unit labels
    #: pid of the supervisor that restarts this process (0: none); a supervised
    #: worker's death is classified by its supervisor (``WorkerDied``).
    supervisor: int = 0
    #: Keys of tasks still running here (or finished and not yet reported) from an
    #: earlier session, that outlive sessions (command runs): the client serving
    #: their keys may adopt them instead of running them again (``TasksStillRunning``).
    live_tasks: list[str] = field(default_factory=list)


@message(29)
class TaskFinished(Message):
    key: str
    nbytes: int
    duration: float  #: seconds spent executing, used to size the pipeline
    type_name: str
    thread: int = 0  #: which of the worker's threads ran it (the task stream's row)


@message(30)
class TaskRaised(Message):
    key: str
    exception: Pickled
    traceback: Pickled
    duration: float
    thread: int = 0  #: which of the worker's threads ran it (the task stream's row)


@message(31)
class ResultTooLarge(Message):
    """Worker -> scheduler: a task's result was larger than this worker can keep, so it
    was dropped at once; the task fails, out of memory (``worker.memory_policy``)."""

    key: str
    nbytes: int  #: the result's size, as ``sizeof`` estimates it
    type_name: str
    limit: int  #: the worker's memory limit, bytes
    largest: int  #: the largest result it keeps: its terminate threshold, or the limit
    duration: float


@message(32)
class MissingDependency(Message):
    """The worker could not fetch ``dep`` for ``key`` from any holder it was told of."""

    key: str
    dep: str
    holders: list[str]
    #: Empty when no holder had it; otherwise why it could not be sent (e.g. unpicklable).
    reason: str


@message(33)
class DataReply(Message):
    """Answer to ``GetData``, from a worker to whoever asked (scheduler, peer, client)."""

    request_id: int
    data: dict[str, Pickled]
    missing: list[str]
    errors: dict[str, str]  #: held, but the value cannot be sent: key -> why


@message(34)
class DataStored(Message):
    """Answer to ``PutData``: the worker holds these keys now."""

    request_id: int
    keys: list[str]
    nbytes: dict[str, int]


# --- scheduler -> worker ------------------------------------------------------------


@message(35)
class LoadFunction(Message):
    """A function the worker has not seen; it precedes the first task using it."""

    func_id: str
    blob: bytes


@message(36)
class ComputeTask(Message):
    key: str
    func_id: str
    args: Pickled
    who_has: dict[str, list[str]]  #: every dependency -> data addresses holding it
    priority: int
    allocation: Allocation  #: what it runs with: demand, units held, alternative chosen
    #: Each dependency's size in bytes as the scheduler knows it (0: not known), so the
    #: worker keeps what it fetches at once within its budget.
    sizes: dict[str, int] = field(default_factory=dict)
    #: Its place in the scheduler's start order (submission order within a priority):
    #: among tasks waiting for a thread, the worker starts the earliest first, not the
    #: one that arrived first, so a graph's later steps go ahead of new inputs.
    order: int = 0

    @classmethod
    def from_fields(cls, values: list[Any]) -> Message:
        key, func_id, args, who_has, priority, allocation, sizes, order = values
        return cls(key, func_id, args, who_has, priority, Allocation(*allocation), sizes, order)


@message(37)
class FreeKeys(Message):
    """Forget these keys: drop their data and, if still pending, the tasks."""

    keys: list[str]


@message(38)
class Prefetch(Message):
    """A task reserved this worker and will run here next: fetch its inputs now, so
    that they are here when its resources free. Key -> its holders' data addresses."""

    who_has: dict[str, list[str]]
    sizes: dict[str, int] = field(default_factory=dict)  #: as in ``ComputeTask``


@message(39)
class DropPrefetch(Message):
    """The task those inputs were fetched for will not run here: drop them (kept only
    where a task here needs them)."""

    keys: list[str]


@message(40)
class GetData(Message):
    """Ask a worker for results (scheduler relay, a peer or a direct client)."""

    request_id: int
    keys: list[str]
    #: Answer in several ``DataReply`` frames: the small values (and the keys missing)
    #: first, then each large value in a frame of its own, so that the asker can use
    #: each as it arrives. A peer asks so; the key sets of the parts add up to ``keys``.
    in_parts: bool = False


@message(41)
class PutData(Message):
    """Store data scattered by a client."""

    request_id: int
    data: dict[str, Pickled]


@message(42)
class TasksDropped(Message):
    """Worker -> scheduler: assigned tasks freed before they started; they never ran.

    Without this the scheduler could not tell "dropped" from "still running" and
    would hold the tasks' resources forever.
    """

    keys: list[str]


@message(43)
class StealRequest(Message):
    """Scheduler -> worker: let these assigned tasks go if they have not started here,
    as an idle worker would start them sooner. Answered by ``StealResponse``."""

    keys: list[str]


@message(44)
class StealResponse(Message):
    """Worker -> scheduler: of a ``StealRequest``'s keys, those let go (they were
    waiting here and never ran) and those already started (they stay). A key in
    neither was no longer here: its report was sent before this answer."""

    released: list[str]
    started: list[str]


@message(45)
class CopiesKept(Message):
    """Worker -> scheduler: it fetched these results from peers for its tasks and keeps
    the copies, as holders the scheduler frees like any other (Dask's ``add-keys``):
    the next task here that needs one finds it in memory."""

    keys: list[str]


#: ``PutData`` request id a worker uses towards the scheduler for data a client put
#: on its data port directly; the client itself reports it with ``ScatterPlaced``.
DIRECT_PUT = -1


@message(46)
class ScatterPlaced(Message):
    """Client -> scheduler: data this client put on workers' data ports directly."""

    request_id: int
    placed: dict[str, list[Any]]  #: key -> [worker data address, nbytes]


@message(47)
class WorkerClosing(Message):
    """Worker -> scheduler, just before a deliberate close: not a crash, not a loss."""

    reason: str


@message(48)
class KeysPending(Message):
    """Scheduler -> client: these results were lost and are being computed again.

    Futures go back to pending; a ``KeysDone`` (or a failure) follows.
    """

    keys: list[str]


@message(49)
class Heartbeat(Message):
    """Worker -> scheduler, every heartbeat interval: still alive (and how busy).

    Also sent at once when the worker pauses or resumes for its memory.
    """

    executing: int
    memory: int = 0  #: resident memory of the worker process, bytes (0: unknown)
    spilled: int = 0  #: bytes of results it moved to disk (as they were in memory)
    #: 1 while paused for its memory (it starts nothing new), else 0; an int
    #: because the wire has no booleans.
    paused: int = 0
    cpu: float = 0.0  #: CPU use of the worker process since the last heartbeat, % of a core
    received: int = 0  #: bytes of results fetched from peers since the worker started
    sent: int = 0  #: bytes of results served to peers since the worker started


@message(50)
class WorkerDraining(Message):
    """Worker -> scheduler: stop sending me tasks; I leave once mine are done.

    The scheduler answers ``DrainDone`` once the running tasks are finished and the
    results still needed were handed to other workers; the worker leaves after
    ``grace`` seconds whatever happens.
    """

    grace: float


@message(51)
class DrainDone(Message):
    """Scheduler -> draining worker: nothing here is needed any more; leave now."""

    handed_off: int  #: results copied to other workers


@message(52)
class WorkerDied(Message):
    """Supervisor -> scheduler: how a worker process it watched ended.

    Sent on a short connection of its own right after the supervisor reaps the
    process, so a poison task's error can say "killed by SIGKILL - likely out of
    memory" instead of "its connection closed".
    """

    name: str
    pid: int
    description: str
    #: 1 when it died of its memory: killed for passing its terminate threshold, or
    #: killed by a signal near its limit; an int because the wire has no booleans.
    out_of_memory: int = 0


@message(53)
class DumpRequest(Message):
    """Ask for the whole cluster state as plain data, for a bug report."""

    request_id: int


@message(54)
class DumpReply(Message):
    request_id: int
    state: dict[str, Any]


# --- command runs (the job queue) ------------------------------------------------------


@message(55)
class RunStarted(Message):
    """Worker -> scheduler: a run's command started (again, for an adopted run)."""

    run_id: int
    pid: int
    held: str  #: resources held, as users write them: ``"gpu=[0] foo=5"``


@message(56)
class RunOutput(Message):
    """Worker -> scheduler: the next bytes of a run's combined stdout and stderr.

    ``offset`` is where they start in the run's log, so that output sent again
    after a reconnection is written once.
    """

    run_id: int
    offset: int
    data: bytes


@message(57)
class RunEnded(Message):
    """Worker -> scheduler: a run's processes are all gone; how it ended."""

    run_id: int
    exit_code: int  #: -1 when it did not exit by itself
    signal: int  #: 0 when no signal killed it
    reason: str  #: "completed", "failed", "timed out", "cancelled", "could not start"
    detail: str  #: one line for users: "exit code 3", "cancelled; stopped with SIGTERM"


@message(58)
class SubmitRuns(Message):
    """Client -> scheduler: queue these runs (``RunSpec.to_dict()`` each)."""

    request_id: int
    specs: list[dict[str, Any]]


@message(59)
class RunsSubmitted(Message):
    """The ids given to submitted runs, or why none was accepted."""

    request_id: int
    ids: list[int]
    error: str
    #: One ``[kind, text]`` per id: what the connected workers make of its request
    #: (``scheduler.unsatisfiable.check_demand``); kind "" when one could run it.
    verdicts: list[list[str]] = field(default_factory=list)


@message(60)
class CheckDemands(Message):
    """Client -> scheduler: could the connected workers ever hold each of these
    demands (``{pool: ticks}``)? The job queue asks before it queues runs."""

    request_id: int
    demands: list[dict[str, int]]


@message(61)
class DemandsChecked(Message):
    """One ``[kind, text]`` per demand asked, in order (``CheckDemands``)."""

    request_id: int
    verdicts: list[list[str]]


@message(62)
class QueryRuns(Message):
    """Client -> scheduler: the state of these runs (to follow their progress)."""

    request_id: int
    ids: list[int]


@message(63)
class CancelRuns(Message):
    """Client -> scheduler: cancel these runs; answered like ``QueryRuns``."""

    request_id: int
    ids: list[int]


@message(64)
class RunsReport(Message):
    """Scheduler -> client: one dict per run (id, label, state, worker, held, outcome)."""

    request_id: int
    runs: list[dict[str, Any]]


# --- code run on workers outside tasks ---------------------------------------------

#: ``request_id`` of a call nobody waits for (``run(wait=False)``, the uploads and
#: plugins replayed to a worker that joins): its answers are dropped, not relayed.
NO_REPLY = 0


@message(65)
class RunOnWorkers(Message):
    """Client -> scheduler: run a pickled ``(function, args, kwargs)`` on workers."""

    request_id: int
    call: bytes
    workers: list[str]  #: names or addresses; empty: every worker


@message(66)
class InstallOnWorkers(Message):
    """Client -> scheduler: a file or a worker plugin for every worker, present and future.

    The scheduler keeps ``blob`` (bounded) and replays it to each worker that joins.
    """

    request_id: int
    kind: str  #: "upload" (``name`` is the file name) or "plugin"
    name: str
    blob: bytes  #: the file's bytes, or the pickled plugin
    load: int  #: uploads: 1 imports (or reloads) what the file holds
    replace: int  #: 0: keep an install of the same name instead (Dask's ``idempotent``)


@message(67)
class UninstallFromWorkers(Message):
    """Client -> scheduler: remove a worker plugin everywhere (its ``teardown`` runs)."""

    request_id: int
    name: str


@message(68)
class WorkersAnswered(Message):
    """Scheduler -> client: each worker's answer to a call, install or uninstall."""

    request_id: int
    #: worker address -> [status, value, traceback]; status "ok" (value: pickled
    #: result), "error" (value: pickled exception) or "lost" (value: why, as text).
    results: dict[str, list[Any]]
    error: str  #: non-empty when the scheduler refused the request as a whole


@message(69)
class RunCall(Message):
    """Scheduler -> worker: run this pickled call outside the task threads."""

    request_id: int
    call: bytes


@message(70)
class Install(Message):
    """Scheduler -> worker: write (and load) an uploaded file, or set up a plugin."""

    request_id: int
    kind: str
    name: str
    blob: bytes
    load: int


@message(71)
class Uninstall(Message):
    """Scheduler -> worker: tear down and forget the plugin ``name``."""

    request_id: int
    name: str


@message(72)
class CallAnswered(Message):
    """Worker -> scheduler: how a ``RunCall``, ``Install`` or ``Uninstall`` went."""

    request_id: int
    status: str  #: "ok" or "error"
    value: Pickled  #: the result, or the exception
    traceback: Pickled  #: pickled traceback of an error (empty when ok)


@message(73)
class VersionsRequest(Message):
    """Client -> scheduler: the scheduler's Python and package versions."""

    request_id: int


@message(74)
class VersionsReply(Message):
    request_id: int
    versions: dict[str, Any]


@message(75)
class LogsRequest(Message):
    """Client -> scheduler: the scheduler's most recent log records (``n`` <= 0: all kept)."""

    request_id: int
    n: int


@message(76)
class LogsReply(Message):
    request_id: int
    records: list[list[str]]  #: [level name, formatted message], oldest first


# --- shared data: datasets, metadata, who has what, retry, replicate, rebalance ---


@message(77)
class PublishDataset(Message):
    """Client -> scheduler: keep ``data`` under ``name``, and the keys it refers to."""

    request_id: int
    name: str
    data: Pickled  #: the pickled object; futures inside it pickle as references to ``keys``
    keys: list[str]
    override: int  #: 1: replace a dataset of that name; 0: refuse (as Dask's KeyError)


@message(78)
class UnpublishDataset(Message):
    """Client -> scheduler: forget these datasets and let their keys go."""

    request_id: int
    names: list[str]


@message(79)
class DatasetRequest(Message):
    """Client -> scheduler: the dataset ``name``; also the names of all (for the error)."""

    request_id: int
    name: str


@message(80)
class DatasetReply(Message):
    """The dataset asked for (``found`` 0: unknown), and every published name."""

    request_id: int
    found: int
    data: Pickled
    keys: list[str]
    names: list[str]


@message(81)
class SharedDataAck(Message):
    """Scheduler -> client: done; ``error`` says why not (empty when it was done)."""

    request_id: int
    error: str


@message(82)
class SetMetadata(Message):
    """Client -> scheduler: store a plain value at a path of nested dictionaries."""

    request_id: int
    path: list[str]
    value: Any


@message(83)
class MetadataRequest(Message):
    """Client -> scheduler: the value at ``path``."""

    request_id: int
    path: list[str]


@message(84)
class MetadataReply(Message):
    request_id: int
    found: int
    value: Any


@message(85)
class ClusterFactsRequest(Message):
    """Client -> scheduler: who holds what, threads and running tasks of every worker."""

    request_id: int


@message(86)
class ClusterFactsReply(Message):
    """Shaped as Dask's answers: keys -> holder addresses, and per worker address."""

    request_id: int
    who_has: dict[str, list[str]]
    has_what: dict[str, list[str]]
    nthreads: dict[str, int]
    processing: dict[str, list[str]]


@message(87)
class RetryKeys(Message):
    """Client -> scheduler: run these failed tasks again, with their failed inputs."""

    keys: list[str]


@message(88)
class ReplicateKeys(Message):
    """Client -> scheduler: have ``n`` workers (0: all) of ``workers`` (empty: all) hold
    each key; answered with ``CopiesDone`` once every copy is stored."""

    request_id: int
    keys: list[str]
    n: int
    workers: list[str]  #: worker addresses or names


@message(89)
class RebalanceKeys(Message):
    """Client -> scheduler: even out the bytes each worker holds by moving results."""

    request_id: int
    keys: list[str]
    all_keys: int  #: 1: every result in memory (``keys`` is then ignored)
    workers: list[str]  #: worker addresses or names; empty: all


@message(90)
class CopiesDone(Message):
    """Scheduler -> client: a replicate or rebalance finished."""

    request_id: int
    copied: int  #: copies stored (for a rebalance: results moved)
    dropped: int  #: copies let go (replicas over ``n``; sources of moves)


# --- cluster lifecycle (restart) -----------------------------------------------------


@message(91)
class RestartRequest(Message):
    """Client -> scheduler: drop every task and result, and reset every worker.

    Every client's futures are told (``KeysPending`` then ``KeysFailed`` "cancelled",
    so finished ones are cancelled too). Supervised workers are told to exit
    (``RestartWorker``) for a fresh process; the others are disconnected, which makes
    them forget their tasks and data and register afresh.
    """

    request_id: int
    reason: str


@message(92)
class RestartReply(Message):
    """How many workers were reset, and the names of those no supervisor watches."""

    request_id: int
    workers: int
    unsupervised: list[str]


@message(93)
class RestartWorker(Message):
    """Scheduler -> a supervised worker, at a restart: exit so that your supervisor
    starts a fresh process (exit status ``RESTART_EXIT`` of worker/supervisor.py)."""

    reason: str


# --- generic hooks for services that are clients (the job queue) -------------------


@message(94)
class TaskNote(Message):
    """Worker -> scheduler: a note about a running task, for the clients wanting its key.

    ``note`` is one encoded message (``codec.encode_message``) the scheduler forwards
    as it is (``TaskNoted``); it never reads it. A ``droppable`` note may be dropped
    when the worker must hold too much while the scheduler is away.
    """

    key: str
    note: bytes
    droppable: int  #: 1 or 0: the wire has no booleans


@message(95)
class TaskNoted(Message):
    """Scheduler -> client: a ``TaskNote`` about a task it wants, from worker ``worker``."""

    key: str
    worker: str
    note: bytes


@message(96)
class RegisterService(Message):
    """Client -> scheduler: serve the ``requests`` of these kinds (message class names)
    that other clients send, and hear of tasks still running on a worker that joins
    whose keys begin with ``key_prefix`` ("" for none)."""

    requests: list[str]
    key_prefix: str


@message(97)
class ForwardedRequest(Message):
    """Scheduler -> service: a request of client ``origin`` (an encoded message)."""

    origin: str
    request: bytes


@message(98)
class ForwardedReply(Message):
    """Service -> scheduler: the answer (an encoded message) to relay to ``origin``."""

    origin: str
    reply: bytes


@message(99)
class TasksStillRunning(Message):
    """Scheduler -> service: a worker joined with these tasks still running from an
    earlier session. ``states`` gives the state of those the scheduler has a task for.
    The service adopts them (``AdoptTask``) or has them stopped (``StopTasks``)."""

    worker_id: str
    worker: str
    keys: list[str]
    states: dict[str, str]


@message(100)
class AdoptTask(Message):
    """Service -> scheduler: submit ``task`` as already running on ``worker_id``,
    holding ``units``, instead of queueing it (its process is not started again)."""

    worker_id: str
    task: TaskSpec
    functions: dict[str, bytes]
    units: dict[str, list[str]]

    @classmethod
    def from_fields(cls, values: list[Any]) -> Message:
        worker_id, task, functions, units = values
        return cls(worker_id, TaskSpec(*task), functions, units)


@message(101)
class StopTasks(Message):
    """Service -> scheduler: have worker ``worker_id`` stop these tasks (``FreeKeys``)."""

    worker_id: str
    keys: list[str]


@message(102)
class WorkerDeparted(Message):
    """Scheduler -> service: the worker named ``name`` left and none of that name remains."""

    name: str


@message(103)
class Unserved(Message):
    """Scheduler -> client: nothing here serves requests of this kind (a class name),
    so none will be answered (a scheduler without a job queue asked about runs)."""

    kind: str


@message(104)
class TaskSeceded(Message):
    """Worker -> scheduler: the running task ``key`` gave its thread back (``secede``)
    to wait on other tasks. Unless ``keep_resources``, it gave back its resources too;
    it asks for them again with ``TaskRejoining``."""

    key: str
    keep_resources: bool


@message(105)
class TaskRejoining(Message):
    """Worker -> scheduler: the seceded task ``key`` counts on a thread again
    (``rejoin``); if it gave its resources back, it waits for ``RejoinGranted``."""

    key: str


@message(106)
class RejoinGranted(Message):
    """Scheduler -> worker: these seceded tasks hold their resources again; they run on."""

    keys: list[str]


@message(107)
class ActorCall(Message):
    """Client or task -> worker data port: call ``name`` on the actor of ``key`` with
    the pickled ``(args, kwargs)``, or, with ``attribute``, read that attribute."""

    request_id: int
    key: str
    name: str
    args: Pickled
    attribute: bool


@message(108)
class ActorReply(Message):
    """Worker data port -> caller: the pickled value, or (``exception`` not empty) the
    pickled exception and traceback the call raised."""

    request_id: int
    value: Pickled
    exception: Pickled
    traceback: Pickled


# --- coordination: locks, semaphores, events, variables, queues, topics ------------
#
# The state of each lives in the scheduler (``scheduler/leases.py``,
# ``scheduler/channels.py``). A request that must wait (an acquire, a get, a wait)
# carries its own ``timeout``: the scheduler answers when it can grant it, or says
# "timed out" at the deadline, so a grant can never cross a client that gave up.

#: ``timeout`` of a request that waits as long as it takes.
NO_TIMEOUT = -1.0


@message(109)
class LeaseRequest(Message):
    """Client -> scheduler: an operation on leases of semaphores (``Lock`` is one with
    one lease) or of multi-locks (two separate namespaces, as in Dask).

    ``op``: "acquire" ``count`` of ``names`` at once (all or nothing) as ``lease_id``,
    waiting up to ``timeout`` seconds (0: not at all; ``NO_TIMEOUT``: without limit);
    "release" ``lease_id``; "value": the leases held on ``names[0]``.
    """

    request_id: int
    op: str
    kind: str  #: "semaphore" or "multilock"
    names: list[str]
    lease_id: str
    count: int  #: how many of ``names`` the lease needs (1 for a semaphore)
    max_leases: int  #: leases a semaphore grants at once (checked against its first user)
    timeout: float
    #: Seconds the lease lasts without a ``RefreshLeases`` (0: until released).
    lease_timeout: float


@message(110)
class RefreshLeases(Message):
    """Client -> scheduler: the holder of these leases is alive (no reply)."""

    lease_ids: list[str]


@message(111)
class EventRequest(Message):
    """Client -> scheduler: "set", "clear", "is_set" or "wait" (up to ``timeout``) on an event."""

    request_id: int
    op: str
    name: str
    timeout: float


@message(112)
class CoordinationReply(Message):
    """Scheduler -> client: the answer to a ``LeaseRequest``, ``EventRequest`` or
    ``Subscribe``. ``ok``: granted, released, set (1) or not (0, also a timeout);
    ``value``: leases held; ``error`` says why the request was refused ("" if not)."""

    request_id: int
    ok: int
    value: int
    error: str


@message(113)
class ValueRequest(Message):
    """Client -> scheduler: an operation on a shared variable or queue.

    Variables: "set" ``items[0]``, "get" (waiting up to ``timeout`` until one is set),
    "delete". Queues: "put" ``items[0]`` (waiting up to ``timeout`` while full), "get"
    ``count`` items (0: every item there now, without waiting), "size". ``maxsize``
    is the queue's bound (0: none), checked against the queue's first user. Futures
    inside an item pickle as references to ``keys``, which the scheduler keeps alive
    while the item is held.
    """

    request_id: int
    op: str
    kind: str  #: "variable" or "queue"
    name: str
    items: list[Pickled]
    keys: list[str]
    count: int
    maxsize: int
    timeout: float


@message(114)
class ValueReply(Message):
    """Scheduler -> client: the items asked for and the keys they refer to (which this
    client now wants), the queue's size, ``timed_out`` 1 at the deadline, or ``error``."""

    request_id: int
    items: list[Pickled]
    keys: list[str]
    size: int
    timed_out: int
    error: str


@message(115)
class Subscribe(Message):
    """Client -> scheduler: send me what is published on topic ``name`` from now on."""

    request_id: int
    name: str


@message(116)
class Unsubscribe(Message):
    """Client -> scheduler: one subscription of mine to ``name`` ended (no reply)."""

    name: str


@message(117)
class Publish(Message):
    """Client -> scheduler: pass ``data`` (a pickled object) to every subscriber of ``name``."""

    name: str
    data: Pickled


@message(118)
class TopicMessage(Message):
    """Scheduler -> client: ``data`` was published on a topic this client subscribes to."""

    name: str
    data: Pickled


@message(119)
class FireAndForget(Message):
    """Client -> scheduler: run these tasks to the end even if no client wants them."""

    keys: list[str]


@message(120)
class DemandRequest(Message):
    """Client -> scheduler: the work waiting for room, by kind of request, and the
    workers (what a cluster that grows and shrinks decides from)."""

    request_id: int


@message(121)
class DemandReply(Message):
    """``queued``: per kind of request, ``options`` (``{pool: ticks}`` demands),
    ``count`` and ``restricted``; ``workers``: ``name``, ``address``, ``running``,
    ``leaving`` (``scheduler.demand``)."""

    request_id: int
    queued: list[dict[str, Any]]
    workers: list[dict[str, Any]]


@message(122)
class StatusRequest(Message):
    """Client -> scheduler: the cluster's status (``scheduler/status.py``), with the
    task stream's executions and the warnings that came after the given numbers."""

    request_id: int
    stream_since: int
    events_since: int
    stream_limit: int


@message(123)
class StatusReply(Message):
    request_id: int
    status: dict[str, Any]
