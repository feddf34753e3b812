"""Asynchronous clients, apportion beside Dask in the same run.

Two figures a service on one event loop cares about, for each system's
``Client(asynchronous=True)`` of a local cluster of 1 worker process with 2 threads:

- throughput: N requests at once, each awaiting one tiny task (``await
  asyncio.gather(*(handler(i) for i in range(N)))`` where each handler does ``return
  await client.submit(inc, i)``), in tasks per second, best of a few runs;
- loop lag: while a large gather (200 MB of results by default) is in flight, how
  late a ticker's ``asyncio.sleep(0.005)`` wakes: the worst and the 99th percentile
  (what every other request on that loop would wait), with the gather's own time.

Usage: ``python benchmarks/async_client.py [--requests N] [--megabytes N] [--repeat N]
[--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import tasks

tasks.share_with_workers()

#: Results the large gather fetches; their size is spread evenly over them.
PARTS = 8


class Figures:
    """What one system measured."""

    def __init__(self) -> None:
        self.rate = 0.0
        self.gather_seconds: list[float] = []
        self.lag_max: list[float] = []
        self.lag_p99: list[float] = []


async def throughput(client: Any, n: int, repeat: int, figures: Figures) -> None:
    async def handler(i: int) -> int:
        value: int = await client.submit(tasks.inc, i, pure=False)
        return value

    await asyncio.gather(*(handler(i) for i in range(50)))  # warm-up
    for _ in range(repeat):
        start = time.perf_counter()
        results = await asyncio.gather(*(handler(i) for i in range(n)))
        elapsed = time.perf_counter() - start
        if results != list(range(1, n + 1)):
            raise AssertionError("wrong results")
        figures.rate = max(figures.rate, n / elapsed)
        print(f"  {n:,} awaited submits in {elapsed:.2f} s: {n / elapsed:,.0f} tasks/s")


async def loop_lag(client: Any, megabytes: int, repeat: int, figures: Figures) -> None:
    nbytes = megabytes * 10**6 // PARTS
    for run in range(repeat):
        parts = client.map(tasks.filled, [run * PARTS + i for i in range(PARTS)], nbytes=nbytes)
        for part in parts:
            await part.exception()  # done, but not fetched
        lags: list[float] = []
        stop = asyncio.Event()

        async def ticker(lags: list[float] = lags, stop: asyncio.Event = stop) -> None:
            loop = asyncio.get_running_loop()
            while not stop.is_set():
                start = loop.time()
                await asyncio.sleep(0.005)
                lags.append(loop.time() - start - 0.005)

        beat = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        first = len(lags)
        start = time.perf_counter()
        values = await client.gather(parts)
        elapsed = time.perf_counter() - start
        during = lags[first:] or [elapsed]  # no tick at all: the whole gather was a stall
        stop.set()
        await beat
        got = sum(v.nbytes for v in values)
        del values, parts
        if got != PARTS * nbytes:
            raise AssertionError(f"gathered {got} bytes, expected {PARTS * nbytes}")
        p99 = statistics.quantiles(during, n=100, method="inclusive")[-1]
        figures.gather_seconds.append(elapsed)
        figures.lag_max.append(max(during))
        figures.lag_p99.append(p99)
        print(
            f"  gather of {megabytes} MB in {elapsed * 1e3:.0f} ms, {len(during)} ticks: "
            f"lag max {max(during) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms"
        )


async def run_apportion(args: argparse.Namespace) -> Figures:
    from apportion import Client, LocalCluster

    figures = Figures()
    async with (
        LocalCluster(n_workers=1, threads_per_worker=2, asynchronous=True) as cluster,
        Client(cluster, asynchronous=True) as client,
    ):
        await throughput(client, args.requests, args.repeat, figures)
        await loop_lag(client, args.megabytes, args.repeat, figures)
    return figures


async def run_dask(args: argparse.Namespace) -> Figures:
    import distributed

    figures = Figures()
    async with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=True,
            dashboard_address=None,
            asynchronous=True,
        ) as cluster,
        distributed.Client(cluster, asynchronous=True) as client,
    ):
        await throughput(client, args.requests, args.repeat, figures)
        await loop_lag(client, args.megabytes, args.repeat, figures)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="awaited submits at once")
    parser.add_argument("--megabytes", type=int, default=200, help="size of the large gather")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per system")
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    args = parser.parse_args()
    runners = {"apportion": run_apportion, "dask": run_dask}
    found: dict[str, Figures] = {}
    for system in args.systems.split(","):
        print(f"{system}:", flush=True)
        found[system] = asyncio.run(runners[system](args))
    print()
    print(
        f"Asynchronous client, 1 worker x 2 threads: {args.requests:,} concurrent awaited "
        f"submits (best), loop lag during a {args.megabytes} MB gather (median of runs)"
    )
    for system, f in found.items():
        print(
            f"  {system:<10} {f.rate:>8,.0f} tasks/s   lag max "
            f"{statistics.median(f.lag_max) * 1e3:6.1f} ms, p99 "
            f"{statistics.median(f.lag_p99) * 1e3:6.1f} ms, gather "
            f"{statistics.median(f.gather_seconds) * 1e3:5.0f} ms"
        )
    a, d = found.get("apportion"), found.get("dask")
    if a and d:
        print(f"  throughput apportion / dask: {a.rate / d.rate:.2f}x")
        lag = statistics.median(d.lag_max) / max(statistics.median(a.lag_max), 1e-6)
        print(f"  worst lag dask / apportion: {lag:.1f}x (above 1: apportion's loop is freer)")


if __name__ == "__main__":
    main()
