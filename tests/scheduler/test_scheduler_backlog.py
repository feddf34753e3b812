"""The waiting work by kind of request, as a cluster that grows reads it."""

from __future__ import annotations

from apportion.core.resources import SCALE
from apportion.protocol.tasks import Notice
from apportion.scheduler.backlog import backlog
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import RecordingCluster


def test_waiting_work_is_counted_once_per_kind_of_request() -> None:
    sim = RecordingCluster(SchedulerConfig())
    sim.add_client("c1")
    sim.allow(Notice)  # GPU work no worker can hold is warned about
    busy = sim.add_worker("cpu-1", nthreads=1, resources="cpus=1")
    for i in range(3):
        sim.submit(f"plain-{i}")
    for i in range(2):
        sim.submit(f"gpu-{i}", resources="gpu=1")
    sim.submit("half", resources={"gpu": 0.5, "cpus": 1})
    sim.place()
    queued, workers = backlog(sim.state)
    by_options = {tuple(tuple(sorted(o.items())) for o in q["options"]): q for q in queued}
    assert by_options[((),)]["count"] == 2  # one of the three plain tasks runs
    assert by_options[((("gpu", SCALE),),)]["count"] == 2
    assert by_options[((("cpus", SCALE), ("gpu", SCALE // 2)),)]["count"] == 1
    assert not any(q["restricted"] for q in queued)
    assert workers == [
        {"name": "cpu-1", "address": f"sim://{busy}", "running": 1, "leaving": False}
    ]
    sim.finish(sim.all_running().pop())
    sim.place()
    queued, workers = backlog(sim.state)
    assert {q["count"] for q in queued if q["options"] == [{}]} == {1}
