"""The cluster's status as the views read it: counts kept as tasks move, pools with
their holders, the waiting requests and why, the task stream and the warnings."""

from __future__ import annotations

from apportion.protocol.cluster import RestartReply, RestartRequest, StatusReply, StatusRequest
from apportion.protocol.tasks import (
    CancelKeys,
    KeysDone,
    KeysFailed,
    KeysPending,
    Notice,
    ReleaseKeys,
    TaskErred,
)
from apportion.protocol.worker import Heartbeat
from apportion.scheduler.events import Tick
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import Histogram
from apportion.scheduler.state import SchedulerConfig
from apportion.scheduler.status import status
from apportion.scheduler.telemetry import FINISHED_GROUPS, STREAM_SIZE
from apportion.testing import RecordingCluster, SimulatedCluster


def _cluster() -> RecordingCluster:
    sim = RecordingCluster(SchedulerConfig())
    sim.add_client("c1")
    sim.allow(Notice, KeysDone, TaskErred, KeysFailed)
    return sim


def test_groups_count_live_records_by_state_and_what_they_did() -> None:
    sim = _cluster()
    sim.add_worker("a", nthreads=3)
    for i in range(3):
        sim.submit(f"inc-{i:032x}")
    sim.submit("('sum-aggregate-9c1d2e3f4a5b6c7d', 0)", deps=["inc-" + "0" * 32])
    sim.place()
    groups = {g["name"]: g for g in status(sim.state)["groups"]}
    inc = groups["inc"]
    assert inc["processing"] >= 2 and inc["processing"] + inc["queued"] == 3
    assert groups["sum-aggregate"]["waiting"] == 1
    sim.finish("inc-" + "0" * 32)
    sim.place()
    groups = {g["name"]: g for g in status(sim.state)["groups"]}
    assert groups["inc"]["memory"] == 1 and groups["inc"]["done"] == 1
    assert groups["sum-aggregate"]["processing"] == 1
    check_invariants(sim.state)


def test_a_group_whose_tasks_are_all_forgotten_is_kept_with_its_totals() -> None:
    sim = _cluster()
    sim.add_worker("a")
    sim.submit("load-" + "1" * 32)
    sim.place()
    sim.raise_("load-" + "1" * 32)
    sim.client_says("c1", ReleaseKeys(["load-" + "1" * 32]))
    assert "load" not in sim.state.telemetry.groups
    (load,) = [g for g in status(sim.state)["groups"] if g["name"] == "load"]
    assert load["failed"] == 1 and load["erred"] == 0
    check_invariants(sim.state)


def test_finished_groups_are_bounded() -> None:
    sim = _cluster()
    sim.add_worker("a")
    for i in range(FINISHED_GROUPS + 20):
        key = f"g{i}"  # every key a group of its own: the worst case
        sim.submit(key)
        sim.place()
        sim.finish(key)
        sim.client_says("c1", ReleaseKeys([key]))
    telemetry = sim.state.telemetry
    assert not telemetry.groups
    assert len(telemetry.finished_groups) == FINISHED_GROUPS
    assert "g0" not in telemetry.finished_groups and f"g{FINISHED_GROUPS + 19}" in (
        telemetry.finished_groups
    )


def test_pools_show_each_unit_and_the_task_holding_it() -> None:
    sim = _cluster()
    sim.add_worker("gpus", nthreads=4, resources="gpu=[0,1,2,3] MEMORY=16GiB")
    sim.submit("train-" + "a" * 32, resources="gpu=2 MEMORY=4GiB")
    sim.place()
    (worker,) = status(sim.state)["workers"]
    pools = {p["name"]: p for p in worker["pools"]}
    gpu, memory = pools["gpu"], pools["MEMORY"]
    assert (gpu["used"], gpu["total"]) == (2, 4)
    busy = [u for u in gpu["units"] if u["used"]]
    assert [u["holders"] for u in busy] == [["train-" + "a" * 32]] * 2
    assert all(not u["holders"] for u in gpu["units"] if not u["used"])
    assert memory["units"] is None and memory["bytes"]
    assert memory["holders"] == ["train-" + "a" * 32]
    assert memory["used"] == 4 * 2**30
    assert worker["tasks"][0]["key"] == "train-" + "a" * 32
    assert "gpu=[" in worker["tasks"][0]["holding"]
    sim.finish("train-" + "a" * 32)
    (worker,) = status(sim.state)["workers"]
    assert all(not u["used"] and not u["holders"] for u in worker["pools"][1]["units"])


def test_pending_lists_each_kind_once_with_its_oldest_task_and_why() -> None:
    sim = _cluster()
    sim.add_worker("small", nthreads=2, resources="gpu=[0]")
    sim.submit("a", resources="gpu=1")
    for i in range(5):
        sim.submit(f"b{i}", resources="gpu=1")
    sim.submit("huge", resources="gpu=4")
    sim.place()
    pending = status(sim.state)["pending"]
    by_request = {p["request"]: p for p in pending}
    one = by_request["gpu=1"]
    assert one["count"] == 5 and one["oldest"] == "b0" and not one["unsatisfiable"]
    assert "queued: needs gpu=1" in one["why"] and "gpu 0 of 1 free" in one["why"]
    four = by_request["gpu=4"]
    assert four["unsatisfiable"] and four["count"] == 1
    assert "no connected worker can ever provide" in four["why"]
    assert [p["oldest"] for p in pending] == ["b0", "huge"]  # oldest kind first


def test_pending_costs_nothing_per_queued_task_but_counts_exactly() -> None:
    sim = _cluster()
    sim.add_worker("a")
    for i in range(2_000):
        sim.submit(f"x-{i}")
    sim.place()
    now = status(sim.state)
    (plain,) = now["pending"]
    assert plain["count"] == 2_000 - now["tasks"]["processing"] and plain["request"] == "a thread"
    assert "all 1 threads on 1 workers are busy" in plain["why"]


def test_the_task_stream_gives_what_came_after_the_last_number_seen() -> None:
    sim = _cluster()
    sim.add_worker("a", nthreads=2)
    sim.submit("inc-1")
    sim.submit("inc-2")
    sim.place()
    sim.now = 10.0
    sim.finish("inc-1", duration=2.0, thread=1)
    first = status(sim.state)["stream"]
    assert first["seq"] == 1
    (item,) = first["items"]
    assert item == [1, "sim://w1", 1, "inc-1", "inc", 8.0, 10.0, True, {}]
    sim.raise_("inc-2")
    later = status(sim.state, stream_since=first["seq"])["stream"]
    assert [i[3] for i in later["items"]] == ["inc-2"] and later["items"][0][7] is False
    assert status(sim.state, stream_since=later["seq"])["stream"]["items"] == []


def test_the_task_stream_keeps_the_last_executions_only() -> None:
    telemetry = _cluster().state.telemetry
    assert telemetry.stream_since(0, 10) == []
    sim = _cluster()
    sim.add_worker("a")
    for i in range(30):
        sim.submit(f"t-{i}")
        sim.place()
        sim.finish(f"t-{i}")
    items = sim.state.telemetry.stream_since(0, 10)
    assert [e.key for e in items] == [f"t-{i}" for i in range(20, 30)]
    assert [e.key for e in sim.state.telemetry.stream_since(27, 10)] == ["t-27", "t-28", "t-29"]
    assert sim.state.telemetry.stream.maxlen == STREAM_SIZE


def test_warnings_are_events_lost_workers_and_unsatisfiable_requests_among_them() -> None:
    sim = _cluster()
    worker = sim.add_worker("a", resources="gpu=1")
    sim.submit("big", resources="gpu=2")
    sim.place()
    sim.remove_worker(worker)
    events = status(sim.state)["events"]
    texts = [e[3] for e in events["items"]]
    assert any("needs gpu=2" in t for t in texts)
    assert any("lost worker a" in t for t in texts)
    assert status(sim.state, events_since=events["seq"])["events"]["items"] == []


def test_workers_report_cpu_memory_and_bytes_moved_and_totals_survive_them() -> None:
    sim = _cluster()
    a = sim.add_worker("a")
    sim.worker_says(a, Heartbeat(0, 1 << 20, 0, 0, 37.5, 1000, 2000))
    (worker,) = status(sim.state)["workers"]
    assert (worker["cpu"], worker["memory"], worker["received"], worker["sent"]) == (
        37.5,
        1 << 20,
        1000,
        2000,
    )
    sim.remove_worker(a)
    assert status(sim.state)["transfers"] == {"received": 1000, "sent": 2000}


def test_a_restart_forgets_the_counts_with_the_tasks() -> None:
    sim = _cluster()
    sim.allow(RestartReply, KeysPending)
    sim.add_worker("a")
    for i in range(3):
        sim.submit(f"x-{i}")
    sim.place()
    sim.client_says("c1", RestartRequest(1, ""))
    sim.handle(Tick(sim.now))
    assert all(
        g["waiting"] + g["queued"] + g["processing"] == 0 for g in status(sim.state)["groups"]
    )
    check_invariants(sim.state)


def test_the_duration_histogram_counts_each_observation_in_its_bucket() -> None:
    histogram = Histogram()
    for value in (0.0002, 0.003, 0.003, 7.0, 1e6):
        histogram.observe(value)
    cumulative = histogram.cumulative()
    assert cumulative[0] == 1 and cumulative[2] == 3 and cumulative[-1] == 5
    assert cumulative == sorted(cumulative)
    assert histogram.count == 5 and histogram.sum == 0.0002 + 0.006 + 7.0 + 1e6


def test_a_poison_task_is_an_event_naming_the_workers_it_killed() -> None:
    sim = SimulatedCluster(SchedulerConfig(max_worker_deaths=2))
    sim.add_client("c1")
    sim.submit("crash")
    for name in ("w-a", "w-b"):
        worker = sim.add_worker(name)
        sim.place()
        sim.remove_worker(worker)
    texts = [e[3] for e in status(sim.state)["events"]["items"]]
    assert any("'crash' was running on 2 workers that died" in t for t in texts)
    assert sum("lost worker" in t for t in texts) == 2
    check_invariants(sim.state)


def test_cancelled_tasks_are_counted_apart_from_failed_ones() -> None:
    sim = _cluster()
    sim.add_worker("a", resources="slot=1")  # "job-1" runs, the others queue
    for i in range(1, 4):
        sim.submit(f"job-{i}", resources="slot=1")
    sim.submit("after-1", deps=["job-2"])  # fails along with the input it waits for
    sim.place()
    sim.client_says("c1", CancelKeys(["job-1", "job-2"]))  # one running, one queued
    sim.finish("job-1")  # its worker reports it: settled only now
    sim.place()
    sim.raise_("job-3")
    groups = {g["name"]: g for g in status(sim.state)["groups"]}
    assert (groups["job"]["cancelled"], groups["job"]["failed"]) == (2, 1)
    assert (groups["after"]["cancelled"], groups["after"]["failed"]) == (1, 0)
    check_invariants(sim.state)


def test_clients_are_the_users_not_the_asker_nor_the_job_queue() -> None:
    sim = _cluster()  # c1: a user's client
    sim.add_client("queue", durable=True)  # the job queue's, a service
    sim.add_client("status-cli")
    sim.allow(StatusReply)
    assert status(sim.state)["clients"] == 2  # the dashboard asks as nobody
    sim.client_says("status-cli", StatusRequest(1, 0, 0, 0))
    (reply,) = sim.got(StatusReply, "status-cli")
    assert reply.status["clients"] == 1
