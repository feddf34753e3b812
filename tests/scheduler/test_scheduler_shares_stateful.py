"""Hypothesis stateful test of shares: random clients (with weights and quotas),
workers and tasks, run in random order. After every placement pass:

- no share holds more than its quota of anything, threads included;
- no waiting task fits now where nothing keeps it out: what it needs is free on some
  worker only if a reservation keeps it there for a share not further above its
  fair share (work-conserving, and reservations honoured);
- no share got a task in the pass while another share, with a task of the same
  request waiting that its quota allows, is further below its fair share than the
  first was when it got it (the freed units go to the share furthest below).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from apportion.core.resources import Amounts, parse_demand
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import QUEUED, TaskRecord, share_of
from apportion.scheduler.shares import FairPass, held_ticks, holdings
from apportion.testing.simulation import SimulatedCluster

CLIENTS = ("a", "b", "c")
DEMANDS: tuple[dict[str, float], ...] = (
    {},
    {"GPU": 1},
    {"GPU": 2},
    {"MEM": 1},
    {"GPU": 1, "MEM": 2},
)


class Shares(RuleBasedStateMachine):
    @initialize(
        weights=st.lists(st.sampled_from([1, 1, 2, 3]), min_size=3, max_size=3),
        quotas=st.lists(
            st.sampled_from([None, None, "GPU=1", "GPU=2", "GPU=3", "threads=1", "threads=2"]),
            min_size=3,
            max_size=3,
        ),
        workers=st.lists(
            st.tuples(st.integers(1, 4), st.integers(0, 4), st.integers(0, 4)),
            min_size=1,
            max_size=3,
        ),
    )
    def start(
        self, weights: list[int], quotas: list[str | None], workers: list[tuple[int, int, int]]
    ) -> None:
        self.sim = SimulatedCluster()
        for client, weight, quota in zip(CLIENTS, weights, quotas, strict=True):
            self.sim.add_client(client)
            self.sim.state.shares.set(
                client, weight, None if quota is None else parse_demand(quota)
            )
        for nthreads, gpus, mem in workers:
            self.sim.add_worker(nthreads=nthreads, resources={"GPU": gpus, "MEM": mem})
        self.count = 0
        self.started: list[str] = []

    @rule(client=st.sampled_from(CLIENTS), demand=st.sampled_from(DEMANDS), n=st.integers(1, 4))
    def submit(self, client: str, demand: dict[str, float], n: int) -> None:
        for _ in range(n):
            self.count += 1
            self.sim.submit(f"{client}-{self.count}", resources=demand, client=client)
        self.started = []

    @rule(pick=st.integers(0, 1_000))
    def finish(self, pick: int) -> None:
        running = sorted(self.sim.all_running())
        if running:
            self.sim.finish(running[pick % len(running)])
        self.started = []

    @rule()
    def place(self) -> None:
        self.started = [key for _, key in self.sim.place()]
        self._check_pass()

    @invariant()
    def consistent(self) -> None:
        check_invariants(self.sim.state)
        state = self.sim.state
        held = holdings(state.workers, state.tasks)
        for share, quota in state.shares.quotas.items():
            for name, cap in quota.items():
                assert held_ticks(held.get(share, {}), name) <= cap, f"{share} past its quota"

    def _check_pass(self) -> None:
        state = self.sim.state
        fair = FairPass(state.shares, state.workers, state.tasks)
        waiting = [t for t in state.tasks.values() if t.state == QUEUED]
        for task in waiting:
            self._no_room_left_for(fair, task)
        last: dict[str, TaskRecord] = {}
        for key in self.started:
            task = state.tasks[key]
            last[share_of(task.queue)] = task
        for share, task in last.items():
            before = _without(fair, share, task)
            for other in waiting:
                mine = share_of(other.queue)
                if mine == share or other.demand != task.demand:
                    continue
                if fair.over_quota(mine, other.resources):
                    continue
                assert before <= fair.dominant(mine) + 1e-9, (
                    f"{share} got {task.key} at {before:.3f} while {mine} waited at "
                    f"{fair.dominant(mine):.3f} with {other.key}"
                )

    def _no_room_left_for(self, fair: FairPass, task: TaskRecord) -> None:
        state = self.sim.state
        share = share_of(task.queue)
        if fair.over_quota(share, task.resources):
            return
        need = task.resources
        for worker in state.workers.values():
            if worker.running() >= worker.nthreads:
                continue
            free = worker.ledger.free
            if any(free.get(n, 0) < amount for n, amount in need.items()):
                continue
            holder = state.tasks.get(worker.reserved_by or "")
            assert holder is not None and holder is not task, (
                f"{task.key} ({need}) fits on {worker.name} and nothing keeps it out"
            )
            theirs = share_of(holder.queue)
            assert theirs == share or fair.dominant(share) >= fair.dominant(theirs), (
                f"{task.key}'s share {share} is further below its fair share than "
                f"{holder.key}'s, whose reservation kept it out"
            )


def _without(fair: FairPass, share: str, task: TaskRecord) -> float:
    """``share``'s dominant share before it got ``task``."""
    held = dict(fair.held.get(share, {}))
    less: Amounts = {**task.resources, "threads": 1}
    for name, amount in less.items():
        held[name] = held.get(name, 0) - amount
    saved = fair.held.get(share)
    fair.held[share] = held
    try:
        return fair.dominant(share)
    finally:
        if saved is None:
            del fair.held[share]
        else:
            fair.held[share] = saved


Shares.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestShares = Shares.TestCase
