"""Worker resources, as in Dask's "Worker Resources" documentation."""

import json
import os
import time

import dask
import dask.array as da
from dask.distributed import Client, LocalCluster


def load(i):
    return list(range(i, i + 10))


def process(d):
    start = time.time()
    time.sleep(0.05)
    return os.getpid(), start, time.time(), sum(d)


def aggregate(parts):
    return sum(part[3] for part in parts)


def peak_overlap(intervals):
    """Most intervals open at once on one process."""
    peak = 0
    by_pid = {}
    for pid, start, end, _ in intervals:
        by_pid.setdefault(pid, []).append((start, end))
    for spans in by_pid.values():
        events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
        open_now = 0
        for _, step in events:
            open_now += step
            peak = max(peak, open_now)
    return peak


if __name__ == "__main__":
    cluster = LocalCluster(n_workers=2, threads_per_worker=4, resources={"GPU": 1, "MEMORY": 10e9})
    client = Client(cluster)
    out = {}

    data = [client.submit(load, i) for i in range(8)]
    processed = [client.submit(process, d, resources={"GPU": 1}) for d in data]
    final = client.submit(aggregate, processed, resources={"MEMORY": 7e9})
    out["final"] = final.result()
    out["gpu_tasks_at_once_per_worker"] = peak_overlap(client.gather(processed))

    mapped = client.map(process, data, resources={"GPU": 1})
    out["map_peak"] = peak_overlap(client.gather(mapped))

    x = da.ones((400, 400), chunks=(100, 100))
    with dask.annotate(resources={"GPU": 1}):
        y = x + 1
    out["annotated_sum"] = float(y.sum().compute())
    out["annotated_optimize_off"] = float(y.sum().compute(optimize_graph=False))
    z = client.persist(y)
    out["persisted_sum"] = float(z.sum().compute())

    client.close()
    cluster.close()
    print(json.dumps(out, sort_keys=True))
