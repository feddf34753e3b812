"""Work stealing between the real scheduler and real workers, in any interleaving.

The scheduler's state machine (``SchedulerState``) and one ``WorkerState`` per worker
are joined by FIFO queues, one per direction and worker, as TCP connections join
them. Hypothesis delivers the messages of any queue at any time, starts and ends
executions (some secede and rejoin, some raise or return too large a result), lets
time pass, pauses workers for their memory and resumes them, loses and adds workers,
and has the client submit, cancel and release tasks. The tasks are of three groups:
``short-N`` (expected to take a millisecond: queued ahead on busy workers, where
they wait and get stolen), ``long-N`` (five seconds: never queued behind another
task, but what waits behind one should move) and ``gpu-N`` (one of the one GPU that
two-thread workers have: a move gives it back on one worker before taking it on the
other). A few take one input, which their worker fetches from its holder.

After every step, beside both state machines' own invariants:

- no key executes on two workers at once, no worker starts a task without a
  ComputeTask that made it a task there, and no key runs more often than the
  scheduler sent it out;
- the scheduler sends a key out only when its last assignment is over: reported
  (finished, raised, dropped, let go to a steal, input missing) or its worker lost;
- what the scheduler thinks a worker processes, that worker has as a task, or
  a message about it is on its way (the ComputeTask there, a report back), and the
  worker has no task the scheduler does not think it processes;
- every steal under way is answered or about to be: the request is on its way, or
  a message about the key is on its way back.

At the end everything is delivered and run until nothing moves: every task the
client still wants is in memory, or failed because it (or an input) raised or was
cancelled; nothing is left processing, no steal pending, no worker holds a task.
The random runs, summed, must have asked for steals, had tasks let go and moved, and
met requests that came too late (the task had started), or the checks proved nothing.
Fixed schedules at the end play each race of one steal step by step.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from apportion.core.resources import parse_demand, parse_supply
from apportion.protocol.base import Message
from apportion.protocol.tasks import CancelKeys, KeysDone, ReleaseKeys, SubmitTasks, TaskSpec
from apportion.protocol.worker import (
    ComputeTask,
    DropPrefetch,
    FreeKeys,
    Heartbeat,
    LoadFunction,
    MissingDependency,
    Prefetch,
    RegisterWorker,
    RejoinGranted,
    ResultTooLarge,
    StealRequest,
    StealResponse,
    TaskFinished,
    TaskRaised,
    TasksDropped,
    TaskSeceded,
)
from apportion.scheduler.dispatch import handle
from apportion.scheduler.events import (
    ClientJoined,
    Command,
    Disconnect,
    Event,
    FromClient,
    FromWorker,
    Log,
    PipeData,
    PlacementDue,
    SendRefused,
    Tick,
    WorkerJoined,
    WorkerLeft,
)
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, MEMORY, PROCESSING, QUEUED
from apportion.scheduler.state import SchedulerConfig, SchedulerState
from apportion.scheduler.wire import to_wire
from apportion.testing.simulation import SimulatedCluster
from apportion.worker import invariants as worker_invariants
from apportion.worker import records as worker_records
from apportion.worker.events import (
    DataInfo,
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
    Rejoining,
    Resumed,
    ResumeTask,
    Seceded,
    SendToScheduler,
    WorkerCommand,
    WorkerEvent,
    arrival,
)
from apportion.worker.state import WorkerState

#: Workers never fall silent here (no worker timeout) and a task lost with its
#: worker is never blamed for the deaths: each loss is the test's doing.
CONFIG = SchedulerConfig(worker_timeout=1e9, max_worker_deaths=1_000_000)
CLIENT = "c1"
#: Expected (and reported) seconds of each group's tasks.
DURATIONS = {"short": 0.001, "long": 5.0, "gpu": 0.05}
#: What each group's tasks ask for: ``gpu`` tasks one of the one GPU some workers have.
DEMANDS = {"gpu": parse_demand({"GPU": 1})}
INFO = DataInfo(8, "int")
MAX_WORKERS = 4

settings.register_profile(
    "stealing-stateful",
    max_examples=200,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
STATEFUL = settings.get_profile("stealing-stateful")


def _reported(msg: Message) -> list[str]:
    """Keys whose assignment to the sending worker ``msg`` ends (a report or a release)."""
    if isinstance(msg, TaskFinished | TaskRaised | ResultTooLarge | MissingDependency):
        return [msg.key]
    if isinstance(msg, TasksDropped):
        return list(msg.keys)
    if isinstance(msg, StealResponse):
        return list(msg.released)
    return []


def _mentioned(msg: Message) -> list[str]:
    """Keys a message from a worker tells the scheduler about."""
    if isinstance(msg, StealResponse):
        return [*msg.released, *msg.started]
    return _reported(msg)


@dataclass
class Peer:
    """One worker: its own state machine, and the connection joining it to the scheduler."""

    id: str
    address: str
    ws: WorkerState
    #: Scheduler -> worker messages not delivered yet, oldest first.
    down: deque[Message] = field(default_factory=deque)
    #: Worker -> scheduler messages not delivered yet, oldest first.
    up: deque[Message] = field(default_factory=deque)
    #: Fetches it asked of peers, not answered yet.
    fetches: list[Fetch] = field(default_factory=list)
    #: Keys made tasks here by a ComputeTask and not started since: the only keys it
    #: may start.
    startable: set[str] = field(default_factory=set)


class StealingMachine(RuleBasedStateMachine):
    """The scheduler, 2-4 workers and one client, every message queued (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.state = SchedulerState(CONFIG)
        self.peers: dict[str, Peer] = {}
        self._ids = itertools.count(1)
        self.inbox: list[Message] = []
        self.logs: list[Log] = []
        self.next_key = 0
        # The client's side.
        self.wanted: set[str] = set()
        self.deps: dict[str, list[str]] = {}
        self.cancelled: set[str] = set()
        self.raised: set[str] = set()
        # What the checks follow.
        #: key -> the worker its last ComputeTask went to, while that assignment lasts.
        self.assigned: dict[str, str] = {}
        #: key -> the worker executing it now.
        self.executing: dict[str, str] = {}
        self.computes: Counter[str] = Counter()
        self.executions: Counter[str] = Counter()
        #: key -> the worker that let it go to a steal, until it is sent out again.
        self.let_go: dict[str, str] = {}
        #: What happened, for the checks that the run exercised stealing.
        self.stats: Counter[str] = Counter()
        self._scheduler(ClientJoined(CLIENT, self.now))
        for group, seconds in DURATIONS.items():
            self.state.telemetry.tally(f"{group}-0").expected = seconds

    # --- plumbing ---------------------------------------------------------------------

    def _scheduler(self, event: Event) -> None:
        """One event into the scheduler; a placement pass follows when one is due, as
        the service runs one after the loop turn that made it due."""
        self._route(handle(self.state, event))
        if self.state.placement_due:
            self._route(handle(self.state, PlacementDue(self.now)))

    def _route(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, Log):
                self.logs.append(command)
                continue
            # No worker falls silent or registers twice, no result is piped to a client.
            assert not isinstance(command, Disconnect | SendRefused | PipeData), command
            peer_id, msg = to_wire(command)
            if peer_id == CLIENT:
                self.inbox.append(msg)
                continue
            peer = self.peers.get(peer_id)
            assert peer is not None, f"{type(msg).__name__} for {peer_id}, not connected"
            if isinstance(msg, ComputeTask):
                self._sent_out(peer, msg.key)
            elif isinstance(msg, StealRequest):
                self.stats["steals asked"] += len(msg.keys)
            peer.down.append(msg)

    def _sent_out(self, peer: Peer, key: str) -> None:
        holder = self.assigned.get(key)
        assert holder is None, f"{key} sent to {peer.id} while still assigned to {holder}"
        self.assigned[key] = peer.id
        self.computes[key] += 1
        victim = self.let_go.pop(key, None)
        if victim is not None and victim != peer.id:
            self.stats["moved"] += 1

    def _worker(self, peer: Peer, event: WorkerEvent) -> None:
        self._commands(peer, peer.ws.handle(event))

    def _commands(self, peer: Peer, commands: list[WorkerCommand]) -> None:
        for command in commands:
            if isinstance(command, SendToScheduler):
                msg = command.message
                peer.up.append(msg)
                if isinstance(msg, StealResponse):
                    self.stats["let go"] += len(msg.released)
                    self.stats["kept, started"] += len(msg.started)
            elif isinstance(command, Execute):
                self._started(peer, command.key)
            elif isinstance(command, Fetch):
                peer.fetches.append(command)
            else:
                assert isinstance(command, ForgetData | ResumeTask), command
        # A task dropped before it started may start again only after a new ComputeTask.
        pending = {k for k, t in peer.ws.tasks.items() if t.state != worker_records.EXECUTING}
        peer.startable &= pending

    def _started(self, peer: Peer, key: str) -> None:
        other = self.executing.get(key)
        assert other is None, f"{key} executes on {other} and {peer.id} at once"
        assert key in peer.startable, f"{peer.id} started {key} without a ComputeTask for it"
        peer.startable.discard(key)
        self.executing[key] = peer.id
        self.executions[key] += 1
        assert self.executions[key] <= self.computes[key], f"{key} ran more often than sent"

    # --- steps (the rules and the fixed scenarios call these) ----------------------------

    def add(self, nthreads: int, gpu: bool = False) -> str:
        worker_id = f"w{next(self._ids)}"
        address = f"sim://{worker_id}"
        self.peers[worker_id] = Peer(worker_id, address, WorkerState(nthreads, address))
        supply, _ = parse_supply({"GPU": 1} if gpu else None)
        registration = RegisterWorker(worker_id, address, nthreads, supply, 0, 0, {})
        self._scheduler(WorkerJoined(worker_id, registration, self.now))
        return worker_id

    def lose(self, worker_id: str) -> None:
        """The worker's process is gone: what it ran, held and had to say is gone too."""
        peer = self.peers.pop(worker_id)
        for key in [k for k, w in self.executing.items() if w == worker_id]:
            del self.executing[key]
        for key in [k for k, w in self.assigned.items() if w == worker_id]:
            del self.assigned[key]
        self._scheduler(WorkerLeft(worker_id, self.now))
        self.stats["lost with messages on their way"] += bool(peer.down or peer.up)

    def submit(self, groups: list[str], deps: list[str | None], retries: int = 0) -> list[str]:
        """One batch; ``deps[i]``, if set, is the input of the i-th task."""
        specs = []
        for group, dep in zip(groups, deps, strict=True):
            key = f"{group}-{self.next_key}"
            self.next_key += 1
            inputs = [] if dep is None else [dep]
            self.deps[key] = inputs
            demand = DEMANDS.get(group, {})
            specs.append(TaskSpec(key, "f", b"", inputs, demand, 0, retries))
        keys = [spec.key for spec in specs]
        self.wanted.update(keys)
        self._scheduler(FromClient(CLIENT, [SubmitTasks(specs, {"f": b"f"}, keys)], self.now))
        return keys

    def cancel(self, key: str) -> None:
        self.cancelled.add(key)
        self._scheduler(FromClient(CLIENT, [CancelKeys([key])], self.now))

    def release(self, key: str) -> None:
        self.wanted.discard(key)
        self._scheduler(FromClient(CLIENT, [ReleaseKeys([key])], self.now))

    def to_worker(self, worker_id: str) -> Message:
        """Deliver the next message the scheduler sent ``worker_id``."""
        peer = self.peers[worker_id]
        msg = peer.down.popleft()
        if isinstance(msg, ComputeTask):
            if msg.key not in peer.ws.tasks and msg.key not in peer.ws.data:
                peer.startable.add(msg.key)
            self._worker(peer, arrival(msg, self.now))
        elif isinstance(msg, Prefetch | DropPrefetch | RejoinGranted | StealRequest):
            self._worker(peer, arrival(msg, self.now))
        elif isinstance(msg, FreeKeys):
            self._worker(peer, FreeArrived(tuple(msg.keys), self.now))
        else:
            assert isinstance(msg, LoadFunction), f"{worker_id} got unexpected {msg}"
        return msg

    def to_scheduler(self, worker_id: str) -> Message:
        """Deliver the next message ``worker_id`` sent the scheduler."""
        msg = self.peers[worker_id].up.popleft()
        for key in _reported(msg):
            if self.assigned.get(key) == worker_id:
                del self.assigned[key]
                if isinstance(msg, StealResponse):
                    self.let_go[key] = worker_id
        self._scheduler(FromWorker(worker_id, [msg], self.now))
        return msg

    def end(self, key: str, how: str = "ok") -> None:
        """The execution of ``key`` returns, raises, or returns too large a result."""
        peer = self.peers[self.executing.pop(key)]
        duration = DURATIONS[key.partition("-")[0]]
        if how == "raised":
            self.raised.add(key)
            self._worker(peer, ExecutionRaised(key, b"e", b"t", duration, self.now))
        elif how == "too large":
            self.raised.add(key)  # fails out of memory, retries or not
            big = DataInfo(2000, "bytes")
            self._worker(peer, ExecutionTooLarge(key, big, 1000, 900, duration, self.now))
        else:
            assert how == "ok", how
            self._worker(peer, ExecutionOk(key, INFO, duration, self.now))

    def pause(self, worker_id: str, paused: bool) -> None:
        """The worker's memory passes its pause threshold, or is back under it: it
        starts nothing meanwhile, and tells the scheduler at once."""
        peer = self.peers[worker_id]
        if paused:
            self._worker(peer, Paused(900, 1000, self.now))
        else:
            self._worker(peer, Resumed(500, 1000, self.now))
        peer.up.append(Heartbeat(len(peer.ws.executing), 900 if paused else 500, 0, int(paused)))

    def secede(self, key: str, keep: bool) -> None:
        """The execution of ``key`` waits on the cluster: its thread (and, unless it
        keeps them, its resources) go back; the scheduler learns it started."""
        self._worker(self.peers[self.executing[key]], Seceded(key, keep, self.now))

    def rejoin(self, key: str) -> None:
        self._worker(self.peers[self.executing[key]], Rejoining(key, self.now))

    def answer_fetch(self, worker_id: str) -> None:
        """The oldest fetch ``worker_id`` asked is answered by its holder, if still there."""
        peer = self.peers[worker_id]
        fetch = peer.fetches.pop(0)
        holder = next((p for p in self.peers.values() if p.address == fetch.address), None)
        if holder is None:
            self._worker(peer, FetchFailed(fetch.address, fetch.keys, "gone", self.now))
            return
        have = {k: holder.ws.data[k] for k in fetch.keys if k in holder.ws.data}
        missing = tuple(k for k in fetch.keys if k not in have)
        self._worker(peer, FetchDone(fetch.address, have, missing, self.now))

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self._scheduler(Tick(self.now))

    def catch_up(self, worker_id: str) -> None:
        """``worker_id`` takes every message, ends every execution and reports, until
        it has nothing left to do (fetches from its peers aside)."""
        peer = self.peers[worker_id]
        for _ in range(100):
            while peer.down:
                self.to_worker(worker_id)
            for key in sorted(k for k, w in self.executing.items() if w == worker_id):
                self.end(key)
            while peer.up:
                self.to_scheduler(worker_id)
            if not (peer.down or peer.ws.executing):
                return
        raise AssertionError(f"{worker_id} did not catch up")

    def quiet(self) -> bool:
        return not self.executing and not any(
            p.down or p.up or p.fetches for p in self.peers.values()
        )

    def drain(self) -> None:
        """Deliver everything and end every execution, until nothing moves."""
        if not any(p.ws.nthreads == 2 for p in self.peers.values()):
            self.add(2, gpu=True)  # for the tasks that need a GPU, if nobody has one
        for peer in list(self.peers.values()):
            if peer.ws.paused:
                self.pause(peer.id, False)
        for _ in range(1_000):
            for peer in list(self.peers.values()):
                while peer.down:
                    self.to_worker(peer.id)
                while peer.fetches:
                    self.answer_fetch(peer.id)
                while peer.up:
                    self.to_scheduler(peer.id)
            for key in sorted(self.executing):
                self.end(key)
            self.check()
            self.advance(1.0)
            if self.quiet():
                return
        raise AssertionError("the cluster did not settle")

    # --- checks -----------------------------------------------------------------------

    def check(self) -> None:
        state = self.state
        check_invariants(state)
        assert state.workers.keys() == self.peers.keys()
        for peer in self.peers.values():
            worker_invariants.check_invariants(peer.ws)
            self._check_views_agree(peer)
        for key, (victim, _) in state.steals.items():
            peer = self.peers[victim]
            asked = any(isinstance(x, StealRequest) and key in x.keys for x in peer.down)
            answered = any(key in _mentioned(x) for x in peer.up)
            assert asked or answered, f"the steal of {key} from {victim} is not answered"
        running = {k for p in self.peers.values() for k in p.ws.executing | set(p.ws.seceded)}
        assert running == self.executing.keys(), f"{running} run, not {set(self.executing)}"

    def _check_views_agree(self, peer: Peer) -> None:
        """The scheduler's and ``peer``'s view of what ``peer`` processes agree, up to
        the messages between them."""
        processing = self.state.workers[peer.id].processing
        computes = {x.key for x in peer.down if isinstance(x, ComputeTask)}
        reports = {k for x in peer.up for k in _reported(x)}
        for key in processing:
            assert key in peer.ws.tasks or key in computes or key in reports, (
                f"{key} processing on {peer.id}, which has no such task nor message"
            )
        for key in peer.ws.tasks:
            assert key in processing, f"{peer.id} has task {key} the scheduler did not give it"

    def check_settled(self) -> None:
        """After ``drain``: every wanted task done or failed for a reason; nothing held."""
        state = self.state
        told_done = {k for x in self.inbox if isinstance(x, KeysDone) for k in x.keys}
        for key in self.wanted:
            task = state.tasks[key]
            assert task.state in (MEMORY, ERRED), f"{key} left {task.state}"
            if task.state == MEMORY:
                assert key in told_done, f"{key} finished but the client was not told"
                assert task.worker in self.peers and key in self.peers[task.worker].ws.data
            else:
                assert self._failed_for_a_reason(key), f"{key} erred for no reason"
        assert not [k for k, t in state.tasks.items() if t.state == PROCESSING]
        assert not state.steals, f"steals left pending: {state.steals}"
        for worker in state.workers.values():
            assert not worker.processing and not worker.incoming and not worker.started
            assert worker.ledger.free == worker.ledger.total
        for peer in self.peers.values():
            assert not peer.ws.tasks, f"{peer.id} still has tasks {sorted(peer.ws.tasks)}"

    def _failed_for_a_reason(self, key: str) -> bool:
        if key in self.cancelled or key in self.raised:
            return True
        return any(self._failed_for_a_reason(dep) for dep in self.deps[key])

    # --- rules ------------------------------------------------------------------------

    @initialize(
        threads=st.lists(st.integers(1, 2), min_size=2, max_size=MAX_WORKERS),
        tasks=st.integers(2, 10),
    )
    def start(self, threads: list[int], tasks: int) -> None:
        """Workers (those of two threads with a GPU), and a batch of short tasks: more
        than threads, queued ahead."""
        for nthreads in threads:
            self.add(nthreads, gpu=nthreads == 2)
        if tasks:
            self.submit(["short"] * tasks, [None] * tasks)

    @precondition(lambda self: len(self.peers) < MAX_WORKERS)
    @rule(nthreads=st.integers(1, 2))
    def add_worker(self, nthreads: int) -> None:
        self.add(nthreads, gpu=nthreads == 2)

    @precondition(lambda self: len(self.peers) > 1)
    @rule(data=st.data(), lost=st.integers(0, 2))
    def lose_worker(self, data: st.DataObject, lost: int) -> None:
        """Now and then (a loss ends most races there: not too often)."""
        if not lost:
            self.lose(data.draw(st.sampled_from(sorted(self.peers))))

    @rule(
        data=st.data(),
        groups=st.lists(
            st.sampled_from(["short", "short", "short", "long", "gpu"]), min_size=1, max_size=4
        ),
        retries=st.integers(0, 1),
    )
    def submit_tasks(self, data: st.DataObject, groups: list[str], retries: int) -> None:
        """Mostly short tasks, some long; a few take a task still wanted as their input."""
        inputs = sorted(self.wanted - self.cancelled)
        deps: list[str | None] = []
        for _ in groups:
            with_input = inputs and not data.draw(st.integers(0, 3))
            deps.append(data.draw(st.sampled_from(inputs)) if with_input else None)
        self.submit(groups, deps, retries)

    @precondition(lambda self: self.wanted)
    @rule(data=st.data(), cancel=st.booleans())
    def cancel_or_release(self, data: st.DataObject, cancel: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.wanted)))
        if cancel:
            self.cancel(key)
        else:
            self.release(key)

    @precondition(lambda self: any(p.down for p in self.peers.values()))
    @rule(data=st.data(), n=st.integers(1, 3))
    def deliver_to_a_worker(self, data: st.DataObject, n: int) -> None:
        peer_id = data.draw(st.sampled_from(sorted(k for k, p in self.peers.items() if p.down)))
        for _ in range(min(n, len(self.peers[peer_id].down))):
            self.to_worker(peer_id)

    @precondition(lambda self: any(p.up for p in self.peers.values()))
    @rule(data=st.data(), n=st.integers(1, 3))
    def deliver_to_the_scheduler(self, data: st.DataObject, n: int) -> None:
        peer_id = data.draw(st.sampled_from(sorted(k for k, p in self.peers.items() if p.up)))
        for _ in range(min(n, len(self.peers[peer_id].up))):
            self.to_scheduler(peer_id)

    @precondition(lambda self: any(p.fetches for p in self.peers.values()))
    @rule(data=st.data())
    def answer_a_fetch(self, data: st.DataObject) -> None:
        fetching = sorted(k for k, p in self.peers.items() if p.fetches)
        self.answer_fetch(data.draw(st.sampled_from(fetching)))

    @precondition(lambda self: self.executing)
    @rule(data=st.data(), how=st.sampled_from(["ok"] * 6 + ["raised", "too large"]))
    def end_an_execution(self, data: st.DataObject, how: str) -> None:
        self.end(data.draw(st.sampled_from(sorted(self.executing))), how)

    @precondition(lambda self: self.peers)
    @rule(data=st.data())
    def pause_or_resume(self, data: st.DataObject) -> None:
        """What waits on a paused worker waits for ever: an idle worker should take it."""
        worker_id = data.draw(st.sampled_from(sorted(self.peers)))
        self.pause(worker_id, not self.peers[worker_id].ws.paused)

    @precondition(lambda self: self.peers)
    @rule(data=st.data())
    def a_worker_races_ahead(self, data: st.DataObject) -> None:
        """One worker runs through all it has while the others stand still: it idles
        beside busy ones, which is when steals come."""
        self.catch_up(data.draw(st.sampled_from(sorted(self.peers))))

    @precondition(lambda self: self.executing)
    @rule(data=st.data(), keep=st.booleans())
    def secede_or_rejoin(self, data: st.DataObject, keep: bool) -> None:
        """A running task waits on tasks it submitted (``secede``), or is back."""
        key = data.draw(st.sampled_from(sorted(self.executing)))
        worker_id = self.executing[key]
        if key in self.peers[worker_id].ws.seceded:
            self.rejoin(key)
        else:
            self.secede(key, keep)

    @rule(seconds=st.sampled_from([0.02, 0.2, 1.0, 6.0]))
    def time_passes(self, seconds: float) -> None:
        self.advance(seconds)

    @invariant()
    def consistent(self) -> None:
        self.check()

    def teardown(self) -> None:
        self.drain()
        self.check_settled()
        _TOTALS.update(self.stats)


#: Counts summed over every run of the machine in this process (see the test below).
_TOTALS: Counter[str] = Counter()


@pytest.mark.timeout(120)
def test_steals_race_starts_finishes_losses_and_cancels_safely() -> None:
    """Random interleavings keep every check above; and they did steal, move tasks, and
    meet a steal that came too late (so the checks were put to the test)."""
    _TOTALS.clear()
    run_state_machine_as_test(StealingMachine, settings=STATEFUL)
    assert all(_TOTALS[k] for k in ("steals asked", "let go", "kept, started", "moved")), _TOTALS


# --- fixed schedules: each race of a steal, one at a time ----------------------------


def _asked_to_let_go() -> StealingMachine:
    """Two one-thread workers. ``w1`` runs ``short-0`` with ``short-2`` queued behind
    it; ``w2`` ran through its two and idles. Once ``short-0`` has run a second (a
    thousand times its group's expectation), the scheduler asks ``w1`` to let
    ``short-2`` go to ``w2``; the request is on its way."""
    machine = StealingMachine()
    machine.add(1)
    machine.add(1)
    machine.submit(["short"] * 4, [None] * 4)
    for worker_id in ("w1", "w2"):
        while machine.peers[worker_id].down:
            machine.to_worker(worker_id)
    machine.catch_up("w2")
    machine.check()
    assert machine.executing == {"short-0": "w1"} and not machine.stats["steals asked"]
    machine.advance(1.0)
    machine.check()
    assert list(machine.peers["w1"].down) == [StealRequest(["short-2"])]
    assert machine.state.steals == {"short-2": ("w1", "w2")}
    return machine


def _settle(machine: StealingMachine, *lost: str) -> None:
    """Run to the end: every task ran once, those ``lost`` with their worker twice."""
    machine.drain()
    machine.check_settled()
    runs = {key: 1 + (key in lost) for key in machine.executions}
    assert machine.executions == runs, machine.executions


@pytest.mark.timeout(5)
def test_a_task_let_go_moves_to_the_idle_worker_and_runs_once() -> None:
    machine = _asked_to_let_go()
    machine.to_worker("w1")
    assert list(machine.peers["w1"].up) == [StealResponse(["short-2"], [])]
    machine.to_scheduler("w1")
    machine.check()
    assert machine.assigned["short-2"] == "w2" and machine.stats["moved"] == 1
    machine.catch_up("w2")
    machine.check()
    assert machine.state.tasks["short-2"].state == MEMORY
    _settle(machine)
    moves = [cause for _, key, _, _, cause in machine.state.log if key == "short-2"]
    assert any("moved from w1, where it waited, to idle w2" in cause for cause in moves), moves


@pytest.mark.timeout(5)
def test_a_task_that_started_before_the_request_arrived_stays() -> None:
    machine = _asked_to_let_go()
    machine.end("short-0")  # its thread frees: short-2 starts
    assert machine.executing == {"short-2": "w1"}
    machine.to_worker("w1")
    assert list(machine.peers["w1"].up)[-1] == StealResponse([], ["short-2"])
    while machine.peers["w1"].up:
        machine.to_scheduler("w1")
    machine.check()
    assert not machine.state.steals and "short-2" in machine.state.workers["w1"].started
    assert not machine.peers["w2"].down and machine.stats["moved"] == 0
    _settle(machine)


@pytest.mark.timeout(5)
def test_a_task_that_finished_before_the_request_arrived_is_settled_by_its_report() -> None:
    machine = _asked_to_let_go()
    machine.end("short-0")
    machine.end("short-2")
    machine.to_worker("w1")
    assert list(machine.peers["w1"].up)[-1] == StealResponse([], [])
    machine.to_scheduler("w1")
    machine.to_scheduler("w1")
    machine.check()
    assert not machine.state.steals and machine.state.workers["w2"].incoming == 0
    _settle(machine)


@pytest.mark.timeout(5)
def test_the_busy_worker_lost_before_it_answers_loses_no_task() -> None:
    machine = _asked_to_let_go()
    machine.lose("w1")
    machine.check()
    assert not machine.state.steals
    _settle(machine, "short-0")
    assert machine.state.tasks["short-2"].state == MEMORY


@pytest.mark.timeout(5)
def test_the_idle_worker_lost_before_the_answer_leaves_the_task_queued_not_lost() -> None:
    machine = _asked_to_let_go()
    machine.lose("w2")
    machine.check()
    machine.to_worker("w1")
    machine.to_scheduler("w1")  # let go, with nowhere to go but back to the queue
    machine.check()
    assert machine.state.tasks["short-2"].state in (QUEUED, PROCESSING)
    assert machine.assigned.get("short-2", "w1") == "w1"
    _settle(machine, "short-1", "short-3")  # results held by the idle worker: again
    assert machine.state.tasks["short-2"].state == MEMORY


@pytest.mark.parametrize("how", ["cancel", "release"])
@pytest.mark.timeout(5)
def test_a_task_cancelled_or_released_while_it_is_moved_never_runs(how: str) -> None:
    machine = _asked_to_let_go()
    if how == "cancel":
        machine.cancel("short-2")
    else:
        machine.release("short-2")
    machine.check()
    assert list(machine.peers["w1"].down)[-1] == FreeKeys(["short-2"])
    machine.to_worker("w1")  # the steal request first: let go
    machine.to_scheduler("w1")
    machine.check()
    _settle(machine)
    assert "short-2" not in machine.executions
    if how == "cancel":
        assert machine.state.tasks["short-2"].state == ERRED
    else:
        assert "short-2" not in machine.state.tasks


@pytest.mark.timeout(5)
def test_a_task_that_seceded_while_asked_for_ends_its_move() -> None:
    """``short-2`` waits behind ``short-0`` on ``w1``; the scheduler asks for it.
    Before the request arrives, ``short-0`` ends, ``short-2`` starts and secedes: the
    scheduler learns it started (``TaskSeceded``), so it can no longer move, and its
    move should end there, not when ``w1`` answers the request."""
    sim = SimulatedCluster()
    sim.add_client(CLIENT)
    w1, w2 = sim.add_worker(), sim.add_worker()
    sim.measured("short-0", DURATIONS["short"])
    for i in range(4):
        sim.submit(f"short-{i}")
    assert sim.place() == [(w1, "short-0"), (w2, "short-1"), (w1, "short-2"), (w2, "short-3")]
    sim.finish("short-1")
    sim.finish("short-3")
    sim.place()
    sim.now += 1.0
    sim.handle(Tick(sim.now))
    assert sim.to_workers[w1][-1] == StealRequest(["short-2"])
    sim.worker_says(w1, TaskFinished("short-0", 8, 0.001, "int"), TaskSeceded("short-2", False))
    assert "short-2" in sim.state.workers[w1].started
    check_invariants(sim.state)
    assert not sim.state.steals and sim.state.workers[w2].incoming == 0


@pytest.mark.timeout(5)
def test_a_task_waiting_on_a_paused_worker_moves_at_the_next_tick() -> None:
    """A paused worker starts nothing: what waits there would wait for ever."""
    machine = StealingMachine()
    machine.add(1)
    machine.add(1)
    machine.submit(["short"] * 4, [None] * 4)
    for worker_id in ("w1", "w2"):
        while machine.peers[worker_id].down:
            machine.to_worker(worker_id)
    machine.catch_up("w2")
    machine.pause("w1", True)
    machine.to_scheduler("w1")
    machine.check()
    assert not machine.state.steals
    machine.advance(0.0)  # no time passed: waiting behind a pause is reason enough
    assert machine.state.steals == {"short-2": ("w1", "w2")}
    machine.to_worker("w1")
    machine.to_scheduler("w1")
    machine.check()
    assert machine.assigned["short-2"] == "w2" and machine.stats["moved"] == 1
    machine.pause("w1", False)
    _settle(machine)
