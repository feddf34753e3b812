"""What acts on, or reports on, the cluster as a whole: its identity and workers,
waiting for workers, restart, the dashboard's login link, the notebook card, and
why tasks wait; each a function of the client's ``SchedulerLink``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Coroutine, Generator, Iterable
from functools import partial
from typing import Any, Protocol

from apportion.client.future import Future
from apportion.client.link import SchedulerLink
from apportion.core.durations import Duration
from apportion.dashboard.auth import NONCE_BYTES, login_link
from apportion.dashboard.card import CardFacts, render
from apportion.loop_thread import in_thread
from apportion.net.security import Security
from apportion.protocol.cluster import (
    DumpReply,
    DumpRequest,
    InfoReply,
    InfoRequest,
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


def scheduler_info(link: SchedulerLink) -> Any:
    """The scheduler's identity and workers with their pools, as Dask returns it.

    An asynchronous client, from its loop, gives the copy it last fetched, as
    Dask's does (a dict; it was fetched when the client connected), which
    awaited (``await client.scheduler_info()``) fetches a fresh one.
    """
    if link.asynchronous:
        return SchedulerInfo(link.identity, partial(_fresh_info, link))
    return link.ask(lambda rid: InfoRequest(rid), partial(_info, link))


def fetch_identity(link: SchedulerLink, timeout: float) -> None:
    """Fetch and keep the scheduler's picture (a blocking client's, as it connects):
    what ``repr`` shows before anything else asked; ``TimeoutError`` after ``timeout``."""
    link.ask(lambda rid: InfoRequest(rid), partial(_info, link), timeout)


async def _fresh_info(link: SchedulerLink) -> dict[str, Any]:
    info: dict[str, Any] = await link.ask(lambda rid: InfoRequest(rid), partial(_info, link))
    return info


def _info(link: SchedulerLink, reply: InfoReply) -> dict[str, Any]:
    info: dict[str, Any] = reply.info
    link.remember(info)  # the copy an asynchronous client gives at once
    return info


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
            info = link.ask(lambda rid: InfoRequest(rid), partial(_info, link), CARD_TIMEOUT)
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


def dump_cluster_state(link: SchedulerLink, filename: str | None = None) -> Any:
    """The scheduler's whole state as plain data; written as JSON to ``filename`` if given.

    Meant for bug reports: every task with its state, inputs, resources and units,
    every worker with its ledger, and the recent transitions with their causes.
    """
    return link.ask(lambda rid: DumpRequest(rid), partial(_dumped, filename=filename))


def _story_rows(reply: StoryReply) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in reply.story]


def _dumped(reply: DumpReply, filename: str | None) -> dict[str, Any]:
    state: dict[str, Any] = reply.state
    if filename is not None:
        with open(filename, "w") as f:
            json.dump(state, f, indent=1, default=str)
    return state
