"""CPU per task with many workers of one scheduler, simulated in one process.

``InMemoryCluster(N)`` runs a real scheduler and N real workers (one thread each)
in this process, connected in memory; a client here maps ``--tasks`` (20,000) no-op
tasks and gathers them, once untimed (every worker then has the function and the
client a data connection to it) and five times timed. Printed for N = 10 and N =
``--workers`` (1,000): tasks per second and this process's CPU time per task, and the
same less what the N idle workers cost on their own (their heartbeats and memory
checks, measured over 3 s before the rounds): the figure to compare, as in a real
deployment each worker's idle cost is in its own process. The last line sets the
medians side by side.

Dask has nothing alike to set beside it (its in-process workers, ``LocalCluster(
processes=False)``, are its normal workers on one event loop; a thousand of them
take minutes to start here): ``throughput.py`` and ``scale.py`` compare with Dask.

Usage: ``python benchmarks/simulated_workers.py [--workers N] [--tasks N]``
"""

from __future__ import annotations

import argparse
import statistics
import time

ROUNDS = 5
IDLE_SECONDS = 3.0


def noop(x: int) -> int:
    return x


def measure(n_workers: int, n_tasks: int) -> float:
    """Print each round; return the median CPU per task less the idle workers', us."""
    from apportion import Client
    from apportion.testing import InMemoryCluster

    started = time.perf_counter()
    less_idle = []
    with InMemoryCluster(n_workers) as cluster, Client(cluster.address) as client:
        client.wait_for_workers(n_workers, timeout=600)
        start_up = time.perf_counter() - started
        client.gather(client.map(noop, range(n_tasks), pure=False))
        time.sleep(1.0)
        cpu = time.process_time()
        time.sleep(IDLE_SECONDS)
        idle = (time.process_time() - cpu) / IDLE_SECONDS  # cores busy with no task
        print(
            f"{n_workers:,} workers: started in {start_up:.1f} s; idle, they use "
            f"{idle * 100:.0f} % of a core"
        )
        for _ in range(ROUNDS):
            cpu, wall = time.process_time(), time.perf_counter()
            client.gather(client.map(noop, range(n_tasks), pure=False))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            less_idle.append((cpu - idle * wall) / n_tasks * 1e6)
            print(
                f"  {n_tasks / wall:>8,.0f} tasks/s; CPU per task {cpu / n_tasks * 1e6:.0f} us,"
                f" less the idle workers' {less_idle[-1]:.0f} us",
                flush=True,
            )
    return statistics.median(less_idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--tasks", type=int, default=20_000)
    args = parser.parse_args()
    print(f"Simulated workers: {args.tasks:,} no-op tasks (map + gather), one process")
    small, large = (measure(n, args.tasks) for n in (10, args.workers))
    print(
        f"median CPU per task less the idle workers': 10 workers {small:.0f} us, "
        f"{args.workers:,} workers {large:.0f} us ({large / small:.2f}x)"
    )


if __name__ == "__main__":
    main()
