"""Failures and recovery, as in Dask's "Resilience" documentation."""

import json
import os
import pathlib
import sys
import tempfile

from dask.distributed import Client, wait


def flaky(path, failures):
    """Raise until called ``failures`` times (counted in a file)."""
    p = pathlib.Path(path)
    calls = int(p.read_text()) if p.exists() else 0
    p.write_text(str(calls + 1))
    if calls < failures:
        raise RuntimeError(f"failure {calls + 1}")
    return calls


def inc(x):
    return x + 1


def crash():
    sys.stdout.flush()
    os._exit(1)


if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1)
    out = {}
    tmp = tempfile.mkdtemp()

    f = client.submit(flaky, os.path.join(tmp, "a"), 2, retries=2)
    out["retried"] = f.result()

    g = client.submit(flaky, os.path.join(tmp, "b"), 1)
    wait(g)
    out["before_retry"] = g.status
    client.retry([g])
    out["after_retry"] = g.result()

    futures = client.map(inc, range(20))
    wait(futures)
    holder = next(iter(client.who_has(futures[0]).values()))[0]
    client.run(crash, workers=[holder], on_error="ignore")
    out["recomputed"] = sum(client.gather(futures))
    client.wait_for_workers(2, timeout=30)
    out["workers_after_crash"] = len(client.scheduler_info()["workers"])

    client.restart()
    out["after_restart"] = client.submit(inc, 1).result()
    out["workers_after_restart"] = len(client.scheduler_info()["workers"])

    client.close()
    print(json.dumps(out, sort_keys=True))
