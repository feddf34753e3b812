"""The notebook card in a real browser: what a Jupyter user sees of a Client.

The card is loaded as the page a notebook's output area would hold (Jupyter puts
``_repr_html_``'s fragment in its own page), over a LocalCluster with a GPU pool
and a dashboard. The checks read what is rendered, not the markup: the scheduler's
address, the worker count, the pool's free and total units as a task takes some,
and a dashboard link that, clicked, logs the browser in to the dashboard.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import cloudpickle
import pytest

import browser
from apportion import Client, Event, LocalCluster
from cli_processes import poll

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.tcp, pytest.mark.process]  # the browser is a process of its own

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def hold(go: Event) -> str:
    go.wait(timeout=30)
    return "released"


@pytest.fixture
def client() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            resources={"GPU": 2},
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        yield client


def gpu_free(client: Client) -> float:
    workers = client.scheduler_info()["workers"].values()
    return sum(w["free_resources"].get("GPU", 0) for w in workers)


def show(page: Page, card: str) -> None:
    """The card as a notebook's output shows it: a fragment in a page of its own."""
    page.set_content(
        '<!doctype html><html><head><meta charset="utf-8"><title>notebook</title></head>'
        f'<body><div class="output">{card}</div></body></html>'
    )


def test_the_card_shows_the_cluster_and_opens_the_dashboard(
    client: Client, browser_page: Page
) -> None:
    page = browser_page
    show(page, client._repr_html_())
    card = page.locator(".apportion-card")
    seen = card.inner_text()
    assert client.scheduler_address in seen
    assert "Workers: 2" in seen
    gpu = page.locator("table.pools tr[data-pool=GPU]")
    assert gpu.locator("td.free").inner_text() == "4"
    assert gpu.locator("td.total").inner_text() == "4"

    go = Event("go-card", client=client)
    held = client.submit(hold, go, resources={"GPU": 1})
    try:
        poll(lambda: gpu_free(client) == 3, 10, "the task to hold its GPU")
        show(page, client._repr_html_())  # a card is static: Jupyter draws it again
        assert gpu.locator("td.free").inner_text() == "3"
        assert gpu.locator("td.total").inner_text() == "4"
        browser.screenshot(page, "card")
    finally:
        go.set()
    assert held.result(timeout=10) == "released"

    link = page.locator("a.dashboard")
    assert link.is_visible()
    with page.context.expect_page() as opened:
        link.click()  # target=_blank: a tab of its own, as from a notebook
    dashboard = opened.value
    browser.watch_page_errors(dashboard)
    dashboard.wait_for_load_state()
    if dashboard.title() == "Not logged in":
        # Logged in, but the browser withholds the new SameSite=Strict session from a
        # visit another site started: the page offers a link of its own site.
        dashboard.get_by_role("link", name="Open the dashboard").click()
    dashboard.wait_for_selector("#resources")
    browser.screenshot(dashboard, "dashboard-from-card")
    assert dashboard.url.startswith(page.locator("a.dashboard").inner_text())
    browser.assert_no_page_errors(page)
