"""WorkerState with seceding tasks: a seceded task's thread runs another task, and it
runs on after ``rejoin`` once the scheduler gave its resources back."""

from __future__ import annotations

from apportion.core.allocation import Allocation
from apportion.protocol.worker import ComputeTask, TaskFinished, TaskRejoining, TaskSeceded
from apportion.worker.events import (
    ComputeArrived,
    DataInfo,
    Execute,
    ExecutionOk,
    RejoinGrantedArrived,
    Rejoining,
    ResumeTask,
    Seceded,
    SendToScheduler,
    WorkerCommand,
)
from apportion.worker.invariants import check_invariants
from apportion.worker.state import WorkerState

INFO = DataInfo(8, "int")


def compute(key: str, resources: dict[str, int] | None = None) -> ComputeArrived:
    task = ComputeTask(key, "f", b"args", {}, 0, Allocation(resources or {}, {}), {})
    return ComputeArrived(task, 1.0)


def ok(key: str, t: float = 2.0) -> ExecutionOk:
    return ExecutionOk(key, INFO, 0.5, t)


def executed(commands: list[WorkerCommand]) -> list[str]:
    return [c.key for c in commands if isinstance(c, Execute)]


def sent(commands: list[WorkerCommand]) -> list[object]:
    return [c.message for c in commands if isinstance(c, SendToScheduler)]


def resumed(commands: list[WorkerCommand]) -> list[str]:
    return [c.key for c in commands if isinstance(c, ResumeTask)]


def test_a_seceded_task_lends_its_thread_and_waits_for_its_resources() -> None:
    state = WorkerState(nthreads=1)
    state.handle(compute("parent", resources={"GPU": 10_000}))
    out = state.handle(compute("child", resources={"GPU": 10_000}))
    assert executed(out) == []  # the one thread is busy
    out = state.handle(Seceded("parent", False, 2.0))
    assert executed(out) == ["child"]
    assert sent(out) == [TaskSeceded("parent", False)]
    out = state.handle(Rejoining("parent", 3.0))
    assert sent(out) == [TaskRejoining("parent")]
    assert resumed(out) == []  # until the scheduler says it holds the GPU again
    state.handle(ok("child", 4.0))
    out = state.handle(RejoinGrantedArrived(("parent",), 5.0))
    assert resumed(out) == ["parent"]
    assert state.executing == {"parent"}
    out = state.handle(ok("parent", 6.0))
    assert sent(out) == [TaskFinished("parent", INFO.nbytes, 0.5, INFO.type_name)]
    check_invariants(state)
    assert [cause for *_, cause in state.story("parent")][2:5] == [
        "seceded; thread free, resources given back",
        "rejoining; waits for its resources",
        "holds its resources again",
    ]


def test_tasks_that_gave_nothing_back_run_on_at_once() -> None:
    state = WorkerState(nthreads=1)
    state.handle(compute("plain"))
    state.handle(compute("other"))
    assert executed(state.handle(Seceded("plain", False, 2.0))) == ["other"]
    out = state.handle(Rejoining("plain", 3.0))
    assert resumed(out) == ["plain"]
    assert state.executing == {"plain", "other"}  # over nthreads for a while
    state.handle(compute("third"))
    assert executed(state.handle(ok("other"))) == []  # still one running on one thread
    assert executed(state.handle(ok("plain"))) == ["third"]
    check_invariants(state)

    keeper = WorkerState(nthreads=1)
    keeper.handle(compute("gpu", resources={"GPU": 10_000}))
    keeper.handle(Seceded("gpu", True, 2.0))
    assert resumed(keeper.handle(Rejoining("gpu", 3.0))) == ["gpu"]
    check_invariants(keeper)


def test_a_task_may_end_seceded_or_while_waiting_to_rejoin() -> None:
    state = WorkerState(nthreads=1)
    state.handle(compute("a", resources={"GPU": 10_000}))
    state.handle(compute("b", resources={"GPU": 10_000}))
    state.handle(Seceded("a", False, 2.0))
    state.handle(ok("a", 3.0))  # never rejoined
    state.handle(Seceded("b", False, 4.0))
    state.handle(Rejoining("b", 5.0))
    state.handle(ok("b", 6.0))
    out = state.handle(RejoinGrantedArrived(("b",), 7.0))  # late: it is gone
    assert resumed(out) == []
    assert not state.seceded and not state.rejoining and not state.executing
    check_invariants(state)


def test_stale_secede_and_rejoin_events_change_nothing() -> None:
    state = WorkerState(nthreads=1)
    state.handle(compute("a"))
    assert state.handle(Rejoining("a", 2.0)) == []  # it never seceded
    assert state.handle(Seceded("gone", False, 2.0)) == []
    out = state.handle(Seceded("a", False, 3.0), Seceded("a", True, 3.0))
    assert sent(out) == [TaskSeceded("a", False)]
    assert not any(isinstance(c, Execute) for c in out)
    check_invariants(state)
