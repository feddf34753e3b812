"""What acts on, or reports on, the cluster as a whole: its identity and workers,
waiting for workers, restart, the dashboard's login link, the notebook card, why
tasks wait, the sizes of results and a dump of the whole state; each a function of the
client's ``SchedulerLink``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Coroutine, Generator, Iterable
from functools import partial
from typing import Any, Protocol

from apportion.client.dump_file import check_format, without, write_dump
from apportion.client.future import Future
from apportion.client.link import SchedulerLink
from apportion.core.durations import Duration
from apportion.core.groups import group_of
from apportion.dashboard.auth import NONCE_BYTES, login_link
from apportion.dashboard.card import CardFacts, render
from apportion.dashboard.link_template import configured_template, format_link
from apportion.loop_thread import in_thread
from apportion.net.security import Security
from apportion.protocol.cluster import (
    DumpReply,
    DumpRequest,
    InfoReply,
    InfoRequest,
    NbytesReply,
    NbytesRequest,
    RestartRequest,
    StoryReply,
    StoryRequest,
    WhyReply,
    WhyRequest,
)


class Restartable(Protocol):
    """A cluster started here (``LocalCluster``), whose worker processes a restart
    replaces."""

    _closed: bool

    def worker_pids(self) -> set[int]: ...

    def quiet_workers(self) -> None: ...

    def wait_replaced(self, old: set[int], timeout: Duration | None) -> None: ...


def scheduler_info(link: SchedulerLink, n_workers: int = -1) -> Any:
    """The scheduler's identity and workers with their pools, as Dask returns it;
    ``n_workers`` (positive) lists only the first that many workers, as Dask's does
    for a large cluster, ``-1`` all of them.

    An asynchronous client, from its loop, gives the copy it last fetched, as
    Dask's does (a dict; it was fetched when the client connected), which
    awaited (``await client.scheduler_info()``) fetches a fresh one.
    """
    if not isinstance(n_workers, int) or n_workers == 0 or n_workers < -1:
        raise ValueError(f"n_workers must be a positive number of workers or -1, not {n_workers!r}")
    if link.asynchronous:
        cached = _first_workers(link.identity, n_workers)
        return SchedulerInfo(cached, partial(_fresh_info, link, n_workers))
    return link.ask(lambda rid: InfoRequest(rid), partial(_info, link, n_workers))


def fetch_identity(link: SchedulerLink, timeout: float) -> None:
    """Fetch and keep the scheduler's picture (a blocking client's, as it connects):
    what ``repr`` shows before anything else asked; ``TimeoutError`` after ``timeout``."""
    link.ask(lambda rid: InfoRequest(rid), partial(_info, link, -1), timeout)


async def _fresh_info(link: SchedulerLink, n_workers: int) -> dict[str, Any]:
    info: dict[str, Any] = await link.ask(
        lambda rid: InfoRequest(rid), partial(_info, link, n_workers)
    )
    return info


def _info(link: SchedulerLink, n_workers: int, reply: InfoReply) -> dict[str, Any]:
    info: dict[str, Any] = reply.info
    link.remember(info)  # the copy an asynchronous client gives at once
    return _first_workers(info, n_workers)


def _first_workers(info: dict[str, Any], n_workers: int) -> dict[str, Any]:
    if n_workers == -1 or len(info.get("workers", ())) <= n_workers:
        return info
    workers = dict(list(info["workers"].items())[:n_workers])
    return {**info, "workers": workers}


class SchedulerInfo(dict[str, Any]):
    """An asynchronous client's ``scheduler_info()``: the copy last fetched, as Dask
    gives it, which awaited fetches a fresh one (with every worker as it is now)."""

    def __init__(
        self, cached: dict[str, Any], fetch: Callable[[], Coroutine[Any, Any, dict[str, Any]]]
    ) -> None:
        super().__init__(cached)
        self._fetch = fetch

    def __await__(self) -> Generator[Any, None, dict[str, Any]]:
        return self._fetch().__await__()


#: Seconds a blocking client's card waits for a fresh picture before showing the last.
CARD_TIMEOUT = 5.0


def card(link: SchedulerLink, name: str, dashboard: Callable[[], str | None]) -> str:
    """The client's card for Jupyter (``Client._repr_html_``; dashboard/card.py).

    A blocking client asks the scheduler for a fresh picture. An asynchronous one,
    from its loop, never blocks it: it shows the copy it last fetched (when it
    connected, or at the last ``await client.scheduler_info()`` or
    ``wait_for_workers``), and says so. A client closed or not connected yet
    shows "No scheduler connected." and why; one cut off, the last picture it had,
    marked so, and no dashboard link. Nothing here raises.
    """
    status, info, note = link.status, None, ""
    if status == "connected" and link.asynchronous:
        info = link.identity or None
        note = "as last fetched: await client.scheduler_info() for news"
    elif status == "connected":
        try:
            info = link.ask(lambda rid: InfoRequest(rid), partial(_info, link, -1), CARD_TIMEOUT)
        except Exception as exc:  # the card shows what it knows, and why it is not fresh
            info = link.identity or None
            note = f"could not reach the scheduler ({type(exc).__name__}: {exc})"
    elif status == "lost the scheduler":
        note = "the last picture, from before the connection was lost"
        info = link.identity or None
    link_text = None
    if info is not None and status == "connected":
        with contextlib.suppress(Exception):  # no link is better than no card
            link_text = dashboard()
    facts = CardFacts("Client", name, status, link.address, info, link_text, time.time(), note)
    return render(facts)


def wait_for_workers(link: SchedulerLink, n_workers: int, timeout: float | None) -> Any:
    """Block (or, asynchronous, an awaitable) until at least ``n_workers`` workers are
    connected."""
    return link.run(_wait_for_workers, link, n_workers, timeout)


async def _wait_for_workers(link: SchedulerLink, n_workers: int, timeout: float | None) -> None:
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        reply = await link.request(lambda rid: InfoRequest(rid))
        link.remember(reply.info)  # what repr and an asynchronous client's card show
        if len(reply.info["workers"]) >= n_workers:
            return
        if deadline is not None and loop.time() > deadline:
            raise TimeoutError(f"fewer than {n_workers} workers after {timeout}s")
        await asyncio.sleep(0.05)  # no event says "a worker joined" to a client


def dashboard_link(link: SchedulerLink, security: Security) -> str | None:
    """A fresh one-time login link to the scheduler's dashboard; None if it serves none.
    Dask's ``distributed.dashboard.link`` setting, where set, gives the link instead
    (``dashboard.link_template``).

    Each access mints a new link from this client's secret (the cluster's): it
    logs one browser in, once, within 24 hours (docs/dashboard.md). A blocking
    client asks the scheduler where its dashboard is the first time; an
    asynchronous one knows from when it connected.
    """
    if not link.identity and not link.asynchronous:
        scheduler_info(link)  # keeps the identity it fetches
    base = link.identity.get("dashboard")
    if not isinstance(base, str) or not base:
        return None
    template = configured_template()
    if template is not None:
        return format_link(template, base, os.environ)
    return login_link(base, security.key(), time.time(), os.urandom(NONCE_BYTES))


def restart(
    link: SchedulerLink,
    cluster: Restartable | None,
    timeout: float,
    wait: bool = True,
) -> Any:
    """Drop every task and result in the cluster and start every worker afresh.

    As in Dask, every future of every client is told: pending and finished
    ones become cancelled (``FutureCancelledError``, "the cluster was
    restarted"); submit again to recompute. A worker with a supervisor (those of
    a ``LocalCluster`` with processes, ``apportion worker --nworkers``) is
    replaced by a fresh process; any other forgets its tasks and data and
    registers again, but keeps its process. With ``wait`` the call returns once
    as many workers as before are connected, a local ``cluster``'s from fresh
    processes (``TimeoutError`` after ``timeout``). An asynchronous client
    returns an awaitable of it.
    """
    if link.asynchronous:
        # Waiting for fresh worker processes has no event to await: one short-lived
        # thread runs the blocking restart while the caller's loop runs on.
        return in_thread(partial(restart, link, cluster, timeout, wait), "apportion-client-restart")
    before = len(scheduler_info(link)["workers"])
    local = cluster if cluster is not None and not cluster._closed else None
    old: set[int] = set()
    if local is not None:
        old = local.worker_pids()
        local.quiet_workers()
    # The scheduler has each supervised worker leave for a fresh process.
    reply = link.ask(lambda rid: RestartRequest(rid, "Client.restart"), timeout=timeout)
    if wait:
        if local is not None and old:
            local.wait_replaced(old, timeout)
        wait_for_workers(link, max(before, reply.workers), timeout)
    return None


def why(link: SchedulerLink, futures: Future | str | Iterable[Future | str]) -> Any:
    """Why each task is not running (yet): a string, or a dict for several."""
    single = isinstance(futures, Future | str)
    items: list[Future | str] = [futures] if isinstance(futures, Future | str) else list(futures)
    keys = [f.key if isinstance(f, Future) else f for f in items]

    def reasons(reply: WhyReply) -> Any:
        return reply.reasons[keys[0]] if single else dict(reply.reasons)

    return link.ask(lambda rid: WhyRequest(rid, keys), reasons)


def story(link: SchedulerLink, key: Future | str) -> Any:
    """The task's transitions: a list of (time, key, from, to, cause)."""
    name = key.key if isinstance(key, Future) else key
    return link.ask(lambda rid: StoryRequest(rid, name), _story_rows)


def dump_cluster_state(
    link: SchedulerLink,
    /,
    filename: str | os.PathLike[str] | None = None,
    write_from_scheduler: bool | None = None,
    exclude: Collection[str] = (),
    format: str = "msgpack",
    **storage_options: Any,
) -> Any:
    """The scheduler's whole state as plain data, for a bug report: every task with
    its state, inputs, resources and units, every worker with its ledger, the recent
    transitions with their causes. Written to a file too if ``filename`` is given.

    As Dask's: ``format`` "msgpack" (the default) writes ``<filename>.msgpack.gz``
    (gzip-compressed msgpack), "yaml" ``<filename>.yaml`` (needs PyYAML); "json",
    apportion's, ``<filename>.json``; the suffix is not added twice. A ``filename``
    with ``://`` is a URL written through fsspec, with ``storage_options``.
    ``exclude`` names entries to leave out wherever they appear (``("log",)``). The
    client writes the file: ``write_from_scheduler=True`` is refused, as the
    scheduler writes no files for clients. Returns the state (an asynchronous
    client: an awaitable of it).
    """
    check_format(format)
    if write_from_scheduler:
        raise ValueError(
            "write_from_scheduler=True: apportion's scheduler writes no files for "
            "clients; the client writes the dump (leave write_from_scheduler unset)"
        )
    if isinstance(exclude, str):
        raise TypeError(f"exclude takes a collection of names, e.g. ({exclude!r},)")
    dumped = partial(
        _dumped,
        filename=filename,
        format=format,
        exclude=frozenset(exclude),
        storage_options=storage_options,
    )
    return link.ask(lambda rid: DumpRequest(rid), dumped)


def nbytes(link: SchedulerLink, keys: Any = None, summary: bool = True) -> Any:
    """The bytes of each result held in the cluster, as its worker measured it
    (Dask's ``sizeof``): of ``keys`` (keys or futures) that have a result, or of
    every key; with ``summary`` (the default), summed by task group (``"inc"``), as
    Dask's ``nbytes``."""
    if keys is None:
        names: list[str] = []
    else:
        listed = [keys] if isinstance(keys, str | Future) else list(keys)
        names = [k.key if isinstance(k, Future) else str(k) for k in listed]

    def sizes(reply: NbytesReply) -> dict[str, int]:
        return by_group(reply.nbytes) if summary else dict(reply.nbytes)

    return link.ask(lambda rid: NbytesRequest(rid, names, int(keys is None)), sizes)


def by_group(sizes: dict[str, int]) -> dict[str, int]:
    """Bytes summed by task group (``inc-3f2a...`` counts under ``inc``)."""
    out: defaultdict[str, int] = defaultdict(int)
    for key, size in sizes.items():
        out[group_of(key)] += size
    return dict(out)


def _story_rows(reply: StoryReply) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in reply.story]


def _dumped(
    reply: DumpReply,
    filename: str | os.PathLike[str] | None,
    format: str,
    exclude: frozenset[str],
    storage_options: dict[str, Any],
) -> dict[str, Any]:
    state: dict[str, Any] = without(reply.state, exclude) if exclude else reply.state
    if filename is not None:
        write_dump(state, filename, format, storage_options)
    return state
