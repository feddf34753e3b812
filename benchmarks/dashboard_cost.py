"""What a dashboard page open costs: tiny-task throughput with and without one.

One LocalCluster (2 worker processes x 1 thread, loopback TCP) serving its
dashboard. The workload is 10,000 no-op tasks, ``map`` then ``gather``, run in
alternating rounds: no page open, then one page open, then none again, and so on,
so that whatever else the machine does weighs on both sides alike. The page is
the real one in headless Chromium (logged in through ``client.dashboard_link``,
and drawn twice before the round starts; the browser runs for the whole benchmark,
so its start-up is not counted) when Playwright and Debian's Chromium are
installed, else a reader of the page's live feed (``/events``, the server-sent
events the page listens to), which is the scheduler's whole share of the cost
without the browser's.

Then what one update of the page costs the scheduler at scale: the status built
from the pure state with 200 workers of 4 GPUs and 100,000 tasks queued, and its
JSON encoding, best of a few.

Dask's own figure for the same workload (no dashboard: it needs Bokeh) is printed
beside for scale.

Usage: ``python benchmarks/dashboard_cost.py [--rounds N] [--tasks N]
[--viewer chromium|events] [--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import http.cookiejar
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tasks
from harness import settle_apportion, settle_dask

tasks.share_with_workers()

CHROMIUM = "/usr/bin/chromium"
#: The flags the test harness uses: no background traffic to a network there is not.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def round_of(client: Any, n: int) -> float:
    """Tasks per second of one ``map`` + ``gather`` of ``n`` no-ops."""
    start = time.perf_counter()
    client.gather(client.map(tasks.noop, range(n), pure=False))
    return n / (time.perf_counter() - start)


@contextmanager
def events_reader(link: str) -> Iterator[None]:
    """Log in through ``link`` and read ``/events`` on a thread, as a page would."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(link, timeout=10) as response:  # the login: a cookie, then "/"
        response.read()
    base = link.split("/login", 1)[0]
    stream = opener.open(base + "/events", timeout=30)
    stop = threading.Event()
    got = [0]

    def read() -> None:
        while not stop.is_set():
            line = stream.readline()
            if not line:
                return
            got[0] += len(line)

    reader = threading.Thread(target=read, name="events-reader", daemon=True)
    reader.start()
    try:
        yield
    finally:
        stop.set()
        stream.close()
        reader.join(timeout=5)
        print(f"    (the feed sent {got[0]:,} bytes)", flush=True)


CHILD = """
import sys
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=sys.argv[1], args=sys.argv[2:])
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    for line in sys.stdin:
        command, _, url = line.strip().partition(" ")
        if command == "open":  # the dashboard, once it has drawn its first update
            page.goto(url)
            page.wait_for_function("() => Number(document.body.dataset.updates) >= 2")
        else:
            page.goto("about:blank")
        print("ok", flush=True)
    browser.close()
"""


class ChromiumViewer:
    """One headless Chromium, in a process of its own, for the whole run: between
    rounds its page goes from the dashboard to a blank page and back, so that its
    start-up is never part of a measured round."""

    def __init__(self) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-c", CHILD, CHROMIUM, *CHROMIUM_FLAGS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _say(self, line: str) -> None:
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write(line + "\n")
        self.child.stdin.flush()
        if self.child.stdout.readline().strip() != "ok":
            raise RuntimeError(f"the browser did not do {line.split()[0]!r}")

    @contextmanager
    def page(self, link: str) -> Iterator[None]:
        self._say(f"open {link}")
        try:
            yield
        finally:
            self._say("blank")

    def close(self) -> None:
        if self.child.stdin is not None:
            self.child.stdin.close()
        try:
            self.child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def chromium_available() -> bool:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return False
    from pathlib import Path

    return Path(CHROMIUM).exists()


def run_apportion(rounds: int, n: int, viewer: str) -> tuple[list[float], list[float]]:
    from apportion import Client, LocalCluster

    closed: list[float] = []
    opened: list[float] = []
    viewer_process = ChromiumViewer() if viewer == "chromium" else None
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        round_of(client, 500)  # warm up
        for i in range(rounds):
            settle_apportion(client)
            closed.append(round_of(client, n))
            link = client.dashboard_link
            if link is None:
                raise RuntimeError("the cluster serves no dashboard")
            page = viewer_process.page(link) if viewer_process else events_reader(link)
            with page:
                settle_apportion(client)
                opened.append(round_of(client, n))
            print(
                f"  round {i + 1}: {closed[-1]:,.0f} tasks/s without, "
                f"{opened[-1]:,.0f} with the page open",
                flush=True,
            )
    if viewer_process is not None:
        viewer_process.close()
    return closed, opened


def run_dask(rounds: int, n: int) -> list[float]:
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        round_of(client, 500)
        out = []
        for _ in range(rounds):
            settle_dask(client)
            out.append(round_of(client, n))
        return out


def status_at_scale(workers: int = 200, queued: int = 100_000) -> None:
    """Milliseconds to build one status (and encode it) with ``queued`` tasks waiting."""
    import json

    from apportion.protocol.tasks import SubmitTasks, TaskSpec
    from apportion.scheduler.events import FromClient
    from apportion.scheduler.status import status
    from apportion.testing import SimulatedCluster

    sim = SimulatedCluster()
    sim.add_client("c1")
    for i in range(workers):
        sim.add_worker(f"w{i}", nthreads=4, resources="gpu=[0,1,2,3] MEMORY=64GiB")
    # Half plain tasks, half asking for a GPU: two kinds of request, each waiting.
    specs = [
        TaskSpec(f"prep-{i:032x}", "f", b"", [], {}, 0, 0)
        if i % 2
        else TaskSpec(f"train-{i:032x}", "f", b"", [], {"gpu": 10_000}, 0, 0)
        for i in range(queued)
    ]
    keys = [spec.key for spec in specs]
    sim.handle(FromClient("c1", [SubmitTasks(specs, {"f": b"f"}, keys)], 0.0))
    sim.place()
    built, encoded, size = [], [], 0
    for _ in range(5):
        start = time.perf_counter()
        picture = status(sim.state)
        middle = time.perf_counter()
        size = len(json.dumps(picture))
        built.append(middle - start)
        encoded.append(time.perf_counter() - middle)
    queued_now = picture["tasks"]["queued"]
    print(
        f"  status with {workers} workers and {queued_now:,} queued: built in "
        f"{min(built) * 1e3:.1f} ms, JSON in {min(encoded) * 1e3:.1f} ms, {size / 1024:.0f} KiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--viewer", choices=["chromium", "events"], default=None)
    parser.add_argument("--systems", default="apportion,dask")
    args = parser.parse_args()
    viewer = args.viewer or ("chromium" if chromium_available() else "events")
    systems = args.systems.split(",")
    print(f"apportion (page: {viewer}):", flush=True)
    closed, opened = run_apportion(args.rounds, args.tasks, viewer)
    dask = run_dask(args.rounds, args.tasks) if "dask" in systems else []
    median_closed, median_opened = statistics.median(closed), statistics.median(opened)
    print()
    print(f"Dashboard cost: {args.tasks:,} no-ops, 2 workers x 1 thread, {args.rounds} rounds")
    print(f"  without a page  median {median_closed:>8,.0f} tasks/s  best {max(closed):,.0f}")
    print(f"  with one open   median {median_opened:>8,.0f} tasks/s  best {max(opened):,.0f}")
    change = median_opened / median_closed - 1
    print(f"  with/without    {median_opened / median_closed:.3f}  ({change:+.1%}; aim: within 5%)")
    status_at_scale()
    if dask:
        median_dask = statistics.median(dask)
        print(f"  dask (no dashboard) median {median_dask:,.0f} tasks/s")
        print(f"  apportion with a page open / dask: {median_opened / median_dask:.2f}x")


if __name__ == "__main__":
    main()
