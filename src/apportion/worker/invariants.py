"""What must hold of a ``WorkerState`` between any two steps, checked in tests.

Kept apart from the rules that keep it (``state.py``): the Hypothesis machine and
the state tests call ``check_invariants`` after every step; the worker never does.
"""

from __future__ import annotations

from apportion.worker.records import EXECUTING, READY, WAITING
from apportion.worker.state import WorkerState


def check_invariants(state: WorkerState) -> None:
    """Raise ``AssertionError`` naming the first broken invariant of ``state``.

    Called after every step of the Hypothesis machine and at the end of every state
    test, so a rule broken by any interleaving shows up where it happened.
    """
    ready = {k for k, t in state.tasks.items() if t.state == READY}
    executing = {k for k, t in state.tasks.items() if t.state == EXECUTING}
    live = [e[4] for e in state._ready if state._is_live(e)]
    assert len(live) == len(set(live)), f"duplicate live ready entries: {live}"
    assert set(live) == ready, f"ready heap {sorted(live)} != ready tasks {sorted(ready)}"
    seceded = state.seceded.keys()
    assert seceded <= executing, f"seceded {sorted(seceded)} not executing"
    assert state.rejoining <= seceded, f"rejoining {state.rejoining} not seceded"
    assert state.rejoined <= state.executing, f"rejoined {state.rejoined} not counted"
    ahead = state.started_ahead.keys()
    assert ahead <= executing, f"started ahead {sorted(ahead)} not executing"
    assert len(ahead) <= state.ahead, f"{len(ahead)} started ahead, more than {state.ahead}"
    assert not ahead & seceded, "a task started ahead has seceded"
    counted = executing - seceded - ahead
    assert counted == state.executing, f"executing {state.executing} != {counted}"
    for key in ahead:
        record = state.tasks[key]
        assert not record.allocation.resources, f"{key}: started ahead holding resources"
    assert not ahead or len(counted) >= state.nthreads, "started ahead while a thread idles"
    assert not ready & executing, "a key is both ready and executing"
    started = len(counted - state.rejoined)
    assert started <= state.nthreads, f"{started} started on {state.nthreads} threads"
    idle = len(counted) < state.nthreads
    assert not (ready and idle and not state.paused), "a ready task waits for no reason"
    held_back = state.paused or state.fetch_budget is not None
    assert held_back or not state._to_fetch, "fetches held back while not paused"
    asked = sum(f.nbytes for f in state.fetches.values() if f.asked)
    assert state.in_flight_bytes == asked, f"{state.in_flight_bytes} bytes coming, not {asked}"
    assert state.owned <= state.data.keys(), "owned keys must be in memory"
    assert not state.data.keys() & state.fetches.keys(), "a key in memory is being fetched"
    assert not state.data.keys() & state.tasks.keys(), "a key is both in memory and a task"
    needs: dict[str, set[str]] = {}
    for key, record in state.tasks.items():
        assert record.state in (WAITING, READY, EXECUTING), f"{key}: {record.state}"
        assert record.missing <= set(record.deps), f"{key}: missing deps it does not have"
        assert not record.missing & state.data.keys(), f"{key}: a missing dep is in memory"
        assert (record.state == WAITING) == bool(record.missing), f"{key}: waiting/missing"
        assert not (record.freed and record.state != EXECUTING), f"{key}: freed but pending"
        if record.state != EXECUTING:
            for dep in record.deps:
                needs.setdefault(dep, set()).add(key)
    assert needs == state.needed_by, f"needed_by {state.needed_by} != {needs}"
    transient = state.data.keys() - state.owned
    wanted = state.needed_by.keys() | state.prefetched
    assert transient <= wanted, f"unneeded transient data {transient}"
    assert not state.prefetched & state.needed_by.keys(), "prefetched and needed by a task"
    held_or_coming = state.data.keys() | state.fetches.keys()
    assert state.prefetched <= held_or_coming, f"prefetched {state.prefetched} not held"
    for dep, fetch in state.fetches.items():
        assert 0 <= fetch.index < len(fetch.holders), f"{dep}: fetch past its holders"
        assert state.address not in fetch.holders, f"{dep}: fetching from ourselves"
