"""The worker's own view of its tasks and data, as a pure state machine.

Theory of operation
-------------------
``WorkerState.handle(*events)`` takes what happened (a task arrived, a fetch
completed, an execution finished, ...) and returns what to do (fetch from a peer,
execute, tell the scheduler, forget data). It holds no values, only keys, sizes
and types, and it imports no asyncio, socket, thread or clock: the service reads
the time and puts it inside each event. So every rule below is tested in
microseconds, and a Hypothesis machine can drive it through any interleaving.

A task moves ``waiting -> ready -> executing`` and leaves the table when it is
reported. A key's value is ``memory`` while it is in the data store; it is
*owned* when the scheduler knows about it: computed or put here, or fetched from a
peer for a task here, a copy kept and reported (``CopiesKept``, Dask's
``add-keys``) so that the next task here that needs it finds it in memory, and the
scheduler frees it with the result. A copy fetched otherwise is *transient*.

A key may also be *prefetched*: the scheduler expects a task here (one that
reserved this worker) and has its inputs fetched ahead, so that they move while the
tasks it waits for run. Such a transient copy is kept until a task here needs it
(then it is that task's, and forgotten once it starts) or the scheduler drops the
prefetch.

A task given here waits for a thread (or its inputs) as long as the tasks before it
run. The scheduler may then ask for it back, for a worker whose thread idles
(``StealArrived``): tasks that have not started are let go, dropped as if freed and
never run here, and the answer says which were let go and which had started. The
state machine decides, so a task that started is never moved and never runs twice.

Short plain tasks may be *started ahead* (``started_ahead``): while every thread runs
a task of a function whose runs here took under ``SHORT_TASK`` on average, a few more plain
tasks of such functions are handed to the threads, which take them in order as they
end the tasks they run. Each counts as executing (a steal finds it started), but not
on a thread until one ends; a burst of tiny tasks then needs no round trip through
the event loop between them, and their outcomes come back together.

A *paused* worker (``Paused``: its memory passed the pause threshold) starts no
execution and sends no fetch until ``Resumed``. Tasks keep arriving and become
ready; fetches wanted meanwhile are kept, each key still ``fetching``, and go out
on resume, except those no pending task needs any more, which are released. A
held fetch is no request in flight: nothing can answer it, so nothing else changes.

A task may *secede* (``secede()``, ``worker_client()``): it goes on running, but
its thread no longer counts, so another task starts, and the scheduler takes back
its resources unless it keeps them. On ``rejoin`` it counts again, at once if it
gave nothing back, else once the scheduler says it holds its resources again
(``RejoinGrantedArrived``). Rejoining never waits for a thread: as with Dask, the
tasks executing may then exceed ``nthreads`` for a while, and nothing new starts
until they are back under it.

The data store is written by the service before it hands over the event that
announces the value (a finished execution, a fetch reply, a put), so that one
``handle`` call can cover a whole batch. That is why ``ForgetData`` comes last in
the returned commands, after any ``Execute`` that reads the inputs, and why a key
that arrives again within the same call is taken off the list to forget.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from typing import Any

from apportion.core.transitions import IllegalTransition
from apportion.protocol.peer_data import DataStored
from apportion.protocol.worker import (
    ComputeTask,
    CopiesKept,
    MissingDependency,
    ResultTooLarge,
    StealResponse,
    TaskFinished,
    TaskRaised,
    TaskRejoining,
    TasksDropped,
    TaskSeceded,
)
from apportion.worker.events import (
    ComputeArrived,
    DataInfo,
    DataPut,
    Execute,
    ExecutionOk,
    ExecutionRaised,
    ExecutionTooLarge,
    Fetch,
    FetchDone,
    FetchFailed,
    ForgetData,
    FreeArrived,
    Paused,
    PrefetchArrived,
    PrefetchDropped,
    RejoinGrantedArrived,
    Rejoining,
    Resumed,
    ResumeTask,
    Seceded,
    SendToScheduler,
    StealArrived,
    WorkerCommand,
    WorkerEvent,
)
from apportion.worker.records import (
    EXECUTING,
    FETCHING,
    MEMORY,
    READY,
    RELEASED,
    WAITING,
    WORKER_TASK_MOVES,
    AssignedTask,
    FetchRecord,
)

#: Seconds under which a task counts as short: tasks of its function may then be
#: handed to a busy thread (``WorkerState.started_ahead``).
SHORT_TASK = 0.002
#: Functions whose run times a worker keeps (``WorkerState.durations``) before it
#: starts again from none.
MAX_FUNCTIONS_TIMED = 10_000


class WorkerState:
    """Tasks, data and fetches of one worker; see the module docstring."""

    def __init__(
        self,
        nthreads: int,
        address: str = "",
        *,
        story_limit: int = 100_000,
        fetch_budget: int | None = None,
        ahead: int = 0,
    ) -> None:
        if nthreads < 1:
            raise ValueError(f"nthreads must be at least 1, got {nthreads}")
        if ahead < 0:
            raise ValueError(f"ahead must be at least 0, got {ahead}")
        self.nthreads = nthreads
        #: Most tasks handed to the threads beyond ``nthreads`` (``started_ahead``).
        self.ahead = ahead
        #: Tasks handed to the threads while every thread was busy (EXECUTING, not
        #: counted in ``executing``), in the order the threads will take them: a
        #: thread that ends a short task starts the next at once, with no round trip
        #: through the event loop, and the loop reports their outcomes in one frame.
        #: Only plain tasks of functions that run here in under ``SHORT_TASK`` (on
        #: average, ``durations``), and only behind such tasks, go ahead: none waits
        #: long behind another, where the scheduler could no longer move it to an
        #: idle worker.
        self.started_ahead: dict[str, None] = {}
        #: Seconds a run of each function took here, by id: the average of its runs,
        #: the latest weighing half (as the scheduler's task groups). A function is
        #: short while this is under ``SHORT_TASK``: one quick call of a function
        #: whose calls take 50 ms does not make the next ones go ahead.
        self.durations: dict[str, float] = {}
        #: Most bytes asked of peers and not arrived yet (None: no bound). A fetch
        #: over it waits for earlier ones, except the first: values arriving faster
        #: than the memory monitor samples would pass the limit before it could spill.
        self.fetch_budget = fetch_budget
        #: Bytes asked of peers and not arrived yet, by the scheduler's sizes.
        self.in_flight_bytes = 0
        #: Our own data address: never fetch from ourselves.
        self.address = address
        #: Tasks not yet reported, by key.
        self.tasks: dict[str, AssignedTask] = {}
        #: Keys whose values are in the data store.
        self.data: dict[str, DataInfo] = {}
        #: Subset of ``data`` the scheduler knows is here; the rest is transient.
        self.owned: set[str] = set()
        #: Dependency -> pending (waiting or ready) tasks that need it; never an empty set.
        self.needed_by: dict[str, set[str]] = {}
        #: Dependencies being fetched; disjoint from ``data``.
        self.fetches: dict[str, FetchRecord] = {}
        #: Inputs fetched ahead for a task expected here, that no task here needs yet;
        #: each in ``data`` or ``fetches``, none in ``needed_by``.
        self.prefetched: set[str] = set()
        #: Keys of tasks in state EXECUTING on a thread that counts: not seceded. No
        #: more than ``nthreads`` start; rejoining tasks may exceed it for a while.
        self.executing: set[str] = set()
        #: Seceded tasks (EXECUTING, their thread not counted) -> whether they kept
        #: their resources.
        self.seceded: dict[str, bool] = {}
        #: Seceded tasks waiting for the scheduler to give their resources back.
        self.rejoining: set[str] = set()
        #: Executing tasks that came back from seceding: the ones that may exceed
        #: ``nthreads``.
        self.rejoined: set[str] = set()
        #: Heap of (no-resources, -priority, order, seq, key): the scheduler's order, then
        #: arrival; entries of gone tasks are skipped.
        self._ready: list[tuple[int, int, int, int, str]] = []
        self._seq = 0
        #: Set by ``Paused``, cleared by ``Resumed``: while set, no ``Execute`` and no
        #: ``Fetch`` comes out of ``handle``.
        self.paused = False
        self._story: deque[tuple[float, str, str, str, str]] = deque(maxlen=story_limit)
        self._out: list[WorkerCommand] = []
        #: Fetches to send, by holder address; kept across calls only while paused.
        self._to_fetch: dict[str, list[str]] = {}
        self._forget: dict[str, None] = {}  # ordered set
        #: Copies fetched for tasks here and kept, to report (``CopiesKept``).
        self._kept: list[str] = []

    # --- public -------------------------------------------------------------------

    def handle(self, *events: WorkerEvent) -> list[WorkerCommand]:
        """Apply ``events`` in order; return the commands, fetches and forgets last."""
        now = 0.0
        for event in events:
            now = event.time
            self._dispatch(event)
        self._start_ready(now)
        if self._kept:
            self._send(CopiesKept(self._kept))
            self._kept = []
        out, self._out = self._out, []
        if not self.paused:
            out.extend(self._fetches_to_send(now))
        if self._forget:
            out.append(ForgetData(tuple(self._forget)))
            self._forget = {}
        return out

    def story(self, *keys: str) -> list[tuple[float, str, str, str, str]]:
        """Transitions of ``keys`` as (time, key, from, to, cause), oldest first."""
        wanted = set(keys)
        return [entry for entry in self._story if entry[1] in wanted]

    def ready_keys(self) -> list[str]:
        """Ready tasks in the order they will start (for tests and views)."""
        live = [e for e in self._ready if self._is_live(e)]
        return [e[4] for e in sorted(live)]

    # --- dispatch -----------------------------------------------------------------

    def _dispatch(self, event: WorkerEvent) -> None:
        match event:
            case ComputeArrived():
                self._on_compute(event.task, event.time)
            case FreeArrived() | StealArrived():
                self._on_letting_go(event)
            case PrefetchArrived() | PrefetchDropped():
                self._on_prefetch(event)
            case FetchDone():
                self._on_fetch_done(event)
            case FetchFailed():
                self._on_fetch_failed(event)
            case ExecutionOk():
                self._on_execution_ok(event)
            case ExecutionRaised():
                self._on_execution_raised(event)
            case ExecutionTooLarge():
                self._on_execution_too_large(event)
            case DataPut():
                self._on_put(event)
            case Paused() | Resumed():
                self.paused = isinstance(event, Paused)
            case Seceded() | Rejoining() | RejoinGrantedArrived():
                self._on_seceding(event)

    def _on_compute(self, task: ComputeTask, now: float) -> None:
        key = task.key
        existing = self.tasks.get(key)
        if existing is not None:
            if existing.freed:
                existing.freed = False
                self._move(key, EXECUTING, EXECUTING, "computed again after free", now)
            return
        if key in self.data:
            info = self.data[key]
            self.owned.add(key)
            self._send(TaskFinished(key, info.nbytes, 0.0, info.type_name))
            self._move(key, MEMORY, MEMORY, "asked to compute a key held here", now)
            return
        deps = tuple(d for d in task.who_has if d != key)
        self._seq += 1
        record = AssignedTask(
            key,
            task.func_id,
            task.args,
            deps,
            task.allocation,
            task.priority,
            self._seq,
            "",
            order=task.order,
        )
        self.tasks[key] = record
        for dep in deps:
            self.prefetched.discard(dep)  # this task's input now, fetched or on its way
            self.needed_by.setdefault(dep, set()).add(key)
            if dep not in self.data:
                record.missing.add(dep)
        if record.missing:
            self._move(key, RELEASED, WAITING, "compute-task", now)
            record.state = WAITING
            for dep in sorted(record.missing):
                self._want(dep, task.who_has.get(dep, ()), now, task.sizes.get(dep, 0))
                if key not in self.tasks:
                    return  # dropped: a dependency has no holder
        else:
            self._move(key, RELEASED, READY, "compute-task", now)
            self._make_ready(record)

    def _on_free(self, keys: Iterable[str], now: float) -> None:
        dropped: list[str] = []
        for key in dict.fromkeys(keys):
            record = self.tasks.get(key)
            if record is not None and record.state == EXECUTING:
                if not record.freed:
                    record.freed = True
                    self._move(key, EXECUTING, EXECUTING, "freed; result discarded", now)
            elif record is not None:
                dropped.append(key)
            if key in self.data:
                if key in self.needed_by:
                    self.owned.discard(key)
                    self._move(key, MEMORY, MEMORY, "freed; kept for local tasks", now)
                else:
                    self._forget_key(key, "freed", now)
        self._drop_tasks(dropped, "freed", now)
        if dropped:
            self._send(TasksDropped(dropped))

    def _on_letting_go(self, event: FreeArrived | StealArrived) -> None:
        if isinstance(event, FreeArrived):
            self._on_free(event.keys, event.time)
        else:
            self._on_steal(event)

    def _on_steal(self, event: StealArrived) -> None:
        """Let go of the tasks asked for that have not started; say which had.

        A key no longer here was reported (finished, raised, dropped) before this
        answer, on the same connection, so the scheduler has settled it already."""
        released: list[str] = []
        started: list[str] = []
        for key in dict.fromkeys(event.keys):
            record = self.tasks.get(key)
            if record is not None:
                (started if record.state == EXECUTING else released).append(key)
        self._drop_tasks(released, "let go to an idle worker", event.time)
        self._send(StealResponse(released, started))

    def _on_fetch_done(self, event: FetchDone) -> None:
        for key, info in event.obtained.items():
            self._arrived(key, info, False, f"fetched from {event.address}", event.time)
        for key in event.missing:
            self._fetch_failed(key, event.address, "peer does not hold it", event.time)
        for key, reason in event.errors.items():
            record = self.fetches.get(key)
            if record is not None and record.address == event.address:
                self._end_fetch(key)
                self.prefetched.discard(key)
                # Another holder would fail the same way: the value itself cannot travel.
                self._move(key, FETCHING, RELEASED, f"{event.address}: {reason}", event.time)
                self._dep_unavailable(key, record.holders, event.time, reason)

    def _on_fetch_failed(self, event: FetchFailed) -> None:
        for key in event.keys:
            self._fetch_failed(key, event.address, event.reason, event.time)

    def _on_execution_ok(self, event: ExecutionOk) -> None:
        record = self._finish_execution(event.key, MEMORY)
        durations = self.durations
        before = durations.get(record.func_id)
        if before is None and len(durations) >= MAX_FUNCTIONS_TIMED:
            durations.clear()  # bounded: a stream of fresh functions (runs) forgets
        durations[record.func_id] = (
            event.duration if before is None else (before + event.duration) / 2
        )
        info = event.info
        self._send(
            TaskFinished(event.key, info.nbytes, event.duration, info.type_name, event.thread)
        )
        if record.freed:
            self._move(event.key, EXECUTING, RELEASED, "finished after free", event.time)
            self._forget[event.key] = None
        else:
            self._move(event.key, EXECUTING, MEMORY, "finished", event.time)
            self._end_fetch(event.key)  # a fetch started before the task arrived
            self._hold(event.key, info, True, event.time)

    def _on_execution_raised(self, event: ExecutionRaised) -> None:
        # Local dependents stay waiting: the scheduler fails them and frees them.
        self._finish_execution(event.key, RELEASED)
        self._send(
            TaskRaised(
                event.key,
                event.exception,
                event.traceback,
                event.duration,
                event.thread,
                int(event.interrupted),
            )
        )
        self._move(event.key, EXECUTING, RELEASED, "raised", event.time)

    def _on_execution_too_large(self, event: ExecutionTooLarge) -> None:
        # As for a raise: the value never reached the data store, and local dependents
        # wait until the scheduler fails and frees them.
        self._finish_execution(event.key, RELEASED)
        info = event.info
        self._send(
            ResultTooLarge(
                event.key, info.nbytes, info.type_name, event.limit, event.largest, event.duration
            )
        )
        self._move(event.key, EXECUTING, RELEASED, "result too large to keep", event.time)

    def _on_put(self, event: DataPut) -> None:
        for key, info in event.stored.items():
            self._arrived(key, info, True, "put", event.time)
        nbytes = {key: info.nbytes for key, info in event.stored.items()}
        self._send(DataStored(event.request_id, list(event.stored), nbytes))

    def _on_seceding(self, event: Seceded | Rejoining | RejoinGrantedArrived) -> None:
        if isinstance(event, Seceded):
            self._on_seceded(event)
        elif isinstance(event, Rejoining):
            self._on_rejoining(event)
        else:
            for key in event.keys:
                self._rejoined(key, "holds its resources again", event.time)

    def _on_seceded(self, event: Seceded) -> None:
        key = event.key
        record = self.tasks.get(key)
        if record is None or record.state != EXECUTING or key in self.seceded:
            return  # its outcome is on its way, or it seceded already: nothing to give
        self.executing.discard(key)
        if key in self.started_ahead:  # a thread took it before the loop knew
            del self.started_ahead[key]
        self.rejoined.discard(key)
        self.seceded[key] = event.keep_resources
        self._send(TaskSeceded(key, event.keep_resources))
        kept = "kept" if event.keep_resources or not record.allocation.resources else "given back"
        self._move(key, EXECUTING, EXECUTING, f"seceded; thread free, resources {kept}", event.time)

    def _on_rejoining(self, event: Rejoining) -> None:
        key = event.key
        record = self.tasks.get(key)
        if record is None or key not in self.seceded or key in self.rejoining:
            return
        self._send(TaskRejoining(key))
        if self.seceded[key] or not record.allocation.resources:
            self._rejoined(key, "rejoined", event.time, asked=False)
            return
        self.rejoining.add(key)
        self._move(key, EXECUTING, EXECUTING, "rejoining; waits for its resources", event.time)

    def _rejoined(self, key: str, cause: str, now: float, asked: bool = True) -> None:
        """``key`` counts on a thread again; its blocked thread runs on."""
        if asked:
            if key not in self.rejoining:
                return  # a grant for a task that finished meanwhile
            self.rejoining.discard(key)
        del self.seceded[key]
        self.executing.add(key)
        self.rejoined.add(key)
        self._out.append(ResumeTask(key))
        self._move(key, EXECUTING, EXECUTING, cause, now)

    # --- data arriving and leaving -----------------------------------------------

    def _arrived(self, key: str, info: DataInfo, owned: bool, cause: str, now: float) -> None:
        """A value for ``key`` is in the data store (fetched or put)."""
        self._forget.pop(key, None)
        old = FETCHING if self._end_fetch(key) is not None else RELEASED
        record = self.tasks.get(key)
        if record is not None:
            self.prefetched.discard(key)  # it was to run here itself
        if record is not None and record.state == EXECUTING:
            self._forget[key] = None  # the running execution will store its own result
            return
        if record is not None:
            # A pending task whose result turned up: done without running it.
            self._drop_tasks([key], cause, now, moved_to=MEMORY)
            self._send(TaskFinished(key, info.nbytes, 0.0, info.type_name))
            owned = True
        elif key in self.data:
            if owned:
                self.owned.add(key)
            return
        elif not owned and not self._wanted(key):
            self._forget[key] = None
            if old == FETCHING:
                self._move(key, old, RELEASED, f"{cause}; no longer needed", now)
            return
        else:
            self._move(key, old, MEMORY, cause, now)
            if not owned and key in self.needed_by:
                owned = True  # a copy for a task here: kept, and the scheduler told
                self._kept.append(key)
        self._hold(key, info, owned, now)

    def _hold(self, key: str, info: DataInfo, owned: bool, now: float) -> None:
        """Record ``key`` in memory and wake the tasks that waited for it."""
        self.data[key] = info
        if owned:
            self.owned.add(key)
        for dependent in self.needed_by.get(key, ()):
            record = self.tasks[dependent]
            record.missing.discard(key)
            if record.state == WAITING and not record.missing:
                self._move(dependent, WAITING, READY, f"dependency {key} in memory", now)
                self._make_ready(record)

    def _forget_key(self, key: str, cause: str, now: float) -> None:
        del self.data[key]
        self.owned.discard(key)
        self.prefetched.discard(key)
        self._forget[key] = None
        self._move(key, MEMORY, RELEASED, cause, now)

    def _release_need(self, dep: str, key: str, now: float) -> None:
        """``key`` no longer needs ``dep``; a transient copy nobody needs goes."""
        needing = self.needed_by[dep]
        needing.discard(key)
        if needing:
            return
        del self.needed_by[dep]
        if dep in self.data and dep not in self.owned:
            self._forget_key(dep, "transient copy no longer needed", now)

    def _wanted(self, key: str) -> bool:
        """Whether a value being fetched is still wanted: by a task here, or ahead."""
        return key in self.needed_by or key in self.prefetched

    def _on_prefetch(self, event: PrefetchArrived | PrefetchDropped) -> None:
        if isinstance(event, PrefetchDropped):
            self._drop_prefetched(event.keys, event.time)
            return
        for key, holders in event.who_has.items():
            if key in self.data or key in self.fetches or key in self.tasks:
                continue
            if key in self.needed_by or not [h for h in holders if h != self.address]:
                continue
            self.prefetched.add(key)
            self._want(key, holders, event.time, event.sizes.get(key, 0))

    def _drop_prefetched(self, keys: Iterable[str], now: float) -> None:
        for key in keys:
            if key not in self.prefetched:
                continue  # claimed by a task here, or gone already
            self.prefetched.discard(key)
            if key in self.data and key not in self.owned:
                self._forget_key(key, "prefetch dropped", now)
            # One still being fetched is forgotten when it arrives, unwanted.

    # --- fetching -----------------------------------------------------------------

    def _end_fetch(self, key: str) -> FetchRecord | None:
        """``key`` is fetched no more (arrived, failed or computed here); its record."""
        record = self.fetches.pop(key, None)
        if record is not None and record.asked:
            self.in_flight_bytes -= record.nbytes
        return record

    def _want(self, dep: str, holders: Iterable[str], now: float, nbytes: int = 0) -> None:
        """Get ``dep`` into memory: wait for a local task or an ongoing fetch, or fetch."""
        if dep in self.tasks:
            return
        others = [h for h in holders if h != self.address]
        record = self.fetches.get(dep)
        if record is not None:
            record.holders.extend(h for h in others if h not in record.holders)
            return
        if not others:
            self._dep_unavailable(dep, list(holders), now)
            return
        record = self.fetches[dep] = FetchRecord(list(dict.fromkeys(others)), nbytes=nbytes)
        self._move(dep, RELEASED, FETCHING, f"fetch from {record.address}", now)
        self._to_fetch.setdefault(record.address, []).append(dep)

    def _fetches_to_send(self, now: float) -> list[Fetch]:
        """The wanted fetches, one per holder, within the budget, leaving out keys that
        no longer need one (then released, unasked). Those over the budget wait."""
        fetches = []
        later: dict[str, list[str]] = {}
        budget = self.fetch_budget
        for address, keys in self._to_fetch.items():
            wanted = []
            for key in keys:
                record = self.fetches.get(key)
                if record is None or record.address != address or record.asked:
                    continue
                if not self._wanted(key):
                    del self.fetches[key]
                    self._move(key, FETCHING, RELEASED, "no longer needed; never asked", now)
                    continue
                coming = self.in_flight_bytes
                if budget is not None and coming and coming + record.nbytes > budget:
                    later.setdefault(address, []).append(key)
                    continue
                record.asked = True
                self.in_flight_bytes += record.nbytes
                wanted.append(key)
            if wanted:
                fetches.append(Fetch(address, tuple(wanted)))
        self._to_fetch = later
        return fetches

    def _fetch_failed(self, key: str, address: str, reason: str, now: float) -> None:
        record = self.fetches.get(key)
        if record is None or record.address != address:
            return  # a stale answer: the fetch already moved on
        if record.asked:
            record.asked = False
            self.in_flight_bytes -= record.nbytes
        record.index += 1
        if not self._wanted(key):
            del self.fetches[key]
            self._move(key, FETCHING, RELEASED, f"{address}: {reason}; not needed", now)
        elif record.index < len(record.holders):
            self._move(key, FETCHING, FETCHING, f"{address}: {reason}; try next", now)
            self._to_fetch.setdefault(record.address, []).append(key)
        else:
            del self.fetches[key]
            self.prefetched.discard(key)
            self._move(key, FETCHING, RELEASED, f"{address}: {reason}; no holder left", now)
            self._dep_unavailable(key, record.holders, now)

    def _dep_unavailable(self, dep: str, holders: list[str], now: float, reason: str = "") -> None:
        """No holder can give ``dep``: tell the scheduler and drop the tasks needing it."""
        dependents = sorted(self.needed_by.get(dep, ()), key=lambda k: self.tasks[k].seq)
        for key in dependents:
            self._send(MissingDependency(key, dep, holders, reason))
        self._drop_tasks(dependents, f"dependency {dep} unavailable", now)

    # --- tasks --------------------------------------------------------------------

    def _drop_tasks(
        self, keys: list[str], cause: str, now: float, *, moved_to: str = RELEASED
    ) -> None:
        """Forget pending tasks; local tasks that waited on them cannot proceed either."""
        for key in keys:
            record = self.tasks.pop(key)
            self._move(key, record.state, moved_to, cause, now)
            for dep in record.deps:
                self._release_need(dep, key, now)
        for key in keys:
            orphaned = key in self.needed_by and key not in self.data and key not in self.tasks
            if orphaned and key not in self.fetches and moved_to == RELEASED:
                self._dep_unavailable(key, [], now)

    def _make_ready(self, record: AssignedTask) -> None:
        record.state = READY
        no_resources = 0 if record.allocation.resources else 1
        entry = (no_resources, -record.priority, record.order, record.seq, record.key)
        heapq.heappush(self._ready, entry)

    def _is_live(self, entry: tuple[int, int, int, int, str]) -> bool:
        record = self.tasks.get(entry[4])
        return record is not None and record.state == READY and record.seq == entry[3]

    def _start_ready(self, now: float) -> None:
        """Start ready tasks while threads are free (and not paused): resource tasks,
        priority, the scheduler's order, arrival. Then hand short ones ahead."""
        ahead = self.started_ahead
        while ahead and len(self.executing) < self.nthreads:
            # A thread came free: it takes the task handed to the threads first.
            key = next(iter(ahead))
            del ahead[key]
            self.executing.add(key)
        if self.paused:
            return
        while self._ready and len(self.executing) < self.nthreads:
            entry = heapq.heappop(self._ready)
            if self._is_live(entry):
                self._execute(self.tasks[entry[4]], "thread free", now)
                self.executing.add(entry[4])
        if not self._may_start_ahead():
            return  # what it asks of the running tasks: nothing below changes them
        while self._ready and len(ahead) < self.ahead:
            entry = self._ready[0]
            if not self._is_live(entry):
                heapq.heappop(self._ready)
                continue
            record = self.tasks[entry[4]]
            if record.allocation.resources or not self._short(record.func_id):
                return
            heapq.heappop(self._ready)
            self._execute(record, "queued on a thread behind short tasks", now)
            ahead[record.key] = None

    def _may_start_ahead(self) -> bool:
        """Every thread is busy with a short task (as its function last ran here)."""
        if len(self.executing) < self.nthreads or self.seceded:
            return False
        return all(self._short(self.tasks[key].func_id) for key in self.executing)

    def _short(self, func_id: str) -> bool:
        """Runs of ``func_id`` took under ``SHORT_TASK`` here, on average."""
        return self.durations.get(func_id, SHORT_TASK) < SHORT_TASK

    def _execute(self, record: AssignedTask, cause: str, now: float) -> None:
        """Hand ``record`` to the threads."""
        record.state = EXECUTING
        self._move(record.key, READY, EXECUTING, cause, now)
        self._out.append(
            Execute(record.key, record.func_id, record.args, record.deps, record.allocation)
        )
        for dep in record.deps:
            self._release_need(dep, record.key, now)

    def _finish_execution(self, key: str, outcome: str) -> AssignedTask:
        """Take ``key`` off the executing tasks as its execution ends towards ``outcome``."""
        record = self.tasks.get(key)
        if record is None or record.state != EXECUTING:
            state = RELEASED if record is None else record.state
            detail = "its execution finished but it was not executing"
            raise IllegalTransition("worker", f"task {key!r}", state, outcome, detail)
        del self.tasks[key]
        self.executing.discard(key)
        if key in self.started_ahead:  # ended before a thread was known to take it
            del self.started_ahead[key]
        if self.seceded:
            # It may end without rejoining, as in Dask: it gave back whatever it gave.
            self.seceded.pop(key, None)
            self.rejoining.discard(key)
        self.rejoined.discard(key)
        return record

    # --- bookkeeping --------------------------------------------------------------

    def _send(self, message: Any) -> None:
        self._out.append(SendToScheduler(message))

    def _move(self, key: str, old: str, new: str, cause: str, now: float) -> None:
        if (old, new) not in WORKER_TASK_MOVES:  # inline: a few times per task
            raise IllegalTransition("worker", f"task {key!r}", old, new, cause)
        self._story.append((now, key, old, new, cause))
