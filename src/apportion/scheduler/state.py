"""The scheduler's state: its records and every low-level change to them.

The bottom layer of ``scheduler/``: the handler modules (``client_requests``,
``worker_reports``, ``membership``, ``relay``, ``placement`` ...) import this and
call its mutations; it imports none of them. ``dispatch.handle`` gives events and
messages to the handlers.

Theory of operation
-------------------
Clients submit tasks; a task whose dependencies are all in memory is QUEUED in a
heap for its *queue key* (its ``Demand``, and where it may run), ordered by priority then
submission. Events never place tasks themselves: they only set
``placement_due``, and the service sends one ``PlacementDue`` per loop turn, so a
burst of ten thousand completions costs one placement pass (``placement.py``).

A result is kept while a client holds a future for it or an unfinished dependent
needs it (``TaskRecord.needed``); when neither holds, the record is forgotten and
the worker told to drop the data. Resources are taken from a worker's ledger when
a task is assigned and given back exactly once, when the worker reports the task
or when the worker is lost, whatever happened to the task in between.

Every state change goes through ``move``, which checks ``SCHEDULER_TASK_MOVES`` in
``records.py`` and appends ``(time, key, from, to, cause)`` to the log that
``story(key)`` reads.

What a handled event made necessary is gathered as commands (``events.py``):
decisions named for their messages (``SendComputeTask``, ``SendFreeKeys`` ...),
answers to client requests as ``Reply``. Completions and frees are batched per
peer until the event is handled (``take_commands``). Nothing here builds a wire
message to send: the service turns commands into messages (``wire.py``).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from heapq import heappush
from typing import Any

from apportion.core.allocation import NOTHING, Allocation
from apportion.core.ledger import describe_units
from apportion.core.people import Person
from apportion.core.resources import describe_resources
from apportion.core.transitions import IllegalTransition
from apportion.protocol.base import Message
from apportion.protocol.worker import WorkerDied
from apportion.scheduler import actors
from apportion.scheduler.books import RelayBook, RemoteBook, ServiceBook, SharedBook
from apportion.scheduler.coordination_book import CoordinationBook
from apportion.scheduler.events import (
    Command,
    Log,
    Reply,
    SendComputeTask,
    SendDropPrefetch,
    SendFreeKeys,
    SendKeysDone,
    SendKeysPending,
    SendLoadFunction,
    SendPrefetch,
    TaskError,
    failure_notice,
)
from apportion.scheduler.holders import clear_replicas, holders, holds
from apportion.scheduler.preempt_book import PreemptBook
from apportion.scheduler.records import (
    ERRED,
    FORGOTTEN,
    MEMORY,
    NEW,
    PROCESSING,
    QUEUED,
    RELEASED,
    SCHEDULER_TASK_MOVES,
    WAITING,
    ClientRecord,
    QueueKey,
    ServingDeath,
    TaskRecord,
    WorkerRecord,
    add_dependent,
    drop_dependent,
)
from apportion.scheduler.shares import FairPass, ShareBook
from apportion.scheduler.telemetry import Telemetry

#: The task's own key was never computed: scattered data cannot be recomputed.
SCATTERED = ""

#: Supervisor reports of worker deaths kept for poison-task errors.
MAX_DEATH_CAUSES = 1_000


#: A reserving task's inputs are fetched ahead when they add up to this many bytes:
#: smaller ones move in less time than the round trip that starts the task.
PREFETCH_FROM = 1 << 20


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Policy settings of one scheduler."""

    #: Fail a task at once when no connected worker can ever meet its demand. Right
    #: for a LocalCluster, which cannot grow; a real cluster warns and waits instead.
    fail_unsatisfiable: bool = False
    #: Transitions kept for ``story``; the oldest are dropped beyond this.
    log_size: int = 200_000
    #: Seconds of plain work to queue ahead on each thread, to hide the round trip.
    pipeline_seconds: float = 0.002
    #: Upper bound on plain tasks queued ahead per thread.
    max_pipeline: int = 32
    #: A plain task whose group is expected to run longer than this (seconds) is
    #: never queued behind another task: it waits in the scheduler for a free thread.
    #: Queuing ahead saves one round trip per task, worth it only for short work.
    queue_ahead_below: float = 0.1
    #: Seconds moving a task queued on one worker to an idle one costs beyond its
    #: inputs' transfer: the round trips that ask its worker to let it go and send it.
    steal_latency: float = 0.01
    #: Bytes per second a result is assumed to move between workers at (Dask's
    #: default): a plain task waits in the queue of the worker holding its inputs,
    #: past ``max_pipeline``, while that wait is shorter than moving them would take.
    transfer_bandwidth: float = 100e6
    #: Fraction of a worker's memory limit (Dask's ``target``, 0.6) past which, by the
    #: results it holds or its process's size, it gets new plain tasks last.
    memory_target: float = 0.6
    #: Seconds a task is assumed to take while none of its group has finished.
    unknown_duration: float = 0.5
    #: A task with no inputs that feeds others (a root: it makes new data) goes to a
    #: worker only while that worker has fewer than ``ceil(threads x this)`` tasks,
    #: so that a worker makes new data only as it gets through the old (Dask's
    #: ``worker-saturation``, 1.1)...
    root_saturation: float = 1.1
    #: ... unless its group's results are measured smaller than this many bytes on
    #: average: tiny roots (a tree of no-ops) are queued ahead as any short task.
    root_output_below: int = 1 << 20
    #: A worker not heard from for this many seconds (no message, no heartbeat) is
    #: declared lost: stopped, cut off or frozen. Its tasks run elsewhere.
    worker_timeout: float = 30.0
    #: Heartbeats per second the scheduler asks to hear: past this many workers,
    #: each is told to beat every ``ceil(workers / this)`` seconds, as 1,000 workers
    #: beating every second would cost the scheduler a thousand messages a second
    #: while nothing happens; but at least five times per ``worker_timeout``, so
    #: that silence still means something (past that, the rate grows again).
    heartbeats_per_second: int = 200
    #: A task running on this many workers that died is failed as the likely cause
    #: (a "poison" task) instead of killing worker after worker.
    max_worker_deaths: int = 3
    #: How long a poison task's failure waits for the supervisor to say how the
    #: last worker died (exit code, signal, out of memory), in seconds.
    death_report_wait: float = 3.0
    #: Stop a preemptible run (the job queue's ``--preemptible``) to let in a share
    #: that has waited this many seconds below its fair share, and never stop one
    #: that has run for less (``preemption.py``). None: never preempt. Off by
    #: default: a stopped run loses what it did since its last checkpoint, so the
    #: cluster's owner chooses what that wait is worth.
    preempt_after: float | None = None


#: The story's line for a running task released: it leaves ``assigned`` at once.
_DISCARDED = "released while running: its worker drops the result when it ends"


class SchedulerState:
    """All task, worker and client records, and the changes every handler makes to them."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.tasks: dict[str, TaskRecord] = {}
        self.workers: dict[str, WorkerRecord] = {}
        #: Seconds every worker was last told to leave at least between heartbeats.
        self.heartbeat_floor = 0.0
        self.clients: dict[str, ClientRecord] = {}
        #: func_id -> pickled function, with the number of live tasks using it.
        self.functions: dict[str, bytes] = {}
        self.function_users: dict[str, int] = defaultdict(int)
        #: queue key -> heap of (-priority, seq, key). Entries go stale when a task
        #: leaves QUEUED; placement skips them, which is cheaper than deleting.
        self.ready: dict[QueueKey, list[tuple[int, int, str]]] = {}
        self.log: deque[tuple[float, str, str, str, str]] = deque(maxlen=self.config.log_size)
        self.placement_due = False
        #: Identity shown in ``scheduler_info`` (set by the service).
        self.identity: dict[str, Any] = {}
        self.relays = RelayBook()
        self.remote = RemoteBook()
        #: Datasets, metadata and copies in flight (``shared_data.py``).
        self.shared = SharedBook()
        #: Locks, semaphores, variables, queues, events, topics (``coordination.py``).
        self.coordination = CoordinationBook()
        #: Counts kept as things happen, for the views (``telemetry.py``).
        self.telemetry = Telemetry()
        self.now = 0.0
        self._seq = 0
        self._out: list[Command] = []
        self.done_keys: dict[str, list[str]] = defaultdict(list)
        self.free_keys: dict[str, list[str]] = defaultdict(list)
        #: Request kinds already warned about, so a sweep of 1,000 says it once.
        self.warned: set[QueueKey] = set()
        self.satisfiable_cache: dict[QueueKey, bool] = {}
        #: Per request kind no connected worker could hold: its names that are slips
        #: of offered ones, with their suggestions. Cleared with the one above.
        self.misnamed_cache: dict[QueueKey, dict[str, str]] = {}
        #: (client, request kind) pairs already told that nobody can run it.
        self.notified: set[tuple[str, QueueKey]] = set()
        #: Tasks whose inputs could not be fetched, and how often (sparse: only those).
        self.fetch_failures: dict[str, int] = {}
        #: Tasks that were running when their worker died: (worker name, pid, how,
        #: whether its last heartbeat was near its memory limit) for each death (sparse).
        self.deaths: dict[str, list[tuple[str, int, str, bool]]] = {}
        #: Tasks that raised and were run again: how many times (sparse).
        self.retried: dict[str, int] = {}
        #: Tasks retried after raising: the id of the worker of each attempt that
        #: raised (sparse; dropped with ``retried``). Placement tries others first.
        self.raised_on: dict[str, list[str]] = {}
        #: Results in memory whose type is not their group's (``GroupTally.result_type``):
        #: key -> type name, "" for unknown. Sparse; an entry goes when its result does.
        self.result_types: dict[str, str] = {}
        #: (worker name, pid) -> how that process ended, as its supervisor reported.
        #: Bounded: only the latest ``MAX_DEATH_CAUSES`` are kept.
        self.death_causes: dict[tuple[str, int], WorkerDied] = {}
        #: Results whose only holder died out of memory while serving them, each
        #: death (sparse). Unlike ``deaths``, kept when the task completes again:
        #: completing is what comes before each such death (``out_of_memory``).
        self.serving_deaths: dict[str, list[ServingDeath]] = {}
        #: Results in memory that a client was told to fetch from their holders
        #: itself (``GatherReply.elsewhere``), since they were computed (sparse).
        self.served_directly: set[str] = set()
        #: Deaths of supervised workers that were serving results, until their
        #: supervisor says whether memory killed them: (name, pid) -> (deadline, deaths).
        self.unclassified: dict[tuple[str, int], tuple[float, list[ServingDeath]]] = {}
        #: Poison tasks held QUEUED (in no heap) until their last worker death is
        #: classified or the deadline passes; then they fail. key -> deadline.
        self.verdicts: dict[str, float] = {}
        #: Clients serving others: requests, tasks still running, notes (``task_hooks``).
        self.services = ServiceBook()
        #: Reserving tasks whose inputs their worker fetches ahead: key -> (worker id,
        #: the inputs asked for). Sparse: one per reservation at most.
        self.prefetches: dict[str, tuple[str, list[str]]] = {}
        #: Tasks whose worker was asked to let them go to an idle one (``stealing``):
        #: key -> (its worker's id, the idle worker's id). The task stays PROCESSING
        #: there, holding what it holds, until that worker answers.
        self.steals: dict[str, tuple[str, str]] = {}
        #: The people the owner admitted, by name (``people.py``; the owner, "", is
        #: never among them). Their secrets are the service's, never the state's.
        self.people: dict[str, Person] = {}
        #: Whether a change to ``people`` is kept by the service across restarts
        #: (it has a people file), and where: said to the owner who changes them.
        self.people_stored = ""
        #: Weights and quotas of shares (``shares.py``); a client's share is on its record.
        self.shares = ShareBook()
        #: Each share's holdings while a placement pass serves several shares, or one
        #: with a quota (``placement.place``); None otherwise, and between passes.
        self.fair: FairPass | None = None
        #: Preemptible tasks, shares waiting below their fair share, stops under way
        #: (``preemption.py``).
        self.preemption = PreemptBook()

    # --- output -----------------------------------------------------------------------

    def take_commands(self) -> list[Command]:
        """What the handled event made necessary; completions and frees are batched."""
        for client_id, keys in self.done_keys.items():
            if client_id in self.clients:
                types = [self.result_type(key) for key in keys]
                self._out.append(SendKeysDone(client_id, keys, types))
        self.done_keys.clear()
        for worker_id, keys in self.free_keys.items():
            if worker_id in self.workers:
                self._out.append(SendFreeKeys(worker_id, keys))
        self.free_keys.clear()
        out, self._out = self._out, []
        return out

    def emit(self, command: Command) -> None:
        """Return ``command`` from the event being handled."""
        self._out.append(command)

    def next_seq(self) -> int:
        """A number later than every one given before: submission order."""
        self._seq += 1
        return self._seq

    def reply(self, client_id: str, message: Message) -> None:
        """Answer a client's request with ``message`` (the shape it asked for)."""
        self._out.append(Reply(client_id, message))

    def warn(self, text: str) -> None:
        """Log a warning (the service's logger); the dashboard lists it too."""
        self._out.append(Log("warning", text))
        self.telemetry.warned(self.now, "warning", text)

    def log_info(self, text: str) -> None:
        """Log for information (the service's logger)."""
        self._out.append(Log("info", text))

    # --- lifecycle ------------------------------------------------------------------

    def move(self, task: TaskRecord, new: str, cause: str) -> None:
        """Change ``task``'s state, checking the table and recording the cause."""
        if (task.state, new) not in SCHEDULER_TASK_MOVES:  # inline: a few times per task
            raise IllegalTransition("scheduler", f"task {task.key!r}", task.state, new, cause)
        if task.reserved_on is not None and new != QUEUED:
            # Only a QUEUED task may hold a reservation; checked here so that every way
            # out (an input lost, say, back to WAITING) frees the worker it held.
            self.drop_reservation(task)
        if self.verdicts and task.state == QUEUED:
            self.verdicts.pop(task.key, None)
        if task.state == MEMORY:
            if self.served_directly:
                self.served_directly.discard(task.key)  # the result's mark, not the task's
            if self.result_types:
                self.result_types.pop(task.key, None)
        self.log.append((self.now, task.key, task.state, new, cause))
        self.telemetry.moved(task, task.state, new)
        task.state = new

    def enqueue(self, task: TaskRecord, cause: str) -> None:
        """Make ``task`` ready: QUEUED, in its queue's heap, placement due."""
        self.move(task, QUEUED, cause)
        heap = self.ready.get(task.queue)
        if heap is None:
            heap = self.ready[task.queue] = []
        heappush(heap, (-task.priority, task.seq, task.key))
        self.placement_due = True

    def requeue(self, task: TaskRecord, cause: str) -> None:
        """Run ``task`` again after its worker gave it back (raised, lost, discarded).

        An input may have been lost while it ran (``lose_result`` counts it in
        ``missing_deps``): then it waits for the recomputation instead of starting
        on a worker that cannot fetch the input.
        """
        if task.missing_deps:
            self.move(task, WAITING, cause)
        else:
            self.enqueue(task, cause)

    def expected(self, task: TaskRecord) -> float:
        """Seconds ``task`` is expected to run: its group's average so far."""
        tally = task.group
        known = None if tally is None else tally.expected
        return self.config.unknown_duration if known is None else known

    def assign(
        self,
        task: TaskRecord,
        worker: WorkerRecord,
        units: dict[str, list[str]] | None = None,
        cause: str = "",
    ) -> None:
        """Start ``task`` on ``worker``: take its resources and send it there.

        ``units``: take these units of indexed pools if they are free (an adopted
        run keeps the devices its processes already use); else placement picks.
        """
        cause = cause or f"assigned to {worker.name}"
        allocation = NOTHING
        demand = task.demand
        if demand.asks:
            amounts = demand.alternatives[task.choice]
            if len(demand.alternatives) > 1:
                cause += f" with {describe_resources(amounts) or 'no resources'}"
            held = worker.ledger.take(amounts, units) if amounts else {}
            if held:
                cause += " holding " + describe_units(held)
            allocation = Allocation(amounts, held, task.choice)
        task.allocation = allocation
        expected = self.expected(task)
        worker.processing[task.key] = (self.now, expected)
        worker.occupancy += expected
        task.worker = worker.id
        self.move(task, PROCESSING, cause)
        if self.fair is not None:
            self.fair.took(task)  # its share holds more: placement serves the others first
        if task.func_id not in worker.functions:
            worker.functions.add(task.func_id)
            self._out.append(
                SendLoadFunction(worker.id, task.func_id, self.functions[task.func_id])
            )
        who_has: dict[str, list[str]] = {}
        sizes: dict[str, int] = {}
        for dep in task.deps:
            record = self.tasks[dep]
            who_has[dep] = [self.workers[w].address for w in holders(record)]
            sizes[dep] = record.nbytes
        self._out.append(
            SendComputeTask(
                worker.id,
                task.key,
                task.func_id,
                task.args,
                who_has,
                task.priority,
                allocation,
                sizes,
                task.seq,
            )
        )

    def unassign(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """The worker is done with ``task``: return its resources exactly once."""
        key = task.key
        _, expected = worker.processing.pop(key)
        worker.occupancy = worker.occupancy - expected if worker.processing else 0.0
        if worker.started:
            worker.started.discard(key)
        if self.steals:
            self.end_steal(key)
        given_back = False
        if worker.seceded or worker.rejoined:
            # It may end while seceded, without rejoining: what it gave back is back.
            given_back = worker.seceded.pop(key, False)
            if key in worker.rejoining:
                worker.rejoining.remove(key)
            worker.rejoined.discard(key)
        allocation = task.allocation
        if allocation is not None and allocation.resources and not given_back:
            worker.ledger.give(allocation.resources, allocation.units)
        task.allocation = None
        task.worker = None

    def end_steal(self, key: str) -> str | None:
        """The move of ``key`` to an idle worker is over, done or not: that worker no
        longer expects it. Returns the idle worker's id, if a move was under way."""
        steal = self.steals.pop(key, None)
        if steal is None:
            return None
        thief = self.workers.get(steal[1])
        if thief is not None:
            thief.incoming -= 1
        return steal[1]

    def reserve(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """``task`` reserves ``worker``: it runs there next. Its large inputs held
        elsewhere are fetched now, so that moving them overlaps the tasks it waits for."""
        worker.reserved_by = task.key
        task.reserved_on = worker.id
        if worker.paused:
            return
        who_has: dict[str, list[str]] = {}
        sizes: dict[str, int] = {}
        for dep_key in task.deps:
            dep = self.tasks[dep_key]
            if dep.state == MEMORY and not holds(dep, worker.id):
                who_has[dep_key] = [self.workers[w].address for w in holders(dep)]
                sizes[dep_key] = dep.nbytes
        if sum(sizes.values()) >= PREFETCH_FROM:
            self.prefetches[task.key] = (worker.id, list(who_has))
            self._out.append(SendPrefetch(worker.id, who_has, sizes))

    def drop_reservation(self, task: TaskRecord) -> None:
        """``task`` no longer holds a worker's reservation; inputs fetched ahead for it
        are dropped unless it is starting on that worker."""
        worker = self.workers.get(task.reserved_on or "")
        if worker is not None and worker.reserved_by == task.key:
            worker.reserved_by = None
        task.reserved_on = None
        prefetched = self.prefetches.pop(task.key, None)
        if prefetched is not None:
            worker_id, keys = prefetched
            if worker_id != task.worker and worker_id in self.workers:
                self._out.append(SendDropPrefetch(worker_id, keys))

    def finish_inputs(self, task: TaskRecord) -> None:
        """``task`` no longer needs its inputs: release those nobody else needs."""
        for dep_key in task.deps:
            dep = self.tasks.get(dep_key)
            if dep is not None and dep.dependents and task.key in dep.dependents:
                drop_dependent(dep, task.key)
                self.release_if_unneeded(dep)

    def release_if_unneeded(self, task: TaskRecord) -> None:
        # A NEW task is mid-submission (a batch sibling failed first): ``submit``
        # releases it after giving it a state, if it is still unneeded then. A
        # FORGOTTEN one went already, when its last dependent failed.
        if not task.needed() and task.state not in (NEW, FORGOTTEN):
            self.forget(task)

    def forget(self, task: TaskRecord) -> None:
        """Drop a task nobody needs. A running one is forgotten when its worker reports.

        A finished one whose result fed results that still exist keeps its record
        (RELEASED, its data dropped), so that a lost result can be recomputed; an
        actor never is (``actors.py``).
        """
        if task.state == PROCESSING and task.worker is not None:
            if not task.discard_result:
                task.discard_result = True
                self.free_keys[task.worker].append(task.key)
                self.log.append((self.now, task.key, PROCESSING, PROCESSING, _DISCARDED))
            return
        if task.state == RELEASED:
            return  # still feeds results that exist (lineage), or it would be gone
        if task.state == ERRED and task.lineage and task.error and task.error[0] == "exception":
            return  # it raised: a failed dependent may be retried, and needs this recipe
        kept = task.state in (MEMORY, WAITING, QUEUED)  # not a failure: nothing to recompute
        if kept and task.lineage and task.func_id != SCATTERED and not task.actor:
            self.keep_released(task, "released; kept to recompute what was computed from it")
            return
        self.remove(task, "released")

    def assigned(self, worker: WorkerRecord) -> list[str]:
        """The keys ``worker`` runs or queues for someone: its ``processing`` less the
        tasks nobody wants any more (``forget``), as ``Client.processing`` shows them.

        Those stay in ``processing`` until the worker reports them, because their
        thread (and resources) are busy until then: the ledger must not hand them out
        twice. They are simply no longer anybody's work.
        """
        tasks = self.tasks
        return [key for key in worker.processing if not tasks[key].discard_result]

    def keep_released(self, task: TaskRecord, cause: str) -> None:
        """Drop ``task``'s result (or stop waiting to compute it) but keep its recipe.

        Scattered data is never kept: it could not be recomputed anyway.
        """
        if task.state == MEMORY:
            self.drop_result(task)
        unfinished = task.state in (WAITING, QUEUED, PROCESSING)
        self.move(task, RELEASED, cause)
        task.worker = None
        if unfinished:
            self.finish_inputs(task)

    def remove(self, task: TaskRecord, cause: str) -> None:
        """Forget ``task`` and what only it kept (its result, released inputs)."""
        if task.state == MEMORY:
            self.drop_result(task)
        unfinished = task.state in (WAITING, QUEUED, PROCESSING)
        self._delete(task, cause)
        if unfinished:
            self.finish_inputs(task)
        self._unlink_lineage(task)

    def _unlink_lineage(self, task: TaskRecord) -> None:
        """``task`` is gone: released inputs that only it could need go too (iteratively:
        a chain of 100,000 released tasks must not recurse 100,000 deep)."""
        stack = [task]
        while stack:
            gone = stack.pop()
            for dep_key in gone.deps:
                dep = self.tasks.get(dep_key)
                if dep is None or dep.lineage <= 0:
                    continue
                dep.lineage -= 1
                if dep.lineage == 0 and (
                    dep.state == RELEASED or (dep.state == ERRED and not dep.needed())
                ):
                    self._delete(dep, "nothing computed from it is left")
                    stack.append(dep)

    def _delete(self, task: TaskRecord, cause: str) -> None:
        """``task`` leaves the table (``move`` frees a reservation it held)."""
        self.move(task, FORGOTTEN, cause)
        del self.tasks[task.key]
        self._forget_counts(task.key)
        if self.preemption.preemptible:
            self.preemption.preemptible.discard(task.key)
            self.preemption.stopping.pop(task.key, None)
        if self.serving_deaths:
            self.serving_deaths.pop(task.key, None)
        self._drop_function_use(task)

    def _drop_function_use(self, task: TaskRecord) -> None:
        if task.func_id != SCATTERED:
            users = self.function_users[task.func_id] - 1
            if users:
                self.function_users[task.func_id] = users
            else:
                del self.function_users[task.func_id]
                self.functions.pop(task.func_id, None)

    def _forget_counts(self, key: str) -> None:
        """A task finished or went away: its failure counts no longer matter."""
        if self.fetch_failures:
            self.fetch_failures.pop(key, None)
        if self.deaths:
            self.deaths.pop(key, None)
        if self.retried:
            self.retried.pop(key, None)
        if self.raised_on:
            self.raised_on.pop(key, None)

    def drop_result(self, task: TaskRecord) -> None:
        """Tell every holder of ``task``'s result to drop it; it is held nowhere now."""
        if task.actor and actors.release(self.workers, task):
            self.placement_due = True
        for worker_id in clear_replicas(task, self.workers):
            self.free_keys[worker_id].append(task.key)
        worker = self.workers.get(task.worker or "")
        if worker is not None and task.key in worker.has_what:
            worker.has_what.discard(task.key)
            worker.nbytes -= task.nbytes
            self.free_keys[worker.id].append(task.key)
        task.worker = None

    def complete(
        self, task: TaskRecord, worker: WorkerRecord, nbytes: int, cause: str, type_name: str = ""
    ) -> None:
        """``task``'s result, of type ``type_name`` ("" if unknown), now lives on ``worker``."""
        self.move(task, MEMORY, cause)
        self._note_type(task, type_name)
        self._forget_counts(task.key)
        task.worker = worker.id
        task.nbytes = nbytes
        worker.has_what.add(task.key)
        worker.nbytes += nbytes
        if task.wanted_by:
            for client_id in task.wanted_by:
                self.done_keys[client_id].append(task.key)
        for dependent_key in task.dependents or ():
            dependent = self.tasks[dependent_key]
            dependent.missing_deps -= 1
            if dependent.missing_deps == 0 and dependent.state == WAITING:
                self.enqueue(dependent, f"input {task.key} ready")
        self.finish_inputs(task)
        self.release_if_unneeded(task)

    def _note_type(self, task: TaskRecord, type_name: str) -> None:
        """Keep the type of ``task``'s result: once per group, and apart (sparse) for
        a result whose type is not its group's."""
        group = task.group
        if group is not None:
            if group.result_type is None and type_name:
                group.result_type = type_name
            if group.result_type == type_name or (group.result_type is None and not type_name):
                return
        self.result_types[task.key] = type_name

    def result_type(self, key: str) -> str:
        """The type name of ``key``'s result in memory ("" if unknown or not in memory)."""
        task = self.tasks.get(key)
        if task is None or task.state != MEMORY:
            return ""
        if self.result_types:
            odd = self.result_types.get(key)
            if odd is not None:
                return odd
        group = task.group
        return (group.result_type or "") if group is not None else ""

    def fail(self, task: TaskRecord, error: TaskError, cause: str) -> None:
        """``task`` and, transitively, every unfinished dependent fail with ``error``."""
        stack = [(task, cause)]
        while stack:
            current, why = stack.pop()
            if current.state == ERRED or current.key not in self.tasks:
                continue
            if current.state == MEMORY and current is not task:
                continue  # a finished dependent no longer needs the failed input
            if current.state == PROCESSING and current.worker is not None:
                if current.cancelled:
                    continue  # failed already; settled when its worker reports
                # Still running: the worker drops the result; resources return on report.
                # The error is kept for clients that ask for the key in the meantime.
                current.cancelled = True
                current.error = error
                self.forget(current)
                self._notify_error(current, error)
            else:
                current.error = error  # before the move: telemetry counts by its kind
                self.move(current, ERRED, why)
                self._notify_error(current, error)
                self.finish_inputs(current)
            for dependent_key in current.dependents or ():
                stack.append((self.tasks[dependent_key], f"input {current.key} failed"))
            if current.state == ERRED:
                # Dependents leave ``dependents`` as they fail (``_finish_inputs``); one
                # still running stays, so its inputs are kept until its worker reports.
                self.release_if_unneeded(current)

    def _notify_error(self, task: TaskRecord, error: TaskError) -> None:
        attempts = self.retried.get(task.key, 0) + 1
        for client_id in task.wanted_by or ():
            self._out.append(failure_notice(client_id, task.key, error, attempts))

    def lose_result(self, task: TaskRecord, cause: str) -> None:
        """The only copy of ``task``'s result is gone: recompute it if we can."""
        if task.actor and actors.release(self.workers, task):
            self.placement_due = True
        task.worker = None
        for client_id in task.wanted_by or ():
            # Their futures said "finished": they must wait again, not fail on gather
            # (or, for an actor, take the failure that follows).
            self._out.append(SendKeysPending(client_id, [task.key]))
        if task.actor:
            self.fail(task, ("lost", actors.lost_text(task, cause), b""), cause)
            return
        for dependent_key in task.dependents or ():
            dependent = self.tasks[dependent_key]
            dependent.missing_deps += 1
            if dependent.state == QUEUED:
                self.move(dependent, WAITING, f"input {task.key} lost")
        if not task.needed():
            self.forget(task)
            return
        self.recompute(task, cause)

    def recompute(self, task: TaskRecord, cause: str) -> None:
        """Run ``task`` (lost or RELEASED) again, and the RELEASED inputs it needs first.

        Its lineage is walked with a stack, not recursion. Scattered data and inputs
        already forgotten cannot be recomputed: the task fails, saying which.
        """
        stack = [(task, cause)]
        while stack:
            current, why = stack.pop()
            if current.state not in (MEMORY, RELEASED):
                continue  # reached twice through two paths: already on its way
            if current.func_id == SCATTERED:
                text = f"scattered data {current.key!r} was lost ({why}) and cannot be recomputed"
                self.fail(current, ("lost", text, b""), why)
                continue
            unknown = [d for d in current.deps if d not in self.tasks]
            if unknown:
                text = (
                    f"result of {current.key!r} was lost ({why}) and input {unknown[0]!r} is gone"
                )
                self.fail(current, ("lost", text, b""), why)
                continue
            failed = next((d for d in current.deps if self.tasks[d].state == ERRED), None)
            if failed is not None:
                error = self.tasks[failed].error or ("lost", f"input {failed!r} failed", b"")
                self.fail(current, error, f"{why}; input {failed} failed")
                continue
            for dep in self.start_again(current, why):
                stack.append((dep, f"needed to recompute {current.key}"))

    def start_again(self, task: TaskRecord, cause: str) -> list[TaskRecord]:
        """Run ``task`` again from its inputs: WAITING for those not in memory, else
        QUEUED. Returns its RELEASED inputs, which the caller must recompute."""
        task.missing_deps = 0
        released = []
        for dep_key in task.deps:
            dep = self.tasks[dep_key]
            add_dependent(dep, task.key)
            if dep.state != MEMORY:
                task.missing_deps += 1
            if dep.state == RELEASED:
                released.append(dep)
        if task.missing_deps:
            self.move(task, WAITING, cause)
        else:
            self.enqueue(task, cause)
        return released

    def story(self, key: str) -> list[tuple[float, str, str, str, str]]:
        """Every recorded transition of ``key``, oldest first, with its cause."""
        return [row for row in self.log if row[1] == key]
