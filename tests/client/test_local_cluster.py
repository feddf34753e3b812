"""LocalCluster and Client() with Dask's arguments; scaling, logs, restart, shutdown; the
embedded cluster's supervision (a task that kills its worker fails, the workers come back).

Pure tests first (scheduler state, supervisor policy, argument parsing), then in-process
clusters, then a few with real worker processes (marked ``process``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from apportion import Client, FutureCancelledError, LocalCluster, WorkerCrashedError, wait
from apportion.deploy.cluster_options import (
    IgnoredOptionWarning,
    log_levels,
    memory_limit_bytes,
)
from apportion.protocol.cluster import RestartReply, RestartRequest
from apportion.protocol.shared_data import PublishDataset
from apportion.protocol.tasks import KeysFailed, KeysPending, ScatterReply, ScatterRequest
from apportion.protocol.worker import RestartWorker, WorkerDied, WorkerDraining
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import PROCESSING
from apportion.testing.simulation import SimulatedCluster
from apportion.worker.detect import memory_total
from apportion.worker.memory_policy import THRESHOLD_NAMES, MemoryThresholds
from apportion.worker.supervisor import Supervisor
from cli_processes import Processes
from supervisor_fakes import FakeMonotonic, FakeSpawner

# --- restart in the scheduler's state machine -----------------------------------------


def test_restart_drops_every_task_tells_every_client_and_resets_every_worker() -> None:
    sim = SimulatedCluster()
    sim.add_client("c1")
    sim.add_client("c2")
    supervised = sim.add_worker("a", nthreads=1, resources="GPU=1", pid=11, supervisor=5)
    sim.add_worker("b", nthreads=1, pid=12)
    sim.submit("done", client="c1")
    sim.place()
    sim.finish("done")
    sim.submit("running", resources="GPU=1", client="c2")
    sim.submit("after", deps=["running"], client="c1")
    sim.place()
    assert sim.state.tasks["running"].state == PROCESSING

    sim.client_says("c1", RestartRequest(7, "test"))

    assert not sim.state.tasks and not sim.state.workers
    # The supervised worker leaves for a fresh process; the other is reset in place.
    assert [type(msg) for msg in sim.to_workers[supervised]][-1] is RestartWorker
    assert sim.disconnected == ["w2"]
    (reply,) = [msg for msg in sim.inbox["c1"] if isinstance(msg, RestartReply)]
    assert (reply.request_id, reply.workers, reply.unsupervised) == (7, 2, ["b"])
    for client, keys in [("c1", ["after", "done"]), ("c2", ["running"])]:
        pending = [k for msg in sim.inbox[client] if isinstance(msg, KeysPending) for k in msg.keys]
        failed = [msg for msg in sim.inbox[client] if isinstance(msg, KeysFailed)]
        assert sorted(pending) == keys  # finished futures are reset first, then cancelled
        assert [f.kind for f in failed] == ["cancelled"]
        assert sorted(failed[0].keys) == keys and "restarted" in failed[0].message
    # A restart is no crash: nothing was blamed on the running task.
    assert not sim.state.deaths and not [log for log in sim.logs if "lost worker" in log.text]
    check_invariants(sim.state)

    sim.add_worker("a", nthreads=1, resources="GPU=1", pid=21)  # the fresh process
    sim.submit("done", client="c1")
    assert sim.place() == [("w3", "done")]
    check_invariants(sim.state)


def test_restart_keeps_the_job_queues_runs_and_drops_datasets_of_results() -> None:
    sim = SimulatedCluster()
    sim.add_client("c1")
    sim.add_client("runs", durable=True)
    sim.add_worker("a", nthreads=2, resources="GPU=1", pid=11, supervisor=5)
    sim.submit("run-1", resources="GPU=1", client="runs")
    sim.submit("run-2", resources="GPU=1", client="runs")
    sim.submit("mine", client="c1")
    sim.place()
    sim.finish("mine")
    sim.client_says("c1", PublishDataset(1, "result", b"p", ["mine"], 0))
    sim.client_says("c1", PublishDataset(2, "note", b"plain", [], 0))
    assert sim.state.tasks["run-1"].state == PROCESSING

    sim.client_says("c1", RestartRequest(3, ""))

    # The runs are not cancelled: the running one is queued again, as when its worker
    # leaves gracefully (the queue records a new attempt), the waiting one waits on.
    assert not [msg for msg in sim.inbox["runs"] if isinstance(msg, KeysFailed)]
    assert {k: t.state for k, t in sim.state.tasks.items()} == {
        "run-1": "queued",
        "run-2": "queued",
    }
    assert list(sim.state.shared.datasets) == ["note"]  # the result it named is gone
    check_invariants(sim.state)
    sim.add_worker("a", nthreads=1, resources="GPU=1", pid=21)
    assert sim.place() == [("w2", "run-1")]
    check_invariants(sim.state)


def test_restart_answers_unplaced_scatters_and_abandons_hand_offs() -> None:
    sim = SimulatedCluster()
    sim.add_client("c1")
    sim.client_says("c1", ScatterRequest(1, {"d": b"x"}))  # parked, then sent to "a"
    a = sim.add_worker("a", nthreads=1)
    sim.add_worker("b", nthreads=1)
    sim.client_says("c1", ScatterRequest(2, {"e": b"y"}))  # on its way to a worker
    sim.submit("r", client="c1")
    sim.place()
    sim.finish("r")
    holder = sim.state.tasks["r"].worker
    sim.worker_says(holder or a, WorkerDraining(30.0))  # hands "r" off: GetData sent
    assert sim.state.relays.handoffs

    sim.client_says("c1", RestartRequest(3, ""))

    # Both scatters were still waiting for their workers' DataStored: answered, empty.
    replies = [msg for msg in sim.inbox["c1"] if isinstance(msg, ScatterReply)]
    assert sorted((r.request_id, r.keys) for r in replies) == [(1, []), (2, [])]
    cancelled = {k for msg in sim.inbox["c1"] if isinstance(msg, KeysFailed) for k in msg.keys}
    assert {"d", "e", "r"} <= cancelled
    assert not sim.state.relays.handoffs and not sim.state.relays.scatters
    assert not sim.state.relays.parked
    check_invariants(sim.state)


def test_restart_answers_a_scatter_parked_for_want_of_workers() -> None:
    sim = SimulatedCluster()
    sim.add_client("c1")
    sim.client_says("c1", ScatterRequest(1, {"d": b"x"}))
    sim.client_says("c1", RestartRequest(2, ""))
    assert [type(msg) for msg in sim.inbox["c1"]] == [KeysFailed, ScatterReply, RestartReply]
    sim.add_worker("a", nthreads=1)  # it must not land after the restart
    assert not sim.state.tasks and not sim.to_workers.get("w1")
    check_invariants(sim.state)


# --- the supervisor's policy for a local cluster ------------------------------------


def test_supervisor_replaces_a_child_at_once_without_reporting_a_death() -> None:
    spawner, monotonic = FakeSpawner(), FakeMonotonic()
    reports: list[WorkerDied] = []
    supervisor = Supervisor(
        [["w", "--name", "w-0"]],
        spawner,
        monotonic,
        names=["w-0"],
        report=reports.append,
    )
    supervisor.start()
    supervisor.replace(supervisor.slots[0])
    supervisor.poll()
    assert len(spawner.spawned) == 2 and spawner.spawned[0].returncode == -signal.SIGKILL
    assert reports == [] and supervisor.slots[0].quick_failures == 0
    spawner.spawned[1].kill()  # a real death afterwards is reported and restarted
    supervisor.poll()
    assert [r.description for r in reports] == ["was killed by SIGKILL"]
    assert len(spawner.spawned) == 3


def test_supervisor_retires_and_adds_children() -> None:
    spawner, monotonic = FakeSpawner(stubborn=True), FakeMonotonic()
    supervisor = Supervisor([["w0"]], spawner, monotonic, report=lambda r: None)
    supervisor.start()
    slot = supervisor.add(["w1"], "w-1")
    assert [p.argv for p in spawner.spawned] == [["w0"], ["w1"]]
    supervisor.retire(slot)
    assert spawner.spawned[1].signals == [signal.SIGTERM]
    spawner.spawned[1].returncode = 1  # even a drain that fails is not restarted
    supervisor.poll()
    assert slot.stopped and len(spawner.spawned) == 2


# --- Dask's arguments -------------------------------------------------------------------


def test_memory_limit_takes_dasks_forms() -> None:
    machine = memory_total()
    assert memory_limit_bytes("4GiB", 2) == 4 * 2**30
    assert memory_limit_bytes(3_000_000_000, 2) == 3_000_000_000
    assert memory_limit_bytes(0.5, 2) == machine // 2
    assert memory_limit_bytes("auto", 4) == machine // 4
    assert memory_limit_bytes(0, 2) == memory_limit_bytes(None, 2) == 0
    with pytest.raises(ValueError, match="memory_limit"):
        memory_limit_bytes("lots", 1)
    with pytest.raises(TypeError):
        memory_limit_bytes([1], 1)  # type: ignore[arg-type]


def test_silence_logs_sets_what_workers_log_and_what_is_shown() -> None:
    assert log_levels(logging.WARN) == (logging.INFO, logging.WARNING)
    assert log_levels(logging.ERROR) == (logging.INFO, logging.ERROR)
    assert log_levels(logging.DEBUG) == (logging.DEBUG, logging.DEBUG)
    assert log_levels("error") == (logging.INFO, logging.ERROR)
    assert log_levels(False) == (logging.INFO, logging.NOTSET)  # Dask: "no change"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as c:
        yield c


@pytest.mark.tcp
def test_local_cluster_takes_dasks_arguments() -> None:
    with LocalCluster(
        n_workers=3,
        threads_per_worker=2,
        processes=False,
        memory_limit="2GiB",
        resources={"GPU": 1},
        dashboard_address=":0",
        silence_logs=logging.ERROR,
        host="127.0.0.1",
        scheduler_port=0,
        name="mine",
    ) as cluster:
        assert cluster.name == "mine"
        link = cluster.dashboard_link
        assert link is not None and link.startswith("http://127.0.0.1:")
        assert "/login?token=" in link and link != cluster.dashboard_link
        assert cluster.memory_limit == 2 * 2**30
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        # The port it listens on, not the 0 it was given (Dask's scheduler.port).
        assert cluster.scheduler_address.endswith(f":{cluster.scheduler.port}")
        assert len(cluster.workers) == 3 and sorted(cluster.workers) == [
            "worker-0",
            "worker-1",
            "worker-2",
        ]
        info = cluster.scheduler.info()["workers"].values()
        assert [(w["nthreads"], w["resources"]) for w in info] == [(2, {"GPU": 1.0})] * 3
        assert repr(cluster) == (
            f"LocalCluster('mine', '{cluster.scheduler_address}', workers=3, threads=6, in-process)"
        )
    with LocalCluster(n_workers=0, threads_per_worker=3, processes=False) as empty:
        assert empty.workers == {}
        empty.scale(2)
        assert [w.nthreads for w in empty.workers.values()] == [3, 3]
    # Dask's rule: threads given, workers not -> one in-process worker.
    with LocalCluster(threads_per_worker=2, processes=False) as one:
        assert len(one.workers) == 1


@pytest.mark.tcp
def test_options_for_dasks_internals_are_ignored_with_one_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cluster = LocalCluster(
            n_workers=1,
            processes=False,
            protocol="tcp://",
            nanny=True,
            max_spill="10GiB",
            worker_class=object,
        )
    cluster.close()
    assert [type(w.message) for w in caught] == [IgnoredOptionWarning]
    text = str(caught[0].message)
    for name in ("max_spill", "nanny", "worker_class"):
        assert name in text
    assert "protocol" not in text  # Dask's protocol is taken (the next test)
    with pytest.raises(TypeError, match="n_wrokers"):
        LocalCluster(n_wrokers=2, processes=False)
    unstarted = LocalCluster(asynchronous=True, processes=False)  # awaiting starts it
    assert unstarted.scheduler_address == "" and "(not started)" in repr(unstarted)
    with pytest.raises(TypeError, match="async with"):
        unstarted.__enter__()


@pytest.mark.tcp
def test_dasks_protocol_chooses_the_transport() -> None:
    with LocalCluster(n_workers=1, processes=False, protocol="inproc://") as in_memory:
        assert in_memory.scheduler_address.startswith("inproc://")  # no socket at all
        with Client(in_memory, set_as_default=False) as client:
            assert client.submit(lambda: 5).result(timeout=10) == 5
    with LocalCluster(n_workers=0, processes=False, protocol="tls", security=True) as tls:
        assert tls.scheduler_address.startswith("tls://127.0.0.1:")
    with pytest.raises(ValueError, match="give processes=False too"):
        LocalCluster(n_workers=0, protocol="inproc://")
    with pytest.raises(ValueError, match="not 'ucx://'"):
        LocalCluster(n_workers=0, processes=False, protocol="ucx://")


@pytest.mark.tcp
def test_memory_fractions_and_local_directory_are_taken_not_ignored(tmp_path: Path) -> None:
    with LocalCluster(
        n_workers=1,
        processes=False,
        memory_target_fraction=0.5,
        memory_spill_fraction=False,
        memory_terminate_fraction=None,  # Dask's "not given"
        local_directory=tmp_path,
    ) as cluster:  # no IgnoredOptionWarning: the suite turns warnings into errors
        assert cluster.memory_thresholds == MemoryThresholds(target=0.5, spill=False)
        assert cluster.local_directory == str(tmp_path)
        argv = cluster._command(cluster.specs[0])
        given = {name: argv[argv.index(f"--memory-{name}") + 1] for name in THRESHOLD_NAMES}
        assert given == {"target": "0.5", "spill": "off", "pause": "0.8", "terminate": "0.95"}
        assert argv[argv.index("--local-directory") + 1] == str(tmp_path)
    with pytest.raises(ValueError, match="memory_pause_fraction"):
        LocalCluster(n_workers=0, processes=False, memory_pause_fraction=80)


@pytest.mark.tcp
def test_client_forwards_cluster_arguments_like_dasks() -> None:
    with pytest.warns(IgnoredOptionWarning, match="interface, serializers") as caught:
        client = Client(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            resources="GPU=2",
            dashboard_address=None,
            interface="lo",
            serializers=["pickle"],
            set_as_default=False,
            name="me",
        )
    assert len(caught) == 1  # one warning for the client and its cluster together
    with client:
        assert client.cluster is not None and len(client.cluster.workers) == 2
        assert client.dashboard_link is None and client.name == "me"
        assert client.submit(lambda: 3).result(timeout=10) == 3
        workers = client.scheduler_info()["workers"].values()
        assert [w["resources"] for w in workers] == [{"GPU": 2.0}] * 2
    assert client.cluster._closed  # its own cluster closed with it
    unconnected = Client(asynchronous=True, processes=False)  # awaiting connects it
    assert "No scheduler connected (not connected yet)" in repr(unconnected)
    with pytest.raises(RuntimeError, match="not connected yet: await it first"):
        unconnected.submit(int)
    with pytest.raises(TypeError) as unexpected:
        Client(processes=False, n_wrokers=1)
    # Dask's exact text, which scripts compare; where it went, as a note.
    assert str(unexpected.value) == "Unexpected keyword arguments: ['n_wrokers']"
    assert unexpected.value.__notes__ == ["LocalCluster() takes none of these"]
    with pytest.raises(TypeError, match=r"a Cluster instance, not the class .*LocalCluster\(\)"):
        Client(LocalCluster)  # type: ignore[arg-type]


@pytest.mark.tcp
def test_client_of_a_cluster_and_shutdown_closes_a_cluster_it_did_not_start(
    cluster: LocalCluster,
) -> None:
    client = Client(cluster, set_as_default=False)
    assert client.cluster is cluster
    assert client.submit(lambda: 1).result(timeout=10) == 1
    client.shutdown()
    assert client._closed and cluster._closed
    with pytest.raises(TypeError, match="n_workers"):
        Client(cluster.scheduler_address, n_workers=2)  # only Client() starts a cluster


@pytest.mark.tcp
def test_scale_up_and_down_loses_no_result(cluster: LocalCluster) -> None:
    with Client(cluster, set_as_default=False) as client:
        cluster.scale(4)
        assert len(cluster.workers) == 4 and len(cluster.scheduler.state.workers) == 4
        futures = client.map(lambda x: x * 10, range(40))
        client.wait_for_workers(4)
        cluster.scale(1)
        assert list(cluster.workers) == ["worker-0"]  # newest left first
        assert client.gather(futures) == [x * 10 for x in range(40)]
        assert len(cluster.scheduler.state.workers) == 1
        check_invariants(cluster.scheduler.state)


@pytest.mark.tcp
def test_restart_cancels_every_future_and_new_work_runs(cluster: LocalCluster) -> None:
    with Client(cluster, set_as_default=False) as client:
        finished = client.submit(lambda: 1, pure=False)
        finished.result(timeout=10)
        blocked = client.submit(time.sleep, 60)
        client.restart(timeout=20)
        assert finished.status == blocked.status == "cancelled"
        with pytest.raises(FutureCancelledError, match="restarted"):
            finished.result(timeout=1)
        assert len(client.scheduler_info()["workers"]) == 2
        assert client.submit(lambda: 2, pure=False).result(timeout=10) == 2
        check_invariants(cluster.scheduler.state)


# --- real worker processes: supervision ---------------------------------------------------


@pytest.fixture
def process_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=None) as c:
        yield c


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_task_that_kills_its_worker_fails_and_the_workers_come_back(
    process_cluster: LocalCluster,
) -> None:
    with Client(process_cluster, set_as_default=False) as client:
        started = time.monotonic()

        def die() -> None:  # defined here: it travels by value, as a script's would
            os._exit(1)

        with pytest.raises(WorkerCrashedError, match="exited with status 1") as info:
            client.submit(die).result(timeout=30)
        assert time.monotonic() - started < 15
        assert "3 workers that died" in str(info.value)
        process_cluster.wait_for_workers(2, timeout=20)
        assert client.gather(client.map(lambda x: x + 1, range(10))) == list(range(1, 11))
        assert len(process_cluster.workers) == 2
        logs = process_cluster.get_logs()
        assert set(logs) == {"scheduler", "worker-0", "worker-1"}
        assert "worker worker-0" in logs["worker-0"]  # its own INFO lines, kept
        assert "exited with status 1" in logs["scheduler"]


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_worker_killed_from_outside_is_replaced_and_its_task_runs_again(
    process_cluster: LocalCluster,
) -> None:
    with Client(process_cluster, set_as_default=False) as client:
        before = {w["pid"] for w in client.scheduler_info()["workers"].values()}

        def pid_after(seconds: float) -> int:
            time.sleep(seconds)
            return os.getpid()

        future = client.submit(pid_after, 2.0, pure=False)
        deadline = time.monotonic() + 10
        while not any(w.processing for w in process_cluster.scheduler.state.workers.values()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (victim,) = [
            w.pid for w in process_cluster.scheduler.state.workers.values() if w.processing
        ]
        os.kill(victim, signal.SIGKILL)
        ran_on = future.result(timeout=30)
        assert ran_on != victim
        process_cluster.wait_for_workers(2, timeout=20)
        after = {w["pid"] for w in client.scheduler_info()["workers"].values()}
        assert len(after) == 2 and victim not in after and len(after & before) == 1


@pytest.mark.process
@pytest.mark.timeout(60)
def test_restart_and_scale_down_on_worker_processes(process_cluster: LocalCluster) -> None:
    with Client(process_cluster, set_as_default=False) as client:
        before = {w["pid"] for w in client.scheduler_info()["workers"].values()}
        old = client.submit(lambda: 1, pure=False)
        old.result(timeout=10)
        client.restart(timeout=30)
        after = {w["pid"] for w in client.scheduler_info()["workers"].values()}
        assert len(after) == 2 and not before & after
        assert old.status == "cancelled"
        futures = client.map(lambda x: x * 2, range(20), pure=False)
        wait(futures, timeout=20)  # every result exists before its holder leaves
        process_cluster.scale(3)
        assert sorted(process_cluster.workers) == ["worker-0", "worker-1", "worker-2"]
        process_cluster.scale(1)
        assert list(process_cluster.workers) == ["worker-0"]
        assert client.gather(futures) == [x * 2 for x in range(20)]


@pytest.mark.process
@pytest.mark.timeout(60)
def test_restart_on_a_remote_cluster_replaces_supervised_workers_and_resets_the_rest(
    procs: Processes,
) -> None:
    address = procs.scheduler()
    procs.start("worker", address, "--nworkers", "2", "--nthreads", "1", "--name", "sup")
    procs.start("worker", address, "--nthreads", "1", "--name", "plain")
    client = Client(address, set_as_default=False)
    try:
        client.wait_for_workers(3, timeout=20)
        before = {w["name"]: w["pid"] for w in client.scheduler_info()["workers"].values()}
        done = client.submit(lambda: 1, pure=False)
        done.result(timeout=10)
        client.restart(timeout=30)
        after = {w["name"]: w["pid"] for w in client.scheduler_info()["workers"].values()}
        assert sorted(after) == ["plain", "sup-0", "sup-1"]
        assert after["plain"] == before["plain"]  # no supervisor: reset in its own process
        assert after["sup-0"] != before["sup-0"] and after["sup-1"] != before["sup-1"]
        assert done.status == "cancelled"
        assert client.gather(client.map(lambda x: -x, range(6))) == [0, -1, -2, -3, -4, -5]
    finally:
        with pytest.warns(UserWarning, match="keeps running"):
            client.shutdown()  # only a LocalCluster object can be closed from a client


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_worker_past_its_memory_limit_is_killed_and_its_task_told_why() -> None:
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="300MiB") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):

        def hog() -> int:
            block = b"x" * (600 * 2**20)  # written, so resident
            time.sleep(10)
            return len(block)

        assert "workers=1, threads=1, memory=300.00 MiB, processes)" in repr(cluster)
        with pytest.raises(WorkerCrashedError, match="out of memory"):
            client.submit(hog).result(timeout=40)
        cluster.wait_for_workers(1, timeout=20)
        assert client.submit(lambda: "fine").result(timeout=10) == "fine"


@pytest.mark.process
@pytest.mark.timeout(60)
def test_silence_logs_decides_what_reaches_stderr_and_get_logs_keeps_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, silence_logs=logging.ERROR) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):

        def say() -> None:
            log = logging.getLogger("apportion.task")
            log.warning("a quiet warning")
            log.error("a loud error")

        client.submit(say).result(timeout=10)
        deadline = time.monotonic() + 10
        while "a loud error" not in cluster.get_logs()["worker-0"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        logs = cluster.get_logs()["worker-0"]
        assert "a quiet warning" in logs and "INFO" in logs  # context is kept
    shown = capsys.readouterr().err
    assert "a loud error" in shown and "a quiet warning" not in shown


@pytest.mark.process
@pytest.mark.timeout(60)
def test_no_worker_outlives_the_process_that_started_the_cluster(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(
        "import os\n"
        "from apportion import Client\n"
        "client = Client(n_workers=2, threads_per_worker=1)\n"
        "print(*[w['pid'] for w in client.scheduler_info()['workers'].values()], flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=40,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    pids = [int(word) for word in result.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 15
    while any(psutil.pid_exists(pid) and _alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "a worker outlived its user's process"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_worker_that_cannot_start_is_an_error_with_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(address: str, spec: dict[str, object]) -> list[str]:
        code = "import sys; sys.stderr.write('cannot start here\\n'); sys.exit(3)"
        return [sys.executable, "-c", code, "--name", str(spec["name"])]

    monkeypatch.setattr("apportion.deploy.local.worker_command", broken)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)exited again and again.*cannot start here"):
        LocalCluster(n_workers=1)
    assert time.monotonic() - started < 20


@pytest.mark.tcp
def test_worker_names_must_be_distinct_and_scale_never_reuses_one() -> None:
    with pytest.raises(ValueError, match=r"given more than once: \['a'\]"):
        LocalCluster(processes=False, workers=[{"name": "a"}, {"name": "a"}])
    with LocalCluster(processes=False, workers=[{"name": "worker-1"}]) as cluster:
        cluster.scale(3)
        assert sorted(cluster.workers) == ["worker-1", "worker-2", "worker-3"]
