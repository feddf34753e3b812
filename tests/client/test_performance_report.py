"""performance_report(): one self-contained HTML page about what ran in a block."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle
import dask.array as da
import pytest

import browser
from apportion import Client, IgnoredOptionWarning, performance_report
from apportion.client import report_page
from apportion.testing import InMemoryCluster

if TYPE_CHECKING:
    from playwright.sync_api import Page

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(30)

#: A key that would end the page's JSON block and inject markup, were it not escaped.
HOSTILE_KEY = "boom-</script><img src=x onerror=alert(1)>"


def inc(x: int) -> int:
    return x + 1


def fail() -> None:
    raise ValueError("fails on purpose")


def embedded(html: str) -> dict[str, Any]:
    """The figures a page embeds."""
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html)
    assert found, "no embedded figures"
    figures: dict[str, Any] = json.loads(found.group(1))
    return figures


@dataclass
class Run:
    """A report written over a small run, and what the run was."""

    path: Path
    keys: set[str]
    failed: str


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Written before any test opens a browser page: Playwright's sync API marks the
    test's thread as running an event loop while a page is open."""
    path = tmp_path_factory.mktemp("report") / "report.html"
    workers = [
        {"name": "gpu", "nthreads": 2, "resources": "gpu=[0,1]"},
        {"name": "cpu", "nthreads": 1},
    ]
    with InMemoryCluster(workers) as cluster, Client(cluster.address) as client:
        client.submit(inc, 100).result()  # before the report: not in it
        with performance_report(filename=path):
            futures = client.map(inc, range(6), resources={"gpu": 1})
            failing = client.submit(fail, key=HOSTILE_KEY)
            client.gather(futures)
            with pytest.raises(ValueError, match="on purpose"):
                failing.result()
            assert da.ones(8, chunks=2).sum().compute() == 8  # on the default client
        yield Run(path, {f.key for f in futures}, failing.key)


def test_the_page_is_one_file_embedding_every_execution(run: Run) -> None:
    assert [p.name for p in run.path.parent.iterdir()] == ["report.html"]
    html = run.path.read_text()
    assert not re.search(r"https?://", html), "the page must load nothing"
    assert "</script><img" not in html
    figures = embedded(html)
    executions = {e[0]: e for e in figures["executions"]}
    assert run.keys | {run.failed} <= set(executions)
    assert "inc-" + next(iter(run.keys)).split("-", 1)[1] in executions  # not the one before
    assert len(executions) == figures["summary"]["tasks"] == len(figures["executions"])
    assert executions[run.failed][5] is False and figures["summary"]["failures"] == 1
    groups = {g["name"]: g for g in figures["groups"]}
    assert groups["inc"]["count"] == 6 and groups["boom"]["failed"] == 1
    assert {"ones", "sum"} & set(groups)
    assert figures["code"]["filename"] == __file__
    assert figures["code"]["source"].startswith("with performance_report(filename=path):")
    assert {t["name"] for t in figures["transfers"]} == {"gpu", "cpu"}
    assert all(0 <= e[3] <= e[4] <= figures["duration"] for e in figures["executions"])


def test_resource_use_adds_up_to_what_the_executions_held(run: Run) -> None:
    figures = embedded(run.path.read_text())
    (gpu,) = [p for p in figures["pools"] if p["name"] == "gpu"]
    assert gpu["total"] == 2.0
    series = gpu["series"]
    times = [t for t, _ in series]
    assert times == sorted(times) and times[0] == 0 and times[-1] == figures["duration"]
    assert all(level >= 0 for _, level in series) and series[-1][1] == 0
    # The area under the steps is the unit-seconds the executions held.
    area = sum((t1 - t0) * level for (t0, level), (t1, _) in itertools.pairwise(series))
    held = sum(e[4] - e[3] for e in figures["executions"] if e[6].get("gpu"))
    assert area == pytest.approx(held, abs=1e-5)
    assert {e[6].get("gpu") for e in figures["executions"] if e[0] in run.keys} == {1.0}


@pytest.mark.process
def test_the_page_draws_in_chromium_without_errors(run: Run, browser_page: Page) -> None:
    browser_page.set_viewport_size({"width": 1200, "height": 900})
    browser_page.goto(run.path.as_uri())
    browser.wait_for_count(browser_page, "body[data-ready='1']", 1)
    count = len(embedded(run.path.read_text())["executions"])
    items = browser_page.get_attribute("#stream-canvas", "data-items")
    assert items == str(count)
    browser.wait_for_text(browser_page, "gpu — total 2", selector="#pools")
    browser.wait_for_text(browser_page, "inc", selector="#group-table")
    browser.wait_for_text(browser_page, HOSTILE_KEY.split("-", 1)[0], selector="#legend")
    assert browser_page.locator("img").count() == 0  # the hostile key stayed text
    browser.screenshot(browser_page, "report")
    browser.assert_no_page_errors(browser_page)


def test_an_asynchronous_client_reports_with_async_with(tmp_path: Path) -> None:
    path = tmp_path / "async.html"

    async def main() -> str:
        async with (
            InMemoryCluster(1) as cluster,
            Client(cluster.address, asynchronous=True) as client,
        ):
            async with performance_report(filename=path):
                future = client.submit(inc, 1)
                assert await future == 2
            return future.key

    key = asyncio.run(main())
    assert [e[0] for e in embedded(path.read_text())["executions"]] == [key]


def test_options_that_cannot_apply_are_refused_or_said() -> None:
    with pytest.raises(ValueError, match="local files only"):
        performance_report("s3://bucket/report.html")
    with pytest.raises(ValueError, match="local files only"):
        performance_report("report.html", storage_options={"anon": True})
    with pytest.warns(IgnoredOptionWarning, match="embeds everything"):
        performance_report("report.html", mode="cdn")


def test_warnings_of_the_window_are_kept_and_escaped() -> None:
    status: dict[str, Any] = {
        "now": 100.0,
        "scheduler": {"address": "inproc://s"},
        "workers": [],
        "threads": 0,
        "pools": [],
        "events": {"seq": 3, "items": [[2, 50.0, "warning", "old"], [3, 99.5, "warning", "</b>"]]},
    }
    # The scheduler's 99.5 is 1000.5 here; the window began at 1000.
    figures = report_page.report_data([], (1000.0, 1001.0), 901.0, status)
    assert figures["events"] == [[0.5, "warning", "</b>"]]
    assert "</b>" not in report_page.render(figures)
    assert embedded(report_page.render(figures))["events"] == figures["events"]
