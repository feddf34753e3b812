"""The asynchronous API, as Dask's "Asynchronous Operation" documentation uses it."""

import asyncio
import json
import logging

from dask.distributed import Client, LocalCluster, as_completed, wait


def inc(x):
    return x + 1


def div(x, y):
    return x / y


async def double(x):
    await asyncio.sleep(0)
    return 2 * x


async def embedded(out):
    # "client = await Client(asynchronous=True)" starts a local cluster of its own.
    client = await Client(
        asynchronous=True,
        n_workers=1,
        threads_per_worker=2,
        processes=False,
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    )
    future = client.submit(lambda x: x + 1, 10)
    out["await_future"] = await future
    await client.close()


async def with_cluster(out):
    async with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            asynchronous=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster, asynchronous=True) as client,
    ):
        futures = client.map(inc, range(10))
        out["gather"] = await client.gather(futures)
        done = []
        async for future in as_completed(client.map(inc, range(20, 25))):
            done.append(await future)
        out["as_completed"] = sorted(done)
        pairs = []
        async for _, result in as_completed(client.map(inc, range(3)), with_results=True):
            pairs.append(result)
        out["with_results"] = sorted(pairs)
        [x] = await client.scatter([41])
        out["scattered"] = await client.submit(inc, x)
        finished, _ = await wait(futures)
        out["wait"] = len(finished)
        try:
            await client.submit(div, 1, 0)
        except ZeroDivisionError as e:
            out["raised"] = type(e).__name__
        out["sync"] = await client.sync(double, 21)
        out["info_type"] = client.scheduler_info()["type"]  # not awaited, as in Dask


if __name__ == "__main__":
    out = {}
    asyncio.run(embedded(out))
    asyncio.run(with_cluster(out))
    print(json.dumps(out, sort_keys=True))
