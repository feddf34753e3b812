"""joblib's Parallel, and scikit-learn through it, on the ``apportion`` backend, against
clusters in this process (the real-process runs are in tests/system/test_joblib_processes.py).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import joblib
import numpy as np
import pytest
from joblib import Parallel, delayed

import apportion.joblib
from apportion import Client, Future, get_worker, task_key, task_resources
from apportion.joblib import ApportionBackend
from apportion.testing import InMemoryCluster
from cluster_checks import checked_client


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    # Two workers of two threads: four threads in all.
    with InMemoryCluster([{"nthreads": 2}] * 2) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with checked_client(cluster) as c:
        yield c


def double(x: int) -> int:
    return 2 * x


def array_id(x: int, data: np.ndarray) -> tuple[int, int, str]:
    """Which copy of ``data`` this task was given (tasks in one process share a
    scattered value; a value pickled into each task is a new copy in each)."""
    return x, id(data), get_worker().name


def test_parallel_runs_every_call_on_the_cluster_in_order(
    cluster: InMemoryCluster, client: Client
) -> None:
    with joblib.parallel_config(backend="apportion"):
        out = Parallel(n_jobs=-1)(delayed(double)(i) for i in range(50))
        workers = Parallel(batch_size=1)(delayed(lambda: get_worker().name)() for _ in range(8))
        generated = Parallel(return_as="generator")(delayed(double)(i) for i in range(20))
        unordered = Parallel(return_as="generator_unordered")(delayed(double)(i) for i in range(20))
        assert list(generated) == [2 * i for i in range(20)]
        assert sorted(unordered) == [2 * i for i in range(20)]
    assert out == [2 * i for i in range(50)]
    assert set(workers) <= {worker.name for worker in cluster.workers}


def test_n_jobs_minus_one_is_the_clusters_threads(client: Client) -> None:
    with joblib.parallel_config(backend="apportion"):
        assert joblib.effective_n_jobs(-1) == 4
        assert joblib.effective_n_jobs(-2) == 3  # joblib's count: all but one
        assert joblib.effective_n_jobs(3) == 3  # a positive n_jobs is kept
        assert joblib.effective_n_jobs(None) == 4  # the backend's default is -1
    with pytest.raises(ValueError, match="n_jobs == 0"):
        ApportionBackend(client).effective_n_jobs(0)


def test_a_large_argument_is_sent_once_per_call_not_once_per_task() -> None:
    data = np.arange(200_000, dtype=np.float64)  # 1.6 MB
    with (
        InMemoryCluster([{"nthreads": 2}]) as one_worker,
        checked_client(one_worker) as client,
        joblib.parallel_config(backend="apportion", client=client),
    ):
        out = Parallel(batch_size=1)(delayed(array_id)(i, data) for i in range(40))
        again = Parallel(batch_size=1)(delayed(array_id)(i, data) for i in range(4))
    # Every task of the call got the same copy: it was stored on the worker once.
    assert [x for x, _, _ in out] == list(range(40))
    assert len({copy for _, copy, _ in out}) == 1
    # The next call sends it again (the first call's copy was released at its end).
    assert len({copy for _, copy, _ in again}) == 1
    # A small backend threshold pickles it into each task instead: a copy per task.
    with (
        InMemoryCluster([{"nthreads": 2}]) as one_worker,
        checked_client(one_worker) as client,
        joblib.parallel_config(backend="apportion", client=client, scatter_at=10**9),
    ):
        copies = Parallel(batch_size=1)(delayed(array_id)(i, data[:1000]) for i in range(4))
    assert len({copy for _, copy, _ in copies}) > 1


class RecordingBackend(ApportionBackend):
    """The backend, keeping every task's future so the test can read what became of
    it (and so that no future is released, which would drop its task anyway)."""

    submitted: list[Future] = []

    def submit(self, func: Any, callback: Any = None) -> Future:
        future = super().submit(func, callback)
        RecordingBackend.submitted.append(future)
        return future


#: Set by the test to end the tasks still running (they run in this process).
RELEASE = threading.Event()


def fail_or_wait(i: int) -> int:
    if i == 0:
        raise ValueError("bad fold")
    RELEASE.wait(10)
    return i


def test_a_failure_cancels_the_rest_and_raises_the_tasks_own_exception(
    cluster: InMemoryCluster,
) -> None:
    RELEASE.clear()
    RecordingBackend.submitted = []
    with checked_client(cluster) as client:
        backend = RecordingBackend(client)
        try:
            with pytest.raises(ValueError, match="bad fold"):
                Parallel(n_jobs=2, backend=backend, batch_size=1, pre_dispatch="all")(
                    delayed(fail_or_wait)(i) for i in range(12)
                )
            assert len(RecordingBackend.submitted) == 12
            # The queued tasks were cancelled (not left to run once a thread frees).
            statuses = [f.status for f in RecordingBackend.submitted[1:]]
            assert statuses.count("cancelled") >= 8, statuses
        finally:
            RELEASE.set()
            RecordingBackend.submitted = []


def inner_keys(i: int) -> tuple[str, list[str]]:
    """A Parallel inside a task: its calls are tasks of their own."""
    keys = Parallel()(delayed(task_key)() for _ in range(3))
    return task_key(), keys


def test_a_nested_parallel_runs_on_the_cluster_without_deadlock() -> None:
    # Two threads, both taken by outer tasks, each waiting on inner tasks: each must
    # give its thread up while they run. (On one thread joblib runs the inner calls
    # in the task itself, as for any n_jobs=1.)
    with (
        InMemoryCluster([{"nthreads": 2}]) as single,
        checked_client(single) as client,
        joblib.parallel_config(backend="apportion", client=client),
    ):
        out = Parallel(batch_size=1)(delayed(inner_keys)(i) for i in range(4))
    for outer, inner in out:
        assert len(inner) == 3 and outer not in inner


def test_verbose_reports_progress(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    with joblib.parallel_config(backend="apportion"):
        Parallel(verbose=10)(delayed(double)(i) for i in range(10))
    err = capsys.readouterr().err
    assert "Using backend ApportionBackend with 4 concurrent workers." in err
    assert re.search(r"Done +10 out of +10 .* finished", err), err


def held(_: int) -> tuple[str, dict[str, Any]]:
    return get_worker().name, task_resources()


def test_resources_apply_to_every_task_of_the_call() -> None:
    workers = [{"name": "gpu", "nthreads": 2, "resources": "GPU=1"}, {"name": "cpu"}]
    with (
        InMemoryCluster(workers) as mixed,
        checked_client(mixed) as client,
        joblib.parallel_config(backend="apportion", client=client, resources={"GPU": 1}),
    ):
        out = Parallel(batch_size=1)(delayed(held)(i) for i in range(6))
        plain = joblib.Parallel(backend="apportion", batch_size=1)(
            delayed(held)(i) for i in range(6)
        )
    assert out == [("gpu", {"GPU": 1.0})] * 6
    assert all(resources == {} for _, resources in plain)


def test_the_backend_refuses_an_unknown_keyword_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"does not take \['resource'\]; it takes client"):
        ApportionBackend(resource={"GPU": 1})


def test_importing_registers_the_backend() -> None:
    assert "apportion" in joblib.parallel.BACKENDS
    assert apportion.joblib.BACKEND_NAME == "apportion"


def test_grid_search_and_cross_val_score_match_a_sequential_run(client: Client) -> None:
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, cross_val_score

    X, y = make_classification(n_samples=300, n_features=10, random_state=0)
    grid = {"C": [0.01, 0.1, 1.0, 10.0]}
    sequential = GridSearchCV(LogisticRegression(), grid, cv=3).fit(X, y)
    started = time.monotonic()
    with joblib.parallel_config(backend="apportion"):
        search = GridSearchCV(LogisticRegression(), grid, cv=3, n_jobs=-1).fit(X, y)
        scores = cross_val_score(LogisticRegression(), X, y, cv=5)
    assert time.monotonic() - started < 30
    assert search.best_params_ == sequential.best_params_
    np.testing.assert_allclose(
        search.cv_results_["mean_test_score"], sequential.cv_results_["mean_test_score"]
    )
    np.testing.assert_allclose(scores, cross_val_score(LogisticRegression(), X, y, cv=5))


def blas_threads(_: int) -> int:
    from threadpoolctl import threadpool_info

    return min(pool["num_threads"] for pool in threadpool_info())


def test_batches_run_with_one_blas_thread_unless_told_otherwise(client: Client) -> None:
    # NumPy's BLAS (loaded by now) would start a thread per core in every worker.
    outside = blas_threads(0)
    with joblib.parallel_config(backend="apportion"):
        inside = Parallel(batch_size=1)(delayed(blas_threads)(i) for i in range(4))
    assert inside == [1] * 4
    with joblib.parallel_config(backend="apportion", inner_max_num_threads=outside):
        assert Parallel(batch_size=1)(delayed(blas_threads)(i) for i in range(2)) == [outside] * 2


def test_a_cluster_without_workers_is_an_error_naming_it_not_a_hang() -> None:
    with InMemoryCluster([]) as empty, checked_client(empty) as client:
        backend = ApportionBackend(client, wait_for_workers_timeout=0.2)
        with pytest.raises(TimeoutError, match=r"found no worker on inproc://.* in 0.2s"):
            Parallel(backend=backend)(delayed(double)(i) for i in range(3))


def test_a_grid_search_sends_its_training_data_once(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 40))  # 640 kB: scattered; each fold's indices are not
    y = (X[:, 0] > 0).astype(int)
    sent: list[tuple[int, ...]] = []
    scatter = client.scatter

    def counting_scatter(data: Any, *args: Any, **kwargs: Any) -> Any:
        sent.extend(getattr(value, "shape", ()) for value in data)
        return scatter(data, *args, **kwargs)

    monkeypatch.setattr(client, "scatter", counting_scatter)
    grid = {"C": [0.1, 1.0, 10.0], "fit_intercept": [True, False]}
    with joblib.parallel_config(backend="apportion", client=client):
        GridSearchCV(LogisticRegression(), grid, cv=3).fit(X, y)  # 18 fits
    assert sent == [(2000, 40)]
