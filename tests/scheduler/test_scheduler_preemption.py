"""Preemption: a share kept below its fair share for ``preempt_after`` gets a preemptible
run of a share above its own stopped, and the run goes back to its queue
(``scheduler/preemption.py``).

Pure: simulated workers and time, milliseconds each. The job queue is a durable
client (``queue``): only its tasks may be preemptible.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from apportion.core.ledger import Ledger
from apportion.core.resources import parse_demand, parse_supply
from apportion.protocol.base import Message
from apportion.protocol.tasks import CancelKeys, TaskPreempted
from apportion.protocol.worker import InterruptTasks
from apportion.scheduler.events import Tick
from apportion.scheduler.explain import explain
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.preemption import Room, Victim, choose
from apportion.scheduler.records import ERRED, MEMORY, PROCESSING, QUEUED
from apportion.scheduler.state import SchedulerConfig
from apportion.testing.simulation import SimulatedCluster

GPU = {"GPU": 1}


def cluster(
    preempt_after: float | None = 1.0, gpus: int = 1, nthreads: int = 4
) -> SimulatedCluster:
    """One worker ``w1`` with ``gpus`` GPUs; the job queue ``queue`` and a client ``b``."""
    sim = SimulatedCluster(SchedulerConfig(preempt_after=preempt_after))
    sim.add_client("queue", durable=True)
    sim.add_client("b")
    sim.add_worker("w1", nthreads=nthreads, resources={"GPU": gpus})
    return sim


def tick(sim: SimulatedCluster, now: float) -> None:
    sim.now = now
    sim.handle(Tick(now))
    sim.place()


def ticks(sim: SimulatedCluster, until: int, step: int) -> None:
    """A tick every ``step`` seconds from 1 until (not at) ``until``."""
    for now in range(1, until, step):
        tick(sim, now)


def interrupts(sim: SimulatedCluster) -> list[list[str]]:
    """The keys of every ``InterruptTasks`` sent so far, one list per message."""
    return [m.keys for ms in sim.to_workers.values() for m in ms if isinstance(m, InterruptTasks)]


def told(sim: SimulatedCluster, client: str) -> list[Message]:
    return [m for m in sim.inbox.get(client, []) if isinstance(m, TaskPreempted)]


def started_runs(sim: SimulatedCluster) -> list[str]:
    return [key for _, _, key in sim.started]


def test_a_waiting_share_gets_a_preemptible_run_stopped_and_the_run_runs_again() -> None:
    sim = cluster()
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.place()
    sim.submit("b-0", resources=GPU, client="b")
    sim.place()
    assert sim.state.tasks["b-0"].state == QUEUED
    tick(sim, 0.5)  # b waits below its fair share from here
    tick(sim, 1.4)
    assert interrupts(sim) == []  # it has not waited a whole second yet
    tick(sim, 1.6)
    assert interrupts(sim) == [["run-1"]]
    [notice] = told(sim, "queue")
    assert isinstance(notice, TaskPreempted)
    assert (notice.key, notice.worker) == ("run-1", "w1")
    assert "preempted for share 'b', which waited 1.1s below its fair share for GPU=1" in (
        notice.reason
    )
    # Its resources stay held until its worker says it ended: b cannot start yet.
    assert sim.state.tasks["b-0"].state == QUEUED
    assert "preemptible run-1 being stopped there to make room" in explain(sim.state, "b-0")
    tick(sim, 2.6)
    assert interrupts(sim) == [["run-1"]]  # one stop under way for b: no second one
    sim.raise_("run-1", interrupted=True)  # the worker stopped it: its task raised
    sim.place()
    run = sim.state.tasks["run-1"]
    assert run.state == QUEUED and run.retries == 0  # not a failure: no retry used
    assert sim.state.tasks["b-0"].state == PROCESSING
    causes = [cause for *_, cause in sim.state.story("run-1")]
    assert any(c.startswith("preempted for share 'b'") for c in causes)
    assert any(c.startswith("stopped on w1 (preempted for share 'b'") for c in causes)
    sim.finish("b-0")
    sim.place()
    assert run.state == PROCESSING  # attempt 2
    assert started_runs(sim).count("run-1") == 2
    check_invariants(sim.state)


def test_what_a_stop_frees_is_kept_for_the_task_it_was_made_for() -> None:
    # b's task first reserves w1 (held by c, which never yields); the stop is made on
    # w2. Once stopped, the queue and b hold nothing: the stopped run, older, would
    # take w2 back, but b's task now holds w2's reservation.
    sim = cluster()
    sim.add_worker("w2", nthreads=4, resources={"GPU": 1})
    sim.add_client("c")
    sim.submit("c-0", resources=GPU, client="c")
    sim.place()
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.place()
    sim.submit("b-0", resources=GPU, client="b")
    sim.place()
    assert sim.state.tasks["b-0"].reserved_on == sim.worker_of("c-0")
    tick(sim, 0.5)
    tick(sim, 1.6)
    assert interrupts(sim) == [["run-1"]]
    w2 = sim.worker_of("run-1")
    assert sim.state.tasks["b-0"].reserved_on == w2
    sim.raise_("run-1", interrupted=True)
    sim.place()
    assert sim.worker_of("b-0") == w2
    assert sim.state.tasks["run-1"].state == QUEUED
    check_invariants(sim.state)


def test_a_worker_with_a_stop_under_way_is_left_alone_until_it_settles() -> None:
    # Two shares wait for the queue's two GPUs: b first, then d. d's stop waits
    # until b's has settled, so that b keeps the reservation made for it.
    sim = cluster(gpus=2)
    sim.add_client("d")
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.submit("run-2", resources=GPU, client="queue", preemptible=True)
    sim.place()
    sim.submit("b-0", resources=GPU, client="b")
    tick(sim, 0.1)
    sim.submit("d-0", resources=GPU, client="d")
    tick(sim, 0.2)
    tick(sim, 1.5)
    tick(sim, 2.5)
    assert interrupts(sim) == [["run-1"]]  # for b, which waited longest
    assert sim.state.tasks["b-0"].reserved_on is not None
    sim.raise_("run-1", interrupted=True)
    sim.place()
    assert sim.state.tasks["b-0"].state == PROCESSING
    tick(sim, 3.0)
    assert interrupts(sim) == [["run-1"], ["run-2"]]  # now for d
    sim.raise_("run-2", interrupted=True)
    sim.place()
    assert sim.state.tasks["d-0"].state == PROCESSING
    check_invariants(sim.state)


def test_no_stop_where_an_older_task_of_the_same_share_holds_the_reservation() -> None:
    # b's big task, older, holds w1's reservation and would keep what a stop frees
    # there; stopping the one preemptible run for b's small task would be for nothing.
    sim = cluster(gpus=2)
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.submit("run-2", resources=GPU, client="queue")
    sim.place()
    sim.submit("b-big", resources={"GPU": 2}, client="b")
    sim.submit("b-small", resources=GPU, client="b")
    sim.place()
    assert sim.state.tasks["b-big"].reserved_on == sim.worker_of("run-1")
    ticks(sim, 30, 3)
    assert interrupts(sim) == []


def test_a_run_that_completes_while_being_stopped_simply_completes() -> None:
    sim = cluster(preempt_after=0.5)
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.place()
    sim.submit("b-0", resources=GPU, client="b")
    tick(sim, 0.5)
    tick(sim, 1.0)
    assert interrupts(sim) == [["run-1"]]
    sim.finish("run-1")
    sim.place()
    assert sim.state.tasks["run-1"].state == MEMORY
    assert not sim.state.preemption.stopping
    assert sim.state.tasks["b-0"].state == PROCESSING
    check_invariants(sim.state)


def test_nothing_is_stopped_when_preemption_is_off() -> None:
    sim = cluster(preempt_after=None)
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.submit("b-0", resources=GPU, client="b")
    sim.place()
    ticks(sim, 100, 7)
    assert interrupts(sim) == []


def test_a_run_not_marked_preemptible_is_never_stopped() -> None:
    sim = cluster()
    sim.submit("run-1", resources=GPU, client="queue")
    sim.submit("b-0", resources=GPU, client="b")
    sim.place()
    ticks(sim, 100, 7)
    assert interrupts(sim) == []


def test_python_tasks_are_never_preempted_even_when_flagged() -> None:
    # A client's own tasks run Python code whose work would be lost: the flag is
    # honoured only from a service (the job queue).
    sim = cluster()
    sim.add_client("a")
    sim.submit("a-0", resources=GPU, client="a", preemptible=True)
    sim.submit("b-0", resources=GPU, client="b")
    sim.place()
    ticks(sim, 100, 7)
    assert interrupts(sim) == []
    assert not sim.state.preemption.preemptible


def test_a_victim_s_share_at_its_fair_share_keeps_its_run() -> None:
    # Three GPUs, three shares: the queue holds its third with a preemptible run, c
    # holds two thirds with runs that are not; b waits, and nothing may be stopped.
    sim = cluster(gpus=3)
    sim.add_client("c", durable=True)
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.submit("c-1", resources=GPU, client="c")
    sim.submit("c-2", resources=GPU, client="c")
    sim.place()
    sim.submit("b-0", resources=GPU, client="b")
    ticks(sim, 30, 3)
    assert interrupts(sim) == []
    assert sim.state.preemption.waiting_since == {"b": 1}


def test_no_stop_for_work_that_would_not_fit_anyway() -> None:
    # b asks for both GPUs; only one is held by a preemptible run.
    sim = cluster(gpus=2)
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.submit("run-2", resources=GPU, client="queue")
    sim.place()
    sim.submit("b-0", resources={"GPU": 2}, client="b")
    ticks(sim, 30, 3)
    assert interrupts(sim) == []


def test_no_stop_for_a_share_its_quota_holds_back() -> None:
    sim = cluster()
    sim.state.shares.set("b", quota=parse_demand({"GPU": 0.5}))
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.submit("b-0", resources=GPU, client="b")
    sim.place()
    ticks(sim, 30, 3)
    assert interrupts(sim) == []


def test_the_waiting_share_must_have_waited_long_enough() -> None:
    sim = cluster(preempt_after=10.0)
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.submit("b-0", resources=GPU, client="b")
    sim.place()
    tick(sim, 0.0)
    tick(sim, 9.9)
    assert interrupts(sim) == []
    tick(sim, 10.0)
    assert interrupts(sim) == [["run-1"]]


def test_a_break_in_the_wait_starts_the_clock_again() -> None:
    sim = cluster(preempt_after=2.0)
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.place()
    sim.submit("b-0", resources=GPU, client="b")
    tick(sim, 0.0)  # b waits from here
    sim.client_says("b", CancelKeys(["b-0"]))
    tick(sim, 1.0)  # nothing of b waits: the wait is over
    sim.submit("b-1", resources=GPU, client="b")
    tick(sim, 1.5)  # and begins again
    tick(sim, 2.5)
    assert interrupts(sim) == []
    tick(sim, 3.5)
    assert interrupts(sim) == [["run-1"]]


def test_a_run_just_started_is_not_stopped_before_preempt_after() -> None:
    # b weighs 3: holding one GPU of two it is still below its fair share (3/4).
    sim = cluster(gpus=2)
    sim.state.shares.set("b", weight=3)
    sim.submit("b-0", resources=GPU, client="b")
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.submit("run-2", resources=GPU, client="queue", preemptible=True)
    sim.place()
    sim.submit("b-1", resources=GPU, client="b")
    tick(sim, 0.0)  # b waits from here
    sim.now = 0.6
    sim.finish("run-1")  # run-2 takes its GPU: the queue holds nothing, b's weight aside
    sim.place()
    assert sim.state.tasks["run-2"].state == PROCESSING
    tick(sim, 1.2)  # b has waited 1.2s, but run-2 has run 0.6s only
    assert interrupts(sim) == []
    tick(sim, 1.6)
    assert interrupts(sim) == [["run-2"]]


def test_the_youngest_run_of_the_share_furthest_above_its_fair_share_is_stopped() -> None:
    sim = cluster(gpus=3)
    sim.add_client("c", durable=True)
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.submit("c-1", resources=GPU, client="c", preemptible=True)
    sim.place()
    sim.now = 0.2
    sim.submit("run-2", resources=GPU, client="queue", preemptible=True)
    sim.place()
    sim.now = 0.3
    sim.submit("b-0", resources=GPU, client="b")
    tick(sim, 0.5)
    tick(sim, 1.6)
    # The queue holds 2/3, above its third; c holds its third: not a victim.
    assert interrupts(sim) == [["run-2"]]


def test_a_stopped_run_whose_worker_is_lost_runs_again_and_nothing_stays_under_way() -> None:
    sim = cluster()
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.place()
    sim.submit("b-0", resources=GPU, client="b")
    tick(sim, 0.5)
    tick(sim, 1.6)
    assert interrupts(sim) == [["run-1"]]
    sim.remove_worker("w1")
    sim.add_worker("w2", nthreads=4, resources={"GPU": 1})
    tick(sim, 1.7)
    assert not sim.state.preemption.stopping
    assert {sim.state.tasks[k].state for k in ("run-1", "b-0")} == {PROCESSING, QUEUED}
    check_invariants(sim.state)


def test_a_run_that_fails_by_itself_while_being_stopped_is_a_failure() -> None:
    # Its worker says it raised, not that the stop ended it (it exited non-zero
    # before any signal was sent): it uses a retry, as any failure does.
    sim = cluster()
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True, retries=1)
    sim.place()
    sim.submit("b-0", resources=GPU, client="b")
    tick(sim, 0.5)
    tick(sim, 1.6)
    assert interrupts(sim) == [["run-1"]]
    sim.raise_("run-1")
    sim.place()
    run = sim.state.tasks["run-1"]
    assert run.state == QUEUED and run.retries == 0  # retried: its one retry used
    assert not sim.state.preemption.stopping
    assert sim.state.tasks["b-0"].state == PROCESSING
    sim.finish("b-0")
    sim.place()
    sim.raise_("run-1")  # no stop asked: fails for good now
    assert run.state == ERRED
    check_invariants(sim.state)


def test_a_scheduler_restarted_during_a_stop_requeues_the_adopted_run_without_a_retry() -> None:
    # The new scheduler knows nothing of the stop: the queue adopts the run as still
    # running, and the worker then says it raised because it was interrupted.
    sim = cluster()
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.place()
    assert not sim.state.preemption.stopping
    sim.raise_("run-1", interrupted=True)
    sim.place()
    run = sim.state.tasks["run-1"]
    assert run.state == PROCESSING and run.retries == 0  # queued again, started again
    assert started_runs(sim).count("run-1") == 2
    causes = [cause for *_, cause in sim.state.story("run-1")]
    assert "stopped on w1 (asked before a scheduler restart); queued again" in causes
    check_invariants(sim.state)


def test_an_interrupted_task_not_preemptible_is_an_ordinary_failure() -> None:
    sim = cluster()
    sim.submit("b-0", client="b")
    sim.place()
    sim.raise_("b-0", interrupted=True)
    assert sim.state.tasks["b-0"].state == ERRED


def test_a_run_cancelled_while_being_stopped_ends_cancelled() -> None:
    sim = cluster()
    sim.submit("run-1", resources=GPU, client="queue", preemptible=True)
    sim.place()
    sim.submit("b-0", resources=GPU, client="b")
    tick(sim, 0.5)
    tick(sim, 1.6)
    sim.client_says("queue", CancelKeys(["run-1"]))
    sim.raise_("run-1")
    sim.place()
    assert sim.state.tasks["run-1"].state == ERRED
    assert sim.state.tasks["b-0"].state == PROCESSING
    check_invariants(sim.state)


# --- choose: which tasks on which worker ----------------------------------------------


def _ledger(spec: str) -> Ledger:
    amounts, units = parse_supply(spec)
    return Ledger(amounts, units)


def test_choose_takes_victims_in_order_until_the_demand_fits() -> None:
    ledger = _ledger("gpu=[0,1,2]")
    held = [ledger.take(parse_demand({"gpu": 1})) for _ in range(3)]
    victims = [Victim(f"v{i}", "w", parse_demand({"gpu": 1}), held[i]) for i in range(3)]
    room = Room("w", ledger, threads_free=0)
    assert choose([parse_demand({"gpu": 2})], [room], victims) == ("w", ["v0", "v1"], 0)
    assert choose([parse_demand({"gpu": 4})], [room], victims) is None


def test_choose_prefers_the_worker_needing_fewest_stops() -> None:
    one, two = _ledger("GPU=2"), _ledger("GPU=2")
    for ledger in (one, two):
        ledger.take(parse_demand(GPU))
    one.take(parse_demand(GPU))
    victims = [
        Victim("a", "one", parse_demand(GPU), {}),
        Victim("b", "one", parse_demand(GPU), {}),
        Victim("c", "two", parse_demand(GPU), {}),
    ]
    rooms = [Room("one", one, 2), Room("two", two, 2)]
    assert choose([parse_demand({"GPU": 2})], rooms, victims) == ("two", ["c"], 0)


def test_choose_needs_a_thread_too() -> None:
    ledger = _ledger("GPU=2")  # the GPUs are free, the threads are not
    victims = [Victim("v", "w", {}, {})]
    assert choose([parse_demand(GPU)], [Room("w", ledger, -1)], victims) is None
    assert choose([parse_demand(GPU)], [Room("w", ledger, 0)], victims) == ("w", ["v"], 0)


# --- any history ------------------------------------------------------------------------


class PreemptionNeverLosesWork(RuleBasedStateMachine):
    """Random submissions, ends, stops reported and time passing on two GPU workers:
    only preemptible tasks of a service are ever stopped, a stopped task is never
    failed (it runs again), and the scheduler's invariants hold throughout."""

    def __init__(self) -> None:
        super().__init__()
        self.sim = SimulatedCluster(SchedulerConfig(preempt_after=1.0))
        for client, durable in (("queue", True), ("c", True), ("b", False)):
            self.sim.add_client(client, durable=durable)
        self.sim.add_worker("w1", nthreads=3, resources={"GPU": 2})
        self.sim.add_worker("w2", nthreads=2, resources={"GPU": 1})
        self.flagged: set[str] = set()
        self.count = 0

    @rule(
        client=st.sampled_from(["queue", "c", "b"]),
        preemptible=st.booleans(),
        gpus=st.sampled_from([1, 1, 2, 0]),
    )
    def submit(self, client: str, preemptible: bool, gpus: int) -> None:
        key = f"{client}-{self.count}"
        self.count += 1
        if preemptible and client != "b":
            self.flagged.add(key)
        self.sim.submit(
            key, resources={"GPU": gpus} if gpus else None, client=client, preemptible=preemptible
        )
        self.sim.place()

    @precondition(lambda self: bool(self.sim.all_running()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.sim.all_running())))
        self.sim.finish(key)
        self.sim.place()

    @precondition(lambda self: bool(self._stopped()))
    @rule(data=st.data())
    def report_stop(self, data: st.DataObject) -> None:
        self.sim.raise_(data.draw(st.sampled_from(self._stopped())), interrupted=True)
        self.sim.place()

    @rule(seconds=st.floats(0.5, 3.0))
    def time_passes(self, seconds: float) -> None:
        tick(self.sim, self.sim.now + seconds)

    def _stopped(self) -> list[str]:
        """Tasks being stopped now, which their worker may report ended."""
        running = self.sim.all_running()
        return sorted(k for k in self.sim.state.preemption.stopping if k in running)

    @invariant()
    def only_preemptible_work_is_stopped_and_none_is_lost(self) -> None:
        check_invariants(self.sim.state)
        for keys in interrupts(self.sim):
            assert set(keys) <= self.flagged, f"stopped {keys}, not all preemptible"
        for key, task in self.sim.state.tasks.items():
            assert task.state != ERRED, f"{key} failed"


PreemptionNeverLosesWork.TestCase.settings = settings(
    max_examples=60, stateful_step_count=50, deadline=None
)
test_preemption_never_loses_work = PreemptionNeverLosesWork.TestCase
