"""The job queue: runs in the journal, tasks in the scheduler, as one of its clients.

``RunQueue`` talks to the scheduler only in client messages (``QueueHost.send`` out,
``on_message`` in). Each queued run becomes one task, ``run-<id>``, whose function
is ``execute_run``: placement, resources, priority, backfill, retries, cancellation
and worker loss are the scheduler's, unchanged. It registers as the service for
run requests (``SubmitRuns``, ``QueryRuns``, ``CancelRuns``, forwarded to it) and
for tasks whose keys begin with ``run-`` (adopted after a scheduler restart), and
hears of its runs through the notes workers send about their tasks (``TaskNoted``
carrying ``RunStarted``, ``RunOutput``, ``RunEnded``).

What becomes of a run is decided by its pure lifecycle (``lifecycle.RunLifecycle``);
this service only turns what it hears into the lifecycle's events and carries out
the commands: tasks into the scheduler, journal writes and run output to the
writer thread (``writer.JournalWriter``), so that no SQLite commit or log file is
ever waited for on the scheduler's event loop. Reads of the journal (runs staged
and cancels asked by other processes, answers to clients) go through the writer
too and come back to the loop as futures.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from apportion.core.demand import Demand
from apportion.core.payload import Pickled, dumps_function, function_id, pack_call
from apportion.core.resources import parse_supply
from apportion.protocol.base import Message
from apportion.protocol.cluster import CheckDemands, DemandsChecked, WhyReply, WhyRequest
from apportion.protocol.codec import ProtocolError, decode_message, encode_message
from apportion.protocol.services import (
    AdoptTask,
    ForwardedReply,
    ForwardedRequest,
    RegisterService,
    StopTasks,
    TaskNoted,
    TasksStillRunning,
    WorkerDeparted,
)
from apportion.protocol.tasks import (
    CancelKeys,
    KeysDone,
    KeysFailed,
    Notice,
    ReleaseKeys,
    SubmitTasks,
    TaskErred,
    TaskPreempted,
    TaskSpec,
)
from apportion.runs import run_events as e
from apportion.runs.journal import QUEUED, RUNNING, STAGED, Journal, RunRecord
from apportion.runs.lifecycle import RunLifecycle
from apportion.runs.live import RUN_KEY_PREFIX, execute_run, run_id_of, run_key
from apportion.runs.messages import (
    CancelPersonRuns,
    CancelRuns,
    QueryRuns,
    RunEnded,
    RunOutput,
    RunsReport,
    RunsSubmitted,
    RunStarted,
    SubmitRuns,
)
from apportion.runs.spec import RunSpec
from apportion.runs.views import RunView
from apportion.runs.writer import JournalWriter

logger = logging.getLogger("apportion.runs")

T = TypeVar("T")

#: Seconds between looks at the journal for runs staged and cancels asked meanwhile.
POLL_SECONDS = 0.5
#: Seconds between updates of the "why is it waiting" text of queued runs.
WAITING_SECONDS = 2.0
#: At most this many queued runs get their waiting text refreshed per update.
WAITING_BATCH = 200
#: How the scheduler's explanation of a task that waits in a queue begins.
_WAITING = ("queued", "waiting")


class QueueHost(Protocol):
    """The queue's connection to the scheduler, as any client has."""

    def send(self, messages: list[Message]) -> None:
        """Send these messages to the scheduler, in order."""
        ...


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """How a scheduler runs its job queue."""

    #: After a restart, how long a run that was running waits for its worker.
    adopt_grace: float = 30.0
    #: The supply of a fixed cluster (``--run-once``): staged runs it can never
    #: meet are reported and left staged instead of queued. None: workers may join.
    fixed_supply: dict[str, int] | None = None
    #: Called with every chunk of run output (``--run-once`` echoes it), from the
    #: writer thread.
    echo: Callable[[bytes], None] | None = None


@dataclass(frozen=True, slots=True)
class _RunTask:
    """What a run's task is made of, made once from its spec."""

    #: ``execute_run(id, spec)``'s arguments, pickled: the spec in its final form.
    args: Pickled
    #: The spec's own demand, as it was parsed where the run entered.
    demand: Demand
    priority: int
    #: Who submitted it ("": the owner): its task is that person's work.
    person: str = ""
    #: The scheduler may stop it and run it again (``RunSpec.preemptible``).
    preemptible: bool = False


class RunQueue:
    """Feeds journal runs to the scheduler as tasks and records what becomes of them.

    Every method runs on the scheduler's event loop.
    """

    def __init__(self, journal: Journal, host: QueueHost, options: QueueOptions) -> None:
        self.host = host
        self.options = options
        self.life = RunLifecycle(options.adopt_grace, options.fixed_supply)
        self.writer = JournalWriter(journal, options.echo)
        blob = dumps_function(execute_run)
        self._function = (function_id(blob), blob)
        #: The task of every run the lifecycle serves (and of staged runs it saw).
        self._tasks: dict[int, _RunTask] = {}
        #: Lifecycle events not yet handled: one is handled at a time, in order, even
        #: when carrying out a command makes the scheduler answer at once.
        self._events: deque[e.Event] = deque()
        self._handling = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: A look at the journal is under way (at most one at a time).
        self._polling = False
        #: The journal has been looked at once since the start.
        self._looked = False
        self._next_poll = 0.0
        self._next_waiting = 0.0
        #: Events that came before the journal was read (``start``): handled after it.
        self._early: list[e.Event] | None = []
        #: Numbers of the queue's own requests to the scheduler (why, checks).
        self._requests = itertools.count(1)
        #: Checks of demands asked (``CheckDemands``): request id -> what follows.
        self._checks: dict[int, Callable[[list[list[str]]], None]] = {}
        requests = [SubmitRuns.__name__, QueryRuns.__name__, CancelRuns.__name__]
        requests.append(CancelPersonRuns.__name__)
        host.send([RegisterService(requests, RUN_KEY_PREFIX)])

    # --- lifecycle ----------------------------------------------------------------

    async def start(self, now: float, wall: float) -> None:
        """Resume what the journal holds: queued runs queue, running ones await adoption;
        then take the runs staged meanwhile."""
        self._loop = asyncio.get_running_loop()
        queued, running = await asyncio.wrap_future(self.writer.call(_resume))
        early, self._early = self._early or [], None
        self._feed(e.Resumed(self._views(queued), self._views(running), now, wall))
        for event in early:
            self._feed(event)
        self._polling = True
        self._polled(await asyncio.wrap_future(self.writer.call(_look)))
        self._next_poll = now + POLL_SECONDS
        self.tick(now, wall)

    async def close(self) -> None:
        """Let the writer finish what it was given (off the loop)."""
        await asyncio.to_thread(self.writer.close)

    @property
    def failures(self) -> int:
        """Runs settled in this session that did not complete (``--run-once`` exit)."""
        return self.life.failures

    @property
    def left_staged(self) -> dict[int, str]:
        """The staged runs this (fixed) cluster can never run, left staged: id ->
        "run LABEL: why", in the order found (``--run-once`` names them)."""
        return dict(self.life.ignored)

    def idle(self) -> bool:
        """Nothing queued, running, awaiting adoption, or staged that this cluster can run."""
        return self._looked and not self._polling and self.life.idle()

    def tick(self, now: float, wall: float) -> None:
        """Time passes: look for staged runs and cancels, expire adoptions, explain waits."""
        if now >= self._next_poll and not self._polling:
            self._next_poll = now + POLL_SECONDS
            self._polling = True
            self._when_done(self.writer.call(_look), self._polled, self._poll_failed)
        self._feed(e.Tick(now, wall))
        if now >= self._next_waiting:
            self._next_waiting = now + WAITING_SECONDS
            self._explain_waiting()

    def _polled(self, found: tuple[list[RunRecord], list[int]]) -> None:
        self._polling = False
        self._looked = True
        staged, cancels = found
        # Runs a fixed cluster can never run were reported once: not made into tasks again.
        staged = [record for record in staged if record.id not in self.life.ignored]
        self._feed(e.Polled(self._views(staged), tuple(cancels), time.monotonic(), time.time()))
        for run_id in self.life.ignored.keys() & self._tasks.keys():
            del self._tasks[run_id]

    # --- events in, commands out ----------------------------------------------------

    def _feed(self, event: e.Event) -> None:
        if self._early is not None:
            self._early.append(event)  # the journal is not read yet
            return
        self._events.append(event)
        if self._handling:
            return  # the loop below takes it, once the current commands are done
        self._handling = True
        try:
            while self._events:
                event = self._events.popleft()
                try:
                    self._carry_out(self.life.handle(event))
                except Exception:
                    logger.exception("job queue: %s failed", type(event).__name__)
        finally:
            self._handling = False

    def _carry_out(self, commands: list[e.Command]) -> None:
        journal: list[e.JournalCommand] = []
        tasks: list[TaskSpec] = []
        for command in commands:
            match command:
                case e.Schedule():
                    tasks.append(self._task_spec(command.run_id, command.retries_left))
                case e.Say():
                    level = logging.WARNING if command.level == "warning" else logging.INFO
                    logger.log(level, "%s", command.text)
                case e.Adopt() | e.Release() | e.CancelTask() | e.StopStrays():
                    self._submit(tasks)
                    tasks = []
                    self._to_scheduler(command)
                case e.MarkEnded():
                    self._tasks.pop(command.run_id, None)
                    journal.append(command)
                case _:
                    journal.append(command)
        self.writer.write(journal)  # before the scheduler acts on what comes next
        self._submit(tasks)

    def _to_scheduler(self, command: e.Adopt | e.Release | e.CancelTask | e.StopStrays) -> None:
        message: Message
        match command:
            case e.Adopt():
                func_id, blob = self._function
                task = self._task_spec(command.run_id, command.retries_left)
                units = parse_supply(command.held or None)[1]
                message = AdoptTask(command.worker_id, task, {func_id: blob}, units)
            case e.Release():
                message = ReleaseKeys([run_key(command.run_id)])
            case e.CancelTask():
                message = CancelKeys([run_key(command.run_id)])
            case e.StopStrays():
                keys = [run_key(run_id) for run_id in command.run_ids]
                message = StopTasks(command.worker_id, keys)
        self.host.send([message])

    def _submit(self, tasks: list[TaskSpec]) -> None:
        if tasks:
            func_id, blob = self._function
            self.host.send([SubmitTasks(tasks, {func_id: blob}, [t.key for t in tasks])])

    def _task_spec(self, run_id: int, retries_left: int) -> TaskSpec:
        """The task that runs the command: ``execute_run(id, spec)``, with its demand."""
        task = self._tasks[run_id]
        key = run_key(run_id)
        func_id = self._function[0]
        first, alternatives = task.demand.wire()
        return TaskSpec(
            key,
            func_id,
            task.args,
            [],
            first,
            task.priority,
            retries_left,
            alternatives,
            person=task.person,
            preemptible=int(task.preemptible),
        )

    def _views(self, records: list[RunRecord]) -> tuple[RunView, ...]:
        """The lifecycle's views of ``records``; their tasks are made here, once."""
        views = []
        for record in records:
            spec = record.spec
            if record.id not in self._tasks:
                args = pack_call((record.id, spec), {})[0]
                self._tasks[record.id] = _RunTask(
                    args, spec.demand, spec.priority, spec.person, spec.preemptible
                )
            views.append(view_of(record))
        return tuple(views)

    def _when_done(
        self,
        future: Future[T],
        then: Callable[[T], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        """Call ``then`` with the writer's answer, or ``failed`` with its error, on the loop."""
        loop = self._loop
        assert loop is not None, "start() first"

        def done(future: Future[T]) -> None:
            error = future.exception()
            if error is None:
                then(future.result())
            else:
                logger.error("job queue: the journal failed: %s", error)
                failed(error)

        def hand_over(future: Future[T]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(done, future)

        future.add_done_callback(hand_over)

    def _poll_failed(self, _: BaseException) -> None:
        self._polling = False  # the next tick looks again

    # --- what the scheduler tells its client ----------------------------------------

    def on_message(self, message: Message) -> None:
        """A message from the scheduler to the queue's client."""
        now, wall = time.monotonic(), time.time()
        match message:
            case KeysDone():
                for key in message.keys:
                    self._task_done(key, None, now, wall)
            case TaskErred():
                self._task_done(message.key, ("failed", ""), now, wall)
            case KeysFailed():
                for key in message.keys:
                    self._task_done(key, (message.kind, message.message), now, wall)
            case TaskNoted() | TaskPreempted():
                self._noted(message, now, wall)
            case TasksStillRunning():
                self._still_running(message, now, wall)
            case WorkerDeparted():
                self._feed(e.WorkerGone(message.name, now, wall))
            case ForwardedRequest():
                self._forwarded(message)
            case WhyReply() | DemandsChecked():
                self._answered(message)
            case Notice():
                level = logging.WARNING if message.level == "warning" else logging.INFO
                logger.log(level, "%s", message.text)
            case _:
                pass  # KeysPending and the like: a run's task is never an input

    def _answered(self, message: WhyReply | DemandsChecked) -> None:
        """The scheduler answered one of the queue's own requests."""
        if isinstance(message, WhyReply):
            self._waiting(message.reasons)
            return
        then = self._checks.pop(message.request_id, None)
        if then is not None:
            then(message.verdicts)

    def _task_done(self, key: str, failure: e.Failure, now: float, wall: float) -> None:
        run_id = run_id_of(key)
        if run_id is not None:
            self._feed(e.TaskDone(run_id, failure, now, wall))

    def _noted(self, noted: TaskNoted | TaskPreempted, now: float, wall: float) -> None:
        """A worker's note about a run: its start, output or end; or the scheduler's
        word that it stops the run to let another share in."""
        if isinstance(noted, TaskPreempted):
            run_id = run_id_of(noted.key)
            if run_id is not None:
                self._feed(e.Preempted(run_id, noted.worker, noted.reason, now, wall))
            return
        try:
            note = decode_message(noted.note)
        except ProtocolError as exc:
            logger.warning("job queue: a garbled note about %s: %s", noted.key, exc)
            return
        match note:
            case RunStarted():
                run_id, held, pid = note.run_id, note.held, note.pid
                self._feed(e.Started(run_id, noted.worker, held, pid, now, wall))
            case RunOutput():
                self.writer.output(note.run_id, note.offset, note.data)
            case RunEnded():
                code, sig, reason, detail = note.exit_code, note.signal, note.reason, note.detail
                self._feed(e.Ended(note.run_id, code, sig, reason, detail, now, wall))

    def _still_running(self, message: TasksStillRunning, now: float, wall: float) -> None:
        """A worker came back with runs alive: adopt those we wait for, stop the others."""
        live = tuple(i for key in message.keys if (i := run_id_of(key)) is not None)
        states = {
            run_id: state
            for key, state in message.states.items()
            if (run_id := run_id_of(key)) is not None
        }
        self._feed(e.WorkerBack(message.worker_id, message.worker, live, states, now, wall))

    def _forwarded(self, forwarded: ForwardedRequest) -> None:
        """A client's run request, forwarded by the scheduler; the answer goes back."""
        origin = forwarded.origin

        def reply(answer: Message) -> None:
            self.host.send([ForwardedReply(origin, encode_message(answer))])

        try:
            self.request(decode_message(forwarded.request), reply, forwarded.person)
        except ProtocolError as exc:
            logger.warning("job queue: a garbled request from %s: %s", origin, exc)

    # --- requests from clients ----------------------------------------------------------

    def request(self, message: Message, reply: Callable[[Message], None], person: str = "") -> None:
        """``SubmitRuns``, ``QueryRuns``, ``CancelRuns`` or ``CancelPersonRuns``:
        answered through ``reply`` once the journal has it. ``person`` asks ("" for
        the owner): their runs are theirs, and they see and cancel only those."""
        match message:
            case SubmitRuns():
                try:
                    specs = [replace(RunSpec.from_dict(s), person=person) for s in message.specs]
                except ValueError as exc:
                    reply(RunsSubmitted(message.request_id, [], str(exc)))
                    return
                demands = [spec.demand.first for spec in specs]
                self._check_demands(
                    demands, lambda verdicts: self._submit_runs(message, specs, verdicts, reply)
                )
            case CancelRuns():
                self._cancel(message.request_id, list(message.ids), person, reply)
            case CancelPersonRuns():
                self._cancel(message.request_id, None, message.person, reply)
            case QueryRuns():
                self._report(message.request_id, list(message.ids), reply, person)

    def _cancel(
        self, request_id: int, ids: list[int] | None, person: str, reply: Callable[[Message], None]
    ) -> None:
        """Cancel runs ``ids`` that ``person`` may cancel (all, for the owner), or with
        ``ids`` None every run of ``person`` not finished; answer with the runs."""
        wall = time.time()

        def cancelled(asked: list[int]) -> None:
            self._feed(e.Polled((), tuple(asked), time.monotonic(), wall))
            self._report(request_id, asked if ids is None else ids, reply, person)

        def request(journal: Journal) -> list[int]:
            if ids is None:
                wanted = [r.id for r in journal.runs(states=UNFINISHED) if r.spec.person == person]
            else:
                wanted = [r.id for r in journal.runs(ids=ids) if _sees(person, r)]
            return _request_cancel(journal, wanted, wall)

        self._ask(self.writer.call(request), cancelled, _no_report(request_id), reply)

    def _check_demands(
        self, demands: list[dict[str, int]], then: Callable[[list[list[str]]], None]
    ) -> None:
        """Ask the scheduler what its workers make of ``demands`` (one ``[kind, text]``
        each, ``scheduler.unsatisfiable.check_demand``); ``then`` gets the answer."""
        request_id = next(self._requests)
        self._checks[request_id] = then
        self.host.send([CheckDemands(request_id, demands)])

    def _submit_runs(
        self,
        message: SubmitRuns,
        specs: list[RunSpec],
        verdicts: list[list[str]],
        reply: Callable[[Message], None],
    ) -> None:
        """Queue ``specs``, or refuse them all if one misspells a resource.

        A misspelt name (``gpu`` where workers offer ``GPU``) is refused, as Slurm
        refuses a request no node's configuration has: it is a typo to fix, and a run
        queued with it would wait for a worker that never comes. Other requests no
        connected worker can hold are queued (a worker that can may join), with the
        verdict in the answer for the submitter to show.
        """
        request_id, wall = message.request_id, time.time()
        for spec, (kind, text) in zip(specs, verdicts, strict=True):
            if kind == "misnamed":
                error = f"the run asks for {spec.resources}, but {text}; nothing was queued"
                reply(RunsSubmitted(request_id, [], error))
                return

        def stage(journal: Journal) -> list[RunRecord]:
            return journal.runs(ids=journal.stage(specs, wall, queued=True))

        def submitted(records: list[RunRecord]) -> None:
            self._feed(e.Submitted(self._views(records), time.monotonic(), wall))
            ids = [r.id for r in records]
            reply(RunsSubmitted(request_id, ids, "", [list(v) for v in verdicts]))

        def failed(error: str) -> Message:
            return RunsSubmitted(request_id, [], f"the scheduler failed: {error}")

        self._ask(self.writer.call(stage), submitted, failed, reply)

    def _report(
        self, request_id: int, ids: list[int], reply: Callable[[Message], None], person: str = ""
    ) -> None:
        future = self.writer.call(lambda journal: report(journal, ids, person))
        answer = lambda runs: reply(RunsReport(request_id, runs))  # noqa: E731
        self._ask(future, answer, _no_report(request_id), reply)

    def _ask(
        self,
        future: Future[T],
        then: Callable[[T], None],
        failed: Callable[[str], Message],
        reply: Callable[[Message], None],
    ) -> None:
        """``_when_done``, with a failure answered to the client (``failed(why)``)."""
        self._when_done(future, then, lambda error: reply(failed(str(error))))

    def _explain_waiting(self) -> None:
        """Ask the scheduler why the runs not started yet wait (``WhyRequest``)."""
        runs = self.life.runs
        queued = [i for i in sorted(self.life.active) if runs[i].state == QUEUED]
        if queued:
            keys = [run_key(run_id) for run_id in queued[:WAITING_BATCH]]
            self.host.send([WhyRequest(next(self._requests), keys)])

    def _waiting(self, reasons: dict[str, str]) -> None:
        """Write down why runs wait, for those still waiting in a queue."""
        commands: list[e.JournalCommand] = []
        for key, reason in reasons.items():
            run_id = run_id_of(key)
            view = self.life.runs.get(run_id) if run_id is not None else None
            if view is not None and view.state == QUEUED and reason.startswith(_WAITING):
                commands.append(e.SetWaiting(view.id, waiting_text(reason)))
        self.writer.write(commands)


def _no_report(request_id: int) -> Callable[[str], Message]:
    """The answer to a query the journal failed (the error is logged): no runs."""
    return lambda _: RunsReport(request_id, [])


def view_of(record: RunRecord) -> RunView:
    """The lifecycle's view of a journal record."""
    return RunView(
        record.id,
        record.label(),
        record.state,
        record.attempts,
        record.spec.retries,
        preemptions=record.preemptions,
        resources=record.spec.resources,
        demand=record.spec.demand.first,
        worker=record.worker,
        held=record.held,
        cancel_requested=record.cancel_requested,
    )


def _resume(journal: Journal) -> tuple[list[RunRecord], list[RunRecord]]:
    return journal.runs(states={QUEUED}), journal.runs(states={RUNNING})


def _look(journal: Journal) -> tuple[list[RunRecord], list[int]]:
    return journal.runs(states={STAGED}), journal.cancel_requests()


def _request_cancel(journal: Journal, ids: list[int], wall: float) -> list[int]:
    asked = []
    with journal.batch():  # one commit, and before the workers are told
        for run_id in ids:
            try:
                journal.request_cancel(run_id, wall)
            except KeyError:
                continue
            asked.append(run_id)
    return asked


def report(journal: Journal, ids: list[int], person: str = "") -> list[dict[str, Any]]:
    """What ``QueryRuns`` and ``CancelRuns`` answer: each known run of ``ids``, or the
    latest runs if ``ids`` is empty, as ``remote.record_to_dict`` gives them; for a
    person, only their own (among the latest, the latest of all that are theirs)."""
    from apportion.runs.remote import MAX_LISTED, record_to_dict

    records = journal.runs(ids=ids) if ids else journal.runs(latest=MAX_LISTED)
    return [record_to_dict(record) for record in records if _sees(person, record)]


def _sees(person: str, record: RunRecord) -> bool:
    """Whether ``person`` may see and cancel run ``record``: the owner ("") any."""
    return not person or record.spec.person == person


#: The states of a run that is not over: what removing its person cancels.
UNFINISHED = frozenset({STAGED, QUEUED, RUNNING})


def waiting_text(explanation: str) -> str:
    """The scheduler's explanation of a waiting task as one line for the run table.

    ``"queued: needs gpu=1\n  w1: gpu 0 of 1 free"`` -> ``"needs gpu=1; w1: gpu 0 of 1 free"``
    (the table already says the run is queued).
    """
    lines = [line.strip() for line in explanation.splitlines() if line.strip()]
    if lines and lines[0].startswith("queued: "):
        lines[0] = lines[0][len("queued: ") :]
    return "; ".join(lines)
