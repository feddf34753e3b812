"""Data in and out through futures: ``gather`` waits for futures and fetches their
results (waiting again for results lost and recomputed meanwhile), ``scatter``
stores local data on workers as futures. How the bytes travel (through the
scheduler or straight to workers) is transfers.py's; these are functions of a
``DataHolder`` (a ``Client``), whose futures they wait for and make.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping
from functools import partial
from typing import Any, Protocol, TypeVar

from apportion.client import shapes, shared_data, transfers
from apportion.client.asynchronous import Ready, awaited, settled
from apportion.client.errors import LostDataError, SerializationError
from apportion.client.future import Future, FutureOwner, KeyState
from apportion.client.restrictions import worker_names
from apportion.client.results import Gathered
from apportion.client.state import PENDING
from apportion.core import payload
from apportion.core.durations import Duration, seconds
from apportion.core.tracebacks import raises_user_frames
from apportion.core.type_names import type_name
from apportion.protocol.tasks import CancelKeys, ScatterRequest

T = TypeVar("T")

#: Rounds of "lost meanwhile, wait for the recomputation, ask again" in one gather.
_GATHER_ATTEMPTS = 5


class DataHolder(FutureOwner, Protocol):
    """What gathering and scattering need of a client (a ``Client``) beyond its futures."""

    @property
    def direct_to_workers(self) -> bool | None: ...

    @property
    def timeout(self) -> float: ...

    @property
    def _waiting(self) -> dict[str, KeyState]: ...

    def _unique_name(self) -> str: ...

    def submit(self, func: Any, *args: Any, **kwargs: Any) -> Future: ...


@raises_user_frames
def gather(
    client: DataHolder,
    futures: Any,
    errors: str = "raise",
    direct: bool | None = None,
    asynchronous: bool | None = None,
) -> Any:
    """Results for a future, or a list/tuple/dict/set of them (same shape back).

    ``errors="raise"`` re-raises the first failure; ``errors="skip"`` leaves failed
    futures out of the result, as Dask does. ``direct`` overrides the client's
    ``direct_to_workers`` for this call. Awaitable, for an asynchronous client.
    """
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', not {errors!r}")
    return client._link.run(
        _gather,
        client,
        futures,
        errors,
        direct,
        asynchronous=asynchronous,
        then=partial(Gathered.values, client=client),
    )


async def _gather(client: DataHolder, futures: Any, errors: str, direct: bool | None) -> Gathered:
    """On the session's loop: wait for ``futures``, then fetch their results."""
    found: list[Future] = []
    shapes.collect(futures, found)
    await _settled(found, errors == "raise")
    skipped: set[str] = set()
    for fut in found:
        failed = fut._key_state.failed()
        if failed is not None:
            if errors == "raise":
                return Gathered({}, failed)
            skipped.add(fut.key)
    wanted = [f.key for f in found if f.key not in skipped]
    fetched = Gathered({})
    if wanted:
        fetched = await _fetch(client, wanted, direct)
    fetched.shape, fetched.skipped = futures, tuple(skipped)
    return fetched


async def _settled(found: list[Future], until_a_failure: bool) -> None:
    """Wait until every future in ``found`` is done, or (``until_a_failure``) one has
    failed: as Dask's ``gather`` raises the first failure without waiting for the
    rest, which may run for hours. One callback per future and one wait, so that a
    gather of 100,000 futures costs the same per future as one of ten."""
    if until_a_failure and any(f._key_state.record.error is not None for f in found):
        return  # failed already: no need to wait for the others
    pending = [f for f in found if not f._key_state.done()]
    if not pending:
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    left = len(pending)

    def one_settled(state: KeyState) -> None:  # on ``loop``
        nonlocal left
        left -= 1
        failed = until_a_failure and state.record.error is not None
        if (left == 0 or failed) and not done.done():
            done.set_result(None)

    def from_any_thread(state: KeyState) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # settled by a message on this loop: most of them
            one_settled(state)
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(one_settled, state)

    # The callbacks hold each key's state, never its Future: a gather that raised
    # its first failure leaves them behind, and a Future they held would keep its
    # key wanted (``client.futures``) after the caller dropped it, as Dask's does not.
    for fut in pending:
        if not fut._key_state.add_callback(partial(from_any_thread, fut._key_state)):
            one_settled(fut._key_state)
    await done


async def settled_on_loop(found: list[Future]) -> None:
    """On the session's loop: wait until every future in ``found`` is done."""
    await _settled(found, until_a_failure=False)


async def gather_on_loop(client: DataHolder, futures: list[Future]) -> Gathered:
    """On the session's loop: the results of ``futures``, still pickled, or their first
    failure, for the asking thread to unpickle or raise (``Gathered.values``)."""
    return await _gather(client, futures, "raise", None)


def gather_keys(client: DataHolder, keys: list[str]) -> dict[str, Any]:
    """Fetch results, waiting here, and unpickle them here (see ``_fetch``)."""
    return client._link.connected.run(_fetch(client, keys)).by_key(client)


async def gather_keys_awaited(client: DataHolder, keys: list[str]) -> dict[str, Any]:
    """Fetch results, awaited in the caller's running loop, and unpickle them there."""
    fetched = await awaited(client._link.connected.loop, _fetch, client, keys)
    return fetched.by_key(client)


def gather_pickled(client: DataHolder, keys: list[str]) -> Gathered:
    """Fetch results, waiting here; unpickled later by whoever takes them
    (``as_completed`` fetches ahead on the callback thread for its iterator's)."""
    return client._link.connected.run(_fetch(client, keys))


async def _fetch(client: DataHolder, keys: list[str], direct: bool | None = None) -> Gathered:
    """On the session's loop: fetch results, pickled; keys lost meanwhile are
    waited for while they are recomputed."""
    wanted = list(dict.fromkeys(keys))
    mode = client.direct_to_workers if direct is None else direct
    out: dict[str, payload.Pickled] = {}
    for _ in range(_GATHER_ATTEMPTS):
        blobs, missing, errors = await transfers.fetch(client._link.connected, wanted, mode)
        if errors:
            raise SerializationError(next(iter(errors.values())))
        out.update(blobs)
        if not missing:
            return Gathered(out)
        # A result lost with its worker comes back as pending (KeysPending, which
        # the scheduler sends before this reply): wait for it and ask again.
        states = [client._waiting.get(key) for key in missing]
        if any(s is None or s.status != PENDING for s in states):
            raise _missing_error(missing)
        for state in states:
            assert state is not None
            await settled(state)
            failed = state.failed()
            if failed is not None:
                return Gathered({}, failed)
        wanted = missing
    raise _missing_error(wanted)


def scatter(
    client: DataHolder,
    data: Any,
    workers: Any = None,
    broadcast: bool = False,
    direct: bool | None = None,
    hash: bool = True,
    timeout: Duration | None = None,
    asynchronous: bool | None = None,
) -> Any:
    """Put local data on workers; returns futures in the shape given (list, dict, one).

    ``workers`` (names, addresses or hosts) limits where the data goes; it waits
    for such a worker if none is connected. ``broadcast=True`` copies every value
    to each of those workers (all, by default). ``direct=True`` sends the data to
    the workers' data ports instead of through the scheduler (default: the
    client's ``direct_to_workers``). ``hash=False`` gives equal values distinct
    keys. ``timeout`` bounds the wait for the data to be stored. Awaitable, for an
    asynchronous client.
    """
    client._link.check_open()
    allowed = worker_names(workers)
    names, items, holding = shapes.scatter_items(data, hash, client._unique_name)
    awaitable = client.asynchronous if asynchronous is None else asynchronous
    if not items:  # nothing to store
        empty = {} if isinstance(data, Mapping) else type(data)()
        return Ready(empty) if awaitable else empty
    futures = {name: Future(name, client) for name in names}
    given = data.values() if isinstance(data, Mapping) else shapes.listed(data)
    for name, value in zip(names, given, strict=True):
        # ``Future.type``: this client knows the type of what it scatters (the
        # scheduler is told only bytes). A value holding futures is rebuilt on a
        # worker, which names its type as any result's.
        if name not in holding:
            futures[name]._key_state.record.type_name = type_name(value)
    if holding:
        # A value holding futures (a persisted collection) is made by a task on a
        # worker, where each future unpickles as its part's value: a worker cannot
        # unpickle a future on its own. The stored value then holds its data.
        for name, value in zip(names, given, strict=True):
            if name in holding:
                call = shapes.held_call(value)
                client.submit(*call, key=name, workers=allowed or None, pure=False)
                del items[name]
    if isinstance(data, Mapping):
        shaped: Any = {k: futures[name] for k, name in zip(data, names, strict=True)}
    elif isinstance(data, list | tuple):
        shaped = type(data)(futures[n] for n in names)
    else:
        shaped = futures[names[0]]
    wait = client.timeout if timeout is None else seconds(timeout) or 0.0
    mode = client.direct_to_workers if direct is None else direct
    store = (_scatter, client, items, futures, allowed, mode, wait, broadcast)
    if awaitable:
        return _then(client._link.run(*store, asynchronous=True), shaped)
    client._link.run(*store, asynchronous=False)
    return shaped


async def _scatter(
    client: DataHolder,
    items: dict[str, payload.Pickled],
    futures: dict[str, Future],
    allowed: list[str],
    mode: bool | None,
    wait: float,
    broadcast: bool,
) -> None:
    """On the session's loop: store ``items`` and wait for their futures."""
    size = sum(map(payload.size_of, items.values()))
    try:
        async with asyncio.timeout(wait):
            left = items
            if items and (mode or (mode is None and size >= transfers.DIRECT_FROM)):
                left = await transfers.scatter_direct(
                    client._link.connected, items, allowed, strict=bool(mode)
                )
            if left:
                await client._link.connected.request(
                    ScatterRequest(client._link.connected.next_id(), left, allowed)
                )
            for fut in futures.values():
                await settled(fut._key_state)
    except TimeoutError:
        client._link.connected.post(CancelKeys(list(futures)))  # not stored later for nobody
        where = f" on a worker matching {allowed}" if allowed else ""
        raise TimeoutError(f"scattered data was not stored{where} within {wait:g}s") from None
    for fut in futures.values():
        failed = fut._key_state.exception_object()
        if failed is not None:
            raise failed
    if broadcast:
        await shared_data.copy_results(client._link, list(futures.values()), None, allowed or None)


async def _then(stored: Awaitable[Any], value: T) -> T:
    """``value``, once ``stored`` is done."""
    await stored
    return value


def _missing_error(keys: list[str]) -> BaseException:
    return LostDataError(f"results no longer held by any worker: {keys[:5]}")
