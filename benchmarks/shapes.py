"""Processes x threads per node: the same 2 cores cut into workers three ways, beside Dask.

The deployment guide's advice on ``apportion worker --nworkers P --nthreads T``,
measured: for each shape (``--shapes``, default 1x2, 2x1 and 4x1 workers x threads)
a local cluster of P worker processes of T threads each (``LocalCluster(n_workers=P,
threads_per_worker=T, processes=True)``, each system's), and on it three workloads,
``map`` then ``gather``, each ``--rounds`` (3) times after a warm-up:

- ``--noop-tasks`` (20,000) no-op tasks: scheduling overhead alone;
- ``--work-tasks`` (2,000) tasks that hold the GIL for ``--work-ms`` (1 ms) each: a
  pure-Python loop (``tasks.spin``), as CPU-bound Python code;
- as many that release it for as long (``tasks.nap``: ``time.sleep``), as I/O or
  NumPy's large operations do.

Tasks/s, best of the rounds and their range. The floor for the GIL-holding tasks is
(tasks x ms) / min(cores, P) and for the releasing ones (tasks x ms) / (P x T): the
"ideal" column gives those as tasks/s.

Usage: ``python benchmarks/shapes.py [--shapes 1x2,2x1,4x1] [--rounds N]
[--noop-tasks N] [--work-tasks N] [--work-ms MS] [--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psutil

import tasks
from harness import settle_apportion, settle_dask
from throughput import warm_up

tasks.share_with_workers()


@dataclass
class Workload:
    label: str
    func: Callable[..., Any]
    n: int
    #: Each task's argument.
    arg: float
    #: tasks/s no shape can beat on this machine, given (processes, threads).
    ideal: Callable[[int, int], float] | None = None
    rates: list[float] = field(default_factory=list)


def workloads(args: argparse.Namespace) -> list[Workload]:
    seconds = args.work_ms / 1000
    cores = psutil.cpu_count(logical=True) or 1
    return [
        Workload(f"{args.noop_tasks:,} no-op", tasks.noop, args.noop_tasks, 0),
        Workload(
            f"{args.work_tasks:,} x {args.work_ms:g} ms holding the GIL",
            tasks.spin,
            args.work_tasks,
            seconds,
            lambda p, t: min(cores, p) / seconds,
        ),
        Workload(
            f"{args.work_tasks:,} x {args.work_ms:g} ms releasing it",
            tasks.nap,
            args.work_tasks,
            seconds,
            lambda p, t: p * t / seconds,
        ),
    ]


def measure(client: Any, settle: Callable[[], None], work: Workload, rounds: int) -> None:
    for _ in range(rounds):
        settle()
        start = time.perf_counter()
        client.gather(client.map(work.func, [work.arg] * work.n, pure=False))
        work.rates.append(work.n / (time.perf_counter() - start))


def cluster(system: str, processes: int, threads: int) -> tuple[Any, Any, Callable[[], None]]:
    if system == "apportion":
        import apportion

        local = apportion.LocalCluster(
            n_workers=processes, threads_per_worker=threads, processes=True
        )
        client = apportion.Client(local)
        return local, client, partial(settle_apportion, client)
    import distributed

    local = distributed.LocalCluster(
        n_workers=processes, threads_per_worker=threads, processes=True, dashboard_address=None
    )
    client = distributed.Client(local)
    return local, client, partial(settle_dask, client)


def run(system: str, shape: str, args: argparse.Namespace) -> list[Workload]:
    processes, threads = (int(n) for n in shape.split("x"))
    local, client, settle = cluster(system, processes, threads)
    try:
        warm_up(client)
        done = []
        for work in workloads(args):
            measure(client, settle, work, args.rounds)
            print(
                f"  {system} {shape} {work.label}: {max(work.rates):,.0f} tasks/s "
                f"({min(work.rates):,.0f}-{max(work.rates):,.0f})",
                flush=True,
            )
            done.append(work)
        return done
    finally:
        client.close()
        local.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1x2,2x1,4x1", help="processes x threads, ...")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each workload")
    parser.add_argument("--noop-tasks", type=int, default=20_000)
    parser.add_argument("--work-tasks", type=int, default=2_000)
    parser.add_argument("--work-ms", type=float, default=1.0, help="each work task's ms")
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    args = parser.parse_args()
    results: dict[tuple[str, str], list[Workload]] = {}
    for system in args.systems.split(","):
        for shape in args.shapes.split(","):
            results[system, shape] = run(system, shape, args)
    cores = psutil.cpu_count(logical=True)
    print()
    print(
        f"tasks/s, best of {args.rounds} (range), workers x threads on {cores} cores; "
        "ideal: the floor of the work's own time"
    )
    header = f"{'workload':<34} {'shape':>5} {'ideal':>7}"
    systems = args.systems.split(",")
    header += "".join(f"{s:>22}" for s in systems)
    print(header)
    print("-" * len(header))
    for index, work in enumerate(workloads(args)):
        for shape in args.shapes.split(","):
            p, t = (int(n) for n in shape.split("x"))
            ideal = "-" if work.ideal is None else f"{work.ideal(p, t):,.0f}"
            line = f"{work.label:<34} {shape:>5} {ideal:>7}"
            for system in systems:
                rates = results[system, shape][index].rates
                line += f"{f'{max(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})':>22}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
