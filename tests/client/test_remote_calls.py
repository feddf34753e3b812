"""Code run on workers outside tasks: ``run``, ``run_on_scheduler``, ``upload_file``,
worker plugins, versions and logs.

Most tests use an in-process cluster; uploads are also checked with worker
processes, since in-process workers share ``sys.modules`` with the test.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apportion import Client, LocalCluster, Worker
from apportion.client.remote_calls import SchedulerView, WorkerLostError
from apportion.deploy.local_shape import worker_command, worker_spec
from apportion.protocol.remote_calls import (
    NO_REPLY,
    CallAnswered,
    CallOnWorkers,
    Install,
    InstallOnWorkers,
    RemoteCall,
    Uninstall,
    UninstallFromWorkers,
    WorkersAnswered,
)
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.remote_calls import MAX_INSTALL_BYTES
from apportion.testing import InMemoryCluster
from apportion.testing.simulation import SimulatedCluster
from apportion.worker.local_directory import LOCK, PREFIX, remove_stale
from cluster_checks import InProcess, checked_client


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster([{"name": "worker-0"}, {"name": "worker-1"}]) as c:
        yield c


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with checked_client(cluster) as c:
        yield c


def addresses(cluster: InProcess) -> set[str]:
    return {w.address for w in cluster.scheduler.state.workers.values()}


def worker_named(cluster: InMemoryCluster, name: str) -> Worker:
    return next(w for w in cluster.workers if w.name == name)


def start_worker(cluster: InMemoryCluster, name: str) -> Worker:
    """A worker that joins the running cluster later (closed by the caller)."""
    return cluster.run(cluster.add_worker(name=name, reconnect_timeout=0))


def stop_worker(cluster: InMemoryCluster, worker: Worker) -> None:
    cluster.run(cluster.remove_worker(worker))
    deadline = time.monotonic() + 5
    while worker.address in addresses(cluster) and time.monotonic() < deadline:
        time.sleep(0.01)  # the scheduler learns of the departure by message; nothing signals it


class Boom(Exception):
    pass


# --- run --------------------------------------------------------------------------------


def test_run_returns_a_result_per_worker_address(client: Client, cluster: InMemoryCluster) -> None:
    result = client.run(lambda x, y=0: x + y, 1, y=2)
    assert result == {address: 3 for address in addresses(cluster)}


def test_run_on_workers_named_by_name_or_address(client: Client, cluster: InMemoryCluster) -> None:
    def name(dask_worker: Any) -> str:
        return str(dask_worker.name)

    by_name = client.run(name, workers=["worker-1"])
    address = worker_named(cluster, "worker-1").address
    assert by_name == {address: "worker-1"}
    other = worker_named(cluster, "worker-0").address
    assert client.run(name, workers=[other]) == {other: "worker-0"}
    assert client.run(name, workers=other) == {other: "worker-0"}
    assert client.run(name, workers=[]) == {}


def test_run_refuses_unknown_workers(client: Client) -> None:
    with pytest.raises(ValueError, match="no worker is named or listens at 'nobody'"):
        client.run(lambda: 1, workers=["nobody"])


def test_run_passes_the_worker_object_as_dask_worker(
    client: Client, cluster: InMemoryCluster
) -> None:
    def describe(dask_worker: Any) -> tuple[str, str, int, dict[str, float], bool]:
        return (
            dask_worker.name,
            dask_worker.address,
            dask_worker.nthreads,
            dask_worker.resources,
            isinstance(dask_worker, Worker),
        )

    result = client.run(describe)
    assert result is not None
    for address, (name, own_address, nthreads, resources, is_worker) in result.items():
        assert worker_named(cluster, name).address == address == own_address
        assert (nthreads, resources, is_worker) == (1, {}, True)


def test_run_reraises_with_the_workers_traceback(client: Client) -> None:
    def fails_here() -> None:
        raise Boom("on the worker")

    with pytest.raises(Boom, match="on the worker") as info:
        client.run(fails_here)
    assert "fails_here" in [entry.name for entry in info.traceback]


def test_run_on_error_return_and_ignore(client: Client, cluster: InMemoryCluster) -> None:
    def fails_on_worker_0(dask_worker: Any) -> str:
        if dask_worker.name == "worker-0":
            raise Boom("worker-0 fails")
        return str(dask_worker.name)

    returned = client.run(fails_on_worker_0, on_error="return")
    assert returned is not None
    bad = worker_named(cluster, "worker-0").address
    good = worker_named(cluster, "worker-1").address
    assert isinstance(returned[bad], Boom) and returned[good] == "worker-1"
    assert client.run(fails_on_worker_0, on_error="ignore") == {good: "worker-1"}
    with pytest.raises(ValueError, match="on_error"):
        client.run(fails_on_worker_0, on_error="sometimes")


def test_run_async_function_runs_on_the_workers_event_loop(client: Client) -> None:
    async def on_loop(delay: float) -> bool:
        await asyncio.sleep(delay)
        asyncio.get_running_loop()  # raises outside a running loop
        return threading.current_thread().name.startswith("apportion-cluster")

    result = client.run(on_loop, 0.01)
    assert result is not None and set(result.values()) == {True}


# In-process workers share this module: functions defined at its top level travel by
# reference and see these objects (locks cannot be pickled by value).
RELEASE = threading.Event()
STARTED = threading.Semaphore(0)
HANG_ON = {"name": ""}


def block() -> str:
    STARTED.release()
    RELEASE.wait(10)
    return threading.current_thread().name


def started() -> None:
    STARTED.release()


def hang_on_one(dask_worker: Any) -> str:
    if dask_worker.name == HANG_ON["name"]:
        STARTED.release()
        RELEASE.wait(10)
    return str(dask_worker.name)


@pytest.fixture
def gates() -> Iterator[None]:
    """Fresh gates for the tests that block threads; released whatever happens."""
    global STARTED
    RELEASE.clear()
    STARTED = threading.Semaphore(0)
    try:
        yield
    finally:
        RELEASE.set()


def test_run_reaches_workers_whose_task_threads_are_all_busy(
    client: Client, cluster: InMemoryCluster, gates: None
) -> None:
    futures = [client.submit(block, pure=False) for _ in range(2)]  # one per single thread
    for _ in futures:
        assert STARTED.acquire(timeout=5)
    result = client.run(lambda: threading.current_thread().name)
    assert result is not None and len(result) == 2
    assert all(name == "apportion-run" for name in result.values())
    assert all(f.status == "pending" for f in futures)
    RELEASE.set()
    assert all(name.startswith("apportion-task") for name in client.gather(futures))


def test_run_wait_false_returns_none_and_still_runs(client: Client, gates: None) -> None:
    assert client.run(started, wait=False) is None
    assert STARTED.acquire(timeout=5) and STARTED.acquire(timeout=5)  # once on each worker


def test_run_refuses_nanny(client: Client) -> None:
    with pytest.raises(ValueError, match="no nanny"):
        client.run(lambda: 1, nanny=True)


def test_run_answers_lost_for_a_worker_that_leaves_mid_call(
    client: Client, cluster: InMemoryCluster, gates: None
) -> None:
    late = start_worker(cluster, "short-lived")
    HANG_ON["name"] = "short-lived"
    box: list[Any] = []
    caller = threading.Thread(target=lambda: box.append(client.run(hang_on_one, on_error="return")))
    caller.start()
    assert STARTED.acquire(timeout=5)
    stop_worker(cluster, late)
    caller.join(5)
    assert not caller.is_alive()
    (result,) = box
    assert isinstance(result[late.address], WorkerLostError)
    assert sorted(v for a, v in result.items() if a != late.address) == ["worker-0", "worker-1"]


# --- run_on_scheduler -----------------------------------------------------------------


def test_run_on_scheduler_sees_a_read_only_snapshot(
    client: Client, cluster: InMemoryCluster
) -> None:
    future = client.submit(lambda: 41, key="answer")
    assert future.result() == 41

    def look(prefix: str, dask_scheduler: SchedulerView) -> tuple[str, list[str], str, str]:
        return (
            prefix + dask_scheduler.address,
            sorted(w.name for w in dask_scheduler.workers.values()),
            dask_scheduler.tasks["answer"].state,
            dask_scheduler.id,
        )

    address, names, state, ident = client.run_on_scheduler(look, "at ")
    assert address == "at " + cluster.scheduler.address
    assert (names, state, ident) == (["worker-0", "worker-1"], "memory", cluster.scheduler.id)

    def mutate(dask_scheduler: SchedulerView) -> None:
        dask_scheduler.workers["x"] = None  # type: ignore[index]

    with pytest.raises(TypeError):
        client.run_on_scheduler(mutate)
    assert client.run_on_scheduler(lambda x: x * 2, 21) == 42

    async def later(dask_scheduler: SchedulerView) -> int:
        await asyncio.sleep(0)
        return len(dask_scheduler.workers)

    assert client.run_on_scheduler(later) == 2


# --- upload_file ----------------------------------------------------------------------


def _forget_module(name: str) -> None:
    sys.modules.pop(name, None)
    importlib.invalidate_caches()


def test_upload_py_then_changed_takes_effect_also_on_later_workers(
    client: Client, cluster: InMemoryCluster, tmp_path: Path
) -> None:
    source = tmp_path / "uploaded_mod_a.py"
    source.write_text("VALUE = 1\n")
    try:
        result = client.upload_file(str(source))
        assert result == {a: {"status": "OK", "nbytes": 10} for a in addresses(cluster)}

        def value() -> int:
            import uploaded_mod_a  # type: ignore[import-not-found]

            return int(uploaded_mod_a.VALUE)

        assert set((client.run(value) or {}).values()) == {1}
        assert client.submit(value, pure=False).result() == 1
        source.write_text("VALUE = 2\n")  # same size, same second: reloaded all the same
        client.upload_file(source)
        assert set((client.run(value) or {}).values()) == {2}
        late = start_worker(cluster, "late-upload")
        try:
            dirs = client.run(lambda dask_worker: str(dask_worker.remote_calls.directory.path))
            assert dirs is not None
            uploads = Path(dirs[late.address])
            assert (uploads / "uploaded_mod_a.py").read_text() == "VALUE = 2\n"
            # A worker directory, locked while the worker lives: the next worker on
            # that base removes it if this one is killed before it can.
            assert uploads.name.startswith(PREFIX) and (uploads / LOCK).exists()
            remove_stale(uploads.parent)
            assert uploads.exists() and uploads.stat().st_mode & 0o077 == 0
        finally:
            stop_worker(cluster, late)
        assert not Path(dirs[late.address]).exists()  # removed when the worker closed
    finally:
        _forget_module("uploaded_mod_a")


def test_upload_zip_package(client: Client, tmp_path: Path) -> None:
    archive = tmp_path / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_pkg_b/__init__.py", "from .inner import twice\n")
        z.writestr("zipped_pkg_b/inner.py", "def twice(x):\n    return 2 * x\n")
    try:
        client.upload_file(archive)

        def use(x: int) -> int:
            import zipped_pkg_b  # type: ignore[import-not-found]

            return int(zipped_pkg_b.twice(x))

        assert client.submit(use, 21).result() == 42
    finally:
        _forget_module("zipped_pkg_b")
        _forget_module("zipped_pkg_b.inner")


def test_upload_refusals(client: Client, tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("x")
    with pytest.raises(ValueError, match=r"\.py"):
        client.upload_file(text)
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (MAX_INSTALL_BYTES + 1))
    with pytest.raises(ValueError, match="limited to"):
        client.upload_file(big)
    broken = tmp_path / "broken_upload_c.py"
    broken.write_text("raise RuntimeError('cannot import me')\n")
    try:
        with pytest.raises(RuntimeError, match="cannot import me"):
            client.upload_file(broken)
    finally:
        _forget_module("broken_upload_c")


@pytest.mark.process
def test_upload_reaches_worker_processes_and_a_later_one(tmp_path: Path) -> None:
    source = tmp_path / "proc_uploaded_d.py"
    source.write_text("def hello():\n    return 'hello from an upload'\n")
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        client.upload_file(source)

        def call() -> str:
            import proc_uploaded_d  # type: ignore[import-not-found]

            return str(proc_uploaded_d.hello())

        assert list((client.run(call) or {}).values()) == ["hello from an upload"]
        source.write_text("def hello():\n    return 'changed'\n")
        client.upload_file(source)
        assert client.submit(call, pure=False).result() == "changed"
        # A worker process that joins later gets the kept upload on registration.
        spec = worker_spec(1, {"name": "late-process", "nthreads": 1})
        late = subprocess.Popen(
            worker_command(cluster.scheduler_address, spec),
            stdin=subprocess.DEVNULL,
            env={**os.environ, **cluster.security.environment("worker")},  # its secret
        )
        try:
            client.wait_for_workers(2, timeout=30)
            (answer,) = (client.run(call, workers=["late-process"]) or {}).values()
            assert answer == "changed"
        finally:
            late.terminate()
            late.wait(10)


# --- plugins --------------------------------------------------------------------------


class Recorder:
    """A worker plugin that records its calls on the worker object."""

    name = "recorder"

    def setup(self, worker: Any) -> None:
        worker.plugin_calls = [*getattr(worker, "plugin_calls", []), "setup"]

    def teardown(self, worker: Any) -> None:
        worker.plugin_calls = [*getattr(worker, "plugin_calls", []), "teardown"]


def test_plugin_setup_on_existing_and_later_workers_teardown_on_unregister(
    client: Client, cluster: InMemoryCluster
) -> None:
    def calls(dask_worker: Any) -> list[str]:
        return list(getattr(dask_worker, "plugin_calls", []))

    for worker in cluster.workers:
        worker.plugin_calls = []
    assert client.register_plugin(Recorder()) == {a: {"status": "OK"} for a in addresses(cluster)}
    assert set(map(tuple, (client.run(calls) or {}).values())) == {("setup",)}
    late = start_worker(cluster, "late-plugin")
    try:
        assert (client.run(calls, workers=[late.address]) or {})[late.address] == ["setup"]
        client.unregister_worker_plugin("recorder")
        assert set(map(tuple, (client.run(calls) or {}).values())) == {("setup", "teardown")}
        client.register_worker_plugin(Recorder())
    finally:
        stop_worker(cluster, late)
    assert late.plugin_calls == ["setup", "teardown", "setup", "teardown"]  # type: ignore[attr-defined]
    client.unregister_worker_plugin("recorder")
    with pytest.raises(ValueError, match="no worker plugin named 'recorder'"):
        client.unregister_worker_plugin("recorder")


def test_dask_worker_plugin_subclass_and_errors(client: Client, cluster: InMemoryCluster) -> None:
    from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

    class Tagger(WorkerPlugin):
        async def setup(self, worker: Any) -> None:
            await asyncio.sleep(0)
            worker.tag = "tagged"

    client.register_plugin(Tagger(), name="tagger")
    assert set((client.run(lambda dask_worker: dask_worker.tag) or {}).values()) == {"tagged"}
    client.unregister_worker_plugin("tagger")

    class Failing:
        def setup(self, worker: Any) -> None:
            raise Boom("setup failed")

    with pytest.raises(Boom, match="setup failed"):
        client.register_plugin(Failing(), name="failing")
    client.unregister_worker_plugin("failing")
    with pytest.raises(TypeError, match="scheduler plugin"):
        client.register_plugin(SchedulerPlugin())
    with pytest.raises(TypeError, match="neither setup"):
        client.register_plugin(object())


def test_plugin_idempotent_keeps_the_first(client: Client) -> None:
    client.register_plugin(Recorder(), name="once")
    try:
        assert client.register_plugin(Recorder(), name="once", idempotent=True) == {}
    finally:
        client.unregister_worker_plugin("once")


def test_plugin_teardown_runs_when_the_worker_closes(
    client: Client, cluster: InMemoryCluster
) -> None:
    late = start_worker(cluster, "closing")
    client.register_plugin(Recorder(), name="closer")
    try:
        stop_worker(cluster, late)
        assert late.plugin_calls == ["setup", "teardown"]  # type: ignore[attr-defined]
    finally:
        client.unregister_worker_plugin("closer")


# --- versions and logs ----------------------------------------------------------------


def test_get_versions(client: Client, cluster: InMemoryCluster) -> None:
    versions = client.get_versions(check=True, packages=["pytest"])
    assert set(versions) == {"scheduler", "workers", "client"}
    assert set(versions["workers"]) == addresses(cluster)
    client_packages = versions["client"]["packages"]
    assert client_packages["python"] == ".".join(map(str, sys.version_info[:3]))
    assert client_packages["cloudpickle"] and client_packages["msgpack"]
    assert client_packages["pytest"] == pytest.__version__
    assert versions["scheduler"]["packages"]["apportion"] == client_packages["apportion"]


def test_get_versions_check_names_a_mismatch(client: Client, monkeypatch: Any) -> None:
    import apportion.versions

    real = apportion.versions.package_version
    # The client and the in-process workers read versions through this name; the
    # scheduler took its own when it started: they now differ on msgpack.
    monkeypatch.setattr(
        "apportion.client.remote_calls.versions",
        lambda: {
            "host": {},
            "packages": {
                name: ("0.0-other" if name == "msgpack" else real(name))
                for name in apportion.versions.REQUIRED
            },
        },
    )
    with pytest.raises(ValueError, match=r"msgpack differs \(client: 0.0-other") as info:
        client.get_versions(check=True)
    assert f"scheduler: {real('msgpack')}" in str(info.value)
    assert "python differs" not in str(info.value)
    assert client.get_versions()["client"]["packages"]["msgpack"] == "0.0-other"  # no check


def test_worker_and_scheduler_logs(client: Client, cluster: InMemoryCluster) -> None:
    def say(text: str, dask_worker: Any) -> None:
        logging.getLogger("some.user.code").warning("%s from %s", text, dask_worker.name)

    client.run(say, "hello", workers=["worker-0"])
    logs = client.get_worker_logs()
    assert set(logs) == addresses(cluster)
    mine = logs[worker_named(cluster, "worker-0").address]
    assert mine[-1][0] == "WARNING" and "hello from worker-0" in mine[-1][1]
    (last,) = client.get_worker_logs(n=1, workers=["worker-0"]).values()
    assert last == mine[-1:]
    logging.getLogger("apportion.scheduler").warning("a scheduler record")
    records = client.get_scheduler_logs()
    assert records[-1][0] == "WARNING" and "a scheduler record" in records[-1][1]
    assert not any("hello from worker-0" in text for _, text in records)
    assert client.get_scheduler_logs(n=1) == records[-1:]


# --- the relay, as a pure state machine -------------------------------------------------


def answers(sim: SimulatedCluster, client: str = "c1") -> list[WorkersAnswered]:
    return [x for x in sim.inbox[client] if isinstance(x, WorkersAnswered)]


def sent(sim: SimulatedCluster, worker_id: str, cls: type[Any]) -> list[Any]:
    return [x for x in sim.to_workers.get(worker_id, []) if isinstance(x, cls)]


@pytest.fixture
def sim() -> Iterator[SimulatedCluster]:
    sim = SimulatedCluster()
    sim.add_worker("alpha")
    sim.add_worker("beta")
    sim.add_client("c1")
    yield sim
    check_invariants(sim.state)


def test_relay_answers_lost_for_a_worker_lost_mid_run(sim: SimulatedCluster) -> None:
    sim.client_says("c1", CallOnWorkers(7, b"call", []))
    (call1,), (call2,) = sent(sim, "w1", RemoteCall), sent(sim, "w2", RemoteCall)
    assert call1.call == call2.call == b"call"
    sim.worker_says("w1", CallAnswered(call1.request_id, "ok", b"one", b""))
    assert answers(sim) == []  # still waiting for w2
    sim.remove_worker("w2")
    (reply,) = answers(sim)
    assert reply.request_id == 7 and reply.error == ""
    assert reply.results["sim://w1"] == ["ok", b"one", b""]
    status, why, _ = reply.results["sim://w2"]
    assert status == "lost" and b"sim://w2 left before answering" in why
    assert not sim.state.remote.calls
    # A late answer from a worker nobody waits for changes nothing.
    sim.worker_says("w1", CallAnswered(call1.request_id, "ok", b"again", b""))
    assert len(answers(sim)) == 1


def test_relay_targets_by_name_or_address_and_refuses_unknown(sim: SimulatedCluster) -> None:
    sim.client_says("c1", CallOnWorkers(1, b"f", ["beta", "sim://w2"]))
    assert sent(sim, "w1", RemoteCall) == [] and len(sent(sim, "w2", RemoteCall)) == 1
    sim.client_says("c1", CallOnWorkers(2, b"f", ["alpha", "gamma"]))
    (refused,) = answers(sim)
    assert refused.request_id == 2 and "'gamma'" in refused.error
    assert sent(sim, "w1", RemoteCall) == []  # nothing runs when one name is unknown


def test_relay_without_reply_and_client_leaving(sim: SimulatedCluster) -> None:
    sim.client_says("c1", CallOnWorkers(NO_REPLY, b"f", []))
    (call,) = sent(sim, "w1", RemoteCall)
    assert call.request_id == NO_REPLY and not sim.state.remote.calls
    sim.client_says("c1", CallOnWorkers(3, b"f", []))
    assert len(sim.state.remote.calls) == 1
    sim.remove_client("c1")
    assert not sim.state.remote.calls


def test_installs_are_kept_and_replayed_in_order_to_joining_workers(
    sim: SimulatedCluster,
) -> None:
    sim.client_says("c1", InstallOnWorkers(1, "upload", "a.py", b"A = 1", 1, 1))
    sim.client_says("c1", InstallOnWorkers(2, "plugin", "p", b"plugin", 0, 1))
    sim.client_says("c1", InstallOnWorkers(3, "upload", "a.py", b"A = 2", 1, 1))
    (first,) = [x for x in sent(sim, "w1", Install) if x.blob == b"A = 1"]
    rid = first.request_id
    sim.worker_says("w1", CallAnswered(rid, "ok", b"r1", b""))
    sim.worker_says("w2", CallAnswered(rid, "ok", b"r2", b""))
    (reply,) = answers(sim)
    assert reply.request_id == 1 and set(reply.results) == {"sim://w1", "sim://w2"}
    late = sim.add_worker("late")
    replay = sent(sim, late, Install)
    assert [(x.name, x.blob, x.request_id) for x in replay] == [
        ("p", b"plugin", NO_REPLY),
        ("a.py", b"A = 2", NO_REPLY),  # the newer upload replaced the older one
    ]
    assert sim.state.remote.kept_bytes == len(b"plugin") + len(b"A = 2")
    # Idempotent: the kept plugin stays, nothing is sent.
    before = len(sent(sim, "w1", Install))
    sim.client_says("c1", InstallOnWorkers(4, "plugin", "p", b"other", 0, 0))
    assert len(sent(sim, "w1", Install)) == before
    assert [r.request_id for r in answers(sim) if r.results == {}] == [4]
    # Uninstall: forgotten for joiners; unknown names are refused.
    sim.client_says("c1", UninstallFromWorkers(5, "p"))
    assert [x.name for x in sent(sim, "w1", Uninstall)] == ["p"]
    assert [x.name for x in sent(sim, sim.add_worker("later"), Install)] == ["a.py"]
    sim.client_says("c1", UninstallFromWorkers(6, "p"))
    assert "no worker plugin named 'p'" in answers(sim)[-1].error


def test_installs_are_bounded(sim: SimulatedCluster, monkeypatch: Any) -> None:
    from apportion.scheduler import remote_calls

    monkeypatch.setattr(remote_calls, "MAX_INSTALL_BYTES", 10)
    monkeypatch.setattr(remote_calls, "MAX_KEPT_BYTES", 15)
    sim.client_says("c1", InstallOnWorkers(1, "upload", "big.py", b"x" * 11, 1, 1))
    assert "limit is 10" in answers(sim)[-1].error
    sim.client_says("c1", InstallOnWorkers(2, "upload", "a.py", b"x" * 10, 1, 1))
    sim.client_says("c1", InstallOnWorkers(3, "upload", "b.py", b"x" * 10, 1, 1))
    assert "keeps at most 15 bytes" in answers(sim)[-1].error
    assert list(sim.state.remote.kept) == [("upload", "a.py")]
    sim.client_says("c1", InstallOnWorkers(4, "script", "c", b"", 1, 1))
    assert "unknown install kind" in answers(sim)[-1].error


@pytest.mark.tcp
def test_run_names_workers_by_bare_address_and_host() -> None:
    # Only TCP addresses have a host and a bare form.
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster,
        checked_client(cluster) as client,
    ):
        address = sorted(client.scheduler_info()["workers"])[0]
        bare = address.removeprefix("tcp://")
        assert list(client.run(os.getpid, workers=[bare])) == [address]
        assert len(client.run(os.getpid, workers=["127.0.0.1"])) == 2  # a host: all its workers
