"""Submitting work: ``submit`` and ``map`` make one task per call, ``submit_graph``
sends the tasks a Dask graph needs; each gives futures of the client's keys.

Functions of a ``SubmittingClient`` (a ``Client``): they make its futures and post its
tasks, and pickle each function once through its ``FunctionCache``.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from apportion.client.actors import actor_task
from apportion.client.errors import SchedulerGoneError
from apportion.client.future import Future, FutureOwner
from apportion.client.graph import canonical_keys, flatten_keys, graph_tasks, wire_key
from apportion.client.large_arguments import warn_if_large
from apportion.client.restrictions import ANYWHERE, Where, where_to_run
from apportion.client.session import TaskBatch
from apportion.client.state import CANCELLED, ERROR
from apportion.client.waiting import futures_of
from apportion.core import payload
from apportion.core.demand import PLAIN, Demand, demand_of
from apportion.core.resources import ResourceSpec
from apportion.protocol.tasks import RetryKeys, SubmitTasks, TaskSpec, WhoHasRequest

#: Functions kept pickled per client; a loop over fresh lambdas must not grow it forever.
_FUNC_CACHE_SIZE = 512
#: Tasks of a ``map`` posted to the scheduler together: few enough that the first
#: start while the rest are being pickled, many enough to cost the loop few wake-ups.
MAP_BATCH = 1000


class FunctionCache:
    """Each function pickled once, cached by identity, so that a loop of submits
    reuses the pickle (and the scheduler its id)."""

    def __init__(self) -> None:
        self._functions: dict[Any, tuple[str, bytes]] = {}

    def __call__(self, func: Callable[..., Any]) -> tuple[str, bytes]:
        """``func``'s id and pickle."""
        try:
            cached = self._functions.get(func)
        except TypeError:  # unhashable callable
            cached = None
        if cached is not None:
            return cached
        blob = payload.dumps_function(func)
        entry = (payload.function_id(blob), blob)
        with contextlib.suppress(TypeError):
            if len(self._functions) >= _FUNC_CACHE_SIZE:
                self._functions.clear()
            self._functions[func] = entry
        return entry


class SubmittingClient(FutureOwner, Protocol):
    """What submitting needs of a client (a ``Client``) beyond its futures."""

    @property
    def _function(self) -> FunctionCache: ...

    @property
    def timeout(self) -> float: ...

    @property
    def scheduler_address(self) -> str: ...

    def _unique_name(self) -> str: ...

    def _again(self, key: str, retry: bool = False) -> None: ...

    def _scheduler_gone(self, reason: str, kind: str = "gone") -> None: ...

    def _caught_up(self) -> None: ...


def task(
    client: SubmittingClient,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    key: str | None,
    demand: Demand,
    priority: int,
    retries: int,
    pure: bool,
    where: Where = ANYWHERE,
    actor: bool = False,
) -> Future:
    _check_call(func, key)
    func_id, blob = client._function(func)
    call = _Call(func_id, _name_of(func), demand, priority, retries, pure, where, actor)
    future, spec = call.prepare(client, args, kwargs, key, stacklevel=5)
    post_tasks(client, [(spec, blob, True)])
    return future


def _check_call(func: Callable[..., Any], key: object) -> None:
    if not callable(func):
        raise TypeError(f"first argument must be callable, not {type(func).__name__}")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}: {key!r}")


def _name_of(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", type(func).__name__)


class _Call:
    """What every task of one ``submit`` or ``map`` shares, worked out once: a
    ``map`` of 10,000 tasks looks its function up and turns its demand into wire
    form once, not per task."""

    __slots__ = (
        "actor",
        "demand",
        "first",
        "func_id",
        "name",
        "others",
        "priority",
        "pure",
        "retries",
        "where",
    )

    def __init__(
        self,
        func_id: str,
        name: str,
        demand: Demand,
        priority: int,
        retries: int,
        pure: bool,
        where: Where,
        actor: bool,
    ) -> None:
        self.func_id = func_id
        self.name = name
        self.demand = demand
        self.first, self.others = demand.wire()
        self.priority = priority
        self.retries = retries
        self.pure = pure
        self.where = where
        self.actor = actor

    def prepare(
        self,
        client: SubmittingClient,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        key: str | None,
        stacklevel: int,
    ) -> tuple[Future, TaskSpec]:
        """The future and the wire spec of one call; ``stacklevel`` of a large-argument
        warning names the user's line."""
        args_blob, deps = payload.pack_call(args, kwargs)
        warn_if_large(payload.size_of(args_blob), f"the arguments of {self.name!r}", stacklevel)
        if key is None:
            key = self._key(client, args_blob)
        future = Future(key, client)
        if future._key_state.status == CANCELLED:
            client._again(key)  # submitted again after a cancel: it runs again
        spec = TaskSpec(
            key,
            self.func_id,
            args_blob,
            sorted(deps),
            self.first,
            self.priority,
            self.retries,
            self.others,
            *self.where,
            actor=int(self.actor),
        )
        return future, spec

    def _key(self, client: SubmittingClient, args_blob: payload.Pickled) -> str:
        if not self.pure:
            return f"{self.name}-{client._unique_name()}"
        # The demand is part of the identity: the same call asking for other
        # resources must not be merged into an existing task.
        digest = hashlib.blake2b(self.func_id.encode(), digest_size=16)
        payload.hash_into(digest, args_blob)
        if self.demand != PLAIN:
            digest.update(repr([sorted(a.items()) for a in self.demand.alternatives]).encode())
        if self.where != ANYWHERE:  # so is where it may run, for the same reason
            digest.update(repr(self.where).encode())
        return f"{self.name}-{digest.hexdigest()}"


def submit(
    client: SubmittingClient,
    func: Callable[..., Any],
    *args: Any,
    key: str | None = None,
    workers: Any = None,
    resources: ResourceSpec | Sequence[ResourceSpec] = None,
    retries: int | None = 0,
    priority: int = 0,
    fifo_timeout: Any = "100 ms",
    allow_other_workers: bool | None = False,
    actor: bool = False,
    actors: bool = False,
    pure: bool = True,
    loose_restrictions: bool | None = None,
    **kwargs: Any,
) -> Future:
    """Run ``func(*args, **kwargs)`` on a worker where ``resources`` are free.

    Futures anywhere in the arguments become dependencies and are replaced by
    their results on the worker. With ``pure=True`` (the default, as in Dask)
    the same call yields the same key, so it is computed once.

    Dask's scheduling keywords never reach ``func``: ``workers=`` (addresses,
    names or hosts) restricts where it runs, ``allow_other_workers=True`` (or
    ``loose_restrictions=True``) makes that a preference. ``fifo_timeout`` has
    no effect: tasks start in submission order (within a priority) exactly.
    ``actor=True`` (or ``actors=True``) makes ``func``, a class, an actor: the
    object stays on its worker, holding the task's resources, and the future's
    result is an ``Actor`` handle whose method calls go straight to it.
    """
    client._link.check_open()
    return task(
        client,
        actor_task(func) if actor or actors else func,
        args,
        kwargs,
        key=key,
        demand=demand_of(resources),
        priority=priority,
        retries=retries or 0,
        pure=pure and not (actor or actors),  # every actor is an object of its own
        where=where_to_run(workers, allow_other_workers, loose_restrictions),
        actor=actor or actors,
    )


def map(
    client: SubmittingClient,
    func: Callable[..., Any],
    *iterables: Iterable[Any],
    key: str | list[str] | None = None,
    workers: Any = None,
    retries: int | None = 0,
    resources: ResourceSpec | Sequence[ResourceSpec] = None,
    priority: int = 0,
    allow_other_workers: bool | None = False,
    fifo_timeout: Any = "100 ms",
    actor: bool = False,
    actors: bool = False,
    pure: bool = True,
    batch_size: int | None = None,
    loose_restrictions: bool | None = None,
    **kwargs: Any,
) -> list[Future]:
    """``submit`` over zipped iterables; ``func`` is pickled once for all tasks.

    Takes ``submit``'s scheduling keywords, for every task. ``batch_size`` has
    no effect: every submission already travels in batches, one message per
    loop turn.
    """
    client._link.check_open()
    as_actors = actor or actors
    if as_actors:
        func = actor_task(func)
    where = where_to_run(workers, allow_other_workers, loose_restrictions)
    demand = demand_of(resources)
    calls = list(zip(*iterables, strict=False))
    if isinstance(key, list):
        if len(key) != len(calls):
            raise ValueError(f"{len(key)} keys given for {len(calls)} tasks")
        keys: list[str | None] = list(key)
    else:
        keys = [None] * len(calls)
    prefix = key if isinstance(key, str) else None
    if not calls:
        return []
    for task_key in keys:
        _check_call(func, task_key)
    func_id, blob = client._function(func)
    call = _Call(
        func_id,
        _name_of(func),
        demand,
        priority,
        retries or 0,
        pure and not as_actors,
        where,
        as_actors,
    )
    out = []
    batch: TaskBatch = []
    for i, (call_args, task_key) in enumerate(zip(calls, keys, strict=True)):
        if prefix is not None:
            task_key = f"{prefix}-{i}"
        future, spec = call.prepare(client, call_args, kwargs, task_key, stacklevel=4)
        out.append(future)
        batch.append((spec, blob, True))
        if len(batch) >= MAP_BATCH:
            post_tasks(client, batch)
            batch = []
    if batch:
        post_tasks(client, batch)
    return out


def caught_up(client: SubmittingClient) -> None:
    """Return once the scheduler has everything this client sent so far: another
    client's graph may use keys this one submitted, and connections do not keep
    order between them."""
    with contextlib.suppress(SchedulerGoneError):
        # Straight on the loop, not ``call``: an asynchronous client's persist has
        # no awaitable form, and one round trip is all it blocks for.
        session = client._link.connected
        session.loop.run(session.request(WhoHasRequest(session.next_id(), [])), client.timeout)


def post_tasks(client: SubmittingClient, batch: TaskBatch) -> None:
    client._link.connected.post(batch)
    if not client._link.connected.connected:
        # Closed, or the scheduler gone, while these were being prepared: the
        # settling of every future that went with it came before these existed.
        if client._closed:
            client._scheduler_gone(f"the client for {client.scheduler_address} was closed", "lost")
        else:
            client._scheduler_gone(f"lost the connection to {client.scheduler_address}")


def submit_graph(
    client: SubmittingClient,
    dsk: Mapping[Any, Any],
    keys: Any,
    resources: ResourceSpec | Mapping[Any, ResourceSpec],
    priority: int,
    retries: int,
    annotations: Mapping[str, Mapping[Any, Any]],
    where: Where = ANYWHERE,
) -> dict[Any, Future]:
    """Send the tasks ``keys`` need; a future for each of ``keys``, by graph key."""
    client._link.check_open()
    for other in _other_clients(client, dsk):
        other._caught_up()
    canon = canonical_keys(dsk)
    roots = {canon.get(k, k) for k in flatten_keys(keys)}
    tasks = list(
        graph_tasks(
            client._function, dsk, keys, resources, priority, retries, annotations, canon, where
        )
    )
    embedded = sum(payload.size_of(spec.args) for spec, _ in tasks)
    warn_if_large(embedded, f"the values in this graph's {len(tasks)} tasks")
    futures = {key: Future(wire_key(key), client) for key in roots}
    wanted = {future.key: future for future in futures.values()}
    for spec, _ in tasks:
        future = wanted.get(spec.key)
        if future is not None and future._key_state.status == CANCELLED:
            client._again(future.key)  # computed again after a cancel: it runs again
    # One outbox item, so the graph reaches the scheduler in one message: a split
    # graph would see its unwanted first half released before the rest arrived.
    post_tasks(client, [(spec, blob, spec.key in wanted) for spec, blob in tasks])
    # Keys with no task sent are parts that exist already (persisted, maybe by
    # another client): this client wants them too.
    existing = wanted.keys() - {spec.key for spec, _ in tasks}
    if existing:
        client._link.connected.post(SubmitTasks([], {}, sorted(existing)))
    return futures


def retry(client: SubmittingClient, futures: Any) -> Any:
    """Run failed futures again, with the failed tasks they depend on; they go back
    to pending. A failure the scheduler has forgotten fails again, saying so.
    Done at once; an asynchronous client returns an awaitable as well, as Dask's."""
    client._link.check_open()
    keys = list(dict.fromkeys(f.key for f in futures_of(futures) if f.status == ERROR))
    for key in keys:  # before the request: the new run's outcome must find it pending
        client._again(key, retry=True)
    if keys:
        client._link.connected.post(RetryKeys(keys))
    return client._link.ready(None)


def _other_clients(client: SubmittingClient, dsk: Mapping[Any, Any]) -> set[SubmittingClient]:
    """The other open clients whose futures ``dsk`` holds as parts (a collection one
    of them persisted)."""
    others: set[SubmittingClient] = set()
    for value in dsk.values():
        part = getattr(value, "value", value)  # a persisted part wraps its future
        owner = part._client if isinstance(part, Future) else None
        if isinstance(owner, type(client)) and owner is not client and not owner._closed:
            others.add(owner)
    return others
