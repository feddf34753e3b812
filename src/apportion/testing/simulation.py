"""Drive the scheduler's state machine with simulated workers and simulated time.

No sockets, no threads, no clock: tests and the pure benchmark tier use this to
check placement decisions in microseconds. Public, so users can test their own
resource plans ("will these jobs overlap on my two GPUs?") before running them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from apportion.core.payload import Pickled
from apportion.core.resources import ResourceSpec, parse_demand, parse_supply
from apportion.protocol.base import Message
from apportion.protocol.peer_data import DataReply, DataStored, GetData, PutData
from apportion.protocol.tasks import SubmitTasks, TaskSpec
from apportion.protocol.worker import (
    ComputeTask,
    DrainDone,
    RegisterWorker,
    StealRequest,
    StealResponse,
    TaskFinished,
    TaskRaised,
    WorkerClosing,
)
from apportion.scheduler.dispatch import handle
from apportion.scheduler.events import (
    ClientJoined,
    ClientLeft,
    Command,
    Disconnect,
    Event,
    FromClient,
    FromWorker,
    IssueCredential,
    Log,
    PipeData,
    PlacementDue,
    SavePeople,
    SendRefused,
    WorkerJoined,
    WorkerLeft,
)
from apportion.scheduler.state import SchedulerConfig, SchedulerState
from apportion.scheduler.wire import to_wire


@dataclass
class Interval:
    """When and where one task ran in a simulation."""

    key: str
    worker: str
    start: float
    end: float


@dataclass
class SimulatedCluster:
    """A scheduler state machine plus bookkeeping of what each fake worker runs."""

    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    now: float = 0.0
    #: A fake worker starts every task it is given at once, so when asked to let
    #: waiting ones go to an idle worker (``StealRequest``) it answers that all had
    #: started. False: the test answers such requests itself.
    answers_steals: bool = True

    def __post_init__(self) -> None:
        self.state = SchedulerState(self.config)
        #: worker id -> keys the scheduler told it to run and it has not reported
        self.running: dict[str, dict[str, ComputeTask]] = {}
        self.logs: list[Log] = []
        #: Peers the scheduler told its service to disconnect (declared lost).
        self.disconnected: list[str] = []
        #: Large results the scheduler told its service to forward to a client; a
        #: test answers each with ``PipeEnded``.
        self.piped: list[PipeData] = []
        #: What the scheduler told its service about people: keep them, issue a
        #: credential (the simulation keeps no file and makes no secret).
        self.people_effects: list[SavePeople | IssueCredential] = []
        #: Workers refused at registration (their name was taken by a live worker).
        self.refused: list[str] = []
        #: client id -> every message the scheduler sent it
        self.inbox: dict[str, list[Message]] = {}
        self.started: list[tuple[float, str, str]] = []
        #: worker id -> every message the scheduler sent it
        self.to_workers: dict[str, list[Message]] = {}
        self._ids = itertools.count(1)
        self._refusals: list[tuple[str, list[str]]] = []

    # --- plumbing -------------------------------------------------------------------

    def handle(self, event: Event) -> list[Command]:
        commands = handle(self.state, event)
        for command in commands:
            if isinstance(command, Log):
                self.logs.append(command)
            elif isinstance(command, PipeData):
                self.piped.append(command)
            elif isinstance(command, SavePeople | IssueCredential):
                self.people_effects.append(command)
            elif isinstance(command, Disconnect):
                self.disconnected.append(command.peer_id)
                self.running.pop(command.peer_id, None)  # a lost worker runs nothing more
            elif isinstance(command, SendRefused):
                # Refused at registration (a name taken): it never became a worker.
                peer_id, msg = to_wire(command)
                self.running.pop(peer_id, None)
                self.refused.append(peer_id)
                self.to_workers.setdefault(peer_id, []).append(msg)
            else:
                peer_id, msg = to_wire(command)
                if peer_id in self.running:
                    self._to_worker(peer_id, msg)
                else:
                    self.inbox.setdefault(peer_id, []).append(msg)
        while self._refusals:
            worker_id, keys = self._refusals.pop(0)
            if worker_id in self.running:
                self.worker_says(worker_id, StealResponse([], keys))
        return commands

    def _to_worker(self, worker_id: str, msg: Message) -> None:
        self.to_workers.setdefault(worker_id, []).append(msg)
        if isinstance(msg, ComputeTask):
            self.running[worker_id][msg.key] = msg
            self.started.append((self.now, worker_id, msg.key))
        elif isinstance(msg, StealRequest) and self.answers_steals:
            held = [key for key in msg.keys if key in self.running[worker_id]]
            self._refusals.append((worker_id, held))

    def place(self) -> list[tuple[str, str]]:
        """Run one placement pass; return the (worker, key) pairs it started."""
        before = len(self.started)
        self.handle(PlacementDue(self.now))
        return [(w, k) for _, w, k in self.started[before:]]

    # --- cluster membership ---------------------------------------------------------

    def add_worker(
        self,
        name: str | None = None,
        nthreads: int = 1,
        resources: ResourceSpec = None,
        *,
        pid: int = 0,
        memory_limit: int = 0,
        supervisor: int = 0,
    ) -> str:
        """Register a fake worker; ``supervisor`` non-zero means one reports its death."""
        worker_id = f"w{next(self._ids)}"
        self.running[worker_id] = {}
        amounts, units = parse_supply(resources)
        reg = RegisterWorker(
            name or worker_id,
            f"sim://{worker_id}",
            nthreads,
            amounts,
            pid,
            memory_limit,
            units,
            supervisor,
        )
        self.handle(WorkerJoined(worker_id, reg, self.now))
        return worker_id

    def remove_worker(self, worker_id: str) -> list[str]:
        """Lose a worker; return the keys it was running."""
        lost = list(self.running.pop(worker_id))
        self.handle(WorkerLeft(worker_id, self.now))
        return lost

    def add_client(self, client_id: str = "c1", *, durable: bool = False, person: str = "") -> str:
        """A client; ``durable`` as the job queue's, whose work outlives a restart;
        acting as ``person`` (one the owner admitted; "": the owner)."""
        self.inbox.setdefault(client_id, [])
        self.handle(ClientJoined(client_id, self.now, durable, person))
        return client_id

    def remove_client(self, client_id: str) -> None:
        self.handle(ClientLeft(client_id, self.now))

    # --- tasks ----------------------------------------------------------------------

    def submit(
        self,
        key: str,
        deps: Iterable[str] = (),
        resources: ResourceSpec = None,
        *,
        priority: int = 0,
        retries: int = 0,
        client: str = "c1",
        wanted: bool = True,
        actor: bool = False,
        preemptible: bool = False,
    ) -> None:
        """Submit one task from ``client``; ``preemptible`` is honoured only from a
        durable client (a service, as the job queue that submits preemptible runs)."""
        spec = TaskSpec(
            key,
            "f",
            b"",
            list(deps),
            parse_demand(resources),
            priority,
            retries,
            actor=int(actor),
            preemptible=int(preemptible),
        )
        msg = SubmitTasks([spec], {"f": b"func"}, [key] if wanted else [])
        self.handle(FromClient(client, [msg], self.now))

    def measured(self, key: str, seconds: float) -> None:
        """Tasks of ``key``'s group (``inc`` for ``inc-1``) are expected to take
        ``seconds``, as if some had finished in that time: placement queues short
        work ahead and moves waiting work by this."""
        self.state.telemetry.tally(key).expected = seconds

    def client_says(self, client: str, *messages: Message) -> None:
        self.handle(FromClient(client, list(messages), self.now))

    def worker_says(self, worker_id: str, *messages: Message) -> None:
        self.handle(FromWorker(worker_id, list(messages), self.now))

    def finish(
        self,
        key: str,
        *,
        nbytes: int = 8,
        duration: float = 0.001,
        thread: int = 0,
        type_name: str = "int",
    ) -> None:
        """The worker running ``key`` reports success (run by its thread ``thread``),
        a result of type ``type_name``."""
        worker_id = self.worker_of(key)
        del self.running[worker_id][key]
        msg = TaskFinished(key, nbytes, duration, type_name, thread)
        self.handle(FromWorker(worker_id, [msg], self.now))

    def answer_steal(
        self, worker_id: str, released: Iterable[str] = (), started: Iterable[str] = ()
    ) -> None:
        """The worker answers a ``StealRequest`` (with ``answers_steals`` off): it let
        ``released`` go, never to run them, and ``started`` had started."""
        released = list(released)
        for key in released:
            self.running[worker_id].pop(key, None)
        self.worker_says(worker_id, StealResponse(released, list(started)))

    def raise_(
        self,
        key: str,
        exception: bytes = b"exc",
        traceback: bytes = b"tb",
        *,
        interrupted: bool = False,
    ) -> None:
        """The worker running ``key`` reports that it raised; ``interrupted``: because
        an ``InterruptTasks`` stopped it (a preempted run), not by itself."""
        worker_id = self.worker_of(key)
        del self.running[worker_id][key]
        msg = TaskRaised(key, exception, traceback, 0.001, interrupted=int(interrupted))
        self.handle(FromWorker(worker_id, [msg], self.now))

    def answer_transfers(self) -> None:
        """Every worker answers what it was sent about data, as a real one would:
        fetches (``GetData``) with placeholder values, stores (``PutData``) as done,
        and a finished drain (``DrainDone``) by leaving."""
        for worker_id, inbox in list(self.to_workers.items()):
            messages, self.to_workers[worker_id] = inbox, []
            for msg in messages:
                if worker_id not in self.running:
                    break  # it left: the rest of its inbox is moot
                if isinstance(msg, GetData):
                    values: dict[str, Pickled] = dict.fromkeys(msg.keys, b"v")
                    self.worker_says(worker_id, DataReply(msg.request_id, values, [], {}))
                elif isinstance(msg, PutData):
                    self.worker_says(worker_id, DataStored(msg.request_id, sorted(msg.data), {}))
                elif isinstance(msg, DrainDone):
                    self.worker_says(worker_id, WorkerClosing("drained"))
                    self.remove_worker(worker_id)

    def worker_of(self, key: str) -> str:
        for worker_id, keys in self.running.items():
            if key in keys:
                return worker_id
        raise KeyError(f"{key} is not running anywhere")

    def all_running(self) -> set[str]:
        return {k for keys in self.running.values() for k in keys}

    # --- whole runs -----------------------------------------------------------------

    def run(self, durations: dict[str, float], *, limit: int = 1_000_000) -> list[Interval]:
        """Run to quiescence: every started task finishes after its duration.

        Tasks missing from ``durations`` take 1.0. Returns when nothing is running
        and a placement pass starts nothing more.
        """
        intervals: list[Interval] = []
        ends: list[tuple[float, int, str, str]] = []
        seq = itertools.count()
        begun: dict[str, float] = {}
        for _ in range(limit):
            for worker_id, key in self.place():
                begun[key] = self.now
                heapq.heappush(
                    ends, (self.now + durations.get(key, 1.0), next(seq), worker_id, key)
                )
            if not ends:
                return intervals
            end, _, worker_id, key = heapq.heappop(ends)
            self.now = end
            if key in self.running.get(worker_id, {}):
                self.finish(key, duration=durations.get(key, 1.0))
                intervals.append(Interval(key, worker_id, begun[key], end))
        raise RuntimeError("simulation did not settle")
