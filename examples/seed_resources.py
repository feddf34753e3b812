"""The worker-resources example from Dask's documentation, run on apportion.

Three workers, as in the docs: two with two GPUs each and one with 100 GB of
memory (here all on this machine, and the "GPUs" are abstract counters, so no GPU
is needed). Twelve files are loaded, each processed by a task that needs one GPU,
and all results aggregated by a task that needs 70 GB of memory.

Run it with ``make demo``. It prints where each task ran and the largest number of
GPU tasks that ever ran at once on each worker, which never exceeds its 2 GPUs.
"""

from __future__ import annotations

import time

from apportion import Client, LocalCluster, UnsatisfiableError, get_worker


def load(filename: str) -> dict[str, object]:
    """Stand-in for reading a file: a little data and where it was read."""
    return {"file": filename, "values": list(range(len(filename) * 1000))}


def process(data: dict[str, object]) -> dict[str, object]:
    """Stand-in for GPU work: 0.3 s of "compute", recording where and when it ran."""
    start = time.time()
    time.sleep(0.3)
    values = data["values"]
    assert isinstance(values, list)
    return {
        "file": data["file"],
        "total": sum(values),
        "worker": get_worker().name,
        "start": start,
        "end": time.time(),
    }


def aggregate(results: list[dict[str, object]]) -> dict[str, object]:
    """Stand-in for the 70 GB aggregation: runs only where the memory pool allows it."""
    return {
        "grand_total": sum(int(str(r["total"])) for r in results),
        "worker": get_worker().name,
    }


def peak_concurrency(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an end at the same instant closes first)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = running = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def main() -> None:
    started = time.time()
    cluster = LocalCluster(
        workers=[
            {"name": "gpu-node-a", "nthreads": 4, "resources": "gpu=2"},
            {"name": "gpu-node-b", "nthreads": 4, "resources": "gpu=2"},
            {"name": "mem-node", "nthreads": 2, "resources": "memory=100e9"},
        ]
    )
    with cluster, Client(cluster) as client:
        print(f"cluster up in {time.time() - started:.1f}s:")
        for info in client.scheduler_info()["workers"].values():
            pools = ", ".join(f"{k}={v:g}" for k, v in info["resources"].items())
            print(f"  {info['name']:<11} {info['nthreads']} threads, resources {pools}")

        filenames = [f"file-{i:02d}.csv" for i in range(12)]
        data = [client.submit(load, fn) for fn in filenames]
        processed = [client.submit(process, d, resources={"gpu": 1}) for d in data]
        final = client.submit(aggregate, processed, resources={"memory": 70e9})
        result = final.result(timeout=120)

        print(f"\n{len(filenames)} GPU tasks:")
        records = client.gather(processed)
        by_worker: dict[str, list[tuple[float, float]]] = {}
        for r in records:
            by_worker.setdefault(str(r["worker"]), []).append((float(r["start"]), float(r["end"])))  # type: ignore[arg-type]
            offset = float(r["start"]) - started  # type: ignore[arg-type]
            print(f"  {r['file']} processed on {r['worker']} at +{offset:.2f}s")
        print(f"\naggregate (memory=70e9) ran on {result['worker']}: total {result['grand_total']}")
        print("\npeak concurrent GPU tasks per worker (each declared gpu=2):")
        for worker, intervals in sorted(by_worker.items()):
            print(f"  {worker}: {peak_concurrency(intervals)} (ran {len(intervals)} tasks)")

        print("\nasking for more than any worker has fails at once on a local cluster:")
        try:
            client.submit(process, {"file": "big", "values": []}, resources={"gpu": 3}).result()
        except UnsatisfiableError as exc:
            print(f"  UnsatisfiableError: {exc}")
    print(f"\ndone in {time.time() - started:.1f}s")


main()
