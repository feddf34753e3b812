"""The scheduler's state machine: events in, commands out, no I/O and no clock.

Theory of operation
-------------------
Clients submit tasks; a task whose dependencies are all in memory is QUEUED in a
heap for its *signature* (its resource demand), ordered by priority then
submission. Events never place tasks themselves: they only set
``placement_due``, and the service sends one ``PlacementDue`` per loop turn, so a
burst of ten thousand completions costs one placement pass (``placement.py``).

A result is kept while a client holds a future for it or an unfinished dependent
needs it (``TaskRecord.needed``); when neither holds, the record is forgotten and
the worker told to drop the data. Resources are taken from a worker's ledger when
a task is assigned and given back exactly once, when the worker reports the task
or when the worker is lost, whatever happened to the task in between.

Every state change goes through ``_move``, which checks the transition table in
``records.py`` and appends ``(time, key, from, to, cause)`` to the log that
``story(key)`` reads.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappush
from typing import Any

from apportion.core.resources import (
    fits,
    format_amount,
    format_resources,
    give_back,
    missing,
    to_units,
)
from apportion.protocol import messages as m
from apportion.scheduler import relay
from apportion.scheduler.events import (
    ClientJoined,
    ClientLeft,
    Command,
    Event,
    FromClient,
    FromWorker,
    Log,
    PlacementDue,
    Send,
    WorkerJoined,
    WorkerLeft,
)
from apportion.scheduler.records import (
    ERRED,
    MEMORY,
    NO_RESOURCES,
    PROCESSING,
    QUEUED,
    TRANSITIONS,
    WAITING,
    ClientRecord,
    TaskRecord,
    WorkerRecord,
)

#: ``why`` with no keys explains at most this many tasks that are not running.
WHY_ALL_LIMIT = 100

#: The task's own key was never computed: scattered data cannot be recomputed.
SCATTERED = ""


class IllegalTransition(AssertionError):
    """A state change outside the transition table: always a bug in the scheduler."""


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
    max_pipeline: int = 16


class SchedulerState:
    """All task, worker and client state, and every decision about it."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.tasks: dict[str, TaskRecord] = {}
        self.workers: dict[str, WorkerRecord] = {}
        self.clients: dict[str, ClientRecord] = {}
        #: func_id -> pickled function, with the number of live tasks using it.
        self.functions: dict[str, bytes] = {}
        self.function_users: dict[str, int] = defaultdict(int)
        #: signature -> heap of (-priority, seq, key). Entries go stale when a task
        #: leaves QUEUED; placement skips them, which is cheaper than deleting.
        self.ready: dict[tuple[tuple[str, int], ...], list[tuple[int, int, str]]] = {}
        self.log: deque[tuple[float, str, str, str, str]] = deque(maxlen=self.config.log_size)
        self.placement_due = False
        #: Identity shown in ``scheduler_info`` (set by the service).
        self.identity: dict[str, Any] = {}
        self.relays = relay.RelayBook()
        self.now = 0.0
        self._seq = 0
        self._out: list[Command] = []
        self._done: dict[str, list[str]] = defaultdict(list)
        self._free: dict[str, list[str]] = defaultdict(list)
        #: Request kinds already warned about, so a sweep of 1,000 says it once.
        self._warned: set[tuple[tuple[str, int], ...]] = set()
        self._satisfiable: dict[tuple[tuple[str, int], ...], bool] = {}
        self._handlers: dict[type[Any], Callable[[Any, Any], None]] = {
            ClientJoined: self._on_client_joined,
            ClientLeft: self._on_client_left,
            WorkerJoined: self._on_worker_joined,
            WorkerLeft: self._on_worker_left,
            FromClient: self._on_from_client,
            FromWorker: self._on_from_worker,
            PlacementDue: self._on_placement_due,
        }

    # --- entry point ----------------------------------------------------------------

    def handle(self, event: Event) -> list[Command]:
        """Apply one event; return what must be sent and logged because of it."""
        self.now = event.now
        self._handlers[type(event)](event, None)
        for client_id, keys in self._done.items():
            if client_id in self.clients:
                self._out.append(Send(client_id, m.KeysDone(keys)))
        self._done.clear()
        for worker_id, keys in self._free.items():
            if worker_id in self.workers:
                self._out.append(Send(worker_id, m.FreeKeys(keys)))
        self._free.clear()
        out, self._out = self._out, []
        return out

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def send(self, peer_id: str, message: m.Message) -> None:
        self._out.append(Send(peer_id, message))

    def warn(self, text: str) -> None:
        self._out.append(Log("warning", text))

    # --- lifecycle helpers ----------------------------------------------------------

    def move(self, task: TaskRecord, new: str, cause: str) -> None:
        """Change ``task``'s state, checking the table and recording the cause."""
        if (task.state, new) not in TRANSITIONS:
            raise IllegalTransition(f"{task.key}: {task.state} -> {new} ({cause})")
        if task.reserved_on is not None and new != QUEUED:
            # Only a QUEUED task may hold a reservation; checked here so that every way
            # out (an input lost, say, back to WAITING) frees the worker it held.
            self.drop_reservation(task)
        self.log.append((self.now, task.key, task.state, new, cause))
        task.state = new

    def enqueue(self, task: TaskRecord, cause: str) -> None:
        """Make ``task`` ready: QUEUED, in its signature's heap, placement due."""
        self.move(task, QUEUED, cause)
        heap = self.ready.get(task.signature)
        if heap is None:
            heap = self.ready[task.signature] = []
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

    def assign(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """Start ``task`` on ``worker``: take its resources and send it there."""
        if task.resources:
            for name, need in task.resources.items():
                worker.free[name] -= need
        worker.processing.add(task.key)
        if task.reserved_on is not None:
            self.drop_reservation(task)
        task.worker = worker.id
        self.move(task, PROCESSING, f"assigned to {worker.name}")
        if task.func_id not in worker.functions:
            worker.functions.add(task.func_id)
            self.send(worker.id, m.LoadFunction(task.func_id, self.functions[task.func_id]))
        who_has: dict[str, list[str]] = {}
        for dep in task.deps:
            holder = self.workers[self.tasks[dep].worker or ""]
            who_has[dep] = [holder.address]
        self.send(
            worker.id,
            m.ComputeTask(
                task.key, task.func_id, task.args, who_has, task.resources, task.priority
            ),
        )

    def unassign(self, task: TaskRecord, worker: WorkerRecord) -> None:
        """The worker is done with ``task``: return its resources exactly once."""
        worker.processing.remove(task.key)
        if task.resources:
            give_back(worker.free, task.resources, worker.total)
        task.worker = None

    def drop_reservation(self, task: TaskRecord) -> None:
        worker = self.workers.get(task.reserved_on or "")
        if worker is not None and worker.reserved_by == task.key:
            worker.reserved_by = None
        task.reserved_on = None

    def _finish_inputs(self, task: TaskRecord) -> None:
        """``task`` no longer needs its inputs: release those nobody else needs."""
        for dep_key in task.deps:
            dep = self.tasks.get(dep_key)
            if dep is not None and task.key in dep.dependents:
                dep.dependents.discard(task.key)
                self.release_if_unneeded(dep)

    def release_if_unneeded(self, task: TaskRecord) -> None:
        # A "new" task is mid-submission (a batch sibling failed first): ``submit``
        # releases it after giving it a state, if it is still unneeded then. A
        # "forgotten" one went already, when its last dependent failed.
        if not task.needed() and task.state not in ("new", "forgotten"):
            self.forget(task)

    def forget(self, task: TaskRecord) -> None:
        """Drop a task nobody needs. A running one is forgotten when its worker reports."""
        if task.state == PROCESSING and task.worker is not None:
            if not task.discard_result:
                task.discard_result = True
                self._free[task.worker].append(task.key)
            return
        self._remove(task, "released")

    def _remove(self, task: TaskRecord, cause: str) -> None:
        if task.state == MEMORY:
            self._drop_result(task)
        if task.reserved_on is not None:
            self.drop_reservation(task)
        unfinished = task.state in (WAITING, QUEUED, PROCESSING)
        self.move(task, "forgotten", cause)
        del self.tasks[task.key]
        if task.func_id != SCATTERED:
            users = self.function_users[task.func_id] - 1
            if users:
                self.function_users[task.func_id] = users
            else:
                del self.function_users[task.func_id]
                self.functions.pop(task.func_id, None)
        if unfinished:
            self._finish_inputs(task)

    def _drop_result(self, task: TaskRecord) -> None:
        worker = self.workers.get(task.worker or "")
        if worker is not None and task.key in worker.has_what:
            worker.has_what.discard(task.key)
            worker.nbytes -= task.nbytes
            self._free[worker.id].append(task.key)
        task.worker = None

    def complete(self, task: TaskRecord, worker: WorkerRecord, nbytes: int, cause: str) -> None:
        """``task``'s result now lives on ``worker``."""
        self.move(task, MEMORY, cause)
        task.worker = worker.id
        task.nbytes = nbytes
        worker.has_what.add(task.key)
        worker.nbytes += nbytes
        if task.wanted_by:
            for client_id in task.wanted_by:
                self._done[client_id].append(task.key)
        for dependent_key in task.dependents:
            dependent = self.tasks[dependent_key]
            dependent.missing_deps -= 1
            if dependent.missing_deps == 0 and dependent.state == WAITING:
                self.enqueue(dependent, f"input {task.key} ready")
        self._finish_inputs(task)
        self.release_if_unneeded(task)

    def fail(self, task: TaskRecord, error: tuple[str, bytes | str, bytes], cause: str) -> None:
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
                if current.reserved_on is not None:
                    self.drop_reservation(current)
                self.move(current, ERRED, why)
                current.error = error
                self._notify_error(current, error)
                self._finish_inputs(current)
            for dependent_key in current.dependents:
                stack.append((self.tasks[dependent_key], f"input {current.key} failed"))
            if current.state == ERRED:
                # Dependents leave ``dependents`` as they fail (``_finish_inputs``); one
                # still running stays, so its inputs are kept until its worker reports.
                self.release_if_unneeded(current)

    def _notify_error(self, task: TaskRecord, error: tuple[str, bytes | str, bytes]) -> None:
        for client_id in task.wanted_by or ():
            self.send(client_id, error_message(task.key, error))

    # --- events ---------------------------------------------------------------------

    def _on_client_joined(self, event: ClientJoined, _: None) -> None:
        self.clients[event.client_id] = ClientRecord(event.client_id)

    def _on_client_left(self, event: ClientLeft, _: None) -> None:
        client = self.clients.pop(event.client_id, None)
        if client is not None:
            self._release(client, list(client.wanted))
        self.relays.drop_client(self, event.client_id)

    def _on_worker_joined(self, event: WorkerJoined, _: None) -> None:
        reg = event.registration
        self.workers[event.worker_id] = WorkerRecord(
            event.worker_id,
            reg.name or event.worker_id,
            reg.address,
            max(1, reg.nthreads),
            reg.resources,
            reg.pid,
            reg.memory_limit,
        )
        self._out.append(
            Log(
                "info",
                f"worker {reg.name} joined at {reg.address}: {reg.nthreads} threads, "
                f"resources {format_resources(reg.resources) or '(none)'}",
            )
        )
        self._satisfiable.clear()
        self._warned.clear()
        self.placement_due = True
        self.relays.worker_joined(self)

    def _on_worker_left(self, event: WorkerLeft, _: None) -> None:
        worker = self.workers.pop(event.worker_id, None)
        if worker is None:
            return
        if worker.leaving is not None:
            self._out.append(Log("info", f"worker {worker.name} closed ({worker.leaving})"))
        else:
            self._out.append(Log("warning", f"lost worker {worker.name} ({worker.address})"))
        if worker.reserved_by is not None:
            reserved = self.tasks.get(worker.reserved_by)
            if reserved is not None:
                reserved.reserved_on = None
        for key in sorted(worker.processing, key=lambda k: self.tasks[k].seq):
            task = self.tasks[key]
            task.worker = None
            if task.discard_result:
                task.discard_result = False
                self._settle_discarded(task, f"worker {worker.name} lost")
            else:
                self.requeue(task, f"worker {worker.name} lost while running it")
        for key in list(worker.has_what):
            held = self.tasks.get(key)
            if held is not None and held.state == MEMORY and held.worker == worker.id:
                self.lose_result(held, f"its result was on worker {worker.name}, which left")
        self.relays.worker_left(self, worker.id)
        self._satisfiable.clear()
        self._warned.clear()
        self.placement_due = True

    def lose_result(self, task: TaskRecord, cause: str) -> None:
        """The only copy of ``task``'s result is gone: recompute it if we can."""
        task.worker = None
        for dependent_key in task.dependents:
            dependent = self.tasks[dependent_key]
            dependent.missing_deps += 1
            if dependent.state == QUEUED:
                self.move(dependent, WAITING, f"input {task.key} lost")
        if not task.needed():
            self.forget(task)
            return
        if task.func_id == SCATTERED:
            text = f"scattered data {task.key!r} was lost ({cause}) and cannot be recomputed"
            self.fail(task, ("lost", text, b""), cause)
            return
        unknown = [d for d in task.deps if d not in self.tasks]
        if unknown:
            text = f"result of {task.key!r} was lost ({cause}) and input {unknown[0]!r} is gone"
            self.fail(task, ("lost", text, b""), cause)
            return
        task.missing_deps = sum(1 for d in task.deps if self.tasks[d].state != MEMORY)
        for dep_key in task.deps:
            self.tasks[dep_key].dependents.add(task.key)
        if task.missing_deps:
            self.move(task, WAITING, cause)
        else:
            self.enqueue(task, cause)

    def _on_placement_due(self, event: PlacementDue, _: None) -> None:
        from apportion.scheduler.placement import place

        self.placement_due = False
        place(self)

    # --- client messages ------------------------------------------------------------

    def _on_from_client(self, event: FromClient, _: None) -> None:
        client = self.clients[event.client_id]
        for msg in event.messages:
            handler = CLIENT_HANDLERS.get(type(msg))
            if handler is None:
                self.warn(f"client {client.id} sent unexpected {type(msg).__name__}; ignored")
            else:
                handler(self, client, msg)

    def submit(self, client: ClientRecord, msg: m.SubmitTasks) -> None:
        self.functions.update(msg.functions)
        # Records, links and wants first, states second: a task that fails at
        # submission must already know who wants it and which dependents fail with
        # it, or it would be forgotten unseen and reported only as "unknown".
        created: list[TaskRecord] = []
        for spec in msg.tasks:
            if spec.key not in self.tasks:
                created.append(self._new_task(spec))
        for task in created:  # after creation, so a batch need not be in graph order
            self._link_inputs(task)
        for key in msg.wanted:
            self.want(client, key)
        for task in created:
            if task.state == "new":  # not already failed with an input
                self._start(task)
        # Tasks nobody wants and nothing depends on would run for no one.
        for task in reversed(created):
            if task.key in self.tasks:
                self.release_if_unneeded(task)
        for task in created:
            if task.resources and task.state in (WAITING, QUEUED) and self.workers:
                self._warn_if_unsatisfiable(task)

    def _link_inputs(self, task: TaskRecord) -> None:
        for dep_key in task.deps:
            dep = self.tasks.get(dep_key)
            if dep is not None:
                dep.dependents.add(task.key)

    def _warn_if_unsatisfiable(self, task: TaskRecord) -> None:
        if not self.satisfiable(task.signature):
            self._warn_unsatisfiable(task, unsatisfiable_text(task, self.workers.values()))

    def _new_task(self, spec: m.TaskSpec) -> TaskRecord:
        """A "new" record; ``submit`` links it to its inputs and ``_start`` sets its state."""
        task = TaskRecord(
            spec.key,
            spec.func_id,
            spec.args,
            tuple(spec.deps),
            spec.resources or NO_RESOURCES,
            spec.priority,
            spec.retries,
            self.next_seq(),
        )
        self.tasks[spec.key] = task
        self.function_users[spec.func_id] += 1
        return task

    def _start(self, task: TaskRecord) -> None:
        """Move a new task to WAITING, QUEUED or (bad input, unsatisfiable) ERRED."""
        failure: tuple[str, bytes | str, bytes] | None = None
        for dep_key in task.deps:
            dep = self.tasks.get(dep_key)
            if dep is None:
                text = f"input {dep_key!r} of {task.key!r} is unknown (already released?)"
                failure = ("lost", text, b"")
            elif dep.state == ERRED and dep.error is not None:
                failure = dep.error
            elif dep.state != MEMORY:
                task.missing_deps += 1
        if failure is None and task.resources:
            failure = self.check_satisfiable(task)
        if failure is not None:
            self.fail(task, failure, "submitted")
        elif task.missing_deps:
            self.move(task, WAITING, "submitted")
        else:
            self.enqueue(task, "submitted")

    def want(self, client: ClientRecord, key: str) -> None:
        task = self.tasks.get(key)
        if task is None:
            self.send(client.id, m.KeysFailed([key], "lost", f"{key!r} is unknown"))
            return
        if task.wanted_by is None:
            task.wanted_by = set()
        task.wanted_by.add(client.id)
        client.wanted.add(key)
        if task.state == MEMORY:
            self._done[client.id].append(key)
        elif (task.state == ERRED or task.cancelled) and task.error is not None:
            self.send(client.id, error_message(key, task.error))

    def _release(self, client: ClientRecord, keys: list[str]) -> None:
        for key in keys:
            client.wanted.discard(key)
            task = self.tasks.get(key)
            if task is not None and task.wanted_by:
                task.wanted_by.discard(client.id)
                self.release_if_unneeded(task)

    def release_keys(self, client: ClientRecord, msg: m.ReleaseKeys) -> None:
        self._release(client, msg.keys)

    def cancel_keys(self, client: ClientRecord, msg: m.CancelKeys) -> None:
        for key in msg.keys:
            task = self.tasks.get(key)
            if task is not None and task.state in (WAITING, QUEUED, PROCESSING):
                text = f"{key!r} was cancelled"
                self.fail(task, ("cancelled", text, b""), f"cancelled by client {client.id}")

    def why(self, client: ClientRecord, msg: m.WhyRequest) -> None:
        from apportion.scheduler.explain import explain

        keys = (
            msg.keys
            or [key for key, task in self.tasks.items() if task.state in (WAITING, QUEUED)][
                :WHY_ALL_LIMIT
            ]
        )
        reasons = {key: explain(self, key) for key in keys}
        self.send(client.id, m.WhyReply(msg.request_id, reasons))

    def info(self, client: ClientRecord, msg: m.InfoRequest) -> None:
        self.send(client.id, m.InfoReply(msg.request_id, self.snapshot()))

    def story(self, client: ClientRecord, msg: m.StoryRequest) -> None:
        rows: list[list[Any]] = [list(row) for row in self.story_of(msg.key)]
        self.send(client.id, m.StoryReply(msg.request_id, rows))

    def story_of(self, key: str) -> list[tuple[float, str, str, str, str]]:
        """Every recorded transition of ``key``, oldest first, with its cause."""
        return [row for row in self.log if row[1] == key]

    def snapshot(self) -> dict[str, Any]:
        """A plain-data picture of the cluster, shaped like Dask's ``scheduler_info``."""
        counts: dict[str, int] = defaultdict(int)
        for task in self.tasks.values():
            counts[task.state] += 1
        workers = {
            w.address: {
                "id": w.id,
                "name": w.name,
                "nthreads": w.nthreads,
                "resources": to_units(w.total),
                "free_resources": to_units(w.free),
                "processing": len(w.processing),
                "keys": len(w.has_what),
                "nbytes": w.nbytes,
                "pid": w.pid,
                "memory_limit": w.memory_limit,
                "reserved_for": w.reserved_by,
            }
            for w in self.workers.values()
        }
        return {
            "type": "Scheduler",
            **self.identity,
            "workers": workers,
            "tasks": dict(counts),
            "clients": len(self.clients),
        }

    # --- worker messages ------------------------------------------------------------

    def _on_from_worker(self, event: FromWorker, _: None) -> None:
        worker = self.workers.get(event.worker_id)
        if worker is None:
            return
        for msg in event.messages:
            handler = WORKER_HANDLERS.get(type(msg))
            if handler is None:
                self.warn(f"worker {worker.name} sent unexpected {type(msg).__name__}; ignored")
            else:
                handler(self, worker, msg)

    def _running_task(self, worker: WorkerRecord, key: str) -> TaskRecord | None:
        """The task ``worker`` reports on, or None (after freeing its data) if stale."""
        task = self.tasks.get(key)
        if task is None or task.state != PROCESSING or task.worker != worker.id:
            if task is None or task.worker != worker.id:
                self._free[worker.id].append(key)
            return None
        self.unassign(task, worker)
        return task

    def task_finished(self, worker: WorkerRecord, msg: m.TaskFinished) -> None:
        task = self._running_task(worker, msg.key)
        if task is None:
            return
        if not task.resources:
            avg = worker.avg_duration
            worker.avg_duration = msg.duration if avg is None else 0.8 * avg + 0.2 * msg.duration
        self.placement_due = True
        if task.discard_result:
            task.discard_result = False
            self._settle_discarded(task, f"finished on {worker.name}, result discarded")
            return
        self.complete(task, worker, msg.nbytes, f"finished on {worker.name}")

    def task_raised(self, worker: WorkerRecord, msg: m.TaskRaised) -> None:
        task = self._running_task(worker, msg.key)
        if task is None:
            return
        self.placement_due = True
        if task.discard_result:
            task.discard_result = False
            self._settle_discarded(task, f"raised on {worker.name}, result discarded")
        elif task.retries > 0:
            task.retries -= 1
            self.requeue(task, f"raised on {worker.name}; retrying ({task.retries} left)")
        else:
            self.fail(task, ("exception", msg.exception, msg.traceback), f"raised on {worker.name}")

    def _settle_discarded(self, task: TaskRecord, cause: str) -> None:
        """A task whose result was dropped on purpose is back from its worker."""
        if task.cancelled:
            task.cancelled = False
            error = task.error or ("cancelled", f"{task.key!r} was cancelled", b"")
            self.move(task, ERRED, cause)
            task.error = error
            self._finish_inputs(task)
            # Dependents submitted while it still ran did not fail with it: now they do.
            for dependent_key in list(task.dependents):
                self.fail(self.tasks[dependent_key], error, f"input {task.key} failed")
            self.release_if_unneeded(task)
        elif task.needed():
            self.requeue(task, cause + "; needed again")
        else:
            self._remove(task, cause)

    def worker_closing(self, worker: WorkerRecord, msg: m.WorkerClosing) -> None:
        worker.leaving = msg.reason or "closed"

    def tasks_dropped(self, worker: WorkerRecord, msg: m.TasksDropped) -> None:
        """The worker let go of tasks we had freed before they started: settle them."""
        for key in msg.keys:
            task = self._running_task(worker, key)
            if task is not None:
                self.placement_due = True
                task.discard_result = False
                self._settle_discarded(task, f"dropped by {worker.name} before it started")

    def missing_dependency(self, worker: WorkerRecord, msg: m.MissingDependency) -> None:
        task = self._running_task(worker, msg.key)
        dep = self.tasks.get(msg.dep)
        if dep is not None and dep.state == MEMORY:
            holder = self.workers.get(dep.worker or "")
            if holder is None or holder.address in msg.holders:
                if holder is not None:
                    holder.has_what.discard(dep.key)
                    holder.nbytes -= dep.nbytes
                self.lose_result(dep, f"{worker.name} could not fetch it")
        if task is None or task.state != PROCESSING:
            return  # a stale report, or the task failed with the input it could not fetch
        self.placement_due = True
        cause = f"input {msg.dep} missing on {worker.name}"
        if task.discard_result:  # released or cancelled meanwhile: do not run it again
            task.discard_result = False
            self._settle_discarded(task, cause)
            return
        task.missing_deps = sum(1 for d in task.deps if self.tasks[d].state != MEMORY)
        if task.missing_deps:
            self.move(task, WAITING, cause)
        else:
            self.enqueue(task, cause)

    # --- resources nobody has -------------------------------------------------------

    def satisfiable(self, signature: tuple[tuple[str, int], ...]) -> bool:
        """Some connected worker's declared supply could hold this request."""
        known = self._satisfiable.get(signature)
        if known is None:
            demand = dict(signature)
            known = any(fits(demand, w.total) for w in self.workers.values())
            self._satisfiable[signature] = known
        return known

    def check_satisfiable(self, task: TaskRecord) -> tuple[str, bytes | str, bytes] | None:
        """At submission, on a cluster that cannot grow: the failure to give ``task``."""
        if not self.config.fail_unsatisfiable or not self.workers:
            return None
        if self.satisfiable(task.signature):
            return None
        return ("unsatisfiable", unsatisfiable_text(task, self.workers.values()), b"")

    def unsatisfiable(self, signature: tuple[tuple[str, int], ...], heap: list[Any]) -> None:
        """Placement found ready tasks that no connected worker can ever hold."""
        tasks = [self.tasks[key] for _, _, key in heap if key in self.tasks]
        tasks = [t for t in tasks if t.state == QUEUED]
        if not tasks:
            return
        text = unsatisfiable_text(tasks[0], self.workers.values())
        if not self.config.fail_unsatisfiable:
            self._warn_unsatisfiable(tasks[0], text)
            return
        for task in tasks:
            self.fail(task, ("unsatisfiable", text, b""), "no connected worker can run it")

    def _warn_unsatisfiable(self, task: TaskRecord, text: str) -> None:
        """Say it once per kind of request and connected-worker set, to log and client."""
        if task.signature in self._warned:
            return
        self._warned.add(task.signature)
        self.warn(text)
        for client_id in task.wanted_by or ():
            self.send(client_id, m.Notice("warning", text))


def unsatisfiable_text(task: TaskRecord, workers: Any) -> str:
    """Name what is missing and the largest supply on offer, for a warning or an error."""
    names = sorted(task.resources)
    best: dict[str, tuple[int, str]] = {}
    for w in workers:
        for name in names:
            have = w.total.get(name, 0)
            if name not in best or have > best[name][0]:
                best[name] = (have, w.name)
    short: set[str] = set()
    for w in workers:
        short.update(missing(task.resources, w.total))
    parts = []
    for name in names:
        have, where = best.get(name, (0, ""))
        if name in short:
            if have:
                parts.append(f"largest {name} supply is {format_amount(have)} on {where}")
            else:
                parts.append(f"no worker offers {name}")
    return (
        f"task {task.key!r} needs {format_resources(task.resources)}, which no connected "
        f"worker can ever provide: {'; '.join(parts)}"
    )


def error_message(key: str, error: tuple[str, bytes | str, bytes]) -> m.Message:
    kind, detail, traceback = error
    if kind == "exception" and isinstance(detail, bytes):
        return m.TaskErred(key, detail, traceback)
    return m.KeysFailed([key], kind, str(detail))


CLIENT_HANDLERS: dict[type[m.Message], Callable[[SchedulerState, ClientRecord, Any], None]] = {
    m.SubmitTasks: SchedulerState.submit,
    m.ReleaseKeys: SchedulerState.release_keys,
    m.CancelKeys: SchedulerState.cancel_keys,
    m.GatherRequest: relay.gather,
    m.ScatterRequest: relay.scatter,
    m.ScatterPlaced: relay.scatter_placed,
    m.WhoHasRequest: relay.who_has,
    m.WhyRequest: SchedulerState.why,
    m.InfoRequest: SchedulerState.info,
    m.StoryRequest: SchedulerState.story,
}

WORKER_HANDLERS: dict[type[m.Message], Callable[[SchedulerState, WorkerRecord, Any], None]] = {
    m.TaskFinished: SchedulerState.task_finished,
    m.TaskRaised: SchedulerState.task_raised,
    m.MissingDependency: SchedulerState.missing_dependency,
    m.TasksDropped: SchedulerState.tasks_dropped,
    m.WorkerClosing: SchedulerState.worker_closing,
    m.DataReply: relay.data_reply,
    m.DataStored: relay.data_stored,
}
