"""Futures, as Dask's "Futures" documentation and quickstart use them."""

import json

from dask.distributed import Client, as_completed, wait


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def square(x):
    return x**2


def neg(x):
    return -x


def div(x, y):
    return x / y


if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1)
    out = {}

    a = client.submit(inc, 10)
    b = client.submit(inc, a)
    out["chained"] = b.result()

    A = client.map(square, range(10))
    B = client.map(neg, A)
    total = client.submit(sum, B)
    out["total"] = total.result()
    out["gather"] = client.gather(A)
    out["gather_dict"] = client.gather({"first": A[0], "last": A[-1]})

    seq = as_completed(client.map(inc, range(5)))
    out["as_completed"] = sorted(f.result() for f in seq)
    done, not_done = wait(B)
    out["wait"] = [len(done), len(not_done), sorted({f.status for f in B})]

    [data] = client.scatter([list(range(100))])
    out["scattered"] = client.submit(sum, data).result()
    big = client.scatter(list(range(1000)), broadcast=True)
    out["broadcast"] = client.submit(len, big).result()
    named = client.scatter({"x": 1, "y": 2})
    out["scatter_dict"] = client.submit(add, named["x"], named["y"]).result()

    bad = client.submit(div, 1, 0)
    try:
        bad.result()
    except ZeroDivisionError:
        out["raised"] = "ZeroDivisionError"
    out["exception"] = type(bad.exception()).__name__
    out["erred_status"] = bad.status

    out["pure_same_key"] = client.submit(inc, 1).key == client.submit(inc, 1).key
    out["impure_new_key"] = (
        client.submit(inc, 1, pure=False).key != client.submit(inc, 1, pure=False).key
    )
    out["named_key"] = client.submit(inc, 41, key="answer").key

    graph = {"x": 1, "y": (inc, "x"), "z": (add, "x", "y")}
    out["get"] = client.get(graph, "z")
    out["get_many"] = client.get(graph, ["y", "z"])

    x = client.submit(inc, 5, priority=10, retries=1)
    out["keywords"] = x.result()
    out["map_kwargs"] = client.gather(client.map(add, range(3), y=10))

    client.close()
    print(json.dumps(out, sort_keys=True))
