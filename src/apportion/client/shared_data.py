"""Data and facts kept by the scheduler: datasets, metadata, who has what, and copies
of results (replicate, rebalance); each a function of the client's ``SchedulerLink``.

A dataset travels as one pickle of the published object in which every future is a
reference to its key (``core.payload``), plus the list of those keys. The scheduler
keeps both without opening the bytes; a reader unpickles with each reference
turned into a future of its own client, so a persisted Dask collection comes back
as the same collection, made of the reader's futures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, MutableMapping
from functools import partial
from typing import Any

import msgpack

from apportion.client.asynchronous import settled
from apportion.client.future import Future
from apportion.client.link import SchedulerLink
from apportion.client.state import ERROR
from apportion.client.waiting import futures_of
from apportion.core import payload
from apportion.protocol.base import Message
from apportion.protocol.cluster import (
    BacklogRequest,
    ClusterFactsRequest,
    InfoRequest,
    StatusRequest,
)
from apportion.protocol.shared_data import (
    DatasetReply,
    DatasetRequest,
    MetadataReply,
    MetadataRequest,
    PublishDataset,
    RebalanceKeys,
    ReplicateKeys,
    SetMetadata,
    SharedDataAck,
    UnpublishDataset,
)
from apportion.protocol.tasks import SubmitTasks, WhoHasReply, WhoHasRequest
from apportion.scheduler.records import worker_aliases


class _NoDefault:
    def __repr__(self) -> str:
        return "<no default>"


#: Makes the client's future of a key.
MakeFuture = Callable[[str], Future]

#: ``default`` not given: a missing name or key raises ``KeyError``.
NO_DEFAULT: Any = _NoDefault()


# --- datasets -------------------------------------------------------------------


def publish_dataset(
    link: SchedulerLink, /, *args: Any, name: Any = None, override: bool = False, **kwargs: Any
) -> Any:
    """Publish named data for other clients: ``publish_dataset(x=future)``,
    ``publish_dataset(df, name="x")`` or ``publish_dataset({"x": df})``.

    Futures and persisted collections keep their results in the cluster until the
    dataset is unpublished, whether or not this client stays. Any other object is
    stored as it is (pickled). A name already published raises ``KeyError``
    unless ``override=True``. Names are strings (others are turned into them).
    """
    link.check_open()
    items: list[tuple[Any, Any]] = list(kwargs.items())
    if name is not None:
        if not args:
            raise ValueError(
                "If name is provided, expecting call signature like publish_dataset(df, name='ds')"
            )
        items.append((name, args[0] if len(args) == 1 else args))
    elif args:
        if len(args) != 1 or not isinstance(args[0], Mapping):
            raise ValueError("If name is omitted, positional argument must be a {name: value} dict")
        items.extend(args[0].items())
    packed = [(_name(item), *payload.pack_call((value,), {})) for item, value in items]
    return link.run(_publish, link, packed, int(override))


async def _publish(
    link: SchedulerLink, packed: list[tuple[str, bytes, set[str]]], override: int
) -> None:
    for item_name, blob, keys in packed:
        reply = await link.request(
            partial(
                PublishDataset,
                name=item_name,
                data=blob,
                keys=sorted(keys),
                override=override,
            )
        )
        if reply.error:
            raise KeyError(reply.error)


def unpublish_dataset(link: SchedulerLink, name: Any) -> Any:
    """Remove published datasets (one name or a list); their results may then go."""
    names = [_name(n) for n in (name if isinstance(name, list) else [name])]
    return link.ask(partial(UnpublishDataset, names=names), _nothing)


def list_datasets(link: SchedulerLink) -> Any:
    """The names of the published datasets, sorted."""
    return link.ask(partial(DatasetRequest, name=""), _names)


def get_dataset(
    link: SchedulerLink, future: MakeFuture, name: Any, default: Any = NO_DEFAULT
) -> Any:
    """The object published as ``name`` (a list of them for a list of names), its
    futures now this client's (``future(key)`` makes one); ``default`` (if given)
    for a name not published."""
    link.check_open()
    names = name if isinstance(name, list) else [name]
    return link.run(
        _get_datasets,
        link,
        names,
        default,
        then=partial(_opened, link, future, isinstance(name, list)),
    )


async def _get_datasets(link: SchedulerLink, names: list[Any], default: Any) -> list[Any]:
    """On the client's loop: each name's reply, still pickled (or ``default``)."""
    found: list[Any] = []
    for name in names:
        reply = await link.request(partial(DatasetRequest, name=_name(name)))
        if not reply.found:
            if default is NO_DEFAULT:
                raise KeyError(f"Dataset '{name}' not found; published: {list(reply.names)}")
            found.append(_Default(default))
            continue
        found.append(reply)
    return found


class _Default:
    """A name not published, given its default (which may be any value)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _opened(link: SchedulerLink, future: MakeFuture, several: bool, found: list[Any]) -> Any:
    """On the asking thread: the datasets unpickled there (``results.loads_here``
    says why not on the client's loop), their futures this client's."""
    values = []
    for reply in found:
        if isinstance(reply, _Default):
            values.append(reply.value)
            continue
        futures = _ClientFutures(future)
        (value,), _ = payload.unpack_call(reply.data, futures)
        if futures.made:
            # This client wants them too; the scheduler answers with their states.
            link.post(SubmitTasks([], {}, sorted(futures.made)))
        values.append(value)
    return values if several else values[0]


def datasets(link: SchedulerLink, future: MakeFuture) -> Datasets:
    """The published datasets as a mutable mapping (see ``Datasets``)."""
    return Datasets(link, future)


# --- metadata -------------------------------------------------------------------


def set_metadata(link: SchedulerLink, key: Any, value: Any) -> Any:
    """Store a plain (msgpack-able) value on the scheduler; a list key is a path into
    nested dictionaries made on the way, as Dask's ``set_metadata``."""
    try:
        msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"metadata must be plain data (msgpack): {exc}") from None
    path = _path(key)
    return link.ask(partial(SetMetadata, path=path, value=value), _metadata_set)


def get_metadata(link: SchedulerLink, keys: Any, default: Any = NO_DEFAULT) -> Any:
    """The value stored at ``keys`` (one key or a path); ``KeyError`` without a default."""
    path = _path(keys)
    return link.ask(
        partial(MetadataRequest, path=path), partial(_metadata, keys=keys, default=default)
    )


# --- who has what ---------------------------------------------------------------


def waiting_work(link: SchedulerLink) -> Any:
    """What the waiting work asks for and what each worker runs: ``{"queued": [...],
    "workers": [...]}`` (``scheduler.backlog``); what adaptive clusters decide from."""
    return link.ask(
        lambda rid: BacklogRequest(rid),
        lambda reply: {"queued": reply.queued, "workers": reply.workers},
    )


def cluster_status(
    link: SchedulerLink, stream_since: int = 0, events_since: int = 0, stream_limit: int = 5_000
) -> Any:
    """The cluster's status as the dashboard shows it (``scheduler.status``): pools
    per worker with the tasks holding each unit, tasks by state and group, the
    waiting requests with why they wait, and the task stream's executions and
    the scheduler's warnings numbered after ``stream_since`` and ``events_since``."""
    return link.ask(
        lambda rid: StatusRequest(rid, stream_since, events_since, stream_limit),
        lambda reply: reply.status,
    )


def _facts(link: SchedulerLink, then: Callable[[Any], Any]) -> Any:
    return link.ask(lambda rid: ClusterFactsRequest(rid), then)


def who_has(link: SchedulerLink, futures: Any = None) -> Any:
    """Worker addresses holding each key: of ``futures``, or of every task known."""
    if futures is None:
        return _facts(link, lambda facts: dict(facts.who_has))
    keys = list(dict.fromkeys(f.key for f in futures_of(futures)))

    def holders(reply: WhoHasReply) -> dict[str, list[str]]:
        return {key: list(reply.who_has.get(key, [])) for key in keys}

    return link.ask(partial(WhoHasRequest, keys=keys), holders)


def has_what(link: SchedulerLink, workers: Any = None) -> Any:
    """The keys whose results each worker (by address) holds."""
    wanted = None if workers is None else _addresses(workers)
    return _facts(link, lambda facts: _by_worker(facts.has_what, wanted, []))


def nthreads(link: SchedulerLink, workers: Any = None) -> Any:
    """Threads of each worker, by address."""
    wanted = None if workers is None else _addresses(workers)
    return _facts(link, lambda facts: _by_worker(facts.nthreads, wanted, None))


#: Dask's older name for ``nthreads``.
ncores = nthreads


def processing(link: SchedulerLink, workers: Any = None) -> Any:
    """The keys assigned to each worker (running, or queued there to run next)."""
    wanted = None if workers is None else _addresses(workers)
    return _facts(link, lambda facts: _by_worker(facts.processing, wanted, []))


# --- retry and copies -----------------------------------------------------------


def replicate(
    link: SchedulerLink,
    futures: Any,
    n: int | None = None,
    workers: Any = None,
    branching_factor: int = 2,
) -> Any:
    """Copy results until ``n`` workers (all if None) of ``workers`` (addresses or
    names; all if None) hold each; copies beyond ``n`` there are dropped. Blocks
    (or, asynchronous, gives an awaitable) until done. ``branching_factor`` is
    accepted for Dask's sake: copies are relayed by the scheduler, not passed on
    from worker to worker."""
    if n is not None and n < 1:
        raise ValueError(f"replicate: n must be 1 or more, not {n}: it cannot delete data")
    link.check_open()
    found = futures_of(futures)
    names = None if workers is None else _addresses(workers)
    return link.run(copy_results, link, found, n, names)


async def copy_results(
    link: SchedulerLink, found: list[Future], n: int | None, names: list[str] | None
) -> None:
    """On the session's loop: once ``found`` are done, copy their results."""
    for future in found:
        await settled(future._key_state)
    keys = sorted({f.key for f in found if f.status != ERROR})
    known = await _known_names(link, names)
    await link.request(partial(ReplicateKeys, keys=keys, n=n or 0, workers=known))


def rebalance(link: SchedulerLink, futures: Any = None, workers: Any = None) -> Any:
    """Move results so that the workers (all, or ``workers``) hold about as many bytes
    each: from the fullest to the emptiest, while a move narrows the gap. Blocks
    (or, asynchronous, gives an awaitable) until done."""
    link.check_open()
    found = None if futures is None else futures_of(futures)
    names = None if workers is None else _addresses(workers)
    return link.run(_rebalance, link, found, names)


async def _rebalance(
    link: SchedulerLink, found: list[Future] | None, names: list[str] | None
) -> None:
    keys: list[str] = []
    for future in found or ():
        await settled(future._key_state)
    if found is not None:
        keys = sorted({f.key for f in found})
    known = await _known_names(link, names)
    await link.request(
        partial(RebalanceKeys, keys=keys, all_keys=int(found is None), workers=known)
    )


async def _known_names(link: SchedulerLink, names: list[str] | None) -> list[str]:
    """``workers=`` as names; a name that matches no connected worker is an error
    here rather than a copy that silently goes nowhere."""
    if names is None:
        return []
    reply = await link.request(lambda rid: InfoRequest(rid))
    known: set[str] = set()
    for address, worker in reply.info["workers"].items():
        known |= worker_aliases(worker["name"], address)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"no connected worker is named, or listens at, {', '.join(map(repr, unknown))}"
        )
    return names


class Datasets(MutableMapping[str, Any]):
    """``client.datasets``: the published datasets as a dictionary.

    As Dask's: on an asynchronous client, from its loop, ``await datasets[name]``,
    ``await datasets.get(name, default)`` and ``async for name in datasets`` work;
    what Python cannot await (``datasets[name] = x``, ``del``, ``in``, ``len``,
    plain ``for``) raises ``TypeError`` naming the call to await instead, rather
    than doing nothing with an awaitable no one awaits.
    """

    __slots__ = ("_future", "_link")

    def __init__(self, link: SchedulerLink, future: MakeFuture) -> None:
        self._link = link
        self._future = future

    def __getitem__(self, name: str) -> Any:
        return get_dataset(self._link, self._future, name)

    def get(self, name: str, default: Any = None) -> Any:
        """The dataset ``name``, or ``default`` if none is published under it (an
        awaitable of it on an asynchronous client)."""
        return get_dataset(self._link, self._future, name, default)

    def __setitem__(self, name: str, value: Any) -> None:
        self._blocking("datasets[name] = value", "await client.publish_dataset(name=value)")
        publish_dataset(self._link, value, name=name)

    def __delitem__(self, name: str) -> None:
        self._blocking("del client.datasets[name]", "await client.unpublish_dataset(name)")
        # As Dask's: deleting a name that is not published is not an error.
        unpublish_dataset(self._link, name)

    def __contains__(self, name: object) -> bool:
        self._blocking("name in client.datasets", "name in await client.list_datasets()")
        return _name(name) in list_datasets(self._link)

    def __iter__(self) -> Iterator[str]:
        self._blocking("iter(client.datasets) or 'for'", "'async for'")
        return iter(list_datasets(self._link))

    def __aiter__(self) -> AsyncIterator[str]:
        if not self._link.asynchronous:
            raise TypeError(
                "'async for' over client.datasets needs an asynchronous client, awaited "
                "from its event loop; iterate with 'for' instead"
            )
        return self._names()

    async def _names(self) -> AsyncIterator[str]:
        for name in await list_datasets(self._link):
            yield name

    def __len__(self) -> int:
        self._blocking("len(client.datasets)", "len(await client.list_datasets())")
        return len(list_datasets(self._link))

    def _blocking(self, what: str, instead: str) -> None:
        """``TypeError`` for ``what`` on an asynchronous client: it cannot be awaited."""
        if self._link.asynchronous:
            raise TypeError(
                f"{what} cannot be awaited on an asynchronous client: use {instead} instead"
            )


class _ClientFutures(Mapping[str, Future]):
    """What references to keys unpickle as for ``get_dataset``: this client's futures."""

    def __init__(self, future: MakeFuture) -> None:
        self._future = future
        self.made: dict[str, Future] = {}

    def __getitem__(self, key: str) -> Future:
        future = self.made.get(key)
        if future is None:
            future = self.made[key] = self._future(key)
        return future

    def __iter__(self) -> Iterator[str]:
        return iter(self.made)

    def __len__(self) -> int:
        return len(self.made)


def _nothing(reply: Message) -> None:
    return None


def _names(reply: DatasetReply) -> list[str]:
    return list(reply.names)


def _metadata_set(reply: SharedDataAck) -> None:
    if reply.error:
        raise ValueError(reply.error)


def _metadata(reply: MetadataReply, keys: Any, default: Any) -> Any:
    if reply.found:
        return reply.value
    if default is not NO_DEFAULT:
        return default
    raise KeyError(keys)


def _by_worker(values: dict[str, Any], workers: list[str] | None, missing: Any) -> dict[str, Any]:
    """``values`` of every worker, or of ``workers`` (those not known: ``missing``, or
    left out if that is None)."""
    if workers is None:
        return values
    if missing is None:
        return {w: values[w] for w in workers if w in values}
    return {w: values.get(w, missing) for w in workers}


def _name(name: object) -> str:
    return name if isinstance(name, str) else str(name)


def _path(keys: Any) -> list[str]:
    items = list(keys) if isinstance(keys, list | tuple) else [keys]
    return [_name(k) for k in items]


def _addresses(workers: Any) -> list[str]:
    return [workers] if isinstance(workers, str) else [str(w) for w in workers]
