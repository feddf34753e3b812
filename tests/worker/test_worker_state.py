"""WorkerState alone: events in, commands out, no network, no threads, no clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from apportion.core.allocation import Allocation
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
)
from apportion.worker import state as worker_state
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
    Seceded,
    SendToScheduler,
    StealArrived,
    WorkerCommand,
)
from apportion.worker.invariants import check_invariants
from apportion.worker.state import SHORT_TASK, WorkerState

ME = "tcp://127.0.0.1:1000"
PEER_A = "tcp://127.0.0.1:2000"
PEER_B = "tcp://127.0.0.1:3000"
INFO = DataInfo(8, "int")


def compute(
    key: str,
    who_has: dict[str, list[str]] | None = None,
    resources: dict[str, int] | None = None,
    priority: int = 0,
    t: float = 1.0,
    units: dict[str, list[str]] | None = None,
    variant: int = 0,
    sizes: dict[str, int] | None = None,
    order: int = 0,
) -> ComputeArrived:
    allocation = Allocation(resources or {}, units or {}, variant)
    task = ComputeTask(key, "f", b"args", who_has or {}, priority, allocation, sizes or {}, order)
    return ComputeArrived(task, t)


def ok(key: str, t: float = 2.0) -> ExecutionOk:
    return ExecutionOk(key, INFO, 0.5, t)


def executed(commands: list[WorkerCommand]) -> list[str]:
    return [c.key for c in commands if isinstance(c, Execute)]


def sent(commands: list[WorkerCommand]) -> list[object]:
    return [c.message for c in commands if isinstance(c, SendToScheduler)]


def forgotten(commands: list[WorkerCommand]) -> set[str]:
    return {k for c in commands if isinstance(c, ForgetData) for k in c.keys}


@pytest.fixture
def state() -> Iterator[WorkerState]:
    s = WorkerState(nthreads=2, address=ME)
    yield s
    check_invariants(s)


@pytest.mark.timeout(5)
def test_task_without_dependencies_runs_at_once(state: WorkerState) -> None:
    commands = state.handle(compute("x"))
    assert commands == [Execute("x", "f", b"args", (), Allocation({}, {}))]
    commands = state.handle(ok("x"))
    assert sent(commands) == [TaskFinished("x", 8, 0.5, "int")]
    assert state.data == {"x": INFO} and state.owned == {"x"}


@pytest.mark.timeout(5)
def test_units_chosen_by_the_scheduler_reach_the_execution(state: WorkerState) -> None:
    gpus = compute("x", resources={"gpu": 20_000, "MEMORY": 10}, units={"gpu": ["2", "3"]})
    half = compute("y", resources={"gpu": 5_000}, units={"gpu": ["1"]})
    commands = state.handle(gpus, half)
    assert commands == [
        Execute(
            "x", "f", b"args", (), Allocation({"gpu": 20_000, "MEMORY": 10}, {"gpu": ["2", "3"]})
        ),
        Execute("y", "f", b"args", (), Allocation({"gpu": 5_000}, {"gpu": ["1"]})),
    ]


@pytest.mark.timeout(5)
def test_units_survive_waiting_for_a_dependency(state: WorkerState) -> None:
    arrived = compute("y", {"x": [PEER_A]}, {"gpu": 10_000}, units={"gpu": ["0"]})
    assert executed(state.handle(arrived)) == []
    commands = state.handle(FetchDone(PEER_A, {"x": INFO}, (), 2.0))
    run = [c for c in commands if isinstance(c, Execute)]
    assert [(c.key, c.deps, dict(c.allocation.units)) for c in run] == [
        ("y", ("x",), {"gpu": ["0"]})
    ]


@pytest.mark.timeout(5)
def test_no_more_than_nthreads_execute(state: WorkerState) -> None:
    assert executed(state.handle(compute("a"), compute("b"), compute("c"))) == ["a", "b"]
    assert executed(state.handle(ok("a"))) == ["c"]


@pytest.mark.timeout(5)
def test_ready_order_is_resources_then_priority_then_arrival() -> None:
    state = WorkerState(nthreads=1, address=ME)
    state.handle(compute("blocker"))
    state.handle(
        compute("plain-low"),
        compute("plain-high", priority=5),
        compute("plain-low-2"),
        compute("gpu", resources={"GPU": 10_000}, priority=-3),
    )
    assert state.ready_keys() == ["gpu", "plain-high", "plain-low", "plain-low-2"]
    order = []
    running = "blocker"
    for _ in range(4):
        (started,) = executed(state.handle(ok(running)))
        order.append(started)
        running = started
    assert order == ["gpu", "plain-high", "plain-low", "plain-low-2"]
    check_invariants(state)


@pytest.mark.timeout(5)
def test_fetches_are_batched_per_peer(state: WorkerState) -> None:
    commands = state.handle(
        compute("x", {"a": [PEER_A], "c": [PEER_B]}),
        compute("y", {"b": [PEER_A, PEER_B], "a": [PEER_A]}),
    )
    fetches = {c.address: set(c.keys) for c in commands if isinstance(c, Fetch)}
    assert fetches == {PEER_A: {"a", "b"}, PEER_B: {"c"}}
    assert sum(isinstance(c, Fetch) for c in commands) == 2


@pytest.mark.timeout(5)
def test_a_copy_fetched_for_tasks_here_is_kept_and_reported(state: WorkerState) -> None:
    state.handle(compute("x", {"a": [PEER_A]}), compute("y", {"a": [PEER_A]}))
    commands = state.handle(FetchDone(PEER_A, {"a": INFO}, (), 2.0))
    assert executed(commands) == ["x", "y"]
    assert sent(commands) == [CopiesKept(["a"])]  # the scheduler counts it a holder now
    assert "a" in state.owned and not forgotten(commands)
    # The next task that needs it finds it here: no fetch.
    assert fetched(state.handle(compute("z", {"a": [PEER_A]}))) == {}
    # It goes when the scheduler frees it, as any result held here.
    assert forgotten(state.handle(FreeArrived(("a",), 3.0))) == set()  # z still needs it
    commands = state.handle(ok("x"))
    assert executed(commands) == ["z"] and forgotten(commands) == {"a"}  # read by z: goes
    check_invariants(state)


@pytest.mark.timeout(5)
def test_a_prefetched_copy_no_task_claims_stays_transient() -> None:
    state = WorkerState(nthreads=1, address=ME)
    state.handle(PrefetchArrived({"a": [PEER_A]}, 1.0, {"a": 8}))
    commands = state.handle(FetchDone(PEER_A, {"a": INFO}, (), 2.0))
    assert sent(commands) == [] and "a" not in state.owned
    assert forgotten(state.handle(PrefetchDropped(("a",), 3.0))) == {"a"}
    check_invariants(state)


def fetched(commands: list[WorkerCommand]) -> dict[str, tuple[str, ...]]:
    return {c.address: c.keys for c in commands if isinstance(c, Fetch)}


@pytest.mark.timeout(5)
def test_fetches_keep_within_the_budget_and_the_rest_follow_as_bytes_arrive() -> None:
    state = WorkerState(nthreads=1, address=ME, fetch_budget=100)
    who_has = {"a": [PEER_A], "b": [PEER_A], "c": [PEER_B]}
    commands = state.handle(compute("x", who_has, sizes={"a": 60, "b": 60, "c": 30}))
    assert fetched(commands) == {PEER_A: ("a",), PEER_B: ("c",)}  # b would pass 100
    assert state.in_flight_bytes == 90
    assert fetched(state.handle(FetchDone(PEER_B, {"c": INFO}, (), 2.0))) == {}
    assert fetched(state.handle(FetchDone(PEER_A, {"a": INFO}, (), 3.0))) == {PEER_A: ("b",)}
    assert executed(state.handle(FetchDone(PEER_A, {"b": INFO}, (), 4.0))) == ["x"]
    assert state.in_flight_bytes == 0
    check_invariants(state)


@pytest.mark.timeout(5)
def test_one_fetch_larger_than_the_budget_still_goes_alone() -> None:
    state = WorkerState(nthreads=1, address=ME, fetch_budget=100)
    who_has = {"big": [PEER_A], "small": [PEER_B]}
    commands = state.handle(compute("x", who_has, sizes={"big": 500, "small": 1}))
    assert fetched(commands) == {PEER_A: ("big",)}
    arrived = state.handle(FetchDone(PEER_A, {"big": INFO}, (), 2.0))
    assert fetched(arrived) == {PEER_B: ("small",)}
    check_invariants(state)


@pytest.mark.timeout(5)
def test_prefetched_inputs_are_kept_for_the_task_that_then_claims_them(
    state: WorkerState,
) -> None:
    commands = state.handle(PrefetchArrived({"a": [PEER_A], "b": [ME]}, 1.0))
    assert [(c.address, c.keys) for c in commands if isinstance(c, Fetch)] == [(PEER_A, ("a",))]
    assert state.prefetched == {"a"}  # never from ourselves
    assert not forgotten(state.handle(FetchDone(PEER_A, {"a": INFO}, (), 2.0)))
    assert "a" in state.data  # no task needs it yet, and it stays
    commands = state.handle(compute("x", {"a": [PEER_A]}, t=3.0))
    assert executed(commands) == ["x"] and not [c for c in commands if isinstance(c, Fetch)]
    assert not state.prefetched  # the task's input now: it goes once the task has it
    assert forgotten(commands) == {"a"}
    state.handle(ok("x"))


@pytest.mark.timeout(5)
def test_a_task_arriving_mid_prefetch_waits_for_that_fetch(state: WorkerState) -> None:
    state.handle(PrefetchArrived({"a": [PEER_A]}, 1.0))
    commands = state.handle(compute("x", {"a": [PEER_A]}, t=2.0))
    assert not [c for c in commands if isinstance(c, Fetch | Execute)]  # asked once only
    assert executed(state.handle(FetchDone(PEER_A, {"a": INFO}, (), 3.0))) == ["x"]
    state.handle(ok("x"))


@pytest.mark.timeout(5)
def test_a_dropped_prefetch_lets_its_inputs_go(state: WorkerState) -> None:
    state.handle(PrefetchArrived({"a": [PEER_A], "b": [PEER_B]}, 1.0))
    state.handle(FetchDone(PEER_A, {"a": INFO}, (), 2.0))
    commands = state.handle(PrefetchDropped(("a", "b", "never"), 3.0))
    assert forgotten(commands) == {"a"} and not state.prefetched
    # "b" was still on its way: it is forgotten as it arrives, unwanted.
    assert forgotten(state.handle(FetchDone(PEER_B, {"b": INFO}, (), 4.0))) == {"b"}
    assert not state.data


@pytest.mark.timeout(5)
def test_a_paused_worker_holds_a_prefetch_and_skips_it_if_dropped_meanwhile(
    state: WorkerState,
) -> None:
    state.handle(Paused(900, 1000, 1.0))
    assert not state.handle(PrefetchArrived({"a": [PEER_A]}, 2.0))
    state.handle(PrefetchDropped(("a",), 3.0))
    assert not [c for c in state.handle(Resumed(500, 1000, 4.0)) if isinstance(c, Fetch)]


@pytest.mark.timeout(5)
def test_next_holder_is_tried_then_missing_dependency_is_reported(state: WorkerState) -> None:
    state.handle(compute("x", {"a": [PEER_A, PEER_B]}))
    commands = state.handle(FetchFailed(PEER_A, ("a",), "connection refused", 2.0))
    assert commands == [Fetch(PEER_B, ("a",))]
    commands = state.handle(FetchDone(PEER_B, {}, ("a",), 3.0))
    assert sent(commands) == [MissingDependency("x", "a", [PEER_A, PEER_B], "")]
    assert state.tasks == {} and state.fetches == {}


@pytest.mark.timeout(5)
def test_dependency_without_holders_is_reported_at_once(state: WorkerState) -> None:
    commands = state.handle(compute("x", {"a": []}))
    assert sent(commands) == [MissingDependency("x", "a", [], "")]
    assert state.tasks == {}


@pytest.mark.timeout(5)
def test_never_fetches_from_itself(state: WorkerState) -> None:
    commands = state.handle(compute("x", {"a": [ME, PEER_A]}))
    assert commands == [Fetch(PEER_A, ("a",))]


@pytest.mark.timeout(5)
def test_execution_freed_meanwhile_is_reported_and_its_result_discarded(
    state: WorkerState,
) -> None:
    state.handle(compute("x"))
    assert state.handle(FreeArrived(("x",), 1.5)) == []
    commands = state.handle(ok("x"))
    assert sent(commands) == [TaskFinished("x", 8, 0.5, "int")]
    assert forgotten(commands) == {"x"} and "x" not in state.data


@pytest.mark.timeout(5)
def test_raised_task_is_reported(state: WorkerState) -> None:
    state.handle(compute("x"))
    commands = state.handle(ExecutionRaised("x", b"exc", b"tb", 0.25, 2.0))
    assert sent(commands) == [TaskRaised("x", b"exc", b"tb", 0.25)]
    assert state.tasks == {}


@pytest.mark.timeout(5)
def test_the_thread_that_ran_a_task_is_reported_with_its_outcome(state: WorkerState) -> None:
    state.handle(compute("x"), compute("y"))
    commands = state.handle(ExecutionOk("x", INFO, 0.5, 2.0, thread=1))
    assert sent(commands) == [TaskFinished("x", 8, 0.5, "int", thread=1)]
    commands = state.handle(ExecutionRaised("y", b"exc", b"tb", 0.25, 2.0, thread=3))
    assert sent(commands) == [TaskRaised("y", b"exc", b"tb", 0.25, thread=3)]
    # A key held here already was not run by any thread: row 0.
    commands = state.handle(compute("x", t=3.0))
    assert sent(commands) == [TaskFinished("x", 8, 0.0, "int", thread=0)]


@pytest.mark.timeout(5)
def test_a_result_too_large_to_keep_is_reported_and_its_dependents_wait(
    state: WorkerState,
) -> None:
    state.handle(compute("big"), compute("small"), compute("sum", {"big": [ME]}))
    info = DataInfo(400 * 2**20, "numpy.ndarray")
    commands = state.handle(ExecutionTooLarge("big", info, 300 * 2**20, 285 * 2**20, 0.5, 2.0))
    assert sent(commands) == [
        ResultTooLarge("big", 400 * 2**20, "numpy.ndarray", 300 * 2**20, 285 * 2**20, 0.5)
    ]
    assert "big" not in state.data and "big" not in state.tasks
    assert state.tasks["sum"].state == "waiting"  # the scheduler fails and frees it
    assert state.story("big")[-1][2:4] == ("executing", "released")
    assert executed(state.handle(ok("small"))) == []


@pytest.mark.timeout(5)
def test_free_drops_pending_tasks_and_data() -> None:
    state = WorkerState(nthreads=1, address=ME)
    state.handle(compute("done"))
    state.handle(ok("done"))
    state.handle(compute("blocker"))
    state.handle(compute("pending"), compute("fetching", {"a": [PEER_A]}))
    commands = state.handle(FreeArrived(("done", "pending", "fetching"), 3.0))
    assert forgotten(commands) == {"done"}
    assert set(state.tasks) == {"blocker"}
    # The fetch still in flight completes; nobody needs the value, so it goes.
    assert forgotten(state.handle(FetchDone(PEER_A, {"a": INFO}, (), 4.0))) == {"a"}
    check_invariants(state)


@pytest.mark.timeout(5)
def test_waiting_tasks_start_in_the_schedulers_order_not_as_they_arrived() -> None:
    state = WorkerState(nthreads=1, address=ME)
    state.handle(compute("running", order=1))
    # New input queued ahead first, then a later step of the graph (submitted before it).
    state.handle(compute("root-9", order=9), compute("root-8", order=8))
    state.handle(compute("step", order=4))
    assert state.ready_keys() == ["step", "root-8", "root-9"]
    assert executed(state.handle(ok("running"))) == ["step"]
    check_invariants(state)


@pytest.mark.timeout(5)
def test_a_steal_lets_go_only_of_tasks_that_have_not_started() -> None:
    state = WorkerState(nthreads=1, address=ME)
    state.handle(compute("done"))
    state.handle(ok("done"))
    assert executed(state.handle(compute("running"))) == ["running"]
    state.handle(compute("queued"), compute("fetching", {"a": [PEER_A]}))
    commands = state.handle(StealArrived(("running", "queued", "fetching", "done"), 3.0))
    # "done" was reported when it finished, before this request could arrive.
    assert sent(commands) == [StealResponse(["queued", "fetching"], ["running"])]
    assert set(state.tasks) == {"running"}
    assert state.story("queued")[-1][2:5] == ("ready", "released", "let go to an idle worker")
    # The fetch in flight completes; nobody here needs the value now, so it goes.
    assert forgotten(state.handle(FetchDone(PEER_A, {"a": INFO}, (), 4.0))) == {"a"}
    # Its result is kept as any other; the thread takes no task that was let go.
    assert executed(state.handle(ok("running"))) == []
    check_invariants(state)


@pytest.mark.timeout(5)
def test_dependency_computed_here_is_awaited_not_fetched(state: WorkerState) -> None:
    state.handle(compute("a"))
    commands = state.handle(compute("b", {"a": []}))
    assert commands == []
    commands = state.handle(ok("a"))
    assert executed(commands) == ["b"]
    assert "a" in state.owned and "a" not in forgotten(commands)


@pytest.mark.timeout(5)
def test_put_data_is_acknowledged_and_feeds_waiting_tasks(state: WorkerState) -> None:
    state.handle(compute("x", {"a": [PEER_A]}))
    commands = state.handle(DataPut(7, {"a": INFO}, 2.0))
    assert sent(commands) == [DataStored(7, ["a"], {"a": 8})]
    assert executed(commands) == ["x"]
    assert "a" in state.owned
    # The fetch answer that comes later does not replace or drop the put value.
    assert forgotten(state.handle(FetchDone(PEER_A, {"a": INFO}, (), 3.0))) == set()
    assert "a" in state.data


@pytest.mark.timeout(5)
def test_story_explains_each_transition(state: WorkerState) -> None:
    state.handle(compute("x", {"a": [PEER_A]}, t=1.0))
    state.handle(FetchDone(PEER_A, {"a": INFO}, (), 2.0))
    state.handle(ok("x", t=3.0))
    assert [(t, old, new) for t, _, old, new, _ in state.story("x")] == [
        (1.0, "released", "waiting"),
        (2.0, "waiting", "ready"),
        (2.0, "ready", "executing"),
        (3.0, "executing", "memory"),
    ]
    assert state.story("a")[0][4] == f"fetch from {PEER_A}"


@pytest.mark.timeout(5)
def test_impossible_event_raises(state: WorkerState) -> None:
    with pytest.raises(IllegalTransition, match="worker: task 'never-started' is released"):
        state.handle(ok("never-started"))


# --- paused for memory: no new execution, no new fetch -------------------------------


def paused(t: float = 1.0) -> Paused:
    return Paused(900, 1000, t)


def resumed(t: float = 5.0) -> Resumed:
    return Resumed(500, 1000, t)


@pytest.mark.timeout(5)
def test_a_paused_worker_starts_no_task_until_it_resumes(state: WorkerState) -> None:
    assert state.handle(paused()) == []
    assert state.handle(compute("x"), compute("y")) == []
    assert state.ready_keys() == ["x", "y"] and not state.executing
    check_invariants(state)  # ready tasks may wait while paused
    assert executed(state.handle(resumed())) == ["x", "y"]


@pytest.mark.timeout(5)
def test_running_tasks_finish_and_report_while_paused(state: WorkerState) -> None:
    state.handle(compute("running"))
    state.handle(paused(), compute("next"))
    commands = state.handle(ok("running"))
    assert sent(commands) == [TaskFinished("running", 8, 0.5, "int")]
    assert executed(commands) == []  # its thread is free, but the worker is paused
    assert executed(state.handle(resumed())) == ["next"]


@pytest.mark.timeout(5)
def test_a_paused_worker_holds_its_fetches_until_it_resumes(state: WorkerState) -> None:
    state.handle(paused())
    assert state.handle(compute("x", {"a": [PEER_A], "b": [PEER_B]})) == []
    assert set(state.fetches) == {"a", "b"}  # wanted, not asked
    commands = state.handle(resumed())
    assert {c.address: c.keys for c in commands if isinstance(c, Fetch)} == {
        PEER_A: ("a",),
        PEER_B: ("b",),
    }
    assert executed(state.handle(FetchDone(PEER_A, {"a": INFO}, (), 6.0))) == []
    assert executed(state.handle(FetchDone(PEER_B, {"b": INFO}, (), 6.0))) == ["x"]


@pytest.mark.timeout(5)
def test_a_held_fetch_nobody_needs_any_more_is_never_sent(state: WorkerState) -> None:
    state.handle(paused(), compute("x", {"a": [PEER_A]}))
    state.handle(FreeArrived(("x",), 2.0))
    assert state.handle(resumed()) == []
    assert state.fetches == {} and state.tasks == {}
    assert state.story("a")[-1][2:4] == ("fetching", "released")


@pytest.mark.timeout(5)
def test_a_held_fetch_whose_value_was_put_meanwhile_is_never_sent(state: WorkerState) -> None:
    state.handle(paused(), compute("x", {"a": [PEER_A]}))
    commands = state.handle(DataPut(3, {"a": INFO}, 2.0))
    assert executed(commands) == [] and state.ready_keys() == ["x"]
    commands = state.handle(resumed())
    assert executed(commands) == ["x"]
    assert not any(isinstance(c, Fetch) for c in commands)


@pytest.mark.timeout(5)
def test_pausing_twice_or_resuming_unpaused_changes_nothing(state: WorkerState) -> None:
    assert state.handle(resumed()) == [] and not state.paused
    state.handle(paused(), paused(2.0))
    assert state.paused
    state.handle(resumed(), resumed(6.0))
    assert not state.paused


# --- Hypothesis: invariants under any interleaving -----------------------------------

KEYS = [f"k{i}" for i in range(8)]
PEERS = [PEER_A, PEER_B, ME]


class WorkerStateMachine(RuleBasedStateMachine):
    """Drives WorkerState like a scheduler and peers would, checking every step."""

    def __init__(self) -> None:
        super().__init__()
        self.state = WorkerState(nthreads=2, address=ME, fetch_budget=100, ahead=2)
        self.time = 0.0
        self.in_flight: list[Fetch] = []
        self.started: set[str] = set()
        self.bursts = 0

    def step(self, *events: object) -> None:
        commands = self.state.handle(*events)  # type: ignore[arg-type]
        if self.state.paused:
            assert not [c for c in commands if isinstance(c, Execute | Fetch)], commands
        for command in commands:
            if isinstance(command, Fetch):
                self.in_flight.append(command)
            elif isinstance(command, Execute):
                assert command.key not in self.started, "started twice"
                assert set(command.deps) <= set(self.state.data) | forgotten(commands)
                self.started.add(command.key)
        for message in sent(commands):
            reported = isinstance(message, TaskFinished | TaskRaised | ResultTooLarge)
            if reported and message.key in self.started:
                self.started.discard(message.key)

    def now(self) -> float:
        self.time += 1.0
        return self.time

    @rule(
        key=st.sampled_from(KEYS),
        deps=st.dictionaries(st.sampled_from(KEYS), st.lists(st.sampled_from(PEERS), max_size=3)),
        gpu=st.booleans(),
        priority=st.integers(-2, 2),
    )
    def compute(self, key: str, deps: dict[str, list[str]], gpu: bool, priority: int) -> None:
        resources = {"GPU": 10_000} if gpu else {}
        sizes = {dep: 40 * (len(dep) + len(holders)) for dep, holders in deps.items()}
        self.step(compute(key, deps, resources, priority, self.now(), sizes=sizes))

    @rule(count=st.integers(1, 4))
    def burst(self, count: int) -> None:
        """Several new tasks with no inputs at once, as a ``map`` sends them: enough to
        keep every thread busy and hand some ahead."""
        self.bursts += 1
        keys = [f"m{self.bursts}-{i}" for i in range(count)]
        self.step(*(compute(key, t=self.now()) for key in keys))

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), fail=st.booleans())
    def answer_fetch(self, data: st.DataObject, fail: bool) -> None:
        fetch = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
        if fail:
            self.step(FetchFailed(fetch.address, fetch.keys, "unreachable", self.now()))
            return
        have = data.draw(st.sets(st.sampled_from(fetch.keys)))
        missing = tuple(k for k in fetch.keys if k not in have)
        self.step(FetchDone(fetch.address, dict.fromkeys(have, INFO), missing, self.now()))

    def on_threads(self) -> set[str]:
        """Tasks a thread may be running: executing, seceded, or handed ahead (a thread
        takes one as soon as it ends a task, before the state machine hears of it)."""
        return self.state.executing | self.state.seceded.keys() | self.state.started_ahead.keys()

    @precondition(lambda self: self.on_threads())
    @rule(
        data=st.data(),
        how=st.sampled_from(["ok", "raised", "too large"]),
        duration=st.sampled_from([0.0001, 0.0001, 0.0001, 0.1]),
    )
    def finish(self, data: st.DataObject, how: str, duration: float) -> None:
        """An execution ends, also one seceded, waiting to rejoin, or handed ahead."""
        key = data.draw(st.sampled_from(sorted(self.on_threads())))
        if how == "raised":
            self.step(ExecutionRaised(key, b"e", b"t", duration, self.now()))
        elif how == "too large":
            self.step(
                ExecutionTooLarge(key, DataInfo(2000, "bytes"), 1000, 950, duration, self.now())
            )
        else:
            self.step(ExecutionOk(key, INFO, duration, self.now()))
        assert key not in self.started, "an execution that started was not reported"

    @precondition(lambda self: self.state.executing or self.state.started_ahead)
    @rule(data=st.data(), keep=st.booleans())
    def secede(self, data: st.DataObject, keep: bool) -> None:
        key = data.draw(
            st.sampled_from(sorted(self.state.executing | self.state.started_ahead.keys()))
        )
        self.step(Seceded(key, keep, self.now()))

    @precondition(lambda self: self.state.seceded)
    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.state.seceded)))
        self.step(Rejoining(key, self.now()))

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=2))
    def grant(self, keys: list[str]) -> None:
        """The scheduler gives resources back, sometimes to tasks gone meanwhile."""
        self.step(RejoinGrantedArrived((*sorted(self.state.rejoining)[:1], *keys), self.now()))

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=3))
    def free(self, keys: list[str]) -> None:
        self.step(FreeArrived(tuple(keys), self.now()))

    @rule(keys=st.sets(st.sampled_from(KEYS), max_size=2))
    def put(self, keys: set[str]) -> None:
        self.step(DataPut(1, dict.fromkeys(keys, INFO), self.now()))

    @rule(who_has=st.dictionaries(st.sampled_from(KEYS), st.lists(st.sampled_from(PEERS))))
    def prefetch(self, who_has: dict[str, list[str]]) -> None:
        self.step(PrefetchArrived(who_has, self.now()))

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=3))
    def drop_prefetch(self, keys: list[str]) -> None:
        self.step(PrefetchDropped(tuple(keys), self.now()))

    @rule()
    def pause(self) -> None:
        self.step(Paused(900, 1000, self.now()))

    @rule()
    def resume(self) -> None:
        self.step(Resumed(500, 1000, self.now()))

    @invariant()
    def holds(self) -> None:
        check_invariants(self.state)


TestWorkerStateMachine = WorkerStateMachine.TestCase
TestWorkerStateMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestWorkerStateMachine = pytest.mark.timeout(50)(TestWorkerStateMachine)


def short_done(key: str, t: float = 2.0) -> ExecutionOk:
    """``key`` finished in well under ``SHORT_TASK``."""
    return ExecutionOk(key, INFO, SHORT_TASK / 10, t)


@pytest.fixture
def ahead_state() -> Iterator[WorkerState]:
    s = WorkerState(nthreads=1, address=ME, ahead=2)
    yield s
    check_invariants(s)


@pytest.mark.timeout(5)
def test_short_tasks_are_handed_to_a_busy_thread_ahead(ahead_state: WorkerState) -> None:
    state = ahead_state
    state.handle(compute("a"))
    state.handle(short_done("a"))  # f is short now
    commands = state.handle(compute("b"), compute("c"), compute("d"), compute("e"))
    assert executed(commands) == ["b", "c", "d"]
    assert state.executing == {"b"} and list(state.started_ahead) == ["c", "d"]
    # Two outcomes in one batch: the thread took c as soon as b ended.
    commands = state.handle(short_done("b", 3.0), short_done("c", 3.0))
    assert sent(commands) == [
        TaskFinished("b", 8, SHORT_TASK / 10, "int"),
        TaskFinished("c", 8, SHORT_TASK / 10, "int"),
    ]
    assert executed(commands) == ["e"]
    assert state.executing == {"d"} and list(state.started_ahead) == ["e"]


@pytest.mark.timeout(5)
def test_tasks_of_a_function_not_known_short_wait_in_the_worker(ahead_state: WorkerState) -> None:
    state = ahead_state
    assert executed(state.handle(compute("a"), compute("b"))) == ["a"]
    state.handle(ExecutionOk("a", INFO, 10 * SHORT_TASK, 2.0))  # long: nothing ahead
    assert state.executing == {"b"} and not state.started_ahead
    assert executed(state.handle(compute("c"))) == []
    assert state.ready_keys() == ["c"]


@pytest.mark.timeout(5)
def test_one_quick_run_of_a_slow_function_does_not_make_it_short(
    ahead_state: WorkerState,
) -> None:
    state = ahead_state
    state.handle(compute("a"))
    state.handle(ExecutionOk("a", INFO, 0.05, 2.0))  # 50 ms
    state.handle(compute("b"))
    state.handle(short_done("b"))  # average 25 ms: still not short
    assert executed(state.handle(compute("c"), compute("d"))) == ["c"]
    assert not state.started_ahead and state.ready_keys() == ["d"]


@pytest.mark.timeout(5)
def test_tasks_holding_resources_never_go_ahead(ahead_state: WorkerState) -> None:
    state = ahead_state
    state.handle(compute("a"))
    state.handle(short_done("a"))
    assert executed(state.handle(compute("b"))) == ["b"]
    commands = state.handle(compute("g", resources={"GPU": 10_000}), compute("c"))
    assert executed(commands) == []  # the GPU task is next: it waits for the thread
    assert not state.started_ahead
    assert state.ready_keys() == ["g", "c"]


@pytest.mark.timeout(5)
def test_a_task_handed_ahead_counts_as_started_for_a_steal(ahead_state: WorkerState) -> None:
    state = ahead_state
    state.handle(compute("a"))
    state.handle(short_done("a"))
    state.handle(compute("b"), compute("c"), compute("d"), compute("e"))
    commands = state.handle(StealArrived(("c", "d", "e"), 3.0))
    assert sent(commands) == [StealResponse(["e"], ["c", "d"])]
    assert list(state.started_ahead) == ["c", "d"]


@pytest.mark.timeout(5)
def test_a_task_handed_ahead_may_secede(ahead_state: WorkerState) -> None:
    state = ahead_state
    state.handle(compute("a"))
    state.handle(short_done("a"))
    state.handle(compute("b"), compute("c"), compute("d"))
    state.handle(Seceded("c", False, 3.0))  # a thread took c before b's outcome came
    assert "c" in state.seceded and "c" not in state.started_ahead
    assert executed(state.handle(short_done("b", 4.0))) == []
    assert state.executing == {"d"}


def test_ahead_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="ahead must be at least 0"):
        WorkerState(nthreads=1, ahead=-1)


def test_run_times_are_kept_for_a_bounded_number_of_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_state, "MAX_FUNCTIONS_TIMED", 2)
    state = WorkerState(nthreads=1, address=ME, ahead=2)
    for i, func in enumerate(["f1", "f2", "f3"]):
        task = ComputeTask(f"k{i}", func, b"args", {}, 0, Allocation({}, {}, 0), {}, 0)
        state.handle(ComputeArrived(task, 1.0))
        state.handle(short_done(f"k{i}"))
    assert list(state.durations) == ["f3"]  # full at two: started again
    check_invariants(state)
