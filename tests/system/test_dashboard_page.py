"""The dashboard page in a real browser, over a real scheduler's dashboard.

One scheduler with two in-process workers of two GPUs each serves the whole module
(starting a browser and a cluster costs more than the checks). Every wait is on the
page's own DOM: the page marks what it drew (``data-used`` and ``data-holders`` on
GPU units, ``data-items`` on the task stream's canvas), so nothing here sleeps.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import cloudpickle
import pytest

import browser
from apportion import Client, Event, Scheduler, Worker
from apportion.net.scheduler_file import write_scheduler_file
from apportion.protocol.people import AddPerson, PersonAdded, PersonRemoved, RemovePerson

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.tcp, pytest.mark.process]  # the browser is a process of its own

# The tasks' functions travel by value: in-process workers unpickle them all the same.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Milliseconds any one DOM condition may take (the page updates every 0.2 s here).
WAIT = 10_000


def hold(go: Event) -> str:
    """Keep what the task was given until the test lets it go."""
    go.wait(timeout=30)
    return "released"


def total(n: int) -> int:
    return sum(range(n))


def hold_until(flag: str) -> str:
    """Keep what the task was given until the file ``flag`` exists (a person's task
    has no Event of the owner's to wait on)."""
    while not Path(flag).exists():
        threading.Event().wait(0.02)
    return "released"


class Cluster:
    """The module's cluster: a scheduler serving its dashboard, two GPU workers, a client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def login(self) -> str:
        """A fresh one-time login link (each logs one browser context in, once)."""
        link = self.client.dashboard_link
        assert link
        return str(link)

    def base(self) -> str:
        parts = urlsplit(self.login())
        return f"{parts.scheme}://{parts.netloc}/"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # The scheduler's own default (not LocalCluster's): a request no worker can meet
    # waits, warned about, instead of failing at once, so the page can show it.
    with (
        Scheduler(port=0, dashboard_address="127.0.0.1:0") as scheduler,
        Worker(scheduler.address, nthreads=2, resources="gpu=[0,1]", name="gpu-a"),
        Worker(scheduler.address, nthreads=2, resources="gpu=[0,1]", name="gpu-b"),
        Client(scheduler.address) as client,
    ):
        client.wait_for_workers(2, timeout=10)
        yield Cluster(client)


@pytest.fixture
def page(browser_page: Page) -> Iterator[Page]:
    """The harness's page at a desktop's size; fails the test on any error it raised."""
    browser_page.set_viewport_size({"width": 1440, "height": 900})
    yield browser_page
    browser.assert_no_page_errors(browser_page)


def shot(page: Page, name: str) -> None:
    browser.screenshot(page, name)


def open_dashboard(page: Page, cluster: Cluster) -> None:
    """Log in through a link, then reload with a fast stream (the session stays)."""
    page.goto(cluster.login())
    page.wait_for_selector("#resources")
    page.goto(page.url.split("?")[0] + "?interval=0.2")
    page.wait_for_function("() => document.body.dataset.updates >= 1", timeout=WAIT)


def test_the_page_opens_through_a_login_link_only(cluster: Cluster, page: Page) -> None:
    chromium = page.context.browser
    assert chromium is not None
    stranger = chromium.new_context()  # the browser console reports the 401: not `page`
    try:
        refused = stranger.new_page().goto(cluster.base())
        assert refused is not None and refused.status == 401
        assert "dashboard.js" not in refused.text()
    finally:
        stranger.close()
    open_dashboard(page, cluster)
    assert page.locator("#connection").text_content() == "live"
    assert "2 workers" in str(page.locator("#cluster-size").text_content())


def test_gpu_units_show_the_task_holding_them_until_it_ends(cluster: Cluster, page: Page) -> None:
    open_dashboard(page, cluster)
    units = page.locator(".card .unit[data-pool=gpu]")
    page.wait_for_function(
        "() => document.querySelectorAll('.card .unit[data-pool=gpu]').length === 4",
        timeout=WAIT,
    )
    assert sorted(units.evaluate_all("us => us.map(u => u.dataset.unit)")) == list("0011")
    before = int(page.locator("#stream-canvas").get_attribute("data-items") or 0)

    go = Event(f"go-{uuid.uuid4().hex}", client=cluster.client)
    future = cluster.client.submit(hold, go, resources={"gpu": 1}, key="hold-gpu-1")
    busy = page.locator(".unit[data-pool=gpu][data-holders='hold-gpu-1']")
    busy.wait_for(timeout=WAIT)
    assert busy.count() == 1 and busy.get_attribute("data-used") == "1"
    assert "hold-gpu-1" in str(busy.get_attribute("title"))
    busy.click()  # its story, from the scheduler
    page.locator("#panel table.story").wait_for(timeout=WAIT)
    assert "processing" in str(page.locator("#panel").text_content())
    shot(page, "gpu-busy")
    page.keyboard.press("Escape")

    go.set()
    assert future.result(timeout=10) == "released"
    page.wait_for_function(
        "() => [...document.querySelectorAll('.unit[data-pool=gpu]')]"
        ".every(u => u.dataset.used === '0' && !u.dataset.holders)",
        timeout=WAIT,
    )
    cluster.client.gather(cluster.client.map(total, range(20)))
    page.wait_for_function(
        f"() => Number(document.getElementById('stream-canvas').dataset.items) >= {before + 21}",
        timeout=WAIT,
    )
    shot(page, "stream")


def test_a_request_no_worker_can_meet_is_shown_first_with_why(cluster: Cluster, page: Page) -> None:
    open_dashboard(page, cluster)
    go = Event(f"go-{uuid.uuid4().hex}", client=cluster.client)
    future = cluster.client.submit(hold, go, resources={"gpu": 8}, key="too-big")
    first = page.locator("#pending-list li").first
    page.locator("#pending-list li.unsatisfiable").wait_for(timeout=WAIT)
    assert "gpu=8" in str(first.locator(".req").text_content())
    assert first.get_attribute("class") == "unsatisfiable"
    why = first.locator(".why")
    assert "no connected worker can ever provide" in str(why.text_content())
    assert first.locator(".key").text_content() == "too-big"
    page.locator("#event-list li").first.wait_for(timeout=WAIT)  # the warning, too
    shot(page, "unsatisfiable")
    future.cancel()
    page.locator("#pending-list li.unsatisfiable").wait_for(state="detached", timeout=WAIT)


def test_each_share_shows_what_it_holds_against_its_fair_share_and_its_quota(
    cluster: Cluster, page: Page, tmp_path: Path
) -> None:
    open_dashboard(page, cluster)
    owner = cluster.client
    session = owner._link.connected
    added = session.call(lambda rid: AddPerson(rid, "alice", 1.0, "gpu=1"), 20)
    assert isinstance(added, PersonAdded) and not added.error
    credential = tmp_path / "alice.json"
    address = owner.scheduler_info()["address"]
    write_scheduler_file(credential, address, added.token, "person-alice", pid=0)
    flag = str(tmp_path / "go")
    try:
        with Client(scheduler_file=credential, timeout=20) as alice:
            hers = alice.map(hold_until, [flag] * 3, pure=False, resources={"gpu": 1})
            mine = owner.submit(hold_until, flag, pure=False, resources={"gpu": 1})
            row = page.locator("#share-rows tr[data-share=alice]")
            page.wait_for_function(
                "() => { const r = document.querySelector('#share-rows tr[data-share=alice]');"
                " return r && r.dataset.quotaHeld === '2'; }",
                timeout=WAIT,
            )
            assert row.get_attribute("data-kind") == "person"
            assert row.get_attribute("data-waiting") == "2"
            cells = row.locator("td")
            assert cells.nth(2).text_content() == "gpu=1 threads=1"
            assert cells.nth(4).text_content() == "gpu=1"
            assert cells.nth(5).text_content() == "2 (gpu=1 \u00d7 2); held by quota gpu=1"
            assert float(row.get_attribute("data-dominant") or 0) == 0.25  # 1 of 4 GPUs
            # The owner's client's share, by the name it gave.
            theirs = page.locator(f"#share-rows tr[data-name='{owner.name}']")
            theirs.wait_for(timeout=WAIT)
            assert theirs.get_attribute("data-kind") == "client"
            assert theirs.locator("td").first.text_content() == f"{owner.name}client"
            shot(page, "shares")
            Path(flag).touch()
            assert alice.gather(hers) == ["released"] * 3
            assert mine.result(timeout=10) == "released"
    finally:
        Path(flag).touch()
        gone = session.call(lambda rid: RemovePerson(rid, "alice"), 20)
        assert isinstance(gone, PersonRemoved) and not gone.error
    page.locator("#share-rows tr[data-share=alice]").wait_for(state="detached", timeout=WAIT)
