"""Publishing datasets between clients, as in Dask's "Publish Datasets" documentation."""

import json

import dask.bag as db
from dask.distributed import Client, LocalCluster


def square(x):
    return x * x


if __name__ == "__main__":
    cluster = LocalCluster(n_workers=2, threads_per_worker=1)
    out = {}

    producer = Client(cluster)
    squares = producer.map(square, range(10))
    total = producer.submit(sum, squares)
    producer.publish_dataset(total=total)
    producer.publish_dataset(squares, name="squares")
    producer.datasets["bag"] = producer.persist(db.from_sequence(range(6), npartitions=3))
    out["listed"] = sorted(producer.list_datasets())
    try:
        producer.publish_dataset(total=total)
    except KeyError:
        out["republish"] = "KeyError"
    producer.publish_dataset(total=total, override=True)
    producer.close()

    consumer = Client(cluster)
    out["total"] = consumer.get_dataset("total").result()
    out["squares"] = consumer.gather(consumer.get_dataset("squares"))
    out["bag"] = sorted(consumer.datasets["bag"].compute())
    out["in"] = ["total" in consumer.datasets, "nothing" in consumer.datasets]
    out["default"] = consumer.get_dataset("nothing", default=0)
    consumer.unpublish_dataset("squares")
    del consumer.datasets["bag"]
    out["after_unpublish"] = sorted(consumer.list_datasets())
    try:
        consumer.get_dataset("squares")
    except KeyError:
        out["missing"] = "KeyError"

    consumer.set_metadata("config", {"lr": 0.1})
    consumer.set_metadata(["run", "epoch"], 3)
    out["metadata"] = [
        consumer.get_metadata("config"),
        consumer.get_metadata(["run", "epoch"]),
        consumer.get_metadata("absent", None),
    ]

    consumer.close()
    cluster.close()
    print(json.dumps(out, sort_keys=True))
