"""Hypothesis stateful test: removing a person loses nothing of anyone else's.

The owner and two people submit chains of tasks from several clients while workers
join and tasks finish, cancel some of their own, and the owner removes and admits
people again. After every step the scheduler's invariants hold, no work of a removed
person waits to start, and every task of everyone else that its client did not
cancel is still there and has not failed.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from apportion.protocol.people import AddPerson, RemovePerson
from apportion.protocol.tasks import CancelKeys
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, QUEUED, WAITING
from apportion.testing.simulation import SimulatedCluster

#: Each client and whom it acts as ("": the owner).
CLIENTS = {"c1": "", "c2": "", "a1": "alice", "a2": "alice", "b1": "bob"}
PEOPLE = ("alice", "bob")


class PeopleMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.sim = SimulatedCluster()
        self.sim.add_client("c1")
        self.sim.add_client("c2")
        self.admitted: set[str] = set()
        self.connected: set[str] = {"c1", "c2"}
        #: Keys each connected client submitted and wants, and those it cancelled.
        self.submitted: dict[str, list[str]] = {c: [] for c in CLIENTS}
        self.cancelled: set[str] = set()
        #: Each key's input (the chains are within one client).
        self.inputs: dict[str, list[str]] = {}
        self.count = 0
        for person in PEOPLE:
            self.admit(person)

    def admit(self, person: str) -> None:
        self.sim.client_says("c1", AddPerson(0, person, 1.0, ""))
        self.admitted.add(person)
        for client, whose in CLIENTS.items():
            if whose == person:
                self.sim.add_client(client, person=person)
                self.connected.add(client)
                self.submitted[client] = []

    @rule()
    def add_worker(self) -> None:
        self.sim.add_worker(nthreads=2)

    @rule(client=st.sampled_from(sorted(CLIENTS)), chained=st.booleans())
    def submit(self, client: str, chained: bool) -> None:
        if client not in self.connected:
            return
        self.count += 1
        key = f"{client}-{self.count}"
        mine = [k for k in self.submitted[client] if k in self.sim.state.tasks]
        deps = [mine[-1]] if chained and mine else []
        self.inputs[key] = deps
        if any(dep in self.cancelled for dep in deps):
            self.cancelled.add(key)  # fails with its cancelled input, as it should
        self.sim.submit(key, deps, client=client)
        self.submitted[client].append(key)
        self.sim.place()

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        running = sorted(self.sim.all_running())
        if running:
            self.sim.finish(data.draw(st.sampled_from(running)))
            self.sim.place()

    @rule(client=st.sampled_from(sorted(CLIENTS)), data=st.data())
    def cancel_own(self, client: str, data: st.DataObject) -> None:
        keys = self.submitted[client]
        if client in self.connected and keys:
            key = data.draw(st.sampled_from(keys))
            self.sim.client_says(client, CancelKeys([key]))
            # Cancelling fails what depends on it too: those count as cancelled.
            ended = {key}
            for later in keys:  # in submission order: inputs come first
                if any(dep in ended for dep in self.inputs[later]):
                    ended.add(later)
            self.cancelled |= ended

    @precondition(lambda self: bool(self.admitted))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        person = data.draw(st.sampled_from(sorted(self.admitted)))
        self.sim.client_says("c1", RemovePerson(0, person))
        self.admitted.discard(person)
        for client, whose in CLIENTS.items():
            if whose == person:
                self.connected.discard(client)
                self.submitted[client] = []
        self.sim.place()

    @precondition(lambda self: len(self.admitted) < len(PEOPLE))
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        self.admit(data.draw(st.sampled_from(sorted(set(PEOPLE) - self.admitted))))

    @invariant()
    def consistent(self) -> None:
        check_invariants(self.sim.state)

    @invariant()
    def nothing_of_a_removed_person_waits(self) -> None:
        state = self.sim.state
        gone = set(PEOPLE) - self.admitted
        assert not [c for c in state.clients.values() if c.person in gone]
        waiting = [
            t.key for t in state.tasks.values() if t.person in gone and t.state in (WAITING, QUEUED)
        ]
        assert not waiting, waiting

    @invariant()
    def nothing_of_anyone_else_is_lost(self) -> None:
        state = self.sim.state
        for client in self.connected:
            for key in self.submitted[client]:
                if key in self.cancelled:
                    continue
                task = state.tasks.get(key)
                assert task is not None, key
                assert task.state != ERRED, (key, task.error)
                assert client in (task.wanted_by or ()), key


PeopleMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPeople = PeopleMachine.TestCase
