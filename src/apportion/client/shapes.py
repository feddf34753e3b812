"""The shapes futures and values come in: what ``gather``, ``scatter``, ``get`` and
``compute`` take apart into keys and put back together, in the same nesting."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from apportion.client.future import Future
from apportion.client.graph import wire_key
from apportion.core import payload

#: A failed future's value in ``gather(..., errors="skip")``: left out of the result.
SKIPPED = object()


def one_or_many(collections: Any) -> tuple[list[Any], bool]:
    """``compute``'s argument as a list, and whether it was a single collection."""
    if isinstance(collections, list | tuple | set | frozenset):
        return list(collections), False
    return [collections], True


def shaped(keys: Any, futures: Mapping[Any, Future]) -> Any:
    """The futures of ``keys``, in the nested lists ``keys`` came in."""
    if isinstance(keys, list):
        return [shaped(k, futures) for k in keys]
    return futures[keys]


def collect(obj: Any, out: list[Future]) -> None:
    """Append the futures in ``obj`` (nested lists, tuples, sets, dict values) to ``out``."""
    if isinstance(obj, Future):
        out.append(obj)
    elif isinstance(obj, list | tuple | set | frozenset):
        for item in obj:
            collect(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            collect(item, out)


def rebuild(obj: Any, values: dict[str, Any]) -> Any:
    """``obj`` with each future replaced by its key's value; ``SKIPPED`` ones left out."""
    if isinstance(obj, Future):
        value = values[obj.key]
        return None if value is SKIPPED else value
    if isinstance(obj, list | tuple | set | frozenset):
        items = (rebuild(item, values) for item in obj if not _skipped(item, values))
        return type(obj)(items)
    if isinstance(obj, dict):
        return {k: rebuild(v, values) for k, v in obj.items() if not _skipped(v, values)}
    return obj


def _skipped(obj: Any, values: dict[str, Any]) -> bool:
    return isinstance(obj, Future) and values.get(obj.key) is SKIPPED


def listed(data: Any) -> list[Any]:
    """The values ``scatter`` stores for ``data`` that is not a mapping, in order."""
    return list(data) if isinstance(data, list | tuple) else [data]


def held(value: Any) -> Any:
    """A scattered value that holds futures, made on a worker (``scatter``)."""
    return value


def held_call(value: Any) -> tuple[Any, ...]:
    """The function and arguments of the task that makes ``value``, which holds
    futures, on a worker: there each future in the arguments is its part's value.
    A Dask collection is rebuilt there from its graph, not unpickled: Dask's
    expressions are cached by name, so a worker in this very process would be
    handed back this collection, futures and all."""
    if hasattr(value, "__dask_postpersist__") and not isinstance(value, type):
        rebuild, extra = value.__dask_postpersist__()
        return rebuilt, rebuild, dict(value.__dask_graph__()), tuple(extra)
    return held, value


def rebuilt(rebuild: Callable[..., Any], graph: dict[Any, Any], extra: tuple[Any, ...]) -> Any:
    """A Dask collection made from its graph, as ``persist`` makes one (``held_call``)."""
    return rebuild(graph, *extra)


def scatter_items(
    data: Any, hash: bool, unique: Callable[[], str]
) -> tuple[list[str], dict[str, payload.Pickled], set[str]]:
    """The keys ``scatter`` stores ``data`` under, in order, each one's pickle, and
    the keys whose values hold futures (a persisted collection): a mapping's own
    keys, else each value's type and the hash of its pickle (or, not ``hash``, a
    name from ``unique()``, so that equal values stay apart)."""
    if isinstance(data, Mapping):
        names = [wire_key(k) for k in data]
        if len(set(names)) != len(names):
            raise ValueError("scatter keys must stay distinct as strings (e.g. 1 and '1')")
        seq: Any = data.values()
    else:
        seq = listed(data)
    pickled = [payload.dumps_referring(v) for v in seq]
    blobs = [blob for blob, _ in pickled]
    if not isinstance(data, Mapping):
        names = [
            f"{type(v).__name__}-"
            + (
                payload.hash_into(hashlib.blake2b(digest_size=16), b).hexdigest()
                if hash
                else unique()
            )
            for v, b in zip(seq, blobs, strict=True)
        ]
    holding = {name for name, (_, refs) in zip(names, pickled, strict=True) if refs}
    return names, dict(zip(names, blobs, strict=True)), holding
