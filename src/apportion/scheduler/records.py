"""What the scheduler knows about each task, task group, worker and client.

Plain slotted classes, not dataclasses: there can be millions of task records and
every byte counts (the scheduler keeps about 590 bytes per queued task). Invariants are
stated on the fields and checked by ``scheduler.invariants.check_invariants``.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import NamedTuple

from apportion.core.allocation import Allocation
from apportion.core.demand import Demand
from apportion.core.ledger import Ledger
from apportion.core.payload import Pickled
from apportion.core.resources import Amounts, Units

#: Shared by every plain task, so 100,000 of them do not hold 100,000 empty dicts.
NO_RESOURCES: Amounts = {}


@dataclass(frozen=True, slots=True)
class Restriction:
    """Where a task may run (Dask's ``workers=``): workers named by address, name or host.

    ``loose`` is Dask's ``allow_other_workers``: the named workers are preferred, and
    the task runs elsewhere only while none of the connected ones could ever hold its
    demand (none connected, or all too small).
    """

    workers: frozenset[str]
    loose: bool

    def allows(self, worker: WorkerRecord) -> bool:
        """``worker`` is one of the named ones (by address, name or host)."""
        return not self.workers.isdisjoint(worker.aliases)

    def describe(self) -> str:
        """The named workers as the user wrote them, sorted."""
        return ", ".join(sorted(self.workers))


@dataclass(frozen=True, slots=True)
class Restricted:
    """Queue key of tasks restricted to some workers: their demand and where.

    The restriction is part of the key so that restricted tasks queue apart: tasks
    with equal keys fit in the same places, and a restricted task that waits for its
    worker never holds up unrestricted tasks with the same demand.
    """

    demand: Demand
    restriction: Restriction


class Shared:
    """Queue key of one share's tasks: their kind (demand, and where they may run)
    and the share they belong to (``scheduler/shares.py``).

    The share is part of the key so that each share's tasks of a kind queue apart,
    and placement can serve the share furthest below its fair share first; a task
    keeps it in the ``queue`` field it has anyway, at no cost per task. Interned
    per client (``ClientRecord.queue_key``), with its hash kept: it is looked up for
    every task that moves.
    """

    __slots__ = ("_hash", "kind", "share")

    def __init__(self, kind: Demand | Restricted, share: str) -> None:
        self.kind = kind
        self.share = share
        self._hash = hash((kind, share))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Shared):
            return NotImplemented
        return self._hash == other._hash and self.share == other.share and self.kind == other.kind

    def __repr__(self) -> str:
        return f"Shared({self.kind!r}, {self.share!r})"


QueueKey = Demand | Restricted | Shared
"""A queue of ready tasks: their ``Demand`` (tasks with equal demands fit in the same
places, so the placement pass can skip them together), or it and where they may run;
for a client's tasks, either and their share."""

#: The share of tasks no client submitted (a relay's placeholders).
NO_SHARE = ""


def kind_of(key: QueueKey) -> Demand | Restricted:
    """A queue's kind of request, whoever's share it is."""
    return key.kind if isinstance(key, Shared) else key


def share_of(key: QueueKey) -> str:
    """The share a queue's tasks belong to (``NO_SHARE`` for none)."""
    return key.share if isinstance(key, Shared) else NO_SHARE


def demand_of(key: QueueKey) -> Demand:
    """What a queue's tasks ask for."""
    if isinstance(key, Shared):
        key = key.kind
    return key.demand if isinstance(key, Restricted) else key


def restriction_of(key: QueueKey) -> Restriction | None:
    """Where a queue's tasks may run; None for anywhere."""
    if isinstance(key, Shared):
        key = key.kind
    return key.restriction if isinstance(key, Restricted) else None


def needs_resources(key: QueueKey) -> bool:
    """A queue's tasks ask for resources (in some alternative), not just a thread."""
    return demand_of(key).asks


def worker_aliases(name: str, address: str) -> frozenset[str]:
    """Every way a ``workers=`` restriction may name a worker: its name, its address
    with and without scheme (``tcp://10.0.0.5:4000``, ``10.0.0.5:4000``), its host."""
    bare = address.partition("://")[2] or address
    if bare.startswith("["):  # [IPv6]:port
        host = bare[1:].partition("]")[0]
    else:
        host = bare.rpartition(":")[0] if ":" in bare else bare
    return frozenset(a for a in (name, address, bare, host) if a)


#: Task states. NEW is a record's state only while ``submit`` builds it; FORGOTTEN
#: appears only in stories, never on a record.
NEW = "new"  #: being submitted: not yet linked to its inputs
FORGOTTEN = "forgotten"  #: dropped from the scheduler's tables
WAITING = "waiting"  #: some dependency is not in memory yet
QUEUED = "queued"  #: ready; waits in the scheduler for a worker where it fits
PROCESSING = "processing"  #: assigned to a worker, which holds its resources
MEMORY = "memory"  #: finished; the result lives on ``worker``
ERRED = "erred"  #: failed (raised, cancelled, unsatisfiable, lost); kept while wanted
#: Finished and no longer needed: the result is dropped but the record stays, with
#: its function and arguments, while results computed from it live (``lineage``),
#: so that a lost one can be recomputed from its inputs' inputs.
RELEASED = "released"

#: The states a live task record can be in, in the order views show them.
LIVE_STATES = (WAITING, QUEUED, PROCESSING, MEMORY, ERRED, RELEASED)


#: Upper bounds (seconds) of the task-duration histogram's buckets; +Inf follows.
DURATION_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 3600.0)


class Histogram:
    """Cumulative counts per bucket, with the sum and count (Prometheus's shape)."""

    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        #: buckets[i]: observations <= DURATION_BUCKETS[i]; the last one is +Inf.
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Non-cumulative here (one increment per observation); ``cumulative`` sums.
        self.buckets[bisect_left(DURATION_BUCKETS, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[int]:
        """Counts of observations at or below each bound, then the total (+Inf)."""
        out, running = [], 0
        for n in self.buckets:
            running += n
            out.append(running)
        return out


class GroupTally:
    """One task group: its live records by state, and what its tasks did.

    Task records point at their group's tally (``TaskRecord.group``), so counting a
    move costs no lookup."""

    __slots__ = (
        "cancelled",
        "done",
        "durations",
        "expected",
        "failed",
        "live",
        "name",
        "output",
        "result_type",
        "states",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        #: Live records of the group by state (LIVE_STATES); sums to ``live``.
        self.states = dict.fromkeys(LIVE_STATES, 0)
        self.live = 0
        #: Executions that finished (a recomputed task counts again), failures, and
        #: tasks cancelled (a user's choice, not a failure: counted apart from them).
        self.done = 0
        self.failed = 0
        self.cancelled = 0
        #: Its tasks' run times, or the shared "other" histogram past HISTOGRAM_GROUPS.
        self.durations: Histogram | None = None
        #: Seconds a task of the group is expected to run: the average of those that
        #: finished, the latest weighing half (as Dask's task prefixes); None until
        #: one has. Placement queues work ahead and moves it by this.
        self.expected: float | None = None
        #: Bytes of a task's result, averaged the same way; None until one finished.
        #: Placement holds back tasks that make data (roots) by this.
        self.output: float | None = None
        #: The type name of the first result of the group (``TaskFinished.type_name``)
        #: None until one finished. Siblings' results almost always share it, so it is
        #: kept once here; a result of another type is named in the state's sparse
        #: ``result_types`` (``SchedulerState.result_type``), not on every task record.
        self.result_type: str | None = None


#: Every legal move of a task in the scheduler. Anything else is a bug and raises
#: ``IllegalTransition`` at once.
SCHEDULER_TASK_MOVES: frozenset[tuple[str, str]] = frozenset(
    {
        (NEW, WAITING),
        (NEW, QUEUED),
        (NEW, MEMORY),
        (NEW, ERRED),
        (WAITING, QUEUED),
        (WAITING, ERRED),
        (WAITING, FORGOTTEN),
        (QUEUED, PROCESSING),
        (QUEUED, WAITING),
        (QUEUED, ERRED),
        (QUEUED, FORGOTTEN),
        (PROCESSING, MEMORY),
        (PROCESSING, QUEUED),
        (PROCESSING, WAITING),
        (PROCESSING, ERRED),
        (PROCESSING, FORGOTTEN),
        (MEMORY, WAITING),
        (MEMORY, QUEUED),
        (MEMORY, ERRED),
        (MEMORY, FORGOTTEN),
        (MEMORY, RELEASED),
        (WAITING, RELEASED),
        (QUEUED, RELEASED),
        (PROCESSING, RELEASED),
        (RELEASED, WAITING),
        (RELEASED, QUEUED),
        (RELEASED, ERRED),
        (RELEASED, FORGOTTEN),
        (ERRED, FORGOTTEN),
        # ``Client.retry``: a failed task (and its failed inputs) runs again.
        (ERRED, WAITING),
        (ERRED, QUEUED),
    }
)


class RareFields:
    """The fields of a task record that most tasks never set, kept apart.

    A queued task of a big ``map`` has every one at its default, so its record holds
    one empty slot instead of nine (64 bytes less per task: the scheduler's memory per
    queued task is mostly its records). ``TaskRecord`` makes one on the first write
    of a value that is not a default and reads them through properties.
    """

    __slots__ = (
        "actor",
        "cancelled",
        "choice",
        "discard_result",
        "error",
        "replicas",
        "reserved_on",
        "restriction",
        "retries",
    )

    def __init__(self) -> None:
        self.choice = 0
        self.restriction: Restriction | None = None
        self.retries = 0
        self.replicas: set[str] | None = None
        self.error: tuple[str, Pickled | str, Pickled] | None = None
        self.reserved_on: str | None = None
        self.discard_result = False
        self.cancelled = False
        self.actor = False


class TaskRecord:
    """The scheduler's view of one task."""

    __slots__ = (
        "_rare",
        "allocation",
        "args",
        "demand",
        "dependents",
        "deps",
        "func_id",
        "group",
        "key",
        "lineage",
        "missing_deps",
        "nbytes",
        "person",
        "priority",
        "queue",
        "seq",
        "state",
        "wanted_by",
        "worker",
    )

    def __init__(
        self,
        key: str,
        func_id: str,
        args: Pickled,
        deps: tuple[str, ...],
        demand: Demand,
        priority: int,
        retries: int,
        seq: int,
        restriction: Restriction | None = None,
    ) -> None:
        self.key = key
        self.func_id = func_id
        #: Opaque pickled arguments; kept until forgotten so the task can run again.
        self.args = args
        self.deps = deps
        #: Unfinished tasks that take this one's result as input (a dependent leaves
        #: the set when it finishes, fails or is forgotten); needed while any. None,
        #: not an empty set, while there are none: most tasks of a big batch have none
        #: yet, and an empty set costs 216 bytes (``add_dependent``).
        self.dependents: set[str] | None = None
        #: Records (any state) that list this task among their inputs; while it is
        #: positive, the record outlives its result (RELEASED) for recomputation.
        self.lineage = 0
        #: Dependencies not in memory; the task is QUEUED exactly when this is 0.
        self.missing_deps = 0
        #: What it asks for, as the client sent it; never changes.
        self.demand = demand
        #: The fields most tasks never set (``RareFields``), None while all are at
        #: their defaults: read and written through the properties below.
        self._rare: RareFields | None = None
        if restriction is not None or retries:
            rare = self._rare = RareFields()
            rare.restriction = restriction
            rare.retries = retries
        #: Its queue: tasks with equal keys fit in the same places.
        self.queue: QueueKey = demand if restriction is None else Restricted(demand, restriction)
        self.priority = priority
        #: Submission order; with priority, the start order among ready tasks.
        self.seq = seq
        self.state = NEW
        #: The worker running it (PROCESSING) or holding its result (MEMORY).
        self.worker: str | None = None
        #: Clients holding a future for this key; None while none. Immutable: a task
        #: wanted by one client shares that client's ``alone`` set (``want``).
        self.wanted_by: frozenset[str] | None = None
        self.nbytes = 0
        #: Its task group's counts (``telemetry.GroupTally``, named by ``core.groups``),
        #: shared with its siblings; set the first time it moves (``Telemetry.moved``).
        self.group: GroupTally | None = None
        #: While PROCESSING on a worker: what it holds there (taken from that
        #: worker's ledger, given back exactly once); for an actor in MEMORY, what it
        #: holds for its lifetime (``scheduler/actors.py``); None otherwise.
        self.allocation: Allocation | None = None
        #: The person whose work it is (``ClientRecord.person`` of the client that
        #: submitted it first; ``OWNER``, "", for the owner's): only they (and the
        #: owner) may see, gather or cancel it (``people_gate.py``).
        self.person = ""

    def _rare_fields(self) -> RareFields:
        """Its ``RareFields``, made on the first write of a value that is not a default."""
        rare = self._rare
        if rare is None:
            rare = self._rare = RareFields()
        return rare

    # Each rare field reads as its default while the task has no ``RareFields``, and
    # writing a default there makes none. Plain properties, not a generic descriptor:
    # ``reserved_on`` is read on every move and ``discard_result`` on every finish.

    @property
    def choice(self) -> int:
        """Which of its alternatives it runs (or last ran, or reserved) with: placement
        chooses, the allocation carries it to the worker."""
        rare = self._rare
        return 0 if rare is None else rare.choice

    @choice.setter
    def choice(self, value: int) -> None:
        if value or self._rare is not None:
            self._rare_fields().choice = value

    @property
    def restriction(self) -> Restriction | None:
        """Where it may run (None: anywhere); a hard one is checked by the invariants."""
        rare = self._rare
        return None if rare is None else rare.restriction

    @property
    def retries(self) -> int:
        """Times it may still run again after raising."""
        rare = self._rare
        return 0 if rare is None else rare.retries

    @retries.setter
    def retries(self, value: int) -> None:
        if value or self._rare is not None:
            self._rare_fields().retries = value

    @property
    def replicas(self) -> set[str] | None:
        """MEMORY only: other workers holding a copy (replicate, rebalance), never
        ``worker`` itself; None (not an empty set) while there are none."""
        rare = self._rare
        return None if rare is None else rare.replicas

    @replicas.setter
    def replicas(self, value: set[str] | None) -> None:
        if value is not None or self._rare is not None:
            self._rare_fields().replicas = value

    @property
    def error(self) -> tuple[str, Pickled | str, Pickled] | None:
        """For ERRED, or PROCESSING and ``cancelled``: ("exception", exc_bytes,
        tb_bytes) or (kind, message, b"")."""
        rare = self._rare
        return None if rare is None else rare.error

    @error.setter
    def error(self, value: tuple[str, Pickled | str, Pickled] | None) -> None:
        if value is not None or self._rare is not None:
            self._rare_fields().error = value

    @property
    def reserved_on(self) -> str | None:
        """The worker this task holds a reservation on while it cannot fit anywhere."""
        rare = self._rare
        return None if rare is None else rare.reserved_on

    @reserved_on.setter
    def reserved_on(self, value: str | None) -> None:
        if value is not None or self._rare is not None:
            self._rare_fields().reserved_on = value

    @property
    def discard_result(self) -> bool:
        """Set when the worker was told to drop the result of this running task."""
        rare = self._rare
        return False if rare is None else rare.discard_result

    @discard_result.setter
    def discard_result(self, value: bool) -> None:
        if value or self._rare is not None:
            self._rare_fields().discard_result = value

    @property
    def cancelled(self) -> bool:
        """Cancelled by a client while PROCESSING: failed once its worker gives it back."""
        rare = self._rare
        return False if rare is None else rare.cancelled

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        if value or self._rare is not None:
            self._rare_fields().cancelled = value

    @property
    def actor(self) -> bool:
        """Its result is an actor: an object living on ``worker`` that takes calls."""
        rare = self._rare
        return False if rare is None else rare.actor

    @actor.setter
    def actor(self, value: bool) -> None:
        if value or self._rare is not None:
            self._rare_fields().actor = value

    @property
    def resources(self) -> Amounts:
        """The alternative it runs (or last ran, or reserved) with, in ticks."""
        return self.demand.alternatives[self.choice]

    def needed(self) -> bool:
        """A client wants it or an unfinished dependent needs its result."""
        # ``dependents`` holds only unfinished dependents, so no separate counter is
        # needed: a counter that nothing maintained made inputs vanish at submission.
        return bool(self.dependents) or bool(self.wanted_by)

    def order(self) -> tuple[int, int]:
        """Start order: higher priority first, then earlier submission."""
        return (-self.priority, self.seq)


def add_dependent(task: TaskRecord, key: str) -> None:
    """``key`` takes ``task``'s result as input."""
    if task.dependents is None:
        task.dependents = {key}
    else:
        task.dependents.add(key)


def drop_dependent(task: TaskRecord, key: str) -> None:
    """``key`` no longer needs ``task``'s result (it ended or was forgotten)."""
    dependents = task.dependents
    if dependents is not None:
        dependents.discard(key)
        if not dependents:
            task.dependents = None


def want(task: TaskRecord, client: ClientRecord) -> None:
    """``client`` holds a future for ``task`` (as well as any others that do)."""
    wanted = task.wanted_by
    if wanted is None:
        task.wanted_by = client.alone
    elif client.id not in wanted:
        task.wanted_by = wanted | client.alone


def unwant(task: TaskRecord, client_id: str) -> None:
    """``client_id`` released its future for ``task``."""
    wanted = task.wanted_by
    if wanted is not None and client_id in wanted:
        task.wanted_by = (wanted - {client_id}) or None


class WorkerRecord:
    """The scheduler's view of one worker process."""

    __slots__ = (
        "actors",
        "address",
        "aliases",
        "cpu",
        "draining",
        "functions",
        "handoff",
        "has_what",
        "id",
        "incoming",
        "last_seen",
        "leaving",
        "ledger",
        "memory",
        "memory_limit",
        "name",
        "nbytes",
        "nthreads",
        "occupancy",
        "paused",
        "pid",
        "processing",
        "received",
        "rejoined",
        "rejoining",
        "reserved_by",
        "seceded",
        "sent",
        "spilled",
        "started",
        "supervisor",
        "thread_freed",
    )

    def __init__(
        self,
        worker_id: str,
        name: str,
        address: str,
        nthreads: int,
        total: Amounts,
        pid: int,
        memory_limit: int,
        units: Units | None = None,
    ) -> None:
        self.id = worker_id
        self.name = name
        self.address = address
        #: Name, address and host: what a ``workers=`` restriction matches.
        self.aliases = worker_aliases(name, address)
        self.nthreads = nthreads
        #: Its supply and what is free of it: the demand of every task in
        #: ``processing`` and of every actor in ``actors`` is taken, and nothing else.
        self.ledger = Ledger(total, units)
        #: Keys assigned here and not yet reported back (seceded ones included), in
        #: the order they were assigned -> (when, the seconds its group was expected
        #: to take then). The worker may not have started them yet: those beyond its
        #: threads wait in its queue, where an idle worker may take them (``stealing``).
        self.processing: dict[str, tuple[float, float]] = {}
        #: Tasks of ``processing`` known to have started (it said so: seceded, or
        #: refused to give one up); the others may still wait in its queue.
        self.started: set[str] = set()
        #: Seconds of work in ``processing``, each task as expected when assigned.
        self.occupancy = 0.0
        #: When it last reported a task finished or raised: a task that waited in its
        #: queue started no earlier than that (``stealing``).
        self.thread_freed = 0.0
        #: Tasks of other workers' ``processing`` on their way here (``stealing``):
        #: they take a thread here as soon as their worker lets them go.
        self.incoming = 0
        #: Tasks of ``processing`` that seceded: their thread does not count ->
        #: whether their resources went back to the ledger (False: kept, or none).
        self.seceded: dict[str, bool] = {}
        #: Seceded tasks waiting to hold their resources again, first asked first.
        self.rejoining: list[str] = []
        #: Tasks of ``processing`` back from seceding: they may exceed ``nthreads``.
        self.rejoined: set[str] = set()
        #: Keys whose result lives here.
        self.has_what: set[str] = set()
        #: Keys of ``has_what`` that are actors holding their task's resources.
        self.actors: set[str] = set()
        self.nbytes = 0
        #: Function ids this worker has been sent.
        self.functions: set[str] = set()
        #: The one task allowed to use what this worker frees, while it cannot fit.
        self.reserved_by: str | None = None
        #: Why the worker announced it is closing; None while it has not.
        self.leaving: str | None = None
        #: When it was last heard from (any message, heartbeats included).
        self.last_seen = 0.0
        self.pid = pid
        self.memory_limit = memory_limit
        #: Resident memory at the last heartbeat, bytes (0 until reported).
        self.memory = 0
        #: Paused for its memory, as its last heartbeat said: no new task goes there.
        self.paused = False
        #: Bytes of results it spilled to disk, at its last heartbeat.
        self.spilled = 0
        #: CPU use of the worker process at its last heartbeat, percent of one core.
        self.cpu = 0.0
        #: Bytes of results it fetched from peers and served to them, since it started.
        self.received = 0
        self.sent = 0
        #: pid of the supervisor that will report how this process ended (0: none).
        self.supervisor = 0
        #: Set by ``WorkerDraining``: finish what runs here, hand results off, then go.
        self.draining = False
        #: Request id of the hand-off of its results in flight, while draining.
        self.handoff: int | None = None

    def running(self) -> int:
        """Tasks here that count on a thread (seceded ones do not)."""
        return len(self.processing) - len(self.seceded)


class ClientRecord:
    """A connected client and the keys it holds futures for."""

    __slots__ = ("alone", "durable", "id", "name", "person", "queue_keys", "share", "wanted")

    def __init__(
        self, client_id: str, durable: bool = False, person: str = "", name: str = ""
    ) -> None:
        self.id = client_id
        #: The name it gave in the handshake (``Client(name=...)``, else
        #: ``client-1a2b3c4d``): how the status names its share, its id being the
        #: scheduler's own (``peer-3``).
        self.name = name or client_id
        #: Whom it acts as: a person the owner admitted (``core/people.py``), or
        #: ``OWNER`` ("") for a client that proved the cluster's secret. Its share in
        #: the fair division, and what it may see and touch (``people_gate.py``).
        self.person = person
        self.wanted: set[str] = set()
        #: ``{id}``, shared by the ``wanted_by`` of every task only this client wants.
        self.alone = frozenset((client_id,))
        #: A service (``RegisterService``): its tasks survive a restart (``restart.py``)
        #: and its leaving (they are not released): the job queue's runs.
        self.durable = durable
        #: The share its tasks belong to (``scheduler/shares.py``): a person's, all
        #: their clients together; else its own, so that two of the owner's clients
        #: are served alternately. The job queue's runs are its service client's
        #: share, one for all the owner's runs, and each person's are theirs.
        self.share = person or client_id
        #: Its tasks' queue keys, one ``Shared`` per kind, interned here so that the
        #: 10,000 tasks of a ``map`` share one (and it goes when the client does).
        self.queue_keys: dict[Demand | Restricted, Shared] = {}

    def queue_key(self, kind: Demand | Restricted) -> Shared:
        """The queue key of this client's tasks of ``kind``."""
        key = self.queue_keys.get(kind)
        if key is None:
            key = self.queue_keys[kind] = Shared(kind, self.share)
        return key


def sees(client: ClientRecord, task: TaskRecord) -> bool:
    """Whether ``client`` may see ``task``: the owner's clients see every task, a
    person's only their own (``people_gate.py``)."""
    return not client.person or task.person == client.person


class ServingDeath(NamedTuple):
    """A worker that died holding the only copy of a result it was serving
    (``scheduler.out_of_memory``)."""

    key: str
    nbytes: int  #: the result's size then
    worker: str  #: the worker's name
    pid: int
    limit: int  #: the worker's memory limit, bytes
    how: str  #: how it died, once known to be out of memory
