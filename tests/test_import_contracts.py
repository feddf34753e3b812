"""Import contracts: no import cycles, and pure modules import no I/O, clock or randomness.

The graph is read from the source with ``ast`` by ``tools/import_graph.py``: imports
inside functions count (they run too). Cycles are checked between modules and
between packages counting imports under ``if TYPE_CHECKING:`` too: they never run,
but a module that names another's class in its annotations depends on it all the
same, for a reader and for the type checker. Purity counts only what runs.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "import_graph", ROOT / "tools" / "import_graph.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()
GRAPH: dict[str, set[str]] = TOOL.import_graph(ROOT / "src")
OWN: dict[str, set[str]] = TOOL.internal(GRAPH)
#: ``OWN`` with the annotation-only imports.
TYPED: dict[str, set[str]] = TOOL.internal(TOOL.import_graph(ROOT / "src", type_checking=True))

#: What a pure module may not import, directly or through other apportion modules.
IMPURE = frozenset(
    {"asyncio", "socket", "subprocess", "threading", "time", "random", "selectors", "sqlite3"}
    | {"concurrent"}
)

#: Pure modules, by name (a pattern, so a module that lands later is covered).
PURE = re.compile(
    r"^apportion\.("
    r"core(\..*)?"
    r"|protocol\.[a-z_]+"
    r"|scheduler\.(?!service$)[a-z_]+"
    r"|worker\.(state|records|invariants|events|memory_policy)"
    r"|testing\.simulation"
    r"|net\.(gate|discovery|foreign_peer)"
    r"|deploy\.(allocator|hostlist|job_template|ssh_commands|ssh_options|sge_template)"
    r"|runs\.(lifecycle|views|run_states|run_events|messages)"
    r"|dashboard\.(http|auth|origin|metrics|card)"
    r"|cli\.status_view"
    r"|client\.state"
    r")$"
)

#: Package cycles allowed (none).
ALLOWED_PACKAGE_CYCLES: set[frozenset[str]] = set()

#: Module cycles allowed (none).
ALLOWED_MODULE_CYCLES: set[frozenset[str]] = set()

#: Pure modules allowed an impure import (none).
ALLOWED_IMPURE: set[tuple[str, str]] = set()


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Every cycle's set of nodes (Tarjan, iterative): components of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_graph_sees_the_layers() -> None:
    assert "apportion.scheduler.state" in OWN["apportion.scheduler.dispatch"]
    assert "apportion.scheduler.state" in OWN["apportion.scheduler.membership"]
    assert (
        not {"apportion.scheduler.dispatch", "apportion.scheduler.membership"}
        & OWN["apportion.scheduler.state"]
    )


def test_no_module_imports_in_a_cycle() -> None:
    cycles = set(strongly_connected(TYPED))
    assert not cycles - ALLOWED_MODULE_CYCLES, f"import cycles: {[sorted(c) for c in cycles]}"
    # The allowed ones are all still there: one that is gone comes off the list.
    assert cycles >= ALLOWED_MODULE_CYCLES


def test_no_package_imports_in_a_cycle() -> None:
    packages: dict[str, set[str]] = {}
    for name, deps in TYPED.items():
        mine = TOOL.package_of(name)
        packages.setdefault(mine, set()).update(
            TOOL.package_of(d) for d in deps if TOOL.package_of(d) != mine
        )
    for name, deps in packages.items():
        packages[name] = {d for d in deps if frozenset({name, d}) not in ALLOWED_PACKAGE_CYCLES}
    cycles = strongly_connected(packages)
    assert not cycles, f"package cycles: {[sorted(c) for c in cycles]}"


#: The engine's packages, which the job queue (``apportion.runs``) is a client of.
ENGINE = ("apportion.scheduler", "apportion.worker")


def test_the_engine_never_imports_the_job_queue() -> None:
    """The job queue depends on the scheduler and the worker, never the other way: the
    scheduler hosts it as a companion, the worker runs its commands through the
    long-lived executor it is given."""
    found = [
        f"{name} imports {dep}"
        for name, deps in sorted(OWN.items())
        if TOOL.package_of(name) in ENGINE
        for dep in sorted(deps)
        if TOOL.package_of(dep) == "apportion.runs"
    ]
    assert not found, "\n".join(found)


def test_the_pure_modules_are_the_expected_ones() -> None:
    pure = {name for name in OWN if PURE.match(name)}
    assert {
        "apportion.scheduler.dispatch",
        "apportion.scheduler.state",
        "apportion.core.ledger",
    } <= pure
    assert "apportion.scheduler.service" not in pure
    assert "apportion.worker.state" in pure and "apportion.testing.simulation" in pure
    assert "apportion.worker.memory_policy" in pure
    # Split out of the worker's state machine, and as pure as it.
    assert {"apportion.worker.records", "apportion.worker.invariants"} <= pure


#: The shells around the state machine (the service, the simulation and its recording
#: variant): the only modules that turn its commands into wire messages.
#: ``scheduler.wire`` is pure (it only builds message dataclasses) but no module of
#: the state machine imports it, so decisions stay domain values.
WIRE_USERS = {
    "apportion.scheduler.service",
    "apportion.testing.simulation",
    "apportion.testing.recording",
}


def test_only_the_shells_turn_commands_into_messages() -> None:
    assert "apportion.scheduler.wire" in {name for name in OWN if PURE.match(name)}
    users = {name for name, deps in OWN.items() if "apportion.scheduler.wire" in deps}
    assert users == WIRE_USERS


def test_pure_modules_import_no_io_clock_or_randomness() -> None:
    broken = []
    for name in sorted(n for n in OWN if PURE.match(n)):
        seen = {name}
        todo = [(name, (name,))]
        while todo:
            current, path = todo.pop()
            outside = {d.partition(".")[0] for d in GRAPH[current] if d not in OWN}
            for bad in sorted(outside & IMPURE):
                if (current, bad) in ALLOWED_IMPURE:
                    continue
                broken.append(f"{' -> '.join(path)} imports {bad}")
            for dep in OWN[current] - seen:
                seen.add(dep)
                todo.append((dep, (*path, dep)))
    assert not broken, "\n".join(broken)


def test_the_drawing_in_the_docs_is_the_graph_of_today() -> None:
    drawing = (ROOT / "docs" / "imports.dot").read_text()
    assert drawing == TOOL.to_dot(GRAPH, True) + "\n", (
        "docs/imports.dot is stale: python tools/import_graph.py --packages > docs/imports.dot"
    )
