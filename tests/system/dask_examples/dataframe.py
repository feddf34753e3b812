"""dask.dataframe on a distributed client: persist, groupby, merge, set_index."""

import json

import dask.dataframe as dd
import pandas as pd
from dask.distributed import Client, wait

if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1)
    out = {}

    pdf = pd.DataFrame(
        {
            "id": range(1000),
            "group": [i % 7 for i in range(1000)],
            "value": [(i * 37) % 101 / 10 for i in range(1000)],
        }
    )
    names = pd.DataFrame({"group": range(7), "name": [f"g{i}" for i in range(7)]})

    df = dd.from_pandas(pdf, npartitions=4)
    df = client.persist(df)
    wait(df)
    out["len"] = len(df)
    means = df.groupby("group").value.mean().compute()
    out["groupby_mean"] = {str(k): round(v, 9) for k, v in means.sort_index().items()}
    out["matches_pandas"] = bool(
        (means.sort_index() - pdf.groupby("group").value.mean()).abs().max() < 1e-9
    )

    merged = df.merge(dd.from_pandas(names, npartitions=1), on="group")
    counts = merged.name.value_counts().compute().sort_index()
    out["merge_counts"] = {k: int(v) for k, v in counts.items()}

    indexed = df.set_index("value").persist()
    out["set_index_divisions"] = indexed.known_divisions
    out["set_index_head"] = indexed.head(3).id.tolist()

    out["filtered_sum"] = round(float(df[df.value > 5].value.sum().compute()), 6)
    out["client_compute"] = int(client.compute(df.id.max()).result())
    out["describe_count"] = float(df.value.describe().compute()["count"])
    out["assign"] = float(df.assign(double=df.value * 2).double.sum().compute())

    client.close()
    print(json.dumps(out, sort_keys=True))
