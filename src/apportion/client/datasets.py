"""Client methods for data and facts kept by the scheduler: datasets, metadata, who has what,
retrying failed tasks, and copies of results (replicate, rebalance).

A dataset travels as one pickle of the published object in which every future is a
reference to its key (``core.payload``), plus the list of those keys. The scheduler
keeps both without opening the bytes; a reader unpickles with each reference
turned into a future of its own client, so a persisted Dask collection comes back
as the same collection, made of the reader's futures.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, MutableMapping
from functools import partial
from typing import TYPE_CHECKING, Any

import msgpack

from apportion.client.future import ERROR, Future
from apportion.client.waiting import futures_of
from apportion.core import payload
from apportion.protocol import messages as m
from apportion.scheduler.records import worker_aliases

if TYPE_CHECKING:
    from apportion.client.future import KeyState
    from apportion.client.session import Session


class _NoDefault:
    def __repr__(self) -> str:
        return "<no default>"


#: ``default`` not given: a missing name or key raises ``KeyError``.
NO_DEFAULT: Any = _NoDefault()


class SharedData:
    """Part of ``Client``; see the module docstring."""

    if TYPE_CHECKING:
        _session: Session
        _keys: dict[str, KeyState]
        _lock: threading.RLock
        timeout: float

        def _check_open(self) -> None: ...

    # --- datasets -------------------------------------------------------------------

    def publish_dataset(
        self, *args: Any, name: Any = None, override: bool = False, **kwargs: Any
    ) -> None:
        """Publish named data for other clients: ``publish_dataset(x=future)``,
        ``publish_dataset(df, name="x")`` or ``publish_dataset({"x": df})``.

        Futures and persisted collections keep their results in the cluster until the
        dataset is unpublished, whether or not this client stays. Any other object is
        stored as it is (pickled). A name already published raises ``KeyError``
        unless ``override=True``. Names are strings (others are turned into them).
        """
        self._check_open()
        items: list[tuple[Any, Any]] = list(kwargs.items())
        if name is not None:
            if not args:
                raise ValueError(
                    "If name is provided, expecting call signature like "
                    "publish_dataset(df, name='ds')"
                )
            items.append((name, args[0] if len(args) == 1 else args))
        elif args:
            if len(args) != 1 or not isinstance(args[0], Mapping):
                raise ValueError(
                    "If name is omitted, positional argument must be a {name: value} dict"
                )
            items.extend(args[0].items())
        for item_name, value in items:
            blob, keys = payload.pack_call((value,), {})
            reply = self._session.call(
                partial(
                    m.PublishDataset,
                    name=_name(item_name),
                    data=blob,
                    keys=sorted(keys),
                    override=int(override),
                )
            )
            if reply.error:
                raise KeyError(reply.error)

    def unpublish_dataset(self, name: Any) -> None:
        """Remove published datasets (one name or a list); their results may then go."""
        names = [_name(n) for n in (name if isinstance(name, list) else [name])]
        self._session.call(partial(m.UnpublishDataset, names=names))

    def list_datasets(self) -> list[str]:
        """The names of the published datasets, sorted."""
        reply = self._session.call(partial(m.DatasetRequest, name=""))
        return list(reply.names)

    def get_dataset(self, name: Any, default: Any = NO_DEFAULT) -> Any:
        """The object published as ``name`` (a list of them for a list of names), its
        futures now this client's; ``default`` (if given) for a name not published."""
        if isinstance(name, list):
            return [self.get_dataset(n, default) for n in name]
        self._check_open()
        reply = self._session.call(partial(m.DatasetRequest, name=_name(name)))
        if not reply.found:
            if default is not NO_DEFAULT:
                return default
            raise KeyError(f"Dataset '{name}' not found; published: {list(reply.names)}")
        futures = _ClientFutures(self)
        (value,), _ = payload.unpack_call(reply.data, futures)
        if futures.made:
            # This client wants them too; the scheduler answers with their states.
            self._session.post(m.SubmitTasks([], {}, sorted(futures.made)))
        return value

    @property
    def datasets(self) -> Datasets:
        """The published datasets as a mutable mapping: get, set, delete, ``in``, iterate."""
        return Datasets(self)

    # --- metadata -------------------------------------------------------------------

    def set_metadata(self, key: Any, value: Any) -> None:
        """Store a plain (msgpack-able) value on the scheduler; a list key is a path into
        nested dictionaries made on the way, as Dask's ``set_metadata``."""
        try:
            msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"metadata must be plain data (msgpack): {exc}") from None
        path = _path(key)
        reply = self._session.call(partial(m.SetMetadata, path=path, value=value))
        if reply.error:
            raise ValueError(reply.error)

    def get_metadata(self, keys: Any, default: Any = NO_DEFAULT) -> Any:
        """The value stored at ``keys`` (one key or a path); ``KeyError`` without a default."""
        path = _path(keys)
        reply = self._session.call(partial(m.MetadataRequest, path=path))
        if reply.found:
            return reply.value
        if default is not NO_DEFAULT:
            return default
        raise KeyError(keys)

    # --- who has what ---------------------------------------------------------------

    def _facts(self) -> Any:
        return self._session.call(lambda rid: m.ClusterFactsRequest(rid))

    def who_has(self, futures: Any = None) -> dict[str, list[str]]:
        """Worker addresses holding each key: of ``futures``, or of every task known."""
        if futures is None:
            return dict(self._facts().who_has)
        keys = list(dict.fromkeys(f.key for f in futures_of(futures)))
        reply = self._session.call(partial(m.WhoHasRequest, keys=keys))
        return {key: list(reply.who_has.get(key, [])) for key in keys}

    def has_what(self, workers: Any = None) -> dict[str, list[str]]:
        """The keys whose results each worker (by address) holds."""
        held: dict[str, list[str]] = self._facts().has_what
        if workers is None:
            return held
        return {w: held.get(w, []) for w in _addresses(workers)}

    def nthreads(self, workers: Any = None) -> dict[str, int]:
        """Threads of each worker, by address."""
        threads: dict[str, int] = self._facts().nthreads
        if workers is None:
            return threads
        return {w: threads[w] for w in _addresses(workers) if w in threads}

    #: Dask's older name for ``nthreads``.
    ncores = nthreads

    def processing(self, workers: Any = None) -> dict[str, list[str]]:
        """The keys assigned to each worker (running, or queued there to run next)."""
        running: dict[str, list[str]] = self._facts().processing
        if workers is None:
            return running
        return {w: running.get(w, []) for w in _addresses(workers)}

    # --- retry and copies -----------------------------------------------------------

    def retry(self, futures: Any) -> None:
        """Run failed futures again, with the failed tasks they depend on; they go back
        to pending. A failure the scheduler has forgotten fails again, saying so."""
        self._check_open()
        keys = []
        for future in futures_of(futures):
            if future.status == ERROR and future.key not in keys:
                # Before the request: the outcome of the new run must find it pending.
                future._state.reset()
                keys.append(future.key)
        if keys:
            self._session.post(m.RetryKeys(keys))

    def replicate(
        self, futures: Any, n: int | None = None, workers: Any = None, branching_factor: int = 2
    ) -> None:
        """Copy results until ``n`` workers (all if None) of ``workers`` (addresses or
        names; all if None) hold each; copies beyond ``n`` there are dropped. Blocks
        until done. ``branching_factor`` is accepted for Dask's sake: copies are
        relayed by the scheduler, not passed on from worker to worker."""
        self._check_open()
        found = futures_of(futures)
        for future in found:
            future._wait(None)
        keys = sorted({f.key for f in found if f.status != ERROR})
        names = self._named_workers(workers)
        self._session.call(partial(m.ReplicateKeys, keys=keys, n=n or 0, workers=names))

    def rebalance(self, futures: Any = None, workers: Any = None) -> None:
        """Move results so that the workers (all, or ``workers``) hold about as many bytes
        each: from the fullest to the emptiest, while a move narrows the gap. Blocks
        until done."""
        self._check_open()
        keys: list[str] = []
        if futures is not None:
            found = futures_of(futures)
            for future in found:
                future._wait(None)
            keys = sorted({f.key for f in found})
        names = self._named_workers(workers)
        self._session.call(
            partial(m.RebalanceKeys, keys=keys, all_keys=int(futures is None), workers=names)
        )

    def _named_workers(self, workers: Any) -> list[str]:
        """``workers=`` as names; a name that matches no connected worker is an error
        here rather than a copy that silently goes nowhere."""
        if workers is None:
            return []
        names = _addresses(workers)
        connected = self._session.call(lambda rid: m.InfoRequest(rid)).info["workers"]
        known: set[str] = set()
        for address, worker in connected.items():
            known |= worker_aliases(worker["name"], address)
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(
                f"no connected worker is named, or listens at, {', '.join(map(repr, unknown))}"
            )
        return names


class Datasets(MutableMapping[str, Any]):
    """``client.datasets``: the published datasets as a dictionary."""

    __slots__ = ("_client",)

    def __init__(self, client: SharedData) -> None:
        self._client = client

    def __getitem__(self, name: str) -> Any:
        return self._client.get_dataset(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self._client.publish_dataset(value, name=name)

    def __delitem__(self, name: str) -> None:
        # As Dask's: deleting a name that is not published is not an error.
        self._client.unpublish_dataset(name)

    def __contains__(self, name: object) -> bool:
        return _name(name) in self._client.list_datasets()

    def __iter__(self) -> Iterator[str]:
        return iter(self._client.list_datasets())

    def __len__(self) -> int:
        return len(self._client.list_datasets())


class _ClientFutures(Mapping[str, Future]):
    """What references to keys unpickle as for ``get_dataset``: this client's futures."""

    def __init__(self, client: SharedData) -> None:
        self._client = client
        self.made: dict[str, Future] = {}

    def __getitem__(self, key: str) -> Future:
        future = self.made.get(key)
        if future is None:
            future = self.made[key] = Future(key, self._client)  # type: ignore[arg-type]
        return future

    def __iter__(self) -> Iterator[str]:
        return iter(self.made)

    def __len__(self) -> int:
        return len(self.made)


def _name(name: object) -> str:
    return name if isinstance(name, str) else str(name)


def _path(keys: Any) -> list[str]:
    items = list(keys) if isinstance(keys, list | tuple) else [keys]
    return [_name(k) for k in items]


def _addresses(workers: Any) -> list[str]:
    return [workers] if isinstance(workers, str) else [str(w) for w in workers]
