"""CPU per task with many workers of one scheduler, simulated in one process.

A real scheduler and N real workers (one thread each) run in this process, connected
in memory (``inproc://``), the scheduler on an event loop thread of its own and the
workers together on another, as the in-memory cluster of ``apportion.testing`` runs
them but for that split; a client here maps ``--tasks`` (20,000) no-op tasks and
gathers them, once untimed (every worker then has the function and the client a data
connection to it) and five times timed. Printed for N = 10 and N = ``--workers``
(1,000), per round: tasks per second, and the CPU time per task of each part of the
process, measured per thread (``/proc/self/task/*/schedstat``) less what that part
uses idle (heartbeats and memory checks, over 3 s before the rounds), as in a real
deployment each worker's idle cost is in its own process:

* ``scheduler``: its loop thread, all it does for the tasks (the state machine, its
  side of every frame): what one scheduler of that many workers pays per task;
* ``workers``: the loop thread of the N workers (their state, their side of every
  frame);
* ``task threads``: the threads running the tasks (waking for each);
* ``client``: the client's loop thread and the calling thread (map and gather).

The last lines set the medians side by side, the scheduler's first.

Dask has nothing alike to set beside it (its in-process workers, ``LocalCluster(
processes=False)``, are its normal workers on one event loop; a thousand of them
take minutes to start here): ``throughput.py`` and ``scale.py`` compare with Dask.

Usage: ``python benchmarks/simulated_workers.py [--workers N] [--tasks N]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections import defaultdict

ROUNDS = 5
IDLE_SECONDS = 3.0
PARTS = ("scheduler", "workers", "task threads", "client")
SCHEDULER_THREAD, WORKERS_THREAD = "bench-scheduler", "bench-workers"


def noop(x: int) -> int:
    return x


def cpu_by_part() -> dict[str, float]:
    """Seconds of CPU each part of this process has used so far (exact to the ns)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                seconds = int(f.read().split()[0]) / 1e9
        except OSError:  # the thread ended meanwhile
            continue
        name = names.get(int(tid), "")
        if name == SCHEDULER_THREAD:
            out["scheduler"] += seconds
        elif name == WORKERS_THREAD:
            out["workers"] += seconds
        elif name.startswith("apportion-task"):
            out["task threads"] += seconds
        else:  # the calling thread, the client's loop and anything else of the process
            out["client"] += seconds
    return out


def measure(n_workers: int, n_tasks: int) -> dict[str, float]:
    """Print each round; return each part's median CPU per task less its idle use, us."""
    from apportion import Client
    from apportion.loop_thread import LoopThread
    from apportion.scheduler.service import Scheduler
    from apportion.worker.service import Worker

    address = f"inproc://simulated-{n_workers}"
    scheduler_loop, workers_loop = LoopThread(SCHEDULER_THREAD), LoopThread(WORKERS_THREAD)
    scheduler = Scheduler(address)
    workers: list[Worker] = []

    async def start_workers() -> None:
        for _ in range(n_workers):  # after the scheduler: they take its credentials
            workers.append(Worker(address, nthreads=1))
            await workers[-1].start()

    async def close_workers() -> None:
        for worker in workers:
            await worker.close()

    started = time.perf_counter()
    per_part: dict[str, list[float]] = defaultdict(list)
    scheduler_loop.run(scheduler.start())
    try:
        workers_loop.run(start_workers(), timeout=600)
        with Client(address) as client:
            client.wait_for_workers(n_workers, timeout=600)
            start_up = time.perf_counter() - started
            client.gather(client.map(noop, range(n_tasks), pure=False))
            time.sleep(1.0)
            before = cpu_by_part()
            time.sleep(IDLE_SECONDS)
            after = cpu_by_part()
            idle = {p: (after[p] - before[p]) / IDLE_SECONDS for p in PARTS}
            print(
                f"{n_workers:,} workers: started in {start_up:.1f} s; idle, they use "
                f"{sum(idle.values()) * 100:.0f} % of a core"
            )
            for _ in range(ROUNDS):
                before, wall = cpu_by_part(), time.perf_counter()
                client.gather(client.map(noop, range(n_tasks), pure=False))
                after, wall = cpu_by_part(), time.perf_counter() - wall
                for part in PARTS:
                    used = after[part] - before[part] - idle[part] * wall
                    per_part[part].append(used / n_tasks * 1e6)
                cells = ", ".join(f"{p} {per_part[p][-1]:.1f}" for p in PARTS)
                total = sum(per_part[p][-1] for p in PARTS)
                print(
                    f"  {n_tasks / wall:>8,.0f} tasks/s; CPU per task less idle: {total:.0f} us"
                    f" ({cells})",
                    flush=True,
                )
    finally:
        workers_loop.run(close_workers(), timeout=120)
        scheduler_loop.run(scheduler.close(), timeout=30)
        workers_loop.stop()
        scheduler_loop.stop()
    return {p: statistics.median(per_part[p]) for p in PARTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--tasks", type=int, default=20_000)
    args = parser.parse_args()
    print(f"Simulated workers: {args.tasks:,} no-op tasks (map + gather), one process")
    small, large = (measure(n, args.tasks) for n in (10, args.workers))
    print(f"median CPU per task less idle, us: 10 workers / {args.workers:,} workers")
    for part in (*PARTS, "all"):
        a = sum(small.values()) if part == "all" else small[part]
        b = sum(large.values()) if part == "all" else large[part]
        print(f"  {part:<13} {a:6.1f} / {b:6.1f}  ({b / a:.2f}x)")


if __name__ == "__main__":
    main()
