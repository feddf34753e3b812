"""dask.delayed on a distributed client, as Dask's tutorial runs it."""

import json

import dask
from dask import delayed
from dask.distributed import Client


def inc(x):
    return x + 1


def double(x):
    return 2 * x


def add(x, y):
    return x + y


@delayed(pure=True)
def scale(x, factor):
    return x * factor


if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=2)
    out = {}

    x = delayed(inc)(1)
    y = delayed(inc)(2)
    z = delayed(add)(x, y)
    out["z"] = z.compute()

    output = []
    for v in [1, 2, 3, 4, 5, 6, 7, 8]:
        a = delayed(inc)(v)
        b = delayed(double)(v)
        output.append(delayed(add)(a, b))
    total = delayed(sum)(output)
    out["total"] = total.compute()
    out["dask_compute"] = list(dask.compute(*output))
    out["client_compute"] = client.compute(total).result()
    out["client_compute_sync"] = client.compute([x, z], sync=True)

    persisted = total.persist()
    out["persisted"] = persisted.compute()

    level = [delayed(inc)(i) for i in range(16)]
    while len(level) > 1:
        level = [delayed(add)(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    out["tree"] = level[0].compute()
    out["decorated"] = scale(7, 6).compute()
    out["gather_futures"] = client.gather(client.compute([x, y]))

    client.close()
    print(json.dumps(out, sort_keys=True))
