"""What a notebook shows of a Client and a LocalCluster: their cards (``_repr_html_``),
``LocalCluster._ipython_display_``, the client's ``repr``, and
``LocalCluster.scheduler.workers`` (Dask's resilience notebook picks a worker process
to kill from it).

In memory first (an asynchronous client, the display without IPython installed),
then in-process clusters over loopback TCP, then real processes: a LocalCluster's
workers and CLI workers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import threading
import types
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from unittest import mock

import pytest

from apportion import Client, Event, LocalCluster
from apportion.deploy import notebook
from apportion.testing import InMemoryCluster
from cli_processes import Processes, poll


def text_of(card: str) -> str:
    """What a reader sees: the card's texts, one space between each (and it parses)."""
    return " ".join(" ".join(ET.fromstring(card).itertext()).split())


def pools(card: str) -> dict[str, tuple[str, str]]:
    """Each pool's (free, total) as the card shows them."""
    rows = ET.fromstring(card).iterfind(".//table[@class='pools']/tr[@data-pool]")
    return {
        str(row.get("data-pool")): (
            str(row.findtext("td[@class='free']")),
            str(row.findtext("td[@class='total']")),
        )
        for row in rows
    }


def hold(go: Event) -> str:
    go.wait(timeout=30)
    return "done"


async def gpu_free(client: Client) -> float:
    """The GPUs free over the cluster, fetched afresh (``await scheduler_info()``)."""
    info = await client.scheduler_info()
    return sum(w["free_resources"].get("GPU", 0) for w in info["workers"].values())


# --- an asynchronous client: the picture it last fetched, never a blocked loop -------


def test_an_asynchronous_clients_card_shows_what_it_last_fetched_without_blocking() -> None:
    with InMemoryCluster(
        [{"name": "a", "nthreads": 2, "resources": "GPU=1"}, {"name": "b", "nthreads": 1}]
    ) as cluster:

        async def main() -> None:
            client = Client(cluster.address, asynchronous=True)
            unconnected = client._repr_html_()
            assert "No scheduler connected." in unconnected
            assert "(not connected yet)" in text_of(unconnected)
            assert "No scheduler connected" in repr(client)
            async with client:
                # The scheduler's loop is stopped: a card that asked it would hang here.
                with mock.patch.object(client._link, "ask", side_effect=AssertionError):
                    card = client._repr_html_()
                seen = text_of(card)
                assert f"Scheduler {cluster.address}" in seen
                assert "Workers: 2" in seen and "Total threads: 3" in seen
                assert "as last fetched" in seen
                assert pools(card) == {"GPU": ("1", "1")}
                assert "processes=2 threads=3" in repr(client)
                go = Event("go", client=client)
                held = client.submit(hold, go, resources={"GPU": 1})
                while await gpu_free(client):
                    await asyncio.sleep(0.01)
                assert pools(client._repr_html_()) == {"GPU": ("0", "1")}  # as awaited
                await go.set()
                assert await held == "done"
            closed = client._repr_html_()
            assert "No scheduler connected." in closed and "(closed)" in text_of(closed)
            assert repr(client) == f"<Client: No scheduler connected (closed: {cluster.address!r})>"

        asyncio.run(asyncio.wait_for(main(), 30))


# --- _ipython_display_, with and without ipywidgets (neither is a dependency) ----------


@pytest.fixture
def fake_ipython(monkeypatch: pytest.MonkeyPatch) -> mock.MagicMock:
    """``IPython.display`` as a kernel has it: ``display`` records what it was given."""
    display = mock.MagicMock()
    monkeypatch.setitem(sys.modules, "IPython.display", display)  # IPython is not installed
    return display


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=False,
        resources={"GPU": 2},
        dashboard_address="127.0.0.1:0",
    ) as c:
        yield c


@pytest.mark.tcp
def test_without_ipywidgets_the_cluster_displays_its_card_and_repr(
    cluster: LocalCluster, fake_ipython: mock.MagicMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # not installed
    cluster._ipython_display_()
    (shown,), keywords = fake_ipython.display.call_args
    assert keywords == {"raw": True}
    assert shown["text/plain"] == repr(cluster)
    seen = text_of(shown["text/html"])
    assert f"Scheduler {cluster.scheduler_address}" in seen and "Workers: 2" in seen
    assert pools(shown["text/html"]) == {"GPU": ("4", "4")}


@pytest.mark.tcp
def test_with_ipywidgets_the_cluster_shows_one_widget_that_keeps_itself_current(
    cluster: LocalCluster, fake_ipython: mock.MagicMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    class HTML:
        def __init__(self, value: str) -> None:
            self.value = value

    widgets = types.ModuleType("ipywidgets")
    widgets.HTML = HTML  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ipywidgets", widgets)
    monkeypatch.setattr(notebook, "REDRAW_SECONDS", 0.02)
    cluster._ipython_display_()
    widget = cluster._cached_widget
    assert isinstance(widget, HTML) and fake_ipython.display.call_args.args == (widget,)
    assert "Workers: 2" in text_of(widget.value)
    cluster._ipython_display_()
    assert cluster._cached_widget is widget  # the same widget, shown again
    cluster.scale(3)
    poll(lambda: "Workers: 3" in text_of(widget.value), 10, "the widget to redraw")
    cluster.close()
    poll(lambda: "(closed)" in text_of(widget.value), 10, "the widget to show the close")


# --- in-process clusters over loopback ------------------------------------------------


@pytest.mark.tcp
def test_a_blocking_clients_card_is_fresh_and_its_pools_free_units_follow_tasks(
    cluster: LocalCluster,
) -> None:
    with Client(cluster, set_as_default=False) as client:
        assert repr(client).startswith(f"<Client: {cluster.scheduler_address!r} processes=2 ")
        card = client._repr_html_()
        seen = text_of(card)
        assert f"Scheduler {cluster.scheduler_address}" in seen
        assert "apportion Client" in seen and "(connected)" in seen
        assert "Workers: 2" in seen and "Up for" in seen
        assert pools(card) == {"GPU": ("4", "4")}
        link = ET.fromstring(card).find(".//a[@class='dashboard']")
        assert link is not None and "/login?token=" in str(link.get("href"))
        go = Event("go-blocking", client=client)
        held = client.submit(hold, go, resources={"GPU": 2})
        poll(lambda: pools(client._repr_html_())["GPU"] == ("2", "4"), 10, "the card")
        assert pools(cluster._repr_html_())["GPU"] == ("2", "4")
        go.set()
        assert held.result(timeout=10) == "done"
    closed = client._repr_html_()
    assert "No scheduler connected." in closed and "(closed)" in text_of(closed)


@pytest.mark.tcp
def test_a_cluster_without_a_dashboard_says_so_on_both_cards() -> None:
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        for card in (client._repr_html_(), cluster._repr_html_()):
            assert "Dashboard none: this scheduler serves no dashboard" in text_of(card)


@pytest.mark.tcp
def test_a_cluster_not_started_or_closed_has_a_card_all_the_same() -> None:
    unstarted = LocalCluster(asynchronous=True, processes=False, n_workers=1)
    card = unstarted._repr_html_()
    assert "No scheduler connected." in card and "not started" in text_of(card)

    async def start_and_close() -> None:
        async with unstarted:
            assert "Workers: 1" in text_of(unstarted._repr_html_())  # read from a loop

    asyncio.run(asyncio.wait_for(start_and_close(), 30))
    assert "(closed)" in text_of(unstarted._repr_html_())


@pytest.mark.tcp
def test_scheduler_workers_is_a_read_only_snapshot_by_address(cluster: LocalCluster) -> None:
    workers = cluster.scheduler.workers
    assert len(workers) == 2
    for address, worker in workers.items():
        assert worker.address == address and worker.nthreads == 1
        assert worker.pid == os.getpid()  # in-process workers share this process
        assert worker.name in ("worker-0", "worker-1") and dict(worker.resources) == {"GPU": 2}
    with pytest.raises(TypeError):
        workers["tcp://elsewhere:1"] = next(iter(workers.values()))  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        next(iter(workers.values())).pid = 1  # type: ignore[misc]
    cluster.scale(3)
    assert len(workers) == 2 and len(cluster.scheduler.workers) == 3  # fetched on access


# --- real processes: a LocalCluster's workers, and CLI workers ------------------------


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_worker_picked_from_scheduler_workers_by_pid_can_be_killed_and_comes_back() -> None:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        workers = cluster.scheduler.workers
        assert {w.pid for w in workers.values()} == cluster.worker_pids()
        assert "Total memory: 2.00 GiB" in text_of(client._repr_html_())
        assert repr(client).endswith("processes=2 threads=2, memory=2.00 GiB>")
        victim = next(iter(workers.values()))
        os.kill(victim.pid, signal.SIGKILL)  # as Dask's resilience notebook does
        poll(
            lambda: (
                len(pids := {w.pid for w in cluster.scheduler.workers.values()}) == 2
                and victim.pid not in pids
            ),
            30,
            "a fresh worker process",
        )
        assert client.submit(lambda: 42).result(timeout=10) == 42


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_client_of_cli_workers_shows_them_and_their_pools(procs: Processes) -> None:
    scheduler, address, _ = procs.start_scheduler(
        "--port", "0", "--dashboard-address", "127.0.0.1:0"
    )
    for name in ("a", "b"):
        procs.start("worker", address, "--nthreads", "1", "--name", name, "--resources", "GPU=2")
    client = Client(address, set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=20)
        assert repr(client).startswith(f"<Client: {address!r} processes=2 threads=2")
        card = client._repr_html_()
        seen = text_of(card)
        assert f"Scheduler {address}" in seen and "Workers: 2" in seen
        assert pools(card) == {"GPU": ("4", "4")}
        assert ET.fromstring(card).find(".//a[@class='dashboard']") is not None
        scheduler.kill()  # the card of a client cut off: what it last saw, and why
        poll(lambda: client._link.status == "lost the scheduler", 20, "the loss")
        seen = text_of(client._repr_html_())
        assert "(lost the scheduler)" in seen and "Workers: 2" in seen
        assert "from before the connection was lost" in seen
        assert "(no login link: lost the scheduler)" in seen
    finally:
        client.close()
    assert "No scheduler connected." in client._repr_html_()


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_card_asked_for_from_another_thread_while_the_client_works(procs: Processes) -> None:
    address = procs.two_workers()
    with Client(address, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=20)
        cards: list[str] = []
        futures = client.map(lambda x: x + 1, range(200))
        thread = threading.Thread(target=lambda: cards.append(client._repr_html_()))
        thread.start()
        thread.join(10)
        assert sum(client.gather(futures)) == sum(range(1, 201))
        assert cards and "Workers: 2" in text_of(cards[0])
