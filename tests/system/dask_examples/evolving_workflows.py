"""An evolving workflow, as dask-examples' "Evolving workflows" notebook describes it:
a computation whose next steps depend on the results so far. Futures are submitted,
and as each completes (``as_completed``) new futures are added to the same iterator
until a target is met; the same again with a coroutine run by ``client.sync``, in
which the client's calls are awaited."""

import json
import random
import time

from dask.distributed import Client, as_completed, wait


def score(seed):
    """A noisy measurement of the quality of a candidate."""
    time.sleep(0.01)
    return random.Random(seed).random()


def refine(seed, step):
    """A candidate near ``seed``, one step further."""
    return seed * 31 + step


def search(client, target, budget):
    """Keep trying candidates near the best so far until one scores above
    ``target`` or ``budget`` candidates have been scored."""
    futures = {client.submit(score, seed): seed for seed in range(4)}
    results = as_completed(futures, with_results=True)
    tried, best = 0, 0.0
    for future, value in results:
        tried += 1
        best = max(best, value)
        if best >= target or tried + results.count() >= budget:
            continue
        nxt = refine(futures[future], tried)
        new = client.submit(score, nxt)
        futures[new] = nxt
        results.add(new)
    return tried, len(futures), 0.0 <= best < 1.0


async def search_async(client, target, budget):
    """The same search as a coroutine: inside ``client.sync`` the calls are awaited."""
    futures = {client.submit(score, seed): seed for seed in range(4)}
    results = as_completed(futures)
    tried, best = 0, 0.0
    async for future in results:
        value = await future
        tried += 1
        best = max(best, value)
        if best >= target or tried + results.count() >= budget:
            continue
        nxt = refine(futures[future], tried)
        new = client.submit(score, nxt)
        futures[new] = nxt
        results.add(new)
    await wait(list(futures))
    every = await client.gather(list(futures))
    [offset] = await client.scatter([1.0])
    shifted = await client.submit(lambda x, y: x + y, max(every), offset)
    return tried, round(best, 6), len(every), shifted == max(every) + 1.0


if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1)
    out = {}
    # A target no candidate reaches: the whole budget is tried, whatever the order.
    out["search"] = search(client, target=2.0, budget=20)
    tried, _, scored, shifted = client.sync(search_async, client, target=2.0, budget=20)
    out["search_async"] = [tried, scored, shifted]
    reached = client.sync(search_async, client, target=0.5, budget=50)
    out["target_reached"] = reached[1] >= 0.5
    client.close()
    print(json.dumps(out, sort_keys=True))
