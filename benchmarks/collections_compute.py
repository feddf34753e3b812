"""Dask collections computed on apportion beside Dask.distributed, in the same run.

Both systems get the same shape: a scheduler in this process and 2 worker processes
of 1 thread each, over loopback TCP, and each computes the same collections with
its own client's ``compute(..., sync=True)`` (Dask lowers and optimises the graph
on the client either way):

a. array: ``(x + x.T).sum()`` of a 2,000 x 2,000 array of ones in 100 x 100 chunks
   (938 tasks after Dask's optimisation);
b. bag: 200,000 numbers in 2,000 partitions, ``map``, ``filter``, ``sum`` (4,288 tasks);
c. delayed: a binary reduction over 2,048 ``delayed`` leaves (4,095 calls).

Each figure is the best wall time of a few runs after a warm-up, from ``compute``
to the value (checked), with the cluster idle before every run.

``--profile`` runs only apportion and prints, per workload, where the wall time goes
(Dask lowering and optimising the collection, the client turning that graph into
tasks, the cluster running them) and the CPU time per task of each process, stage by
stage (``task_profile.py``; Dask's own code is a stage of its own).

Usage: ``python benchmarks/collections_compute.py [--repeat N] [--systems apportion,dask]
[--profile]``
"""

from __future__ import annotations

import argparse
import marshal
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import dask
import dask.array as da
import dask.bag as db

import tasks
from harness import settle_apportion, settle_dask

tasks.share_with_workers()

SIDE, CHUNK = 2_000, 100
N_NUMBERS, N_PARTITIONS = 200_000, 2_000
N_LEAVES = 2_048


def array() -> tuple[Any, Any]:
    x = da.ones((SIDE, SIDE), chunks=CHUNK)
    return (x + x.T).sum(), 2.0 * SIDE * SIDE


def bag() -> tuple[Any, Any]:
    numbers = db.from_sequence(range(N_NUMBERS), npartitions=N_PARTITIONS)
    total = numbers.map(tasks.inc).filter(tasks.is_even).sum()
    return total, sum(n + 1 for n in range(N_NUMBERS) if (n + 1) % 2 == 0)


def delayed_tree() -> tuple[Any, Any]:
    level = [dask.delayed(tasks.inc)(i) for i in range(N_LEAVES)]
    while len(level) > 1:
        pairs = zip(level[::2], level[1::2], strict=True)
        level = [dask.delayed(tasks.add)(a, b) for a, b in pairs]
    return level[0], N_LEAVES * (N_LEAVES + 1) // 2


WORKLOADS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "a. array": array,
    "b. bag": bag,
    "c. delayed": delayed_tree,
}


def measure(client: Any, settle: Callable[[], None], repeat: int) -> dict[str, float]:
    """Best seconds per workload; each collection is built afresh for every run."""
    best: dict[str, float] = {}
    for name, build in WORKLOADS.items():
        for _ in range(repeat):
            collection, expected = build()
            settle()
            start = time.perf_counter()
            value = client.compute(collection, sync=True)
            elapsed = time.perf_counter() - start
            if value != expected:
                raise AssertionError(f"{name}: got {value}, expected {expected}")
            best[name] = min(best.get(name, float("inf")), elapsed)
        print(f"  {name:<12} {best[name]:>8.3f} s  (best of {repeat})", flush=True)
    return best


def warm_up(client: Any) -> None:
    """Load Dask, NumPy and the task module on the workers before timing."""
    x = da.ones((200, 200), chunks=100)
    client.compute((x + x.T).sum(), sync=True)
    client.compute(db.from_sequence(range(10), npartitions=2).map(tasks.inc).sum(), sync=True)


def run_apportion(repeat: int) -> dict[str, float]:
    from apportion import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        settle = partial(settle_apportion, client)

        warm_up(client)
        return measure(client, settle, repeat)


def run_dask(repeat: int) -> dict[str, float]:
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        settle = partial(settle_dask, client)

        warm_up(client)
        return measure(client, settle, repeat)


def _processes(client: Any) -> dict[str, Any]:
    """This process (client and scheduler) and each worker process, by name."""
    import psutil

    pids = sorted(w["pid"] for w in client.scheduler_info()["workers"].values())
    out = {"client+scheduler": psutil.Process()}
    out.update({f"worker {i + 1}": psutil.Process(pid) for i, pid in enumerate(pids)})
    return out


def _cpu(processes: dict[str, Any]) -> dict[str, float]:
    return {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}


def phases(
    client: Any, build: Callable[[], tuple[Any, Any]], processes: dict[str, Any]
) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds of one run by phase, and the CPU seconds per task of each process over
    it. The lowering is timed on a twin of the collection (what ``compute`` runs
    first, Dask's work); submitting is ``compute`` without waiting, less that;
    running is the wait for the value."""
    from apportion.client.collections import lower

    twin, _ = build()
    start = time.perf_counter()
    graph = lower([twin], optimize_graph=True, finalize=True).graph
    lowering = time.perf_counter() - start
    collection, expected = build()
    settle_apportion(client)
    before, start = _cpu(processes), time.perf_counter()
    future = client.compute(collection)
    submitted = time.perf_counter()
    value = future.result()
    done, after = time.perf_counter(), _cpu(processes)
    if value != expected:
        raise AssertionError(f"got {value}, expected {expected}")
    per = {name: (after[name] - before[name]) / len(graph) for name in processes}
    split = {
        "Dask: lower and optimise": lowering,
        "apportion: graph to tasks": max(0.0, submitted - start - lowering),
        "run and gather": done - submitted,
    }
    return split, per


def profile(repeat: int) -> None:
    """Per workload: the wall time by phase and the CPU per task of each process
    (best of ``repeat``, no profiler), then that CPU by stage (one more run, every
    thread of every process under cProfile)."""
    import task_profile
    from apportion import Client, LocalCluster

    cpu: dict[str, dict[str, float]] = {}
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        warm_up(client)
        processes = _processes(client)
        for name, build in WORKLOADS.items():
            best: tuple[float, dict[str, float], dict[str, float]] | None = None
            for _ in range(repeat):
                split, per = phases(client, build, processes)
                if best is None or sum(split.values()) < best[0]:
                    best = (sum(split.values()), split, per)
            assert best is not None
            total, split, cpu[name] = best
            parts = ", ".join(f"{phase} {seconds:.3f} s" for phase, seconds in split.items())
            print(f"{name}: {total:.3f} s = {parts}", flush=True)
    print("profiling every thread of every process (one more run of each)...", flush=True)
    for name, build in WORKLOADS.items():
        print(f"\n{name}:")
        task_profile.report(cpu[name], _stage_profiles(build))


def _stage_profiles(build: Callable[[], tuple[Any, Any]]) -> dict[str, dict[str, Any]]:
    """Every thread of every process under cProfile over one ``compute`` (the lowering
    included) after a warm-up: {process: {thread: stats}}."""
    import task_profile
    from apportion import Client, LocalCluster

    os.environ[task_profile.ENVIRONMENT_VARIABLE] = "1"
    path = [str(task_profile.HOOK_DIR), os.environ["PYTHONPATH"]]
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    task_profile.start()
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
            warm_up(client)
            processes = _processes(client)
            by_pid = {p.pid: name for name, p in processes.items()}
            pids = {w: info["pid"] for w, info in client.scheduler_info()["workers"].items()}
            collection, expected = build()
            settle_apportion(client)
            client.run(_worker_clear)
            task_profile.clear()
            if client.compute(collection, sync=True) != expected:
                raise AssertionError("wrong value under the profiler")
            profiles = {"client+scheduler": marshal.loads(task_profile.collect())}
            for address, blob in client.run(_worker_collect).items():
                profiles[by_pid[pids[address]]] = marshal.loads(blob)
    finally:
        del os.environ[task_profile.ENVIRONMENT_VARIABLE]
        os.environ["PYTHONPATH"] = path[1]
    return dict(sorted(profiles.items()))


def _worker_clear() -> None:
    import task_profile

    task_profile.clear()


def _worker_collect() -> bytes:
    import task_profile

    return task_profile.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--systems", default="apportion,dask")
    parser.add_argument(
        "--profile", action="store_true", help="apportion's time by phase, process and stage"
    )
    args = parser.parse_args()
    if args.profile:
        profile(args.repeat)
        return
    runners = {"apportion": run_apportion, "dask": run_dask}
    results: dict[str, dict[str, float]] = {}
    for system in args.systems.split(","):
        print(f"{system}:", flush=True)
        results[system] = runners[system](args.repeat)
    ours, theirs = results.get("apportion", {}), results.get("dask", {})
    print()
    print("Dask collections: 2 worker processes x 1 thread, loopback TCP (best of runs)")
    header = f"{'workload':<12} {'apportion':>10} {'dask':>10} {'speed-up':>9}"
    print(header)
    print("-" * len(header))
    for name in WORKLOADS:
        a, d = ours.get(name), theirs.get(name)
        ratio = f"{d / a:.2f}x" if a and d else "-"
        print(f"{name:<12} {_seconds(a):>10} {_seconds(d):>10} {ratio:>9}")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


if __name__ == "__main__":
    main()
