"""dask.array on a distributed client, as in Dask's array documentation."""

import json

import dask
import dask.array as da
import numpy as np
from dask.distributed import Client, progress, wait

if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1, memory_limit="2GiB")
    out = {}

    data = np.random.default_rng(0).random((1000, 1000))
    x = da.from_array(data, chunks=(250, 250))
    y = x + x.T
    out["mean"] = round(float(y.mean().compute()), 9)
    out["sum_axis0"] = np.round(y.sum(axis=0)[:5].compute(), 9).tolist()
    out["matches_numpy"] = bool(np.allclose(y.compute(), data + data.T))

    z = y.persist()
    wait(z)
    progress(z, notebook=False)
    out["persisted_std"] = round(float(z.std().compute()), 9)
    out["slice"] = np.round(z[::250, ::250].compute(), 9).tolist()
    out["dot_trace"] = round(float((x @ x.T).trace().compute()), 6)

    r = da.random.default_rng(42).random((2000, 2000), chunks=(500, 500))
    out["random_shape"] = list(r.shape)
    out["random_in_range"] = bool(((r >= 0) & (r < 1)).all().compute())
    future = client.compute(r.sum())
    out["client_compute_close"] = bool(abs(future.result() - 2_000_000) < 10_000)
    out["dask_compute"] = [int(v) for v in dask.compute(x.shape[0], (x > 0.5).sum())]
    out["blocks"] = int(y.numblocks[0] * y.numblocks[1])

    client.close()
    print(json.dumps(out, sort_keys=True))
