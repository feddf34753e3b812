"""Tasks that start tasks, in each of the ways Dask's "Launch Tasks from Tasks" page
describes: Dask's ``compute`` of delayed calls inside a task, ``get_client`` with
``secede`` and ``rejoin``, and ``worker_client``; Fibonacci numbers, as there."""

import json

from dask import compute, delayed
from dask.distributed import Client, get_client, rejoin, secede, worker_client


def fib_here(n):
    return n if n < 2 else fib_here(n - 1) + fib_here(n - 2)


@delayed
def fib_delayed(n):
    if n < 2:
        return n
    # Delayed calls made inside the task, computed on the cluster in parallel.
    smaller, smallest = compute(fib_delayed(n - 1), fib_delayed(n - 2))
    return smaller + smallest


def fib_seceding(n):
    if n < 2:
        return n
    client = get_client()
    halves = [client.submit(fib_seceding, n - 1), client.submit(fib_seceding, n - 2)]
    secede()  # this thread waits below without holding a slot of the worker
    smaller, smallest = client.gather(halves)
    rejoin()
    return smaller + smallest


def fib_with_worker_client(n):
    if n < 2:
        return n
    with worker_client() as client:  # secedes for the block, rejoins after it
        halves = client.map(fib_with_worker_client, [n - 1, n - 2])
        smaller, smallest = client.gather(halves)
    return smaller + smallest


def split_and_process(words):
    """Data made on a worker, then one task per part of it, started from there."""
    with worker_client() as client:
        lengths = client.map(len, words)
        return client.submit(sum, lengths).result()


if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1)
    out = {"expected": [fib_here(n) for n in (8, 10)]}
    out["delayed"] = [fib_delayed(n).compute() for n in (8, 10)]
    out["get_client"] = client.gather([client.submit(fib_seceding, n) for n in (8, 10)])
    out["worker_client"] = client.gather(client.map(fib_with_worker_client, [8, 10]))
    out["split"] = client.submit(split_and_process, ["tasks", "from", "tasks"]).result()
    client.close()
    print(json.dumps(out, sort_keys=True))
