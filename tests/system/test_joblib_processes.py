"""scikit-learn and joblib on real worker processes: the embedded cluster a script gets
when it opens no client (with apportion.Pool and the standard library's waiting on the
same cluster), and CLI workers offering GPU units.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import cloudpickle
import joblib
import pytest
from joblib import Parallel, delayed
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score

import apportion.joblib  # noqa: F401  # registers the backend
from apportion import Client, task_environment, task_key
from cli_processes import Processes, run_python_script

pytestmark = [pytest.mark.process, pytest.mark.tcp]

# Worker processes are fresh interpreters that cannot import this test module. (joblib's
# calls travel as arguments, which go by reference when the C pickler can take them:
# the calls below are lambdas, which it cannot, so they go by value, as functions
# defined in a user's script do.)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: A user's script: no client anywhere, only joblib's configuration.
SCRIPT = """
import os

import joblib
from joblib import Parallel, delayed
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score

import apportion.joblib

X, y = make_classification(n_samples=400, n_features=8, random_state=0)
grid = {"C": [0.01, 0.1, 1.0, 10.0]}
with joblib.parallel_config(backend="apportion"):
    threads = joblib.effective_n_jobs(-1)
    search = GridSearchCV(LogisticRegression(), grid, cv=5).fit(X, y)
    scores = cross_val_score(LogisticRegression(), X, y, cv=5)
    pids = set(Parallel(n_jobs=-1, batch_size=1)(delayed(os.getpid)() for _ in range(20)))
expected = GridSearchCV(LogisticRegression(), grid, cv=5).fit(X, y)
assert search.best_params_ == expected.best_params_, (search.best_params_, expected.best_params_)
assert len(scores) == 5
assert os.getpid() not in pids, "the calls ran in the script's own process"
print("threads", threads, "pids", len(pids), "best", search.best_params_["C"])

# multiprocessing's pool with the import changed, and the standard library's waiting,
# on the cluster the backend started (no __main__ guard: workers never run this file).
import asyncio
import concurrent.futures as cf

from apportion import Pool, get_client


def cube(x):
    return x**3


with Pool() as pool:
    assert pool.map(cube, range(10)) == [x**3 for x in range(10)]
    assert sorted(pool.imap_unordered(cube, range(5))) == [0, 1, 8, 27, 64]
client = get_client()
futures = [client.submit(cube, i) for i in range(5)]
done, not_done = cf.wait(futures, timeout=60)
assert len(done) == 5 and not not_done
assert sorted(f.result() for f in cf.as_completed(futures)) == [0, 1, 8, 27, 64]


async def main():
    return await asyncio.wrap_future(client.submit(cube, 3))


assert asyncio.run(main()) == 27
print("standard library: ok")
"""


@pytest.mark.timeout(150)
def test_a_script_with_no_client_runs_its_search_pool_and_futures_on_an_embedded_cluster(
    tmp_path: Path,
) -> None:
    script = tmp_path / "search.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "APPORTION_HOME": str(tmp_path / "home")}
    done = run_python_script(script, env, timeout=120)
    assert done.returncode == 0, done.stderr[-6000:]
    words = done.stdout.split()
    # n_jobs=-1 counted the embedded cluster's threads, and the calls ran on its workers.
    assert int(words[words.index("threads") + 1]) >= 1
    assert int(words[words.index("pids") + 1]) >= 1
    assert "standard library: ok" in done.stdout


def unit_and_inner(_: int) -> tuple[str, list[str], str]:
    """The GPU unit this task holds, and a nested Parallel's task keys."""
    inner = Parallel(batch_size=1)(delayed(task_key)() for _ in range(4))
    return task_environment()["CUDA_VISIBLE_DEVICES"], inner, task_key()


def fails_at(i: int, bad: int) -> int:
    if i == bad:
        raise KeyError(f"candidate {i}")
    return i


@pytest.mark.timeout(120)
def test_cli_workers_run_searches_gpu_calls_with_their_units_and_nested_calls(
    procs: Processes,
) -> None:
    address = procs.scheduler()
    for name in ("a", "b"):
        procs.start(
            "worker", address, "--nthreads", "2", "--name", name, "--resources", "gpu=[0,1]"
        )
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        with joblib.parallel_config(backend="apportion", resources={"gpu": 1}):
            assert joblib.effective_n_jobs(-1) == 4
            out = Parallel(batch_size=1)(delayed(lambda i: unit_and_inner(i))(i) for i in range(8))
        assert {unit for unit, _, _ in out} <= {"0", "1"}
        for _, inner, outer in out:
            assert len(set(inner)) == 4 and outer not in inner
        X, y = make_classification(n_samples=300, n_features=8, random_state=1)
        grid = {"C": [0.01, 1.0, 100.0]}
        with joblib.parallel_config(backend="apportion"):
            search = GridSearchCV(LogisticRegression(), grid, cv=3, n_jobs=-1).fit(X, y)
            scores = cross_val_score(LogisticRegression(), X, y, cv=3)
        expected = GridSearchCV(LogisticRegression(), grid, cv=3).fit(X, y)
        assert search.best_params_ == expected.best_params_
        assert list(scores) == list(cross_val_score(LogisticRegression(), X, y, cv=3))
        with (
            joblib.parallel_config(backend="apportion"),
            pytest.raises(KeyError, match="candidate 3"),
        ):
            Parallel(batch_size=1)(delayed(lambda i: fails_at(i, 3))(i) for i in range(10))
        # The failed call's tasks are gone from the cluster, none left queued.
        assert not any(client.processing().values())
