"""Task graphs as apportion tasks: old-style (``{"x": 1, "y": (add, "x", 2)}``) and Dask's.

Each old-style entry becomes one task running ``core.payload.run_spec`` on the
entry, with every reference to another key replaced by a ``KeyRef``: pickling
records it as a dependency, unpickling on the worker turns it into that key's
value. An entry that is a Dask task node (``dask._task_spec.GraphNode``, what
Dask's collections produce now) names its dependencies itself; it becomes a task
running ``core.payload.run_node`` with a ``KeyRef`` for each of them.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from apportion.client.future import Future
from apportion.client.restrictions import ANYWHERE, Where, where_to_run
from apportion.core import payload
from apportion.core.demand import Demand, single
from apportion.core.resources import ResourceSpec
from apportion.protocol.tasks import TaskSpec


def wire_key(key: Any) -> str:
    """Keys travel as strings; Dask-style tuple keys keep their repr."""
    return key if isinstance(key, str) else repr(key)


def flatten_keys(keys: Any) -> Iterator[Any]:
    if isinstance(keys, list):
        for k in keys:
            yield from flatten_keys(k)
    else:
        yield keys


def _is_node(value: Any) -> bool:
    """A Dask task node; such values exist only once Dask's task module is imported."""
    module = sys.modules.get("dask._task_spec")
    return module is not None and isinstance(value, module.GraphNode)


def _is_key(value: Any, dsk: Mapping[Any, Any]) -> bool:
    try:
        return value in dsk
    except TypeError:  # unhashable values are never keys
        return False


def _convert(value: Any, canon: Mapping[Any, Any]) -> Any:
    """An old-style graph value with each reference to a key made a ``KeyRef``."""
    if isinstance(value, tuple) and value and callable(value[0]):
        return (value[0], *(_convert(arg, canon) for arg in value[1:]))
    if isinstance(value, list):
        return [_convert(item, canon) for item in value]
    if _is_key(value, canon):
        return payload.KeyRef(wire_key(canon[value]))
    return value


def _references(value: Any, dsk: Mapping[Any, Any]) -> Iterator[Any]:
    if _is_node(value):
        yield from value.dependencies
    elif isinstance(value, tuple) and value and callable(value[0]):
        for arg in value[1:]:
            yield from _references(arg, dsk)
    elif isinstance(value, list):
        for item in value:
            yield from _references(item, dsk)
    elif _is_key(value, dsk):
        yield value


def canonical_keys(dsk: Mapping[Any, Any]) -> dict[Any, Any]:
    """Each key of ``dsk`` by itself: a reference equal to a key but spelt otherwise
    (``("x", numpy.int64(0))`` for ``("x", 0)``) must travel under the key's own name."""
    return {key: key for key in dsk}


def needed_in_order(
    dsk: Mapping[Any, Any], keys: Any, canon: Mapping[Any, Any] | None = None
) -> list[Any]:
    """Keys needed for ``keys`` (as ``dsk`` spells them), dependencies first.

    Raises ``ValueError`` on a cycle, ``KeyError`` for a key the graph lacks.
    """
    canon = canonical_keys(dsk) if canon is None else canon
    order: list[Any] = []
    done: set[Any] = set()
    for root in flatten_keys(keys):
        if not _is_key(root, canon):
            raise KeyError(f"{root!r} is not a key of the graph")
        root = canon[root]
        if root in done:
            continue
        stack: list[tuple[Any, Iterator[Any]]] = [(root, _references(dsk[root], canon))]
        active = {root}
        while stack:
            key, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                active.discard(key)
                if key not in done:
                    done.add(key)
                    order.append(key)
            elif not _is_key(child, canon):
                raise KeyError(f"{key!r} depends on {child!r}, which is not in the graph")
            elif child in active:
                raise ValueError(f"the graph has a cycle through {child!r}")
            elif child not in done:
                child = canon[child]
                active.add(child)
                stack.append((child, _references(dsk[child], canon)))
    return order


def start_order(dsk: Mapping[Any, Any], needed: list[Any]) -> list[Any]:
    """``needed`` (dependencies first) in the order its tasks should start: Dask's own
    ``dask.order`` when Dask is imported (it is for every Dask collection), which
    starts each task when that lets its inputs be released soonest; else as given,
    depth first from the outputs."""
    if "dask" not in sys.modules or len(needed) < 2:
        return needed
    from dask.order import order  # Dask is imported already: never imported for this

    try:
        priorities = order({key: dsk[key] for key in needed})
    except Exception:  # a graph Dask's order cannot read still runs, depth first
        return needed
    return sorted(needed, key=priorities.__getitem__)


def _demand_by_key(
    dsk: Mapping[Any, Any], resources: ResourceSpec | Mapping[Any, ResourceSpec]
) -> tuple[Demand, dict[Any, Demand]]:
    """One demand for all tasks, or per key (keys or tuples of keys -> spec)."""
    if not names_keys(resources, dsk):
        return single(resources), {}  # type: ignore[arg-type]
    assert isinstance(resources, Mapping)
    per_key: dict[Any, Demand] = {}
    for target, spec in resources.items():
        demand = single(spec)  # type: ignore[arg-type]
        for key in _group(target, dsk):
            per_key[key] = demand
    if not per_key:
        # Typically keys renamed by Dask's task fusion (dask.compute optimises first).
        warnings.warn(
            f"resources given by key name none of this graph's {len(dsk)} tasks: "
            "they ask for no resources",
            stacklevel=4,
        )
    return single(None), per_key


def _group(target: Any, dsk: Mapping[Any, Any]) -> Iterator[Any]:
    """The keys a per-key resources entry names: a key, or a tuple of keys (such as
    ``tuple(bag.__dask_keys__())``), possibly nested."""
    if _is_key(target, dsk):
        yield target
    elif isinstance(target, tuple):
        for item in target:
            yield from _group(item, dsk)


def names_keys(resources: Any, dsk: Mapping[Any, Any]) -> bool:
    """``resources`` maps keys of ``dsk`` (or groups of them) to demands, rather than
    being one demand (``{"GPU": 1}``) for every task. Keys it names that ``dsk``
    lacks are ignored: one mapping may serve several graphs."""
    if not isinstance(resources, Mapping) or not resources:
        return False
    if any(isinstance(v, Mapping) or (isinstance(v, str) and "=" in v) for v in resources.values()):
        return True  # a single demand's amounts are never mappings nor "name=amount"
    return all(isinstance(v, str) for v in resources.values()) and any(
        _is_key(k, dsk) or isinstance(k, tuple) for k in resources
    )


#: Dask annotations (``dask.annotate(...)``) that apportion honours, per key.
ANNOTATIONS = (
    "resources",
    "priority",
    "retries",
    "workers",
    "allow_other_workers",
    "loose_restrictions",
)


def _per_key_where(annotations: Mapping[str, Mapping[Any, Any]], where: Where) -> dict[Any, Where]:
    """Where each annotated key may run: its own ``workers`` and ``allow_other_workers``
    annotations, each falling back to the whole graph's (``where``) when absent."""
    names = annotations.get("workers", {})
    loose = {
        **annotations.get("loose_restrictions", {}),
        **annotations.get("allow_other_workers", {}),
    }
    out: dict[Any, Where] = {}
    for key in names.keys() | loose.keys():
        try:
            out[key] = where_to_run(
                names[key] if key in names else where[0],
                loose[key] if key in loose else bool(where[1]),
                strict=False,
            )
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"workers annotated on {key!r}: {exc}") from None
    return out


def _per_key_annotations(
    annotations: Mapping[str, Mapping[Any, Any]],
) -> tuple[dict[Any, Demand], dict[Any, int], dict[Any, int]]:
    """Demands, priorities and retries given to single keys, checked."""
    demands: dict[Any, Demand] = {}
    for key, spec in annotations.get("resources", {}).items():
        try:
            demands[key] = single(spec)
        except ValueError as exc:
            raise ValueError(f"resources annotated on {key!r}: {exc}") from None
    numbers: list[dict[Any, int]] = []
    for name in ("priority", "retries"):
        checked: dict[Any, int] = {}
        for key, value in annotations.get(name, {}).items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} annotated on {key!r} must be an int, not {value!r}")
            checked[key] = value
        numbers.append(checked)
    return demands, numbers[0], numbers[1]


def _existing(value: Any, name: str) -> bool:
    """A persisted collection's entry: the future of this very key, computed or on its way."""
    if _is_node(value) and hasattr(value, "value"):  # Dask wraps plain values in a DataNode
        value = value.value
    return isinstance(value, Future) and value.key == name


def graph_tasks(
    pickled: Callable[[Callable[..., Any]], tuple[str, bytes]],
    dsk: Mapping[Any, Any],
    keys: Any,
    resources: ResourceSpec | Mapping[Any, ResourceSpec],
    priority: int,
    retries: int,
    annotations: Mapping[str, Mapping[Any, Any]] | None = None,
    canon: Mapping[Any, Any] | None = None,
    where: Where = ANYWHERE,
) -> Iterator[tuple[TaskSpec, bytes]]:
    """The tasks needed for ``keys``, dependencies first, with the function blob
    (``pickled(function)``: its id and pickle, as the client caches them).

    ``annotations`` (Dask's, by type then key) override ``resources``, ``priority``,
    ``retries`` and where tasks may run (``where``) for the keys they name.
    ``canon`` is ``canonical_keys(dsk)`` if the caller has it already.
    """
    # Each key's wire name, worked out once: a reference to a key spelt otherwise
    # (``numpy.int64(0)`` for ``0``) finds the name of the key it equals here.
    names: dict[Any, str] = {}
    seen: dict[str, Any] = {}
    for key in dsk:
        name = wire_key(key)
        if name in seen:
            raise ValueError(f"graph keys {seen[name]!r} and {key!r} both travel as {name!r}")
        seen[name] = key
        names[key] = name
    common, per_key = _demand_by_key(dsk, resources)
    demands, priorities, retry_counts = _per_key_annotations(annotations or {})
    places = _per_key_where(annotations or {}, where)
    canon = canonical_keys(dsk) if canon is None else canon
    common_wire = common.wire()  # most tasks ask for the graph's demand: put in wire form once
    for key in start_order(dsk, needed_in_order(dsk, keys, canon)):
        value = dsk[key]
        name = names[key]
        if _existing(value, name):
            continue
        if _is_node(value):
            refs = {dep: payload.KeyRef(names[dep]) for dep in value.dependencies}
            args, deps = payload.pack_call((value, refs), {})
            func_id, blob = pickled(payload.run_node)
        else:
            args, deps = payload.pack_call((_convert(value, canon),), {})
            func_id, blob = pickled(payload.run_spec)
        own = demands.get(key, per_key.get(key))
        first, alternatives = common_wire if own is None else own.wire()
        spec = TaskSpec(
            name,
            func_id,
            args,
            sorted(deps),
            first,
            priorities.get(key, priority),
            retry_counts.get(key, retries),
            alternatives,
            *places.get(key, where),
        )
        yield spec, blob
