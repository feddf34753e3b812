"""Tasks submitted from tasks, apportion beside Dask in the same run.

A recursive fan-out in the shape of Dask's Fibonacci example: each task submits the
two halves of the rest of its subtree with ``get_client().submit``, secedes, gathers
them and rejoins, until 10,000 tasks have run (about half of them waiting, seceded,
at the widest point). Both systems get 2 worker processes of 2 threads; the figure
is tasks per second from the root's submit to its result, best of a few runs after
a warm-up.

Usage: ``python benchmarks/tasks_from_tasks.py [--tasks N] [--repeat N]
[--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import tasks
from harness import settle_apportion, settle_dask

tasks.share_with_workers()


def measure(client: Any, library: str, settle: Callable[[Any], None], n: int, repeat: int) -> float:
    client.submit(tasks.fan_out, 50, library, pure=False).result()  # warm-up: clients, imports
    best = 0.0
    for _ in range(repeat):
        settle(client)
        start = time.perf_counter()
        count = client.submit(tasks.fan_out, n, library, pure=False).result()
        elapsed = time.perf_counter() - start
        if count != n:
            raise AssertionError(f"{count} tasks ran, expected {n}")
        best = max(best, n / elapsed)
        print(f"  {n:,} tasks in {elapsed:.2f} s: {n / elapsed:,.0f} tasks/s", flush=True)
    return best


def run_apportion(n: int, repeat: int) -> float:
    from apportion import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2) as cluster, Client(cluster) as client:
        return measure(client, "apportion", settle_apportion, n, repeat)


def run_dask(n: int, repeat: int) -> float:
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        return measure(client, "distributed", settle_dask, n, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks in the fan-out")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per system")
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    args = parser.parse_args()
    runners = {"apportion": run_apportion, "dask": run_dask}
    best: dict[str, float] = {}
    for system in args.systems.split(","):
        print(f"{system}:", flush=True)
        best[system] = runners[system](args.tasks, args.repeat)
    print()
    print(f"Tasks from tasks: a fan-out of {args.tasks:,} tasks, 2 workers x 2 threads (best)")
    for system, rate in best.items():
        print(f"  {system:<10} {rate:>10,.0f} tasks/s")
    if best.get("apportion") and best.get("dask"):
        print(f"  apportion / dask: {best['apportion'] / best['dask']:.2f}x")


if __name__ == "__main__":
    main()
