"""A simulated cluster that fails a test on any message the test did not expect.

As in HyperQueue's scheduler tests, every message the scheduler sends is recorded
and must be *taken* by the test: ``got``, ``worker_got``, ``freed``, ``done`` and
``place`` take what they return. ``check_all_taken`` (a test fixture calls it after
each test) fails on whatever is left, so a stray ``FreeKeys`` or a second
``KeysDone`` cannot slip by unnoticed. A test that does not care about some kind of
message says so, explicitly and for itself only, with ``allow``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from apportion.core.resources import ResourceSpec, from_ticks, parse_demand
from apportion.protocol.base import Message
from apportion.protocol.tasks import KeysDone, SubmitTasks, TaskSpec
from apportion.protocol.worker import ComputeTask, FreeKeys, LoadFunction
from apportion.scheduler.events import Command, Event, ServiceEffect
from apportion.scheduler.records import FORGOTTEN
from apportion.scheduler.wire import to_wire
from apportion.testing.simulation import SimulatedCluster

M = TypeVar("M", bound=Message)

#: Bookkeeping that comes with the messages a test does take: the function a
#: ``ComputeTask`` needs is loaded once per worker, before its first task.
ALWAYS_ALLOWED: tuple[type[Message], ...] = (LoadFunction,)


class UnexpectedMessages(AssertionError):
    """Messages the scheduler sent that no test step took or allowed."""


class RecordingCluster(SimulatedCluster):
    """``SimulatedCluster`` whose sent messages must each be taken (or allowed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        #: (peer, kind) -> (order sent, message) for each message sent and not taken yet;
        #: keyed so that taking one kind costs nothing per message of other kinds.
        self.untaken: dict[tuple[str, type[Message]], list[tuple[int, Message]]] = {}
        self._sent = 0
        #: Kinds of message this test does not care about (``allow``).
        self.allowed: set[type[Message]] = set(ALWAYS_ALLOWED)

    def handle(self, event: Event) -> list[Command]:
        commands = super().handle(event)
        for command in commands:
            if not isinstance(command, ServiceEffect):
                peer_id, message = to_wire(command)
                kind = (peer_id, type(message))
                self.untaken.setdefault(kind, []).append((self._sent, message))
                self._sent += 1
        return commands

    # --- taking ---------------------------------------------------------------------

    def _take(self, peer: str, cls: type[Message]) -> None:
        for kind in [k for k in self.untaken if k[0] == peer and issubclass(k[1], cls)]:
            del self.untaken[kind]

    def got(self, cls: type[M], client: str = "c1") -> list[M]:
        """Every message of type ``cls`` sent to ``client`` so far; takes them."""
        self._take(client, cls)
        return [msg for msg in self.inbox.get(client, []) if isinstance(msg, cls)]

    def worker_got(self, worker_id: str, cls: type[M]) -> list[M]:
        """Every message of type ``cls`` sent to the worker so far; takes them."""
        self._take(worker_id, cls)
        return [msg for msg in self.to_workers.get(worker_id, []) if isinstance(msg, cls)]

    def freed(self, worker_id: str) -> list[str]:
        """Keys the worker was told to free so far (takes its ``FreeKeys``)."""
        return [key for msg in self.worker_got(worker_id, FreeKeys) for key in msg.keys]

    def done(self, client: str = "c1") -> list[str]:
        """Keys reported finished to ``client`` so far (takes its ``KeysDone``)."""
        return [key for msg in self.got(KeysDone, client) for key in msg.keys]

    def place(self) -> list[tuple[str, str]]:
        """One placement pass; what it started is returned, so its ``ComputeTask``s are
        taken."""
        started = super().place()
        for worker_id in {w for w, _ in started}:
            self._take(worker_id, ComputeTask)
        return started

    def allow(self, *kinds: type[Message]) -> None:
        """Let messages of these kinds go untaken, for this cluster (this test) only."""
        self.allowed.update(kinds)

    def check_all_taken(self) -> None:
        """Fail if any message sent is neither taken nor of an allowed kind."""
        left = sorted(
            (order, peer, msg)
            for (peer, kind), sent in self.untaken.items()
            if not issubclass(kind, tuple(self.allowed))
            for order, msg in sent
        )
        if left:
            lines = "\n".join(f"  to {peer}: {msg!r}"[:300] for _, peer, msg in left)
            raise UnexpectedMessages(f"{len(left)} messages sent and not expected:\n{lines}")

    # --- helpers the scheduler tests share --------------------------------------------

    def submit_graph(
        self,
        graph: Mapping[str, tuple[Iterable[str], ResourceSpec]],
        wanted: Iterable[str],
        client: str = "c1",
    ) -> None:
        """Submit several tasks in one message, as a client's ``compute`` does."""
        specs = [
            TaskSpec(key, "f", b"", list(deps), parse_demand(res), 0, 0)
            for key, (deps, res) in graph.items()
        ]
        self.client_says(client, SubmitTasks(specs, {"f": b"func"}, list(wanted)))

    def state_of(self, key: str) -> str:
        """The task's state, FORGOTTEN once the scheduler dropped it."""
        task = self.state.tasks.get(key)
        return FORGOTTEN if task is None else task.state

    def free(self, worker_id: str) -> dict[str, float]:
        """The worker's free resources, as plain numbers."""
        return from_ticks(self.state.workers[worker_id].ledger.free)
