"""The handshake gate: connections still shaking hands are bounded per host and in all,
the oldest dropped first; refusals are logged once per host and window, then summed."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Hashable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from apportion.net import gate as gate_module
from apportion.net.gate import (
    MAX_REFUSAL_HOSTS,
    REFUSAL_WINDOW,
    HandshakeGate,
    RefusalLog,
    check_invariants,
    check_refusals,
)


def test_the_gate_is_pure() -> None:
    tree = ast.parse(Path(gate_module.__file__).read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    roots = {name.split(".")[0] for name in imported}
    assert not roots & {"asyncio", "socket", "time", "threading", "selectors", "random"}


def test_defaults() -> None:
    gate = HandshakeGate()
    assert (gate.per_address, gate.total) == (64, 1024)
    assert (REFUSAL_WINDOW, MAX_REFUSAL_HOSTS) == (60.0, 4096)


@pytest.mark.parametrize(("per_address", "total"), [(0, 1), (1, 0), (-1, 5)])
def test_a_gate_without_room_is_refused(per_address: int, total: int) -> None:
    with pytest.raises(ValueError, match="room"):
        HandshakeGate(per_address, total)


# --- pending connections -------------------------------------------------------------


def test_a_host_at_its_bound_loses_its_oldest_pending_connection_not_the_new_one() -> None:
    gate = HandshakeGate(per_address=3, total=100)
    for i in range(3):
        assert gate.admit(f"slow-{i}", "127.0.0.1", float(i)) == []
    assert gate.admit("other", "10.0.0.2", 3.0) == []
    assert gate.admit("legit", "127.0.0.1", 4.0) == ["slow-0"]
    assert gate.pending("127.0.0.1") == 3 and gate.pending() == 4
    assert gate.since("slow-0") is None and gate.since("legit") == 4.0
    # The legitimate client finishes within milliseconds; the trickler goes on.
    gate.done("legit")
    assert gate.admit("slow-3", "127.0.0.1", 5.0) == []
    assert gate.admit("slow-4", "127.0.0.1", 6.0) == ["slow-1"]
    check_invariants(gate)


def test_the_total_bound_drops_the_oldest_pending_connection_of_all() -> None:
    gate = HandshakeGate(per_address=10, total=3)
    gate.admit("a1", "a", 0.0)
    gate.admit("b1", "b", 1.0)
    gate.admit("a2", "a", 2.0)
    assert gate.admit("c1", "c", 3.0) == ["a1"]
    assert gate.admit("c2", "c", 4.0) == ["b1"]
    assert gate.pending("a") == 1 and gate.pending("b") == 0 and gate.pending("c") == 2
    check_invariants(gate)


def test_a_host_at_its_bound_makes_room_in_the_total_too_so_one_admission_drops_one() -> None:
    gate = HandshakeGate(per_address=2, total=3)
    gate.admit("b1", "b", 0.0)
    gate.admit("a1", "a", 1.0)
    gate.admit("a2", "a", 2.0)
    # Total and host both full: the host's oldest goes, not b1 (older, but not its).
    assert gate.admit("a3", "a", 3.0) == ["a1"]
    assert gate.admit("c1", "c", 4.0) == ["b1"]  # total full: the oldest of all
    assert gate.pending() == 3 and gate.pending("a") == 2
    check_invariants(gate)
    other = HandshakeGate(per_address=2, total=2)
    other.admit("x1", "x", 0.0)
    other.admit("y1", "y", 1.0)
    assert other.admit("y2", "y", 2.0) == ["x1"]  # y is under its bound: the total's oldest
    check_invariants(other)


def test_done_forgets_a_key_and_ignores_unknown_ones() -> None:
    gate = HandshakeGate(per_address=2, total=2)
    gate.admit("k", "h", 0.0)
    gate.done("k")
    gate.done("k")
    gate.done("never seen")
    assert gate.pending() == 0 and gate.pending("h") == 0
    check_invariants(gate)


def test_a_key_already_pending_is_refused() -> None:
    gate = HandshakeGate()
    gate.admit("k", "h", 0.0)
    with pytest.raises(ValueError, match="already pending"):
        gate.admit("k", "h", 1.0)


class GateMachine(RuleBasedStateMachine):
    """The gate against a model: a list of (key, host), oldest first."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = HandshakeGate()
        self.model: list[tuple[int, str]] = []
        self.keys = itertools.count()
        self.now = 0.0

    @initialize(per_address=st.integers(1, 4), total=st.integers(1, 8))
    def bounds(self, per_address: int, total: int) -> None:
        self.gate = HandshakeGate(per_address, total)

    @rule(host=st.sampled_from(["a", "b", "c"]), dt=st.floats(0, 5))
    def admit(self, host: str, dt: float) -> None:
        key = next(self.keys)
        self.now += dt
        before = {k for k, _ in self.model}
        evicted = self.gate.admit(key, host, self.now)
        expected = []
        mine = [k for k, h in self.model if h == host]
        if len(mine) >= self.gate.per_address:
            expected.append(mine[0])
            self.model = [(k, h) for k, h in self.model if k != mine[0]]
        if len(self.model) >= self.gate.total:
            expected.append(self.model.pop(0)[0])
        self.model.append((key, host))
        assert evicted == expected and len(evicted) <= 1
        assert key not in evicted, "a new connection is never dropped by its own admission"
        assert set(evicted) <= before
        for gone in evicted:
            assert self.gate.since(gone) is None
        assert self.gate.since(key) == self.now

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        key, _ = data.draw(st.sampled_from(self.model))
        self.gate.done(key)
        self.model = [(k, h) for k, h in self.model if k != key]

    @rule(key=st.integers(-5, -1))
    def finish_unknown(self, key: Hashable) -> None:
        self.gate.done(key)

    @invariant()
    def bounds_hold(self) -> None:
        check_invariants(self.gate)
        assert self.gate.pending() == len(self.model) <= self.gate.total
        for host in "abc":
            count = self.gate.pending(host)
            assert count == sum(h == host for _, h in self.model) <= self.gate.per_address


TestGateMachine = GateMachine.TestCase
TestGateMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


# --- refusals ----------------------------------------------------------------------


def test_the_first_refusal_is_said_then_quiet_then_summed_up() -> None:
    log = RefusalLog()
    assert log.refused("h", "bad token", 0.0) == "refused a connection from h: bad token"
    assert log.refused("h", "bad token", 1.0) is None
    assert log.refused("other", "version 9", 2.0) == "refused a connection from other: version 9"
    assert log.refused("h", "no hello", 59.0) is None
    assert (
        log.refused("h", "version 9", 61.0)
        == "refused 3 more connections from h in the last 61 s: version 9"
    )
    assert log.refused("h", "x", 62.0) is None  # a new window started with the summary
    check_refusals(log)


def test_a_host_quiet_for_a_window_is_said_afresh() -> None:
    log = RefusalLog()
    assert log.refused("h", "r", 0.0) is not None
    assert log.refused("h", "r", 60.0) == "refused a connection from h: r"


def test_overdue_sums_up_refusals_that_stopped_within_their_window() -> None:
    log = RefusalLog()
    log.refused("a", "r1", 0.0)
    log.refused("a", "r2", 10.0)
    log.refused("b", "q", 5.0)
    log.refused("c", "s", 30.0)
    log.refused("c", "s", 31.0)
    assert log.overdue(59.0) == []
    assert log.overdue(70.0) == ["refused 1 more connection from a in the last 70 s: r2"]
    assert log.overdue(100.0) == ["refused 1 more connection from c in the last 70 s: s"]
    assert log.refused("a", "r", 101.0) == "refused a connection from a: r"
    check_refusals(log)


def test_the_refusal_table_is_bounded_dropping_the_oldest_host() -> None:
    log = RefusalLog(max_hosts=3)
    for i, host in enumerate("abcd"):
        assert log.refused(host, "r", float(i)) is not None
    check_refusals(log)
    assert log.refused("b", "r", 10.0) is None  # remembered
    assert log.refused("a", "r", 10.0) is not None  # forgotten: said afresh
    assert len(RefusalLog()._hosts) == 0
    big = RefusalLog()
    for i in range(MAX_REFUSAL_HOSTS + 100):
        big.refused(f"10.0.{i // 256}.{i % 256}", "r", float(i) / 1000)
    assert len(big._hosts) == MAX_REFUSAL_HOSTS


def test_the_gate_logs_refusals_through_its_refusal_log() -> None:
    gate = HandshakeGate()
    assert gate.refused("h", "r", 0.0) == "refused a connection from h: r"
    assert gate.refused("h", "r", 1.0) is None


_EVENTS = st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 40)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(_EVENTS)
def test_one_line_per_host_and_window_and_every_refusal_is_counted(
    events: list[tuple[str, float]],
) -> None:
    log = RefusalLog()
    now = 0.0
    said_at: dict[str, list[float]] = {}
    counted = 0
    for host, dt in events:
        now += dt
        line = log.refused(host, "r", now)
        if line is not None:
            said_at.setdefault(host, []).append(now)
            counted += 1 if line.startswith("refused a connection") else int(line.split()[1])
        check_refusals(log)
    for line in log.overdue(now + 2 * REFUSAL_WINDOW):
        counted += int(line.split()[1])
    assert counted == len(events)
    for times in said_at.values():
        assert all(b - a >= REFUSAL_WINDOW for a, b in itertools.pairwise(times))
