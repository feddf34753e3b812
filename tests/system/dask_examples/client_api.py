"""Everyday client methods a script calls around its tasks."""

import json
import logging
import os
import pathlib
import tempfile
import time

from dask.distributed import Client, LocalCluster, WorkerPlugin, as_completed


def inc(x):
    return x + 1


def tag(dask_worker):
    return getattr(dask_worker, "plugin_tag", None)


class Tagger(WorkerPlugin):
    def setup(self, worker):
        worker.plugin_tag = "set up"

    def teardown(self, worker):
        pass


def use_uploaded(x):
    import uploaded_helper

    return uploaded_helper.triple(x)


if __name__ == "__main__":
    cluster = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        memory_limit="2GiB",
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    )
    client = Client(cluster)
    out = {}

    pids = client.run(os.getpid)
    out["run_workers"] = len(pids)
    out["run_distinct_pids"] = len(set(pids.values()))
    first = sorted(pids)[0]
    out["run_subset"] = list(client.run(os.getpid, workers=[first])) == [first]
    out["nthreads"] = sorted(client.nthreads().values())
    out["scheduler_workers"] = len(client.scheduler_info()["workers"])
    out["cluster_workers"] = len(cluster.workers)
    out["dashboard_link_type"] = type(client.dashboard_link).__name__ in ("str", "NoneType")

    futures = client.map(inc, range(10))
    out["results"] = sorted(f.result() for f in as_completed(futures))
    who = client.who_has(futures)
    out["who_has_each_once"] = all(len(holders) == 1 for holders in who.values())
    out["has_what_total"] = sum(len(keys) for keys in client.has_what().values()) >= 10

    folder = pathlib.Path(tempfile.mkdtemp())
    module = folder / "uploaded_helper.py"
    module.write_text("def triple(x):\n    return 3 * x\n")
    client.upload_file(str(module))
    out["uploaded"] = client.submit(use_uploaded, 5).result()

    client.register_plugin(Tagger(), name="tagger")
    out["plugin"] = sorted(set(client.run(tag).values()))

    versions = client.get_versions(check=True)
    out["versions_have_workers"] = len(versions["workers"]) == 2

    cluster.scale(3)
    client.wait_for_workers(3, timeout=60)
    out["scaled_up"] = len(client.scheduler_info()["workers"])
    cluster.scale(1)
    while len(client.scheduler_info()["workers"]) > 1:
        time.sleep(0.05)
    out["scaled_down"] = len(client.scheduler_info()["workers"])
    out["results_kept"] = sum(client.gather(futures))

    with client.get_executor() as executor:
        out["executor"] = list(executor.map(inc, range(3)))

    client.close()
    cluster.close()
    print(json.dumps(out, sort_keys=True))
