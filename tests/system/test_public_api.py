"""The public names: all exported, documented, and usable under Dask's names."""

from __future__ import annotations

import concurrent.futures
import inspect
import time
from typing import Any

import pytest

import apportion
from apportion import Client, LocalCluster, WorkerPlugin


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in apportion.__all__:
        obj = getattr(apportion, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"apportion.{name} has no docstring"


def test_dask_exception_names_catch_apportion_failures() -> None:
    assert apportion.CancelledError is concurrent.futures.CancelledError
    assert issubclass(apportion.FutureCancelledError, apportion.CancelledError)
    with pytest.raises(apportion.KilledWorker):
        raise apportion.WorkerCrashedError("died three times")


class Marker(WorkerPlugin):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def setup(self, worker: Any) -> None:
        worker.marked = True


def is_marked(dask_worker: Any) -> bool:
    return getattr(dask_worker, "marked", False)


@pytest.mark.tcp
def test_a_worker_plugin_subclass_is_installed_on_every_worker() -> None:
    with LocalCluster(n_workers=2, processes=False) as cluster, Client(cluster) as client:
        client.register_plugin(Marker(), name="marker")
        assert set(client.run(is_marked).values()) == {True}
        assert WorkerPlugin().setup(None) is None  # the base hooks do nothing


def fail_once(path: str) -> str:
    import os

    if not os.path.exists(path):
        open(path, "w").close()
        raise RuntimeError("first call fails")
    return "second call works"


@pytest.mark.tcp
def test_future_client_release_and_retry(tmp_path: Any) -> None:
    with LocalCluster(n_workers=1, processes=False) as cluster, cluster.get_client() as client:
        assert apportion.TimeoutError is TimeoutError
        future = client.submit(sum, [1, 2, 3])
        assert future.client is client and future.result() == 6
        assert client.futures_of([future, {"x": future}]) == [future]
        future.release()
        future.release()  # idempotent: counted once
        deadline = time.monotonic() + 5
        while cluster.scheduler.state.tasks and time.monotonic() < deadline:
            time.sleep(0.01)  # the release travels to the scheduler
        assert not cluster.scheduler.state.tasks  # released before garbage collection
        flaky = client.submit(fail_once, str(tmp_path / "flag"))
        with pytest.raises(RuntimeError, match="first call fails"):
            flaky.result()
        flaky.retry()
        assert flaky.result() == "second call works"


@pytest.mark.tcp
def test_default_client_is_the_newest_open_default_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apportion.client import dask_default

    monkeypatch.setattr(dask_default, "_clients", [])  # clients other tests left open
    with LocalCluster(n_workers=1, processes=False) as cluster:
        with Client(cluster) as first:
            assert apportion.default_client() is first and Client.current() is first
            with Client(cluster) as second, Client(cluster, set_as_default=False) as other:
                assert apportion.default_client() is second
                assert apportion.default_client(other) is other
            assert Client.current() is first
        with pytest.raises(ValueError, match=r"No clients found \(no open client\)"):
            apportion.default_client()
