"""Dask collections (delayed, bag, array, dataframe) turned into graphs for apportion.

Dask stays optional: nothing here imports it before a collection is handed over,
and no collection exists unless Dask was imported. Dask lowers each collection
into an expression, optimises it and renders it as a graph of task nodes; the
client submits the graphs together as it submits any other (``client.graph``),
with the ``dask.annotate`` annotations apportion honours (resources, priority,
retries).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apportion.client.graph import ANNOTATIONS, names_keys

#: The Dask releases whose collections lower into expressions (``collections_to_expr``).
MIN_DASK = "2025.4"


def is_collection(obj: Any) -> bool:
    """A Dask collection; false for everything while Dask is not imported."""
    dask = sys.modules.get("dask")
    return dask is not None and bool(dask.is_dask_collection(obj))


@dataclass(frozen=True, slots=True)
class Lowered:
    """Collections as one graph."""

    graph: Mapping[Any, Any]
    #: One entry per collection, in order: its final key (compute) or its keys as
    #: ``__dask_keys__`` nests them (persist).
    keys: list[Any]
    #: Annotations by type, then key (``{"resources": {key: {"GPU": 1}}}``).
    annotations: dict[str, dict[Any, Any]]


def lower(
    collections: Sequence[Any], *, optimize_graph: bool, finalize: bool, resources: Any = None
) -> Lowered:
    """One graph computing ``collections``; with ``finalize`` each ends in a single key
    holding its final value (a list for a bag, an array for an array, ...).

    ``resources`` is what the caller asks of the graph's tasks: one demand, or
    demands by key, which must then survive optimisation as annotations must.
    Each collection is lowered on its own: lowered together, Dask groups them by
    kind and gives their keys back in that order, not in the order given.
    """
    graph: dict[Any, Any] = {}
    keys: list[Any] = []
    annotations: dict[str, dict[Any, Any]] = {}
    for collection in collections:
        expr = _expression(collection, optimize_graph, finalize, resources)
        part, notes = expression_graph(expr)
        graph.update(part)
        for kind, by_key in notes.items():
            annotations.setdefault(kind, {}).update(by_key)
        if finalize:
            (final_key,) = expr.__dask_keys__()
            keys.append(final_key)
        else:
            keys.append(expr.__dask_keys__())
    return Lowered(graph, keys, annotations)


def _expression(collection: Any, optimize_graph: bool, finalize: bool, resources: Any) -> Any:
    try:
        from dask._expr import FinalizeCompute
        from dask.base import collections_to_expr
    except ImportError as exc:  # an old Dask: its collections are not expressions yet
        import dask

        raise ImportError(
            f"computing Dask collections needs dask {MIN_DASK} or later; "
            f"this is dask {dask.__version__}"
        ) from exc
    if optimize_graph:
        plain = collections_to_expr(collection, False)
        by_key = isinstance(resources, Mapping) and names_keys(resources, plain.__dask_graph__())
        if by_key or _annotated(plain):
            # Dask's low-level fusion renames tasks and drops layer annotations: a
            # fused task would run without the GPU its key was given. Resources
            # outrank fusion here.
            optimize_graph = False
    expr = collections_to_expr(collection, optimize_graph)
    if finalize:
        expr = FinalizeCompute(expr)
    return expr.optimize()


def _annotated(expr: Any) -> bool:
    """Some task of ``expr`` has an annotation apportion honours."""
    return any(kind in ANNOTATIONS for kind in expr.__dask_annotations__())


def expression_graph(expr: Any) -> tuple[dict[Any, Any], dict[str, dict[Any, Any]]]:
    """The graph and annotations of a Dask expression (what ``dask.compute`` hands a
    scheduler). Annotations active around the call (``with dask.annotate(...)``)
    apply to every key the expression's own do not cover."""
    import dask

    expr = _unfused_where_annotated(expr)
    graph = dict(expr.__dask_graph__())
    annotations = {kind: dict(by_key) for kind, by_key in expr.__dask_annotations__().items()}
    for kind, value in dask.get_annotations().items():
        by_key = annotations.setdefault(kind, {})
        for key in graph:
            by_key.setdefault(key, value(key) if callable(value) else value)
    return graph, annotations


def _unfused_where_annotated(expr: Any) -> Any:
    """``expr``, its annotated graphs optimised without Dask's low-level fusion.

    ``dask.compute`` optimises the expression before it reaches a scheduler, but a
    graph built from layers (arrays, bags, delayed) is only rendered, by its
    collection's optimiser, once the scheduler asks for it. That optimiser's
    low-level fusion renames tasks and drops their layers' annotations, so a task
    annotated with a GPU would run without one. Annotated graphs are rendered here
    with that fusion off; blockwise fusion stays, as it keeps annotations (a fused
    layer takes the largest demand of the layers it merges). Unannotated graphs are
    left to Dask's optimiser as they are.
    """
    from dask._expr import HLGExpr, _HLGExprSequence
    from dask.core import flatten
    from dask.highlevelgraph import HighLevelGraph

    if isinstance(expr, _HLGExprSequence) and all(isinstance(p, HLGExpr) for p in expr.operands):
        parts = list(expr.operands)
    elif isinstance(expr, HLGExpr):
        parts = [expr]
    else:  # expressions of Dask's own (dataframes) carry their annotations themselves
        return expr
    if not any(_annotated_layers(part.hlg) for part in parts):
        return expr
    graphs = [_optimised_keeping_annotations(part) for part in parts]
    keys = list(flatten(expr.__dask_keys__()))
    # Dask's own rendering of an optimised graph: its keys, its annotations by key.
    return _HLGExprSequence(HLGExpr(dsk=HighLevelGraph.merge(*graphs), output_keys=keys))


def _annotated_layers(hlg: Any) -> bool:
    return any(
        layer.annotations and any(kind in layer.annotations for kind in ANNOTATIONS)
        for layer in hlg.layers.values()
    )


def _optimised_keeping_annotations(part: Any) -> Any:
    import dask
    from dask.core import flatten
    from dask.highlevelgraph import HighLevelGraph

    keys = part.__dask_keys__()
    hlg = part.hlg
    optimizer = part.low_level_optimizer
    if optimizer is None:
        return hlg
    if not _annotated_layers(hlg):
        return optimizer(hlg, keys)
    with dask.config.set({"optimization.fuse.active": False, "optimization.fuse.delayed": False}):
        optimised = optimizer(hlg, keys)
    if isinstance(optimised, HighLevelGraph) and _annotated_layers(optimised):
        return optimised
    # This optimiser fuses whatever the configuration says (a bag's does): the
    # annotations outrank it, so the graph is only culled.
    return hlg.cull(set(flatten(keys)))
