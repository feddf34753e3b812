"""Time to finish a graph despite losing a worker, apportion beside Dask in the same run.

Both systems get the same cluster: a scheduler in this process and 3 worker
processes of 1 thread each, talking over loopback TCP. The graph has 1,999 tasks of
5 ms each (``time.sleep``): 1,000 independent leaves, then pairwise sums level by
level (500, 250, 125, 62, ...; the odd node out of a level is carried up to the next
one) down to a single root. The client holds a future to every task, so every
result stays wanted: a result lost with its worker must be computed again.

Each system runs the graph

a. normally, on one warmed-up cluster, with the scheduler idle before every run;
b. with one worker process killed with SIGKILL once 1,000 futures have completed,
   counted in the client with ``as_completed``; each such run gets a fresh cluster
   (warmed up first), so that every run starts with 3 workers.

Both restart the killed worker process (Dask's Nanny; apportion's LocalCluster
supervises its workers). What is compared is the time to finish despite losing a
worker. The makespan runs from the first submit to the root's result;
afterwards every one of the 1,999 results is gathered and checked (untimed).

Usage: ``python benchmarks/recovery.py [--repeat N] [--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

import tasks
from harness import dask_task_count, wait_until

# The kill makes Dask's surviving workers log a traceback (at ERROR) for each fetch
# from the dead one that failed: expected here, and pages long, so silenced.
os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "critical")
tasks.share_with_workers()

N_WORKERS = 3
N_LEAVES = 1_000
KILL_AFTER = 1_000
#: Longest wait for the root, so that a system that never recovers cannot hang the suite.
ROOT_TIMEOUT = 180.0


@dataclass
class Graph:
    futures: list[Any]
    expected: list[int]

    @property
    def root(self) -> Any:
        return self.futures[-1]


def level_sizes() -> list[int]:
    """Tasks on each level of the graph, leaves first."""
    sizes, nodes = [N_LEAVES], N_LEAVES
    while nodes > 1:
        sizes.append(nodes // 2)
        nodes = nodes // 2 + nodes % 2
    return sizes


def build(client: Any) -> Graph:
    """Submit the graph; futures in submission order, the root last."""
    level = client.map(tasks.sleepy_inc, range(N_LEAVES), pure=False)
    values = [i + 1 for i in range(N_LEAVES)]
    graph = Graph(list(level), list(values))
    while len(level) > 1:
        pairs = range(0, len(level) - 1, 2)
        sums = [client.submit(tasks.sleepy_add, level[i], level[i + 1], pure=False) for i in pairs]
        sum_values = [values[i] + values[i + 1] for i in pairs]
        graph.futures += sums
        graph.expected += sum_values
        # The odd node out, if any, is carried up unchanged: it is not a new task.
        level = sums + level[len(sums) * 2 :]
        values = sum_values + values[len(sum_values) * 2 :]
    return graph


@dataclass
class RunResult:
    makespan: float
    root_ok: bool
    all_ok: bool
    killed_pid: int | None = None
    #: Seconds from the first submit to the kill.
    killed_at: float | None = None


def run_once(
    client: Any, as_completed: Callable[..., Iterator[Any]], victim: int | None
) -> RunResult:
    """Run the graph; SIGKILL ``victim`` once ``KILL_AFTER`` futures have completed.

    Run (a) counts completions in the same way and only skips the kill, so that both
    runs do the same work in the client.
    """
    start = time.perf_counter()
    graph = build(client)
    completions = as_completed(graph.futures, timeout=ROOT_TIMEOUT)
    for seen, _ in enumerate(completions, start=1):
        if seen >= KILL_AFTER:
            break
    killed_at = None
    if victim is not None:
        os.kill(victim, signal.SIGKILL)
        killed_at = time.perf_counter() - start
    root = graph.root.result(timeout=ROOT_TIMEOUT)
    makespan = time.perf_counter() - start
    values = client.gather(graph.futures)
    # Drained so that nothing keeps the futures it holds: apportion's callback thread
    # keeps a reference to the last callback it ran (this iterator's queue) until it
    # runs another, and the queue's futures would hold their tasks on the scheduler.
    for _ in completions:
        pass
    return RunResult(
        makespan,
        root_ok=root == graph.expected[-1],
        all_ok=list(values) == graph.expected,
        killed_pid=victim,
        killed_at=killed_at,
    )


def warm_up(client: Any) -> None:
    """Start every worker's thread and import the task module before timing."""
    leaves = client.map(tasks.sleepy_inc, range(6 * N_WORKERS), pure=False)
    client.submit(tasks.sleepy_add, leaves[0], leaves[-1], pure=False).result()
    client.gather(leaves)


@dataclass
class Session:
    """A connected client on a fresh cluster of ``N_WORKERS`` worker processes."""

    client: Any
    as_completed: Callable[..., Iterator[Any]]
    settle: Callable[[], None]
    #: Worker address -> pid of its process.
    pids_by_address: Callable[[], dict[str, int]]

    def worker_pids(self) -> list[int]:
        """Pids of the connected worker processes, in order of their addresses."""
        pids = self.pids_by_address()
        return [pids[addr] for addr in sorted(pids)]


@dataclass
class Processes:
    """Every worker pid seen, to check that none outlives its cluster."""

    pids: set[int] = field(default_factory=set)

    def leftovers(self) -> list[str]:
        left = []
        for pid in sorted(self.pids):
            with contextlib.suppress(psutil.NoSuchProcess):
                left.append(f"{pid} ({psutil.Process(pid).status()})")
        for child in psutil.Process().children(recursive=True):
            if child.pid not in self.pids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    command = " ".join(child.cmdline())[:80]
                    left.append(f"{child.pid} ({child.status()}: {command})")
        return left


@contextlib.contextmanager
def apportion_session() -> Iterator[Session]:
    from apportion import Client, LocalCluster, as_completed

    cluster = LocalCluster(n_workers=N_WORKERS, threads_per_worker=1)
    try:
        client = Client(cluster)
        try:

            def idle() -> bool:
                held = client.scheduler_info()["tasks"]
                # The client's callback thread keeps the last future it called back
                # (the previous run's root) until it runs another callback: one
                # finished result may stay, nothing else.
                return sum(held.values()) == held.get("memory", 0) <= 1

            def settle() -> None:
                gc.collect()  # drop the previous run's futures, so their releases go now
                wait_until(idle, "apportion scheduler still holds tasks")

            def pids() -> dict[str, int]:
                workers = client.scheduler_info()["workers"]
                return {addr: info["pid"] for addr, info in workers.items()}

            yield Session(client, as_completed, settle, pids)
        finally:
            client.close()
    finally:
        cluster.close()


@contextlib.contextmanager
def dask_session() -> Iterator[Session]:
    import distributed

    cluster = distributed.LocalCluster(
        n_workers=N_WORKERS, threads_per_worker=1, processes=True, dashboard_address=None
    )
    try:
        client = distributed.Client(cluster)
        try:
            client.wait_for_workers(N_WORKERS, timeout=60)

            def settle() -> None:
                gc.collect()
                wait_until(
                    lambda: client.run_on_scheduler(dask_task_count) == 0,
                    "dask scheduler still holds tasks",
                )

            def pids() -> dict[str, int]:
                # Dask's scheduler_info() has no pid per worker: ask each worker.
                return client.run(os.getpid)

            yield Session(client, distributed.as_completed, settle, pids)
        finally:
            client.close()
    finally:
        cluster.close()
        _stop_resource_tracker()


def _stop_resource_tracker() -> None:
    """Stop the helper process that spawning Dask's workers started in this process.

    multiprocessing starts it on the first spawn and leaves it until this process
    exits; stopping it here (it comes back on the next spawn) leaves nothing behind.
    """
    from multiprocessing import resource_tracker

    with contextlib.suppress(AttributeError, OSError, ChildProcessError):
        resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


@dataclass
class SystemResult:
    normal: list[RunResult]
    killed: list[RunResult]
    #: Worker processes connected at the end of each run with a kill.
    workers_after_kill: list[int]
    leftovers: list[str]


def measure(
    open_session: Callable[[], contextlib.AbstractContextManager[Session]], repeat: int
) -> SystemResult:
    processes = Processes()
    normal: list[RunResult] = []
    with open_session() as session:
        processes.pids.update(session.worker_pids())
        warm_up(session.client)
        for i in range(repeat):
            session.settle()
            run = run_once(session.client, session.as_completed, victim=None)
            normal.append(run)
            print(f"  a. run {i + 1}: {run.makespan:.3f} s, {_verdict(run)}", flush=True)
    killed: list[RunResult] = []
    workers_after: list[int] = []
    for i in range(repeat):
        with open_session() as session:
            pids = session.worker_pids()
            processes.pids.update(pids)
            warm_up(session.client)
            gc.collect()
            run = run_once(session.client, session.as_completed, victim=pids[0])
            killed.append(run)
            after = session.worker_pids()
            processes.pids.update(after)
            workers_after.append(len(after))
        print(
            f"  b. run {i + 1}: {run.makespan:.3f} s, {_verdict(run)}; killed pid "
            f"{run.killed_pid} at {run.killed_at:.3f} s; {len(after)} workers at the end",
            flush=True,
        )
    left = processes.leftovers()
    print(f"  processes left after closing: {', '.join(left) if left else 'none'}", flush=True)
    return SystemResult(normal, killed, workers_after, left)


def _verdict(run: RunResult) -> str:
    if run.root_ok and run.all_ok:
        return "all correct"
    return f"WRONG (root {'ok' if run.root_ok else 'wrong'}, all {'ok' if run.all_ok else 'no'})"


def report(results: dict[str, SystemResult]) -> None:
    sizes = level_sizes()
    n_tasks = sum(sizes)
    work = n_tasks * tasks.SLEEP_SECONDS
    print()
    print(
        f"Recovery from a lost worker: {N_WORKERS} worker processes x 1 thread, loopback TCP "
        "(best of runs)"
    )
    print(
        f"  Graph: {n_tasks:,} tasks of {tasks.SLEEP_SECONDS * 1000:g} ms (time.sleep): "
        f"{N_LEAVES:,} independent leaves, then"
    )
    print(
        f"  pairwise sums level by level ({', '.join(str(s) for s in sizes[1:])} tasks; "
        "an odd node out is carried up)"
    )
    print(
        f"  to one root = {N_LEAVES * (N_LEAVES + 1) // 2:,}. The client holds every future, "
        "so lost results are recomputed."
    )
    print(
        f"  Kill: SIGKILL to the first worker process by address once {KILL_AFTER:,} futures "
        "have completed,"
    )
    print("  counted with as_completed in the client; a fresh cluster for each run with a kill.")
    print(
        "  Both restart the killed worker process (Dask's Nanny, apportion's supervised "
        "LocalCluster)."
    )
    print("  The comparison is the time to finish despite losing a worker.")
    print(
        f"  No-kill lower bound: {work:.2f} s of work / {N_WORKERS} threads = "
        f"{work / N_WORKERS:.3f} s"
    )
    header = (
        f"{'system':<10} {'no kill':>8} {'with kill':>10} {'slowdown':>9} "
        f"{'workers after':>14}  correct"
    )
    print(header)
    print("-" * len(header))
    for name, result in results.items():
        a = min(r.makespan for r in result.normal)
        b = min(r.makespan for r in result.killed)
        runs = result.normal + result.killed
        right = sum(r.root_ok and r.all_ok for r in runs)
        correct = "yes" if right == len(runs) else "NO"
        after = "/".join(str(n) for n in result.workers_after_kill)
        print(
            f"{name:<10} {a:>7.3f}s {b:>9.3f}s {b / a:>8.2f}x {after:>14}  {correct} "
            f"({right}/{len(runs)} runs: root and all {n_tasks:,} results)"
        )
    print(
        f"  best of {max(len(r.normal) for r in results.values())} for each column; "
        "'workers after' = workers connected at the end of each run with a kill"
    )
    if "apportion" in results and "dask" in results:
        ours, theirs = results["apportion"], results["dask"]
        mine = min(r.makespan for r in ours.killed)
        other = min(r.makespan for r in theirs.killed)
        print(f"With a kill: dask / apportion = {other / mine:.2f}x")
    for name, result in results.items():
        if result.leftovers:
            print(f"{name}: processes LEFT RUNNING: {', '.join(result.leftovers)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of (a) and of (b) per system")
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    args = parser.parse_args()
    sessions = {"apportion": apportion_session, "dask": dask_session}
    results: dict[str, SystemResult] = {}
    for system in args.systems.split(","):
        print(f"{system}:", flush=True)
        start = time.perf_counter()
        results[system] = measure(sessions[system], args.repeat)
        print(f"  ({time.perf_counter() - start:.1f} s including start-up)", flush=True)
    report(results)


if __name__ == "__main__":
    main()
