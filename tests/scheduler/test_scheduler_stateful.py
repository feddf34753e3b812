"""Hypothesis stateful tests: random event sequences never break the scheduler's invariants.

Workers come and go with small random supplies (fractional amounts included), clients
submit graphs with random demands (some nobody can meet), tasks finish, raise, lose
inputs, are released and cancelled, secede (giving back their resources or keeping
them) and rejoin, clients leave. After every step the whole state
is checked; at the end enough workers join and the cluster runs to quiescence: every
wanted task either finished or failed with a reason, unless nobody can ever run it.
"""

from __future__ import annotations

import copy
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from apportion.core.resources import format_resources, parse_demand
from apportion.protocol.cluster import WhyReply, WhyRequest
from apportion.protocol.shared_data import (
    PublishDataset,
    RebalanceKeys,
    ReplicateKeys,
    UnpublishDataset,
)
from apportion.protocol.tasks import (
    CancelKeys,
    GatherRequest,
    KeysDone,
    KeysFailed,
    ReleaseKeys,
    RetryKeys,
    SubmitTasks,
    TaskErred,
    TaskSpec,
)
from apportion.protocol.worker import (
    Heartbeat,
    MissingDependency,
    ResultTooLarge,
    TaskRejoining,
    TasksDropped,
    TaskSeceded,
    WorkerClosing,
    WorkerDied,
    WorkerDraining,
)
from apportion.scheduler.events import FromWorker, Tick, WorkerDeathReport
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.placement import pools
from apportion.scheduler.records import ERRED, MEMORY, PROCESSING, QUEUED, WAITING
from apportion.scheduler.state import SchedulerConfig
from apportion.scheduler.unsatisfiable import pinned_by_inputs, satisfiable
from apportion.testing.simulation import SimulatedCluster

settings.register_profile(
    "scheduler-stateful",
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
STATEFUL = settings.get_profile("scheduler-stateful")

POOLS = ("GPU", "MEM", "lic")
AMOUNTS = (0.25, 0.5, 1, 1.5, 2, 3)
#: The supply the final rescue worker offers: enough for every satisfiable demand.
RESCUE: dict[str, object] = {**{name: 4 for name in POOLS}, "gpu": [0, 1, 2, 3]}
CLIENTS = ("c1", "c2")

supplies = st.one_of(
    st.sampled_from([{}, {"GPU": 1}, {"GPU": 2}, {"GPU": 2, "MEM": 4}, {"lic": 1, "GPU": 0.5}]),
    st.dictionaries(st.sampled_from(POOLS), st.sampled_from((0, *AMOUNTS)), max_size=3),
    # Indexed pools: units with identity, handed out whole or shared by fractions.
    st.sampled_from([{"gpu": [0]}, {"gpu": [0, 1]}, {"gpu": [2, 3, 5], "MEM": 2}]),
)
demands = st.one_of(
    st.just({}),
    st.sampled_from([{"GPU": 1}, {"GPU": 2}, {"GPU": 0.5}, {"MEM": 1.5}, {"GPU": 1, "lic": 0.25}]),
    st.dictionaries(st.sampled_from(POOLS), st.sampled_from(AMOUNTS), min_size=1, max_size=2),
    st.sampled_from([{"gpu": 1}, {"gpu": 2}, {"gpu": 0.5}, {"gpu": 0.25}, {"gpu": 1, "MEM": 1}]),
    # Requests no worker in this test can ever meet (1.5 units of an indexed pool too).
    st.sampled_from([{"GPU": 100}, {"fpga": 1}, {"lic": 1, "fpga": 2}, {"gpu": 1.5}]),
)
#: ``workers=`` restrictions: none (mostly), names, a host, an address, nobody.
restrictions = st.sampled_from([[], [], [], ["a"], ["a", "b"], ["nobody"], ["w1"], ["sim://w2"]])


class SchedulerMachine(RuleBasedStateMachine):
    config = SchedulerConfig()

    def __init__(self) -> None:
        super().__init__()
        self.sim = SimulatedCluster(self.config)
        self.connected: set[str] = set()
        self.next_key = 0
        self.pid = 0
        for client in CLIENTS:
            self.sim.add_client(client)
            self.connected.add(client)

    def _maybe_place(self, data: st.DataObject) -> None:
        """The service runs a placement pass after most loop turns; sometimes batch more."""
        if data.draw(st.integers(0, 3)):
            self.sim.place()

    # --- membership -----------------------------------------------------------------

    @initialize(supply=st.lists(supplies, min_size=1, max_size=3))
    def first_workers(self, supply: list[dict[str, float]]) -> None:
        for resources in supply:
            # A memory limit matters only when a holder dies while serving a result.
            self.sim.add_worker(nthreads=2, resources=resources, memory_limit=100)

    @rule(
        nthreads=st.integers(1, 3),
        supply=supplies,
        name=st.sampled_from([None, "a", "b"]),
        supervised=st.booleans(),
        limited=st.booleans(),
    )
    def add_worker(
        self,
        nthreads: int,
        supply: dict[str, float],
        name: str | None,
        supervised: bool,
        limited: bool,
    ) -> None:
        """A new worker, or one that comes back under the name it had (a rejoin); some
        with a memory limit (of 100 bytes: results are 0 to 100 bytes here)."""
        self.pid += 1
        self.sim.add_worker(
            name,
            nthreads=nthreads,
            resources=supply,
            pid=self.pid,
            supervisor=int(supervised),
            memory_limit=100 if limited else 0,
        )

    @precondition(lambda self: self.sim.running)
    @rule(data=st.data())
    def drain_worker(self, data: st.DataObject) -> None:
        """A worker got SIGTERM: it finishes its tasks, hands its results off, leaves."""
        worker_id = data.draw(st.sampled_from(sorted(self.sim.running)))
        self.sim.worker_says(worker_id, WorkerDraining(30.0))
        self._maybe_place(data)

    @rule()
    def workers_answer(self) -> None:
        """Workers answer the hand-off relays; a worker told it is drained leaves."""
        self.sim.answer_transfers()

    @rule(data=st.data(), seconds=st.sampled_from([0.5, 2.0, 4.0]))
    def time_passes(self, data: st.DataObject, seconds: float) -> None:
        """A supervisor reports a death (or not), and held verdicts come due."""
        deaths = {d[:2] for seen in self.sim.state.deaths.values() for d in seen}
        deaths |= set(self.sim.state.unclassified)
        if deaths and data.draw(st.booleans()):
            name, pid = data.draw(st.sampled_from(sorted(deaths)))
            memory = data.draw(st.booleans())
            report = WorkerDied(name, pid, "was killed by SIGKILL", int(memory))
            self.sim.handle(WorkerDeathReport(report, self.sim.now))
        self.sim.now += seconds
        self.sim.handle(Tick(self.sim.now))
        self._maybe_place(data)

    @precondition(lambda self: self.sim.running)
    @rule(data=st.data())
    def remove_worker(self, data: st.DataObject) -> None:
        worker_id = data.draw(st.sampled_from(sorted(self.sim.running)))
        if data.draw(st.booleans()):  # its last heartbeat: near its limit, if it has one
            self.sim.worker_says(worker_id, Heartbeat(0, 95))
        self.sim.remove_worker(worker_id)
        self._maybe_place(data)

    @rule(data=st.data())
    def client_leaves_or_joins(self, data: st.DataObject) -> None:
        """A client disconnects (its futures are released) or connects again."""
        client = data.draw(st.sampled_from(CLIENTS))
        if client in self.connected:
            self.connected.discard(client)
            self.sim.remove_client(client)
            self._maybe_place(data)
        else:
            self.connected.add(client)
            self.sim.add_client(client)

    # --- submitting -----------------------------------------------------------------

    @precondition(lambda self: self.connected)
    @rule(
        data=st.data(),
        size=st.integers(1, 4),
        shuffle=st.booleans(),
        retries=st.integers(0, 1),
    )
    def submit(self, data: st.DataObject, size: int, shuffle: bool, retries: int) -> None:
        """A batch of tasks; inputs from earlier keys, possibly released ones."""
        client = data.draw(st.sampled_from(sorted(self.connected)))
        specs: list[TaskSpec] = []
        wanted: list[str] = []
        for _ in range(size):
            key = f"t{self.next_key}"
            self.next_key += 1
            # Inputs: mostly live keys, sometimes one already released (or never made).
            live = sorted(self.sim.state.tasks)[-8:] + [s.key for s in specs]
            pool = live if live and data.draw(st.integers(0, 5)) else [f"t{self.next_key + 99}"]
            deps = data.draw(st.lists(st.sampled_from(pool), max_size=2, unique=True))
            demand = parse_demand(data.draw(demands))
            priority = data.draw(st.integers(0, 2))
            # Sometimes alternatives: the scheduler runs the first that fits now.
            others = [parse_demand(d) for d in data.draw(st.lists(demands, max_size=2))]
            variants = [demand, *others] if others else []
            # Sometimes only some workers may run it (by name, host or address), or
            # should: hard and loose restrictions, some naming nobody.
            where = data.draw(restrictions)
            loose = int(data.draw(st.booleans()))
            # Sometimes an actor: it holds its resources while its result lives.
            actor = int(data.draw(st.integers(0, 4)) == 0)
            specs.append(
                TaskSpec(
                    key, "f", b"", deps, demand, priority, retries, variants, where, loose, actor
                )
            )
            if data.draw(st.booleans()) or not wanted:
                wanted.append(key)
        if shuffle:
            specs.reverse()  # a batch need not list inputs before dependents
        self.sim.client_says(client, SubmitTasks(specs, {"f": b"func"}, wanted))
        self._maybe_place(data)

    @precondition(lambda self: self.connected)
    @rule(data=st.data())
    def resubmit_wanted_elsewhere(self, data: st.DataObject) -> None:
        """Another client asks for a key that exists (or existed)."""
        if not self.next_key:
            return
        client = data.draw(st.sampled_from(sorted(self.connected)))
        key = f"t{data.draw(st.integers(0, self.next_key - 1))}"
        spec = TaskSpec(key, "f", b"", [], {}, 0, 0)
        self.sim.client_says(client, SubmitTasks([spec], {"f": b"func"}, [key]))

    # --- the workers' side ----------------------------------------------------------

    @rule()
    def place(self) -> None:
        self.sim.place()
        for worker in self.sim.state.workers.values():
            if worker.rejoining:  # the first waiting could not take its units back
                task = self.sim.state.tasks[worker.rejoining[0]]
                assert task.allocation is not None
                ledger = copy.deepcopy(worker.ledger)
                assert not ledger.take_exactly(task.allocation.resources, task.allocation.units)

    def _seceded(self) -> dict[str, bool]:
        return {k: v for w in self.sim.state.workers.values() for k, v in w.seceded.items()}

    @precondition(lambda self: self.sim.all_running())
    @rule(data=st.data(), keep=st.booleans())
    def secede(self, data: st.DataObject, keep: bool) -> None:
        """A running task waits on subtasks: its thread, and mostly its resources, go."""
        seceded = self._seceded()
        free = sorted(k for k in self.sim.all_running() if k not in seceded)
        if not free:
            return
        key = data.draw(st.sampled_from(free))
        keep = keep and not data.draw(st.integers(0, 2))
        self.sim.worker_says(self.sim.worker_of(key), TaskSeceded(key, keep))
        self._maybe_place(data)

    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        """A seceded task wants its thread and resources back."""
        asking = {k for w in self.sim.state.workers.values() for k in w.rejoining}
        seceded = sorted(k for k in self._seceded() if k not in asking)
        if not seceded:
            return
        key = data.draw(st.sampled_from(seceded))
        self.sim.worker_says(self.sim.worker_of(key), TaskRejoining(key))
        self._maybe_place(data)

    @precondition(lambda self: self.sim.all_running())
    @rule(data=st.data(), ok=st.booleans())
    def finish_or_raise(self, data: st.DataObject, ok: bool) -> None:
        """Mostly success; sometimes the task raises (and may be retried), or its
        result was too large for its worker."""
        key = data.draw(st.sampled_from(sorted(self.sim.all_running())))
        if ok or not data.draw(st.integers(0, 3)):
            self.sim.finish(key, nbytes=data.draw(st.integers(0, 100)))
        elif data.draw(st.integers(0, 3)):
            self.sim.raise_(key)
        else:
            worker_id = self.sim.worker_of(key)
            del self.sim.running[worker_id][key]
            too_large = ResultTooLarge(key, 200, "bytes", 100, 95, 0.1)
            self.sim.handle(FromWorker(worker_id, [too_large], self.sim.now))
        self._maybe_place(data)

    @precondition(lambda self: self.sim.all_running())
    @rule(data=st.data())
    def missing_dependency(self, data: st.DataObject) -> None:
        """A worker could not fetch an input from the holder it was told of."""
        key = data.draw(st.sampled_from(sorted(self.sim.all_running())))
        worker_id = self.sim.worker_of(key)
        compute = self.sim.running[worker_id][key]
        if not compute.who_has:
            return
        dep = data.draw(st.sampled_from(sorted(compute.who_has)))
        del self.sim.running[worker_id][key]
        msg = MissingDependency(key, dep, compute.who_has[dep], "")
        self.sim.handle(FromWorker(worker_id, [msg], self.sim.now))
        self._maybe_place(data)

    @precondition(lambda self: self.sim.all_running())
    @rule(data=st.data())
    def drop_freed(self, data: st.DataObject) -> None:
        """A worker told to free a task before it started reports that it dropped it."""
        tasks = self.sim.state.tasks
        freed = sorted(k for k in self.sim.all_running() if tasks[k].discard_result)
        if not freed:
            return
        key = data.draw(st.sampled_from(freed))
        worker_id = self.sim.worker_of(key)
        del self.sim.running[worker_id][key]
        self.sim.handle(FromWorker(worker_id, [TasksDropped([key])], self.sim.now))
        self._maybe_place(data)

    # --- the clients' side ----------------------------------------------------------

    def _any_key(self, data: st.DataObject, client: str) -> str:
        """Mostly a key the client wants; sometimes any key, live or not."""
        wanted = sorted(self.sim.state.clients[client].wanted)
        if wanted and data.draw(st.integers(0, 3)):
            return data.draw(st.sampled_from(wanted))
        return f"t{data.draw(st.integers(0, max(0, self.next_key - 1)))}"

    @precondition(lambda self: self.connected and self.next_key)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        client = data.draw(st.sampled_from(sorted(self.connected)))
        self.sim.client_says(client, ReleaseKeys([self._any_key(data, client)]))

    @precondition(lambda self: self.connected and self.next_key)
    @rule(data=st.data(), direct_from=st.sampled_from([0, 1, 50]))
    def gather(self, data: st.DataObject, direct_from: int) -> None:
        """A client gathers a key, mostly one in memory: relayed, or told where to
        fetch it itself (then its holder serves it until it leaves memory)."""
        client = data.draw(st.sampled_from(sorted(self.connected)))
        done = sorted(k for k, t in self.sim.state.tasks.items() if t.state == MEMORY)
        key = data.draw(st.sampled_from(done)) if done else self._any_key(data, client)
        self.sim.client_says(client, GatherRequest(1, [key], direct_from))
        if data.draw(st.booleans()):
            self.workers_answer()

    def _held_on_limited_workers(self) -> list[str]:
        state = self.sim.state
        return sorted(
            k
            for k, t in state.tasks.items()
            if t.state == MEMORY and t.worker is not None and state.workers[t.worker].memory_limit
        )

    @precondition(lambda self: self.connected and self._held_on_limited_workers())
    @rule(data=st.data(), direct=st.booleans(), near=st.booleans())
    def holder_dies_serving(self, data: st.DataObject, direct: bool, near: bool) -> None:
        """A result's holder dies while a client gathers it: out of memory, maybe."""
        client = data.draw(st.sampled_from(sorted(self.connected)))
        key = data.draw(st.sampled_from(self._held_on_limited_workers()))
        self.sim.client_says(client, GatherRequest(1, [key], int(direct)))
        holder = self.sim.state.tasks[key].worker
        assert holder is not None
        if near:
            self.sim.worker_says(holder, Heartbeat(0, 95))
        self.sim.remove_worker(holder)
        self._maybe_place(data)

    @precondition(lambda self: self.connected and self.next_key)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        client = data.draw(st.sampled_from(sorted(self.connected)))
        self.sim.client_says(client, CancelKeys([self._any_key(data, client)]))

    @precondition(lambda self: self.connected and self.next_key)
    @rule(data=st.data())
    def why(self, data: st.DataObject) -> None:
        client = data.draw(st.sampled_from(sorted(self.connected)))
        self.sim.client_says(client, WhyRequest(1, [self._any_key(data, client)]))
        reply = self.sim.inbox[client][-1]
        assert isinstance(reply, WhyReply) and all(reply.reasons.values())

    # --- shared data: retry, copies of results, datasets -------------------------------

    @precondition(lambda self: self.connected and self.next_key)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        """A client runs a key again: failed (with its failed inputs), or any other."""
        client = data.draw(st.sampled_from(sorted(self.connected)))
        self.sim.client_says(client, RetryKeys([self._any_key(data, client)]))
        self._maybe_place(data)

    def _results_to_copy(self) -> bool:
        state = self.sim.state
        return len(state.workers) > 1 and any(t.state == MEMORY for t in state.tasks.values())

    @precondition(lambda self: self.connected and self._results_to_copy())
    @rule(data=st.data(), n=st.integers(0, 3))
    def replicate(self, data: st.DataObject, n: int) -> None:
        """Copies to ``n`` workers (0: all); the copies travel when workers answer."""
        client = data.draw(st.sampled_from(sorted(self.connected)))
        done = sorted(k for k, t in self.sim.state.tasks.items() if t.state == MEMORY)
        keys = data.draw(st.lists(st.sampled_from(done), max_size=3)) if done else []
        keys.append(self._any_key(data, client))
        self.sim.client_says(client, ReplicateKeys(1, keys, n, []))
        if data.draw(st.booleans()):
            self.workers_answer()  # the copies land before anything else happens

    @precondition(lambda self: self.connected and self._results_to_copy())
    @rule(data=st.data())
    def rebalance(self, data: st.DataObject) -> None:
        client = data.draw(st.sampled_from(sorted(self.connected)))
        self.sim.client_says(client, RebalanceKeys(1, [], 1, []))
        if data.draw(st.booleans()):
            self.workers_answer()

    @precondition(lambda self: self.connected and self.next_key)
    @rule(data=st.data(), name=st.sampled_from(["x", "y"]))
    def publish_or_unpublish(self, data: st.DataObject, name: str) -> None:
        """A dataset holds keys (any, even unknown ones) until it is unpublished."""
        client = data.draw(st.sampled_from(sorted(self.connected)))
        if name in self.sim.state.shared.datasets and data.draw(st.booleans()):
            self.sim.client_says(client, UnpublishDataset(1, [name]))
        else:
            key = self._any_key(data, client)
            self.sim.client_says(client, PublishDataset(1, name, b"", [key], 1))
        self._maybe_place(data)

    # --- checks ---------------------------------------------------------------------

    @invariant()
    def state_is_consistent(self) -> None:
        check_invariants(self.sim.state)

    @invariant()
    def workers_run_what_the_scheduler_assigned(self) -> None:
        for worker_id, running in self.sim.running.items():
            assert set(running) == self.sim.state.workers[worker_id].processing.keys()

    def teardown(self) -> None:
        self._run_to_quiescence()
        self._check_nothing_hangs(actors_released=False)
        # A task may wait for what live actors hold (a GPU=2 request beside an actor
        # holding 3 of 4): it must run once its clients let the actors go.
        for _ in range(100):  # actors that were waiting themselves are built meanwhile
            if not self._release_actors():
                break
            self._settle()
        self._check_nothing_hangs(actors_released=True)

    def _release_actors(self) -> bool:
        """Clients release every live actor they hold; every dataset is unpublished.
        Whether there was anything to let go."""
        state = self.sim.state
        live = {k for w in state.workers.values() for k in w.actors}
        released = bool(state.shared.datasets)
        for client_id in sorted(self.connected):
            held = sorted(live & state.clients[client_id].wanted)
            if held:
                released = True
                self.sim.client_says(client_id, ReleaseKeys(held))
            if state.shared.datasets:
                self.sim.client_says(client_id, UnpublishDataset(1, sorted(state.shared.datasets)))
        return released

    def _run_to_quiescence(self) -> None:
        sim = self.sim
        for worker in list(sim.state.workers.values()):
            if worker.draining:  # its grace ran out: it leaves, deliberately
                sim.worker_says(worker.id, WorkerClosing("drain timed out"))
                sim.remove_worker(worker.id)
        sim.now += 10  # every held poison verdict comes due
        sim.handle(Tick(sim.now))
        while sim.state.verdicts:  # of workers that tick found silent: held a while more
            sim.now += sim.state.config.death_report_wait
            sim.handle(Tick(sim.now))
        sim.add_worker("rescue", nthreads=4, resources=RESCUE)
        self._settle()

    def _settle(self) -> None:
        """Workers finish everything they are given until nothing runs."""
        sim = self.sim
        for _ in range(10_000):
            for key in sorted(sim.all_running()):
                sim.now += 0.1
                sim.finish(key)
            sim.place()
            check_invariants(sim.state)
            if not sim.all_running():
                break
        else:
            raise AssertionError("the cluster did not settle")

    def _actors_hold_resources(self) -> bool:
        state = self.sim.state
        return any(
            (allocation := state.tasks[k].allocation) is not None and allocation.resources
            for w in state.workers.values()
            for k in w.actors
        )

    def _check_nothing_hangs(self, actors_released: bool) -> None:
        state = self.sim.state
        # Before they are released, live actors may hold what a waiting task needs.
        defer = not actors_released and self._actors_hold_resources()
        for worker in state.workers.values():
            ledger = worker.ledger
            free = Counter(ledger.free)
            for key in worker.actors:  # live actors hold theirs until released
                allocation = state.tasks[key].allocation
                free.update(allocation.resources if allocation is not None else {})
            total = Counter(ledger.total)
            assert free == total, f"{worker.name} did not get everything back"
        for client_id in self.connected:
            client = state.clients[client_id]
            inbox = self.sim.inbox[client_id]
            done = {k for msg in inbox if isinstance(msg, KeysDone) for k in msg.keys}
            failed = {k for msg in inbox if isinstance(msg, KeysFailed) for k in msg.keys}
            failed |= {msg.key for msg in inbox if isinstance(msg, TaskErred)}
            for key in client.wanted:
                task = state.tasks[key]
                assert task.state != PROCESSING
                if task.state == MEMORY:
                    assert key in done, f"{key} finished but {client_id} was not told"
                elif task.state == ERRED:
                    assert key in failed, f"{key} failed but {client_id} was not told"
                else:
                    assert task.state in (WAITING, QUEUED)
                    if not defer:
                        self._check_blocked_by_unsatisfiable(key)

    def _check_blocked_by_unsatisfiable(self, key: str, seen: frozenset[str] = frozenset()) -> None:
        """A task left waiting waits for a request nobody can meet, and we said so."""
        state = self.sim.state
        task = state.tasks[key]
        assert key not in seen, f"{key} hangs: it waits for itself"
        seen |= {key}
        if task.state == QUEUED:
            restricted = task.restriction is not None and not task.restriction.loose
            assert task.resources or restricted, f"{key} hangs"
            # Nobody could hold it, or nobody beside the actors among its own inputs.
            by_option = pools(state, task.queue)
            pinned = pinned_by_inputs(state, task, by_option)
            if not pinned and satisfiable(state, task.queue):
                # Or it waits for what a live actor holds, kept for a task blocked so.
                kept_for = {
                    d
                    for pool in by_option
                    for w in pool
                    for a in w.actors
                    for d in state.tasks[a].dependents or ()
                    if state.tasks[d].state in (WAITING, QUEUED)
                }
                assert kept_for, f"{key} hangs"
                for dependent in sorted(kept_for):
                    self._check_blocked_by_unsatisfiable(dependent, seen)
                return
            text = format_resources(task.resources)
            logs = [log.text for log in self.sim.logs if log.level == "warning"]
            said = [line for line in logs if f"needs {text}," in line]
            said += [line for line in logs if "alternatives" in line and text in line]
            if task.restriction is not None:
                named = f"may run only on workers matching {task.restriction.describe()}"
                said += [line for line in logs if named in line]
            assert said, f"no warning for {key}"
            return
        pending = [d for d in task.deps if state.tasks[d].state != MEMORY]
        assert pending, f"{key} waits for nothing"
        for dep in pending:
            self._check_blocked_by_unsatisfiable(dep, seen)


class FailUnsatisfiableMachine(SchedulerMachine):
    """On a cluster that cannot grow, nothing may be left waiting at all. One worker
    death is enough for a verdict here, so that verdicts come within short runs."""

    config = SchedulerConfig(fail_unsatisfiable=True, max_worker_deaths=1)

    def _check_blocked_by_unsatisfiable(self, key: str, seen: frozenset[str] = frozenset()) -> None:
        raise AssertionError(f"{key} left {self.sim.state.tasks[key].state}")


SchedulerMachine.TestCase.settings = STATEFUL
FailUnsatisfiableMachine.TestCase.settings = STATEFUL
TestScheduler = SchedulerMachine.TestCase
TestSchedulerFailUnsatisfiable = FailUnsatisfiableMachine.TestCase
