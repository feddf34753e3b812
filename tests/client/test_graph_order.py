"""The order a graph's tasks start in: Dask's ``dask.order`` for Dask's graphs, so that
inputs are released soon and fewer results are held at once.

Graphs run on the simulated cluster (no process, no socket): two workers of one
thread, every task taking the same time, and the most results held in memory at
any moment is counted.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Hashable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.client.graph import needed_in_order, start_order
from apportion.protocol.tasks import SubmitTasks, TaskSpec
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import MEMORY
from apportion.testing import SimulatedCluster

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
dask_core = pytest.importorskip("dask.core")


def _wire(key: Hashable) -> str:
    return repr(key) if isinstance(key, tuple) else str(key)


def _held_at_most(
    dsk: Mapping[Hashable, object],
    wanted: list[Hashable],
    order: list[Hashable],
    log: list[str] | None = None,
) -> int:
    """Submit ``order`` as one batch, run it to the end on two one-thread workers
    (tasks end in the order they started; a task with no inputs makes a block of
    32 MiB, the others small results), and return the most results held at once.
    Checks on the way that no task started before its inputs were in memory; the
    keys started are appended to ``log`` in the order they started."""
    sim = SimulatedCluster()
    sim.add_client("c1")
    sim.add_worker(nthreads=1)
    sim.add_worker(nthreads=1)
    specs = [
        TaskSpec(
            _wire(key),
            "f",
            b"",
            sorted(_wire(dep) for dep in dask_core.get_dependencies(dsk, key)),
            {},
            0,
            0,
        )
        for key in order
    ]
    sim.client_says("c1", SubmitTasks(specs, {"f": b"func"}, [_wire(k) for k in wanted]))
    most = 0
    running: list[str] = []
    while True:
        started = [key for _, key in sim.place()]
        for key in started:
            assert all(sim.state.tasks[dep].state == MEMORY for dep in sim.state.tasks[key].deps)
        running += started
        if log is not None:
            log += started
        if not running:
            break
        key = running.pop(0)
        sim.finish(key, nbytes=8 if sim.state.tasks[key].deps else 32 << 20, duration=0.05)
        most = max(most, sum(1 for t in sim.state.tasks.values() if t.state == MEMORY))
    check_invariants(sim.state)
    assert all(sim.state.tasks[_wire(k)].state == MEMORY for k in wanted)
    return most


def _optimized(expr: object) -> tuple[dict[Hashable, object], list[Hashable]]:
    (expr,) = dask.optimize(expr)
    graph = dict(expr.__dask_graph__())  # type: ignore[attr-defined]
    return graph, list(dask_core.flatten(expr.__dask_keys__()))  # type: ignore[attr-defined]


def _diamond_chains(chains: int, steps: int) -> dict[Hashable, object]:
    """Chains of diamonds (``x -> x + 1, x * 2 -> their sum -> ...``), summed at the end."""
    dsk: dict[Hashable, object] = {}
    for j in range(chains):
        dsk[f"x-{j}-0"] = j
        for k in range(steps):
            dsk[f"l-{j}-{k}"] = (operator.add, f"x-{j}-{k}", 1)
            dsk[f"r-{j}-{k}"] = (operator.mul, f"x-{j}-{k}", 2)
            dsk[f"x-{j}-{k + 1}"] = (operator.add, f"l-{j}-{k}", f"r-{j}-{k}")
    dsk["total"] = (sum, [f"x-{j}-{steps}" for j in range(chains)])
    return dsk


def _graph(name: str) -> tuple[dict[Hashable, object], list[Hashable]]:
    if name == "diamond chains":
        return _diamond_chains(4, 6), ["total"]
    x = da.ones((8, 8), chunks=(2, 2))  # named alike in every run: the same ties
    if name == "transpose":
        return _optimized((x + x.T).sum())
    if name == "shared mean":
        return _optimized((x - x.mean(axis=0)).std())
    return _optimized(da.ones((16, 16), chunks=(2, 2)).sum(split_every=4))


def _roots_first(dsk: Mapping[Hashable, object], keys: list[Hashable]) -> list[Hashable]:
    """Every task without inputs, then the rest: what a scheduler that starts ready
    tasks first in, first out does with a graph listed in no particular order."""
    return sorted(keys, key=lambda k: (bool(dask_core.get_dependencies(dsk, k)), repr(k)))


# The most results held in Dask's order, and with every root started first. Depth
# first holds 11 to 19 (transpose) or 15 to 21 (mean) as set iteration falls; on a
# real cluster, where making a block costs more than adding two, Dask's order holds
# a third as much at the peak (docs/scheduling.md).
@pytest.mark.parametrize(
    ("name", "most", "roots_first"),
    [
        ("transpose", 10, 20),
        ("shared mean", 16, 32),
        ("tree reduction", 12, 64),
        ("diamond chains", 8, 8),
    ],
)
def test_dask_graphs_start_in_dasks_order(name: str, most: int, roots_first: int) -> None:
    dsk, wanted = _graph(name)
    depth_first = needed_in_order(dsk, wanted)
    started = start_order(dsk, depth_first)
    priorities = dask.order.order({key: dsk[key] for key in depth_first})
    assert sorted(started, key=repr) == sorted(depth_first, key=repr)  # the same tasks
    assert started == sorted(depth_first, key=priorities.__getitem__)
    assert _held_at_most(dsk, wanted, started) <= most
    assert _held_at_most(dsk, wanted, _roots_first(dsk, depth_first)) == roots_first


@pytest.mark.parametrize(("name", "most"), [("tree reduction", 12), ("diamond chains", 8)])
def test_graphs_without_dask_start_depth_first_and_hold_as_little(
    name: str, most: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsk, wanted = _graph(name)
    depth_first = needed_in_order(dsk, wanted)
    monkeypatch.delitem(sys.modules, "dask")  # as for futures and plain dicts
    assert start_order(dsk, depth_first) == depth_first
    assert _held_at_most(dsk, wanted, depth_first) <= most


def test_without_dask_a_graph_starts_depth_first(monkeypatch: pytest.MonkeyPatch) -> None:
    dsk = {"a": 1, "b": (operator.add, "a", 1), "c": (operator.add, "a", "b")}
    monkeypatch.delitem(sys.modules, "dask")  # a plain dict graph, Dask never imported
    assert start_order(dsk, needed_in_order(dsk, ["c"])) == ["a", "b", "c"]


@st.composite
def _graphs(draw: st.DrawFn) -> dict[Hashable, object]:
    """Random DAGs of ``add`` tasks: each key takes up to three earlier keys."""
    n = draw(st.integers(1, 25))
    graph: dict[Hashable, object] = {}
    for i in range(n):
        inputs = draw(st.lists(st.integers(0, max(i - 1, 0)), max_size=3)) if i else []
        graph[f"k-{i}"] = (sum, [f"k-{j}" for j in inputs]) if inputs else i
    return graph


def _evaluate(dsk: Mapping[Hashable, object], keys: list[str]) -> dict[Hashable, object]:
    """Run the tasks of ``_graphs`` in the order ``keys`` started, each once."""
    values: dict[Hashable, object] = {}
    for key in keys:
        task = dsk[key]
        if isinstance(task, tuple):
            func, inputs = task
            assert all(k in values for k in inputs), f"{key} started before its inputs"
            values[key] = func(values[k] for k in inputs)
        else:
            values[key] = task
    return values


@settings(max_examples=60, deadline=None)
@given(_graphs())
def test_the_order_starts_no_task_before_its_inputs_and_keeps_results(
    dsk: dict[Hashable, object],
) -> None:
    wanted = [list(dsk)[-1]]
    depth_first = needed_in_order(dsk, wanted)
    started = start_order(dsk, depth_first)
    assert sorted(started) == sorted(depth_first)
    log: list[str] = []
    _held_at_most(dsk, wanted, started, log)  # runs to the end: the wanted key in memory
    assert sorted(log) == sorted(depth_first)  # each needed task ran, once
    assert _evaluate(dsk, log)[wanted[0]] == dask.get(dsk, wanted[0])
