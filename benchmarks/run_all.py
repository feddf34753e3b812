"""Run every benchmark in turn, each in its own interpreter, and print their figures.

``make bench`` calls this. The tiers: the pure state machine (events per second),
CPU per task with 10 and 1,000 workers simulated in one process, scheduler memory
per queued task, end-to-end throughput beside Dask, tasks submitted
from tasks (a seceding fan-out of 10,000) beside Dask, asynchronous clients (awaited
submits per second, event-loop lag during a large gather) beside Dask, placement
quality on a mixed CPU/GPU workload beside Dask, fair shares of a GPU box between
two people (and tiny-task throughput with one share and two) beside Dask, tasks of
uneven durations (makespan over its lower bound) beside Dask, recovery from a killed
worker beside Dask, Dask collections computed on each, bytes per second between workers
and to the client beside Dask, the job queue's runs per second beside HyperQueue,
task throughput beside a run printing 50 MB, the cost of authentication and TLS
per connection and in tiny-task throughput beside Dask's TLS, the cost of a
dashboard page left open on tiny-task throughput, scikit-learn's GridSearchCV through
joblib on apportion's backend beside joblib's loky and Dask's backend, and, beside Dask on
workers with a 2 GiB memory limit, three limits of data held and reduced
(spill.py), a 10 GiB shuffle (shuffle.py) and Dask arrays and frames larger than
memory, with each system's peak worker memory (memory_order.py).
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent

SCRIPTS = [
    "state_machine.py",
    "simulated_workers.py",
    "scheduler_memory.py",
    "throughput.py",
    "tasks_from_tasks.py",
    "async_client.py",
    "placement_quality.py",
    "fairness.py",
    "uneven.py",
    "recovery.py",
    "collections_compute.py",
    "data_transfer.py",
    "queue_throughput.py",
    "chatty_run.py",
    "security.py",
    "dashboard_cost.py",
    "joblib_search.py",
    # Their defaults: 2 workers of 2 GiB each; about 2 and 4 minutes here.
    "spill.py",
    "shuffle.py",
    # Its smaller sizes (`make bench-memory` runs the full ones): about 2 minutes here.
    "memory_order.py",
]


def main() -> int:
    cores = psutil.cpu_count(logical=True)
    memory = psutil.virtual_memory().total / 2**30
    print(f"Python {platform.python_version()} on {platform.platform()}")
    print(f"{cores} cores, {memory:.0f} GiB memory", flush=True)
    failed = []
    start = time.perf_counter()
    for script in SCRIPTS:
        print(f"\n=== {script} ===", flush=True)
        began = time.perf_counter()
        code = subprocess.call([sys.executable, str(HERE / script)])
        print(f"=== {script}: {time.perf_counter() - began:.0f} s, exit {code} ===", flush=True)
        if code:
            failed.append(script)
    print(f"\nall benchmarks: {time.perf_counter() - start:.0f} s", flush=True)
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
