"""End-to-end tasks per second over TCP, apportion beside Dask (and Ray) in the same run.

Every system gets the same shape: a scheduler in this process and 2 worker processes
of 1 thread each, talking over loopback TCP (Ray: ``ray.init(num_cpus=2)``, tasks of
one CPU, so two run at once in its worker processes; run with ``--systems
apportion,dask,ray`` where Ray is installed: the ``bench`` extra has it). Three
workloads, each the best of a few repetitions after a warm-up:

a. independent: 10,000 no-op tasks, ``map`` then ``gather``;
b. tree: a binary reduction over 4,096 leaves, submitted as futures on futures
   (4,095 ``add`` tasks), ``result()`` of the root;
c. merge: 10,000 tasks and one task taking all of them as a list, ``result()``.

Tasks per second counts every task of the workload (8,191 for the tree, 10,001 for
the merge) over the wall time from the first submit to the last result. Every
submit passes ``pure=False`` so that no repetition reuses an earlier result.

``--profile`` runs only apportion's independent workload and prints the CPU time
per task of each process (the client and scheduler, each worker) and where it goes,
stage by stage (``task_profile.py``).

Ray runs the same workload code through a small adapter (``RayClient``): ``map`` and
``submit`` are remote calls, a list of futures given as one argument reaches the task
as the list of its values (Ray resolves only top-level references, so the adapter
passes them as separate arguments and rebuilds the list).

Usage: ``python benchmarks/throughput.py [--repeat N] [--min-runs N] [--budget S]
[--systems apportion,dask,ray] [--profile]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import tasks
from harness import settle_apportion, settle_dask

tasks.share_with_workers()

N_INDEPENDENT = 10_000
N_LEAVES = 4_096
N_MERGE = 10_000

#: Minimum apportion/Dask ratio we aim for, per workload (printed, never asserted).
TARGETS = {"a. independent": 20.0, "b. tree": 20.0, "c. merge": 20.0}
#: ... and apportion/Ray.
RAY_TARGET = 5.0


def independent(client: Any) -> int:
    futures = client.map(tasks.noop, range(N_INDEPENDENT), pure=False)
    client.gather(futures)
    return N_INDEPENDENT


def tree(client: Any) -> int:
    level = client.map(tasks.inc, range(N_LEAVES), pure=False)
    count = len(level)
    while len(level) > 1:
        level = [
            client.submit(tasks.add, level[i], level[i + 1], pure=False)
            for i in range(0, len(level), 2)
        ]
        count += len(level)
    total = level[0].result()
    expected = N_LEAVES * (N_LEAVES + 1) // 2
    if total != expected:
        raise AssertionError(f"tree reduction gave {total}, expected {expected}")
    return count


def merge(client: Any) -> int:
    futures = client.map(tasks.inc, range(N_MERGE), pure=False)
    total = client.submit(tasks.sum_of, futures, pure=False).result()
    expected = N_MERGE * (N_MERGE + 1) // 2
    if total != expected:
        raise AssertionError(f"merge gave {total}, expected {expected}")
    return N_MERGE + 1


@dataclass(frozen=True)
class RunPlan:
    """How many times to run each workload."""

    max_runs: int = 3
    min_runs: int = 2
    #: Seconds per workload after which no run beyond ``min_runs`` starts.
    budget: float = 20.0


WORKLOADS: dict[str, Callable[[Any], int]] = {
    "a. independent": independent,
    "b. tree": tree,
    "c. merge": merge,
}


def warm_up(client: Any) -> None:
    """Start worker threads, load the task module and fill caches before timing."""
    client.gather(client.map(tasks.noop, range(200), pure=False))
    leaves = client.map(tasks.inc, range(8), pure=False)
    client.submit(tasks.sum_of, leaves, pure=False).result()
    client.submit(tasks.add, leaves[0], leaves[1], pure=False).result()


def measure(client: Any, settle: Callable[[], None], plan: RunPlan) -> dict[str, float]:
    """Best tasks/s of each workload, with the cluster idle before every run.

    Each workload runs ``plan.max_runs`` times, but stops after ``plan.min_runs`` once
    ``plan.budget`` seconds have gone on it: the same rule for both systems, so
    that a slow system does not make the whole suite take many minutes.
    """
    best: dict[str, float] = {}
    for name, workload in WORKLOADS.items():
        spent, runs = 0.0, 0
        while runs < plan.max_runs and (runs < plan.min_runs or spent < plan.budget):
            settle()
            start = time.perf_counter()
            count = workload(client)
            elapsed = time.perf_counter() - start
            spent, runs = spent + elapsed, runs + 1
            best[name] = max(best.get(name, 0.0), count / elapsed)
        print(f"  {name:<16} {best[name]:>10,.0f} tasks/s  (best of {runs})", flush=True)
    return best


def run_apportion(plan: RunPlan) -> dict[str, float]:
    from apportion import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1)
    try:
        client = Client(cluster)
        try:
            settle = partial(settle_apportion, client)

            warm_up(client)
            return measure(client, settle, plan)
        finally:
            client.close()
    finally:
        cluster.close()


def run_dask(plan: RunPlan) -> dict[str, float]:
    import distributed

    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    try:
        client = distributed.Client(cluster)
        try:
            settle = partial(settle_dask, client)

            warm_up(client)
            return measure(client, settle, plan)
        finally:
            client.close()
    finally:
        cluster.close()


class _RayFuture:
    """A Ray object reference with the two calls the workloads make on a future."""

    __slots__ = ("ref",)

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def result(self) -> Any:
        import ray

        return ray.get(self.ref)


def _rebuilt(func: Callable[..., Any], shape: list[int], *values: Any) -> Any:
    """Call ``func`` with the arguments ``RayClient.submit`` flattened: ``shape[i]`` is
    -1 for an argument passed as it was, else the length of a list of futures."""
    args, at = [], 0
    for n in shape:
        if n < 0:
            args.append(values[at])
            at += 1
        else:
            args.append(list(values[at : at + n]))
            at += n
    return func(*args)


class RayClient:
    """The part of a client the workloads use, on Ray's tasks (one CPU each)."""

    def __init__(self) -> None:
        import ray

        self._ray = ray
        self._remote: dict[Any, Any] = {}

    def _fn(self, func: Any) -> Any:
        remote = self._remote.get(func)
        if remote is None:
            remote = self._remote[func] = self._ray.remote(num_cpus=1)(func)
        return remote

    def map(self, func: Any, items: Any, pure: bool = False) -> list[_RayFuture]:
        remote = self._fn(func)
        return [_RayFuture(remote.remote(item)) for item in items]

    def submit(self, func: Any, *args: Any, pure: bool = False) -> _RayFuture:
        if not any(isinstance(a, list) for a in args):
            refs = [a.ref if isinstance(a, _RayFuture) else a for a in args]
            return _RayFuture(self._fn(func).remote(*refs))
        shape, flat = [], []
        for a in args:
            if isinstance(a, list):
                shape.append(len(a))
                flat.extend(f.ref if isinstance(f, _RayFuture) else f for f in a)
            else:
                shape.append(-1)
                flat.append(a.ref if isinstance(a, _RayFuture) else a)
        return _RayFuture(self._fn(_rebuilt).remote(func, shape, *flat))

    def gather(self, futures: list[_RayFuture]) -> list[Any]:
        return list(self._ray.get([f.ref for f in futures]))


def run_ray(plan: RunPlan) -> dict[str, float]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        client = RayClient()
        warm_up(client)
        return measure(client, lambda: time.sleep(0.2), plan)
    finally:
        ray.shutdown()


def _processes(client: Any) -> dict[str, Any]:
    """This process (client and scheduler) and each worker process, by name."""
    import psutil

    pids = sorted(w["pid"] for w in client.scheduler_info()["workers"].values())
    out = {"client+scheduler": psutil.Process()}
    out.update({f"worker {i + 1}": psutil.Process(pid) for i, pid in enumerate(pids)})
    return out


def _cpu(processes: dict[str, Any]) -> dict[str, float]:
    return {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}


def cpu_per_task(repeat: int) -> dict[str, float]:
    """CPU seconds per task of each process over the independent workload, no profiler:
    the run with the least CPU in total of ``repeat`` (the one least disturbed)."""
    from apportion import Client, LocalCluster

    best: dict[str, float] = {}
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        warm_up(client)
        processes = _processes(client)
        for _ in range(repeat):
            settle_apportion(client)
            before, start = _cpu(processes), time.perf_counter()
            count = independent(client)
            elapsed, after = time.perf_counter() - start, _cpu(processes)
            per = {name: (after[name] - before[name]) / count for name in processes}
            print(
                f"  {count / elapsed:>8,.0f} tasks/s; CPU per task: "
                + ", ".join(f"{name} {us * 1e6:.0f} us" for name, us in per.items())
                + f"; total {sum(per.values()) * 1e6:.0f} us",
                flush=True,
            )
            if not best or sum(per.values()) < sum(best.values()):
                best = per
    return best


def _worker_clear() -> None:
    import task_profile

    task_profile.clear()


def _worker_collect() -> bytes:
    import task_profile

    return task_profile.collect()


def stage_profiles() -> dict[str, dict[str, Any]]:
    """Every thread of every process under cProfile over one run of the independent
    workload (after a warm-up): {process: {thread: stats}}."""
    import marshal

    import task_profile
    from apportion import Client, LocalCluster

    os.environ[task_profile.ENVIRONMENT_VARIABLE] = "1"
    path = [str(task_profile.HOOK_DIR), os.environ["PYTHONPATH"]]
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    task_profile.start()
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        warm_up(client)
        processes = _processes(client)
        by_pid = {p.pid: name for name, p in processes.items()}
        pids = {w: info["pid"] for w, info in client.scheduler_info()["workers"].items()}
        settle_apportion(client)
        client.run(_worker_clear)
        task_profile.clear()
        independent(client)
        profiles = {"client+scheduler": marshal.loads(task_profile.collect())}
        for address, blob in client.run(_worker_collect).items():
            profiles[by_pid[pids[address]]] = marshal.loads(blob)
    return dict(sorted(profiles.items()))


def profile(repeat: int) -> None:
    """CPU per task of each process, then its split by stage (``task_profile.py``)."""
    import task_profile

    print(f"apportion, {N_INDEPENDENT:,} no-op tasks (map + gather), 2 workers x 1 thread:")
    cpu = cpu_per_task(repeat)
    print("profiling every thread of every process (one more run)...", flush=True)
    profiles = stage_profiles()
    task_profile.report(cpu, profiles)


def report(results: dict[str, dict[str, float]]) -> None:
    ours = results.get("apportion", {})
    theirs = results.get("dask", {})
    print()
    print("End-to-end throughput: 2 worker processes x 1 thread, loopback TCP (best of runs)")
    header = f"{'workload':<16} {'apportion/s':>12} {'dask/s':>10} {'ratio':>7} {'target':>7}  met"
    print(header)
    print("-" * len(header))
    for name in WORKLOADS:
        a, d = ours.get(name), theirs.get(name)
        ratio = a / d if a and d else None
        target = TARGETS[name]
        met = "-" if ratio is None else ("yes" if ratio >= target else "NO")
        print(
            f"{name:<16} {_fmt(a):>12} {_fmt(d):>10} "
            f"{(f'{ratio:.2f}x' if ratio else '-'):>7} {f'>={target:g}x':>7}  {met}"
        )
    rays = results.get("ray")
    if rays:
        print()
        print(f"{'workload':<16} {'apportion/s':>12} {'ray/s':>10} {'ratio':>7} {'target':>7}  met")
        for name in WORKLOADS:
            a, r = ours.get(name), rays.get(name)
            ratio = a / r if a and r else None
            met = "-" if ratio is None else ("yes" if ratio >= RAY_TARGET else "NO")
            print(
                f"{name:<16} {_fmt(a):>12} {_fmt(r):>10} "
                f"{(f'{ratio:.2f}x' if ratio else '-'):>7} {f'>={RAY_TARGET:g}x':>7}  {met}"
            )
    if ours:
        per_task = {name: 1e6 / rate for name, rate in ours.items()}
        text = ", ".join(f"{name.split('. ')[1]} {us:.0f} us" for name, us in per_task.items())
        print(f"apportion wall time per task: {text}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="most runs per workload")
    parser.add_argument("--min-runs", type=int, default=2, help="fewest runs per workload")
    parser.add_argument(
        "--budget", type=float, default=20.0, help="seconds per workload before min-runs stops"
    )
    parser.add_argument(
        "--systems",
        default="apportion,dask,ray" if importlib.util.find_spec("ray") else "apportion,dask",
        help="comma-separated (default: Ray too where it is installed)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="apportion's CPU per task by process and stage"
    )
    args = parser.parse_args()
    if args.profile:
        profile(args.repeat)
        return
    plan = RunPlan(args.repeat, min(args.min_runs, args.repeat), args.budget)
    runners = {"apportion": run_apportion, "dask": run_dask, "ray": run_ray}
    results: dict[str, dict[str, float]] = {}
    for system in args.systems.split(","):
        print(f"{system}:", flush=True)
        start = time.perf_counter()
        results[system] = runners[system](plan)
        print(f"  ({time.perf_counter() - start:.1f} s including start-up)", flush=True)
    report(results)


if __name__ == "__main__":
    main()
