"""Workers paused for their memory, in the scheduler's state machine alone: no new task
goes to them until their heartbeat says they resumed, and a task that only they
could run waits for them rather than failing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion.protocol.cluster import WhyReply, WhyRequest
from apportion.protocol.worker import Heartbeat, WorkerClosing
from apportion.scheduler import views
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import QUEUED
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import RecordingCluster

pytestmark = pytest.mark.timeout(5)


@pytest.fixture
def sim() -> Iterator[RecordingCluster]:
    cluster = RecordingCluster(SchedulerConfig(fail_unsatisfiable=True))
    cluster.add_client("c1")
    yield cluster
    check_invariants(cluster.state)
    cluster.check_all_taken()


def pause(sim: RecordingCluster, worker: str, spilled: int = 0) -> None:
    sim.worker_says(worker, Heartbeat(0, 900, spilled, 1))


def resume(sim: RecordingCluster, worker: str) -> None:
    sim.worker_says(worker, Heartbeat(0, 500, 0, 0))


def why(sim: RecordingCluster, key: str) -> str:
    sim.client_says("c1", WhyRequest(1, [key]))
    return sim.got(WhyReply)[-1].reasons[key]


def test_a_paused_worker_gets_no_new_task_until_it_resumes(sim: RecordingCluster) -> None:
    paused = sim.add_worker("paused", nthreads=2)
    busy = sim.add_worker("busy", nthreads=1)
    pause(sim, paused)
    for key in ("a", "b", "c"):
        sim.submit(key)
    started = sim.place()
    assert {w for w, _ in started} == {busy}
    assert "paused for their memory (paused)" in why(sim, "c")
    resume(sim, paused)
    assert sim.state.placement_due  # resuming is news for the placement
    assert {w for w, _ in sim.place()} == {paused}


def test_a_task_only_a_paused_worker_can_run_waits_for_it(sim: RecordingCluster) -> None:
    gpu = sim.add_worker("gpu", nthreads=1, resources="GPU=1")
    sim.add_worker("cpu", nthreads=1)
    pause(sim, gpu)
    sim.submit("train", resources="GPU=1")
    assert sim.place() == []
    assert sim.state_of("train") == QUEUED  # not unsatisfiable: it waits
    assert "gpu: paused for its memory" in why(sim, "train")
    resume(sim, gpu)
    assert sim.place() == [(gpu, "train")]


def test_every_worker_paused_is_said_so(sim: RecordingCluster) -> None:
    only = sim.add_worker("only", nthreads=4)
    pause(sim, only)
    sim.submit("x")
    assert sim.place() == []
    assert why(sim, "x") == "queued: every worker is paused for its memory (only)"


def test_the_snapshot_shows_paused_and_spilled(sim: RecordingCluster) -> None:
    w = sim.add_worker("w")
    (info,) = views.snapshot(sim.state)["workers"].values()
    assert info["status"] == "running" and info["spilled_bytes"] == 0
    pause(sim, w, spilled=12345)
    (info,) = views.snapshot(sim.state)["workers"].values()
    assert info["status"] == "paused" and info["spilled_bytes"] == 12345
    assert info["memory"] == 900
    sim.worker_says(w, WorkerClosing("closed"))
    (info,) = views.snapshot(sim.state)["workers"].values()
    assert info["status"] == "closing"
