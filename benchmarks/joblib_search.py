"""scikit-learn's GridSearchCV through joblib: loky, apportion and Dask on one machine.

A 5-fold grid search of 40 candidates (200 fits of a logistic regression on a
synthetic classification problem of 5,000 rows and 40 features, 1.6 MB of
training data) under ``joblib.parallel_config(backend=...)``: joblib's own ``loky``
process pool, apportion's backend (``apportion.joblib``) on a ``LocalCluster``, and
Dask's joblib backend on a ``distributed.LocalCluster``, each with the same number of
worker processes of one thread (``--workers``; loky gets ``n_jobs`` of that many).
The figure is the search's wall time, best of a few runs after a warm-up run (which
pays for imports on the workers and loky's start).

Usage: ``python benchmarks/joblib_search.py [--workers N] [--repeat N]
[--systems loky,apportion,dask]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import joblib
import numpy as np
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV

#: 20 values of C x 2 of fit_intercept: 40 candidates, 5 folds each.
GRID = {"C": list(np.logspace(-3, 3, 20)), "fit_intercept": [True, False]}
FOLDS = 5


def search(X: Any, y: Any) -> GridSearchCV:
    estimator = LogisticRegression(max_iter=200)
    return GridSearchCV(estimator, GRID, cv=FOLDS, n_jobs=-1).fit(X, y)


def timed(config: Callable[[], AbstractContextManager[Any]], X: Any, y: Any, repeat: int) -> float:
    with config():
        search(X, y)  # warm-up
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            fitted = search(X, y)
            elapsed = time.perf_counter() - start
            print(f"  {elapsed:.2f} s (best C {fitted.best_params_['C']:.3g})", flush=True)
            best = min(best, elapsed)
    return best


@contextmanager
def loky(workers: int) -> Iterator[None]:
    with joblib.parallel_config(backend="loky", n_jobs=workers):
        yield


@contextmanager
def apportion_backend(workers: int) -> Iterator[None]:
    import apportion.joblib  # noqa: F401  # registers the backend
    from apportion import Client, LocalCluster

    with (
        LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
        joblib.parallel_config(backend="apportion", client=client),
    ):
        yield


@contextmanager
def dask_backend(workers: int) -> Iterator[None]:
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster),
        joblib.parallel_config(backend="dask"),
    ):
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (1 thread)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per system")
    parser.add_argument("--systems", default="loky,apportion,dask", help="comma-separated")
    args = parser.parse_args()
    X, y = make_classification(n_samples=5000, n_features=40, random_state=0)
    configs = {"loky": loky, "apportion": apportion_backend, "dask": dask_backend}
    best: dict[str, float] = {}
    for system in args.systems.split(","):
        print(f"{system}:", flush=True)
        best[system] = timed(lambda s=system: configs[s](args.workers), X, y, args.repeat)
    candidates = len(GRID["C"]) * len(GRID["fit_intercept"])
    print()
    print(
        f"GridSearchCV: {candidates} candidates x {FOLDS} folds, "
        f"{args.workers} worker processes of 1 thread (best of {args.repeat})"
    )
    for system, seconds in best.items():
        print(f"  {system:<10} {seconds:>7.2f} s")
    if "loky" in best:
        for system in [name for name in best if name != "loky"]:
            print(f"  {system} / loky: {best[system] / best['loky']:.2f}x the time")
    if best.get("apportion") and best.get("dask"):
        print(f"  apportion / dask: {best['apportion'] / best['dask']:.2f}x the time")


if __name__ == "__main__":
    main()
