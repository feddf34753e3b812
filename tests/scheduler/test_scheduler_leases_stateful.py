"""Hypothesis stateful test of semaphores, locks and multi-locks in the scheduler's state.

Clients acquire (with and without timeouts and lease timeouts), release, refresh,
leave and come back while time passes. After every step the scheduler's invariants
hold (never more leases than ``max_leases``, no waiter of a gone client, no grantable
waiter left waiting), every request is answered at most once, and the leases the
scheduler holds are exactly those this model saw granted and not yet released,
expired or dropped with their client. At the end every request still waiting is
answered (granted or timed out) once the leases are given back, or was dropped
with its client: none is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from apportion.protocol.coordination import (
    NO_TIMEOUT,
    CoordinationReply,
    LeaseRequest,
    RefreshLeases,
)
from apportion.protocol.tasks import Notice
from apportion.scheduler.events import Tick
from apportion.scheduler.invariants import check_invariants
from apportion.testing.simulation import SimulatedCluster

CLIENTS = ("c1", "c2", "c3")
#: (kind, names, count, max_leases): two semaphores (one a lock) and three multi-locks.
TARGETS = (
    ("semaphore", ("db",), 1, 2),
    ("semaphore", ("lock",), 1, 1),
    ("multilock", ("x", "y"), 2, 1),
    ("multilock", ("y", "x", "z"), 3, 1),
    ("multilock", ("z", "x"), 1, 1),
)
TIMEOUTS = (0.0, 1.0, 2.5, NO_TIMEOUT)
LEASE_TIMEOUTS = (0.0, 2.0)


@dataclass
class Asked:
    client: str
    kind: str
    names: tuple[str, ...]
    lease_id: str


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sim = SimulatedCluster()
        self.now = 0.0
        self.connected: set[str] = set()
        self.seen = {client: 0 for client in CLIENTS}
        self.rid = 0
        #: request id -> the acquire waiting for its answer.
        self.waiting: dict[int, Asked] = {}
        #: lease id -> the acquire granted it, while the model thinks it is held.
        self.held: dict[str, Asked] = {}
        self.answered: set[int] = set()
        #: Release requests sent and not answered yet.
        self.releases: set[int] = set()
        for client in CLIENTS:
            self._join(client)

    # --- plumbing -------------------------------------------------------------------

    def _join(self, client: str) -> None:
        self.sim.add_client(client)
        self.connected.add(client)

    def _next(self) -> int:
        self.rid += 1
        return self.rid

    def _read(self) -> None:
        """Take every new answer: grants become held leases; check each once."""
        for client in CLIENTS:
            inbox = self.sim.inbox.get(client, [])
            new, self.seen[client] = inbox[self.seen[client] :], len(inbox)
            for msg in new:
                if isinstance(msg, Notice):
                    expired = [i for i, a in self.held.items() if a.client == client]
                    still = set(self.sim.state.coordination.leases)
                    for lease_id in expired:
                        if lease_id not in still:
                            del self.held[lease_id]
                    continue
                assert isinstance(msg, CoordinationReply), msg
                assert not msg.error, msg.error
                if msg.request_id in self.releases:
                    self.releases.remove(msg.request_id)
                    assert msg.ok, "a lease the model holds could not be released"
                    continue
                assert msg.request_id not in self.answered, "answered twice"
                self.answered.add(msg.request_id)
                asked = self.waiting.pop(msg.request_id, None)
                if asked is None:
                    continue
                assert asked.client == client and client in self.connected
                if msg.ok:
                    self.held[asked.lease_id] = asked

    def _release(self, lease_id: str) -> None:
        asked = self.held.pop(lease_id)
        rid = self._next()
        self.releases.add(rid)
        msg = LeaseRequest(rid, "release", asked.kind, list(asked.names), lease_id, 0, 1, 0, 0)
        self.sim.client_says(asked.client, msg)

    # --- rules ----------------------------------------------------------------------

    @rule(
        client=st.sampled_from(CLIENTS),
        what=st.sampled_from(TARGETS),
        timeout=st.sampled_from(TIMEOUTS),
        lease_timeout=st.sampled_from(LEASE_TIMEOUTS),
    )
    def acquire(
        self,
        client: str,
        what: tuple[str, tuple[str, ...], int, int],
        timeout: float,
        lease_timeout: float,
    ) -> None:
        if client not in self.connected:
            return
        kind, names, count, max_leases = what
        rid = self._next()
        lease_id = f"lease-{rid}"
        self.waiting[rid] = Asked(client, kind, names, lease_id)
        msg = LeaseRequest(
            rid, "acquire", kind, list(names), lease_id, count, max_leases, timeout, lease_timeout
        )
        self.sim.client_says(client, msg)
        self._read()
        if timeout == 0:
            assert rid not in self.waiting, "a non-blocking acquire left waiting"

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self._release(data.draw(st.sampled_from(sorted(self.held))))
        self._read()

    @rule(client=st.sampled_from(CLIENTS))
    def refresh(self, client: str) -> None:
        if client in self.connected:
            mine = [i for i, a in self.held.items() if a.client == client]
            self.sim.client_says(client, RefreshLeases(mine))

    @rule(dt=st.sampled_from((0.5, 1.0, 3.0)))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.sim.now = self.now
        self.sim.handle(Tick(self.now))
        self._read()

    @rule(client=st.sampled_from(CLIENTS))
    def leave_or_return(self, client: str) -> None:
        if client in self.connected:
            self.connected.discard(client)
            self.sim.remove_client(client)
            self.held = {i: a for i, a in self.held.items() if a.client != client}
            self.waiting = {r: a for r, a in self.waiting.items() if a.client != client}
        else:
            self._join(client)
        self._read()

    # --- checks ---------------------------------------------------------------------

    @invariant()
    def state_is_consistent(self) -> None:
        check_invariants(self.sim.state)
        book = self.sim.state.coordination
        assert set(book.leases) == set(self.held), "leases differ from the grants seen"
        queued = {w.request_id for p in book.pools.values() for q in p.values() for w in q.queue}
        assert queued == set(self.waiting), "waiters differ from the requests unanswered"

    def teardown(self) -> None:
        """Give back every lease until nothing waits: no request is lost."""
        for _ in range(len(self.waiting) + 1):
            for lease_id in list(self.held):
                self._release(lease_id)
            self.now += 100.0
            self.sim.now = self.now
            self.sim.handle(Tick(self.now))
            self._read()
            if not self.waiting:
                break
        assert not self.waiting, f"requests never answered: {sorted(self.waiting)}"
        check_invariants(self.sim.state)


LeaseMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLeases = LeaseMachine.TestCase
