"""dask.bag on a distributed client: the word count and records of Dask's examples."""

import json

import dask.bag as db
from dask.distributed import Client

LINES = [
    "the quick brown fox jumps over the lazy dog",
    "the dog sleeps",
    "a fox is quick and the fox is brown",
    "lazy days for the lazy dog",
] * 25

RECORDS = [
    {"name": name, "age": age, "city": city}
    for name, age, city in [
        ("alice", 31, "paris"),
        ("bob", 25, "rome"),
        ("carol", 41, "paris"),
        ("dave", 35, "oslo"),
        ("erin", 29, "rome"),
    ]
] * 20


def is_even(n):
    return n % 2 == 0


if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1)
    out = {}

    words = db.from_sequence(LINES, npartitions=4).str.split().flatten()
    out["top_words"] = sorted(words.frequencies().topk(3, key=1).compute())
    out["distinct"] = sorted(words.distinct().compute())
    out["count"] = words.count().compute()

    numbers = db.from_sequence(range(1000), npartitions=8)
    out["even_squares"] = numbers.filter(is_even).map(lambda n: n**2).sum().compute()
    out["mean"] = numbers.mean().compute()

    people = db.from_sequence(RECORDS, npartitions=5)
    out["names"] = sorted(people.pluck("name").distinct().compute())
    out["by_city"] = sorted(
        people.foldby("city", lambda total, r: total + r["age"], 0, lambda a, b: a + b).compute()
    )
    out["adults"] = people.filter(lambda r: r["age"] > 30).count().compute()
    out["client_compute"] = sorted(client.compute(people.pluck("age").distinct()).result())
    persisted = client.persist(numbers.map(lambda n: n + 1))
    out["persisted_max"] = persisted.max().compute()

    client.close()
    print(json.dumps(out, sort_keys=True))
