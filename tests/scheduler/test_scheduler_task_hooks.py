"""The scheduler's generic hooks for client services, pure: notes, adoption, requests."""

from __future__ import annotations

import pytest

from apportion.protocol.base import Message
from apportion.protocol.codec import decode_message, encode_message
from apportion.protocol.services import (
    AdoptTask,
    ForwardedReply,
    ForwardedRequest,
    RegisterService,
    StopTasks,
    TaskNote,
    TaskNoted,
    TasksStillRunning,
    Unserved,
    WorkerDeparted,
)
from apportion.protocol.tasks import SubmitTasks, TaskSpec
from apportion.protocol.worker import FreeKeys, RegisterWorker
from apportion.runs.messages import QueryRuns, RunsSubmitted, SubmitRuns
from apportion.scheduler.dispatch import handle
from apportion.scheduler.events import (
    ClientJoined,
    ClientLeft,
    Command,
    Event,
    FromClient,
    FromWorker,
    ServiceEffect,
    WorkerJoined,
    WorkerLeft,
)
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import PROCESSING
from apportion.scheduler.state import SchedulerState
from apportion.scheduler.wire import to_wire

pytestmark = pytest.mark.timeout(10)


class Cluster:
    def __init__(self) -> None:
        self.state = SchedulerState()
        self.sent: list[tuple[str, Message]] = []

    def handle(self, event: Event) -> list[Command]:
        out = handle(self.state, event)
        self.sent += [to_wire(c) for c in out if not isinstance(c, ServiceEffect)]
        return out

    def to(self, peer: str, kind: type[Message]) -> list[Message]:
        return [msg for p, msg in self.sent if p == peer and isinstance(msg, kind)]

    def worker(
        self, peer: str, name: str, live: list[str] | None = None, address: str = ""
    ) -> None:
        address = address or f"sim://{peer}"
        reg = RegisterWorker(name, address, 1, {}, 1, 0, {}, 0, live or [])
        self.handle(WorkerJoined(peer, reg, 0.0))


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster()
    c.handle(ClientJoined("svc", 0.0))
    c.handle(FromClient("svc", [RegisterService(["SubmitRuns"], "run-")], 0.0))
    c.handle(ClientJoined("user", 0.0))
    return c


def test_a_note_goes_unread_to_the_clients_wanting_the_task(cluster: Cluster) -> None:
    cluster.worker("w", "w1")
    task = TaskSpec("run-1", "f", b"", [], {}, 0, 0)
    cluster.handle(FromClient("svc", [SubmitTasks([task], {"f": b"f"}, ["run-1"])], 0.0))
    cluster.handle(FromWorker("w", [TaskNote("run-1", b"opaque", 1)], 0.0))
    cluster.handle(FromWorker("w", [TaskNote("nobody-wants", b"x", 1)], 0.0))
    assert cluster.to("svc", TaskNoted) == [TaskNoted("run-1", "w1", b"opaque")]
    assert cluster.to("user", TaskNoted) == []
    check_invariants(cluster.state)


def test_tasks_still_running_go_to_the_service_of_their_prefix(cluster: Cluster) -> None:
    cluster.worker("w", "w1", live=["run-7", "other-1"])
    assert cluster.to("svc", TasksStillRunning) == [TasksStillRunning("w", "w1", ["run-7"], {})]
    assert cluster.to("w", FreeKeys) == [FreeKeys(["other-1"])]  # nobody claims it
    task = TaskSpec("run-7", "f", b"", [], {}, 0, 0)
    cluster.handle(FromClient("svc", [AdoptTask("w", task, {"f": b"f"}, {})], 0.0))
    assert cluster.state.tasks["run-7"].state == PROCESSING
    cluster.handle(FromClient("svc", [StopTasks("w", ["run-8"])], 0.0))
    assert cluster.to("w", FreeKeys)[-1] == FreeKeys(["run-8"])
    check_invariants(cluster.state)


def test_notes_sent_before_an_adoption_reach_the_service_once_it_adopts(
    cluster: Cluster,
) -> None:
    # What the worker kept while no scheduler was up (a run's output, its end) comes
    # right after it registers, before its service could adopt the task.
    cluster.worker("w", "w1", live=["run-7", "run-8"])
    kept = [TaskNote("run-7", b"output", 1), TaskNote("run-7", b"ended", 0)]
    cluster.handle(FromWorker("w", [*kept, TaskNote("run-8", b"stray", 0)], 0.0))
    assert cluster.to("svc", TaskNoted) == []
    task = TaskSpec("run-7", "f", b"", [], {}, 0, 0)
    cluster.handle(FromClient("svc", [AdoptTask("w", task, {"f": b"f"}, {})], 0.0))
    assert cluster.to("svc", TaskNoted) == [
        TaskNoted("run-7", "w1", b"output"),
        TaskNoted("run-7", "w1", b"ended"),
    ]
    cluster.handle(FromClient("svc", [StopTasks("w", ["run-8"])], 0.0))  # not adopted
    assert not cluster.state.services.unadopted
    cluster.handle(FromWorker("w", [TaskNote("run-8", b"later", 0)], 0.0))
    assert len(cluster.to("svc", TaskNoted)) == 2  # nobody wants run-8's notes
    check_invariants(cluster.state)


def test_notes_kept_for_an_adoption_go_with_their_worker(cluster: Cluster) -> None:
    cluster.worker("w", "w1", live=["run-7"])
    cluster.handle(FromWorker("w", [TaskNote("run-7", b"output", 1)], 0.0))
    cluster.handle(WorkerLeft("w", 1.0))
    assert not cluster.state.services.unadopted


def test_requests_are_forwarded_and_answers_relayed(cluster: Cluster) -> None:
    request = SubmitRuns(5, [])
    cluster.handle(FromClient("user", [request], 0.0))
    [forwarded] = cluster.to("svc", ForwardedRequest)
    assert isinstance(forwarded, ForwardedRequest)
    assert decode_message(forwarded.request) == request
    reply = RunsSubmitted(5, [1], "")
    cluster.handle(FromClient("svc", [ForwardedReply("user", encode_message(reply))], 0.0))
    assert cluster.to("user", RunsSubmitted) == [reply]


def test_a_request_nobody_serves_is_answered_unserved(cluster: Cluster) -> None:
    cluster.handle(FromClient("user", [QueryRuns(1, [])], 0.0))
    assert cluster.to("user", Unserved) == [Unserved("QueryRuns")]


def test_a_departure_is_told_only_when_no_worker_keeps_the_name(cluster: Cluster) -> None:
    cluster.worker("w", "w1")
    cluster.worker("v", "v1")
    cluster.handle(WorkerLeft("w", 0.0))
    assert cluster.to("svc", WorkerDeparted) == [WorkerDeparted("w1")]
    # The same worker registering again (it reconnected) replaces itself: not departed.
    cluster.worker("v-again", "v1", address="sim://v")
    assert "v" not in cluster.state.workers and "v-again" in cluster.state.workers
    assert cluster.to("svc", WorkerDeparted) == [WorkerDeparted("w1")]


def test_a_service_keeps_its_work_when_it_leaves(cluster: Cluster) -> None:
    task = TaskSpec("run-1", "f", b"", [], {}, 0, 0)
    cluster.handle(FromClient("svc", [SubmitTasks([task], {"f": b"f"}, ["run-1"])], 0.0))
    cluster.handle(ClientLeft("svc", 0.0))
    assert "run-1" in cluster.state.tasks
