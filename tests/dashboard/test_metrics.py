"""``/metrics``: the cluster's status rendered in Prometheus's text format, read back
with Prometheus's own parser and checked against the state it came from."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from apportion.dashboard.metrics import MetricsInput, render_metrics
from apportion.protocol.people import AddPerson
from apportion.protocol.tasks import CancelKeys, KeysDone, KeysFailed, Notice, TaskErred
from apportion.protocol.worker import Heartbeat
from apportion.scheduler.records import DURATION_BUCKETS
from apportion.scheduler.state import SchedulerConfig
from apportion.scheduler.status import durations, status
from apportion.testing import RecordingCluster

INC = [f"inc-{i:032x}" for i in range(8)]
TRAIN = "train-" + "a" * 32

#: (sample name, sorted labels) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> tuple[Samples, dict[str, str]]:
    """Every sample by name and labels, and every family's type."""
    samples: Samples = {}
    types = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"{key} twice"
            samples[key] = s.value
    return samples, types


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _named(samples: Samples, name: str) -> Iterable[tuple[dict[str, str], float]]:
    return ((dict(labels), v) for (n, labels), v in samples.items() if n == name)


def _cluster() -> RecordingCluster:
    sim = RecordingCluster(SchedulerConfig())
    sim.add_client("c1")
    sim.allow(Notice, KeysDone, TaskErred, KeysFailed)
    a = sim.add_worker("a", nthreads=2, resources="gpu=[0,1] MEMORY=16GiB")
    sim.add_worker("b", nthreads=1)
    sim.worker_says(a, Heartbeat(0, 1 << 20, 0, 0, 37.5, 1000, 2000))
    sim.submit("load-" + "1" * 32)
    sim.submit(INC[0])
    sim.submit(INC[1])
    sim.place()
    for key, seconds in ((INC[0], 0.002), (INC[1], 7.0)):
        sim.finish(key, duration=seconds)
    sim.raise_("load-" + "1" * 32)
    sim.submit(TRAIN, resources="gpu=1 MEMORY=4GiB")
    for key in INC[2:]:
        sim.submit(key)
    sim.place()
    return sim


def _render(sim: RecordingCluster, runs: dict[str, int] | None = None) -> str:
    given = MetricsInput(status(sim.state), durations(sim.state), "0.1.0", 0.25, 1.5, runs)
    return render_metrics(given)


def test_the_metrics_match_the_state_they_were_rendered_from() -> None:
    sim = _cluster()
    now = status(sim.state)
    samples, types = _samples(_render(sim, {"queued": 3, "running": 1, "done": 7}))

    for group in now["groups"]:
        for state in now["tasks"]:
            assert (
                _get(samples, "apportion_tasks", state=state, group=group["name"]) == (group[state])
            )
        assert _get(samples, "apportion_tasks_done_total", group=group["name"]) == group["done"]
    assert _get(samples, "apportion_tasks_done_total", group="inc") == 2
    assert _get(samples, "apportion_tasks_failed_total", group="load") == 1
    for state, n in now["tasks"].items():
        assert _get(samples, "apportion_cluster_tasks", state=state) == n
    queued = sum(
        v for labels, v in _named(samples, "apportion_tasks") if labels["state"] == "queued"
    )
    assert queued == now["tasks"]["queued"] > 0

    assert _get(samples, "apportion_resource_total", worker="a", pool="gpu") == 2
    assert _get(samples, "apportion_resource_used", worker="a", pool="gpu") == 1
    assert _get(samples, "apportion_resource_units_busy", worker="a", pool="gpu") == 1
    assert _get(samples, "apportion_resource_used", worker="a", pool="MEMORY") == 4 * 2**30
    assert _get(samples, "apportion_worker_threads", worker="a") == 2
    assert _get(samples, "apportion_worker_memory_bytes", worker="a") == 1 << 20
    assert _get(samples, "apportion_worker_cpu_percent", worker="a") == 37.5
    assert _get(samples, "apportion_workers", status="running") == 2
    assert _get(samples, "apportion_transfer_received_bytes_total") == 1000
    assert _get(samples, "apportion_transfer_sent_bytes_total") == 2000
    assert _get(samples, "apportion_worker_sent_bytes_total", worker="a") == 2000

    assert _get(samples, "apportion_event_loop_lag_seconds") == 0.25
    assert _get(samples, "apportion_event_loop_lag_max_seconds") == 1.5
    assert _get(samples, "apportion_runs", state="done") == 7
    assert _get(samples, "apportion_clients") == 1
    assert _get(samples, "apportion_scheduler_info", address="", version="0.1.0") == 1
    assert types["apportion_task_duration_seconds"] == "histogram"
    assert types["apportion_tasks_done"] == "counter"


def test_the_duration_histograms_add_up_and_their_buckets_only_grow() -> None:
    sim = _cluster()
    samples, _ = _samples(_render(sim))
    name = "apportion_task_duration_seconds"
    assert _get(samples, f"{name}_count", group="inc") == 2
    assert _get(samples, f"{name}_sum", group="inc") == 7.002
    assert _get(samples, f"{name}_count", group="load") == 1
    buckets = sorted(
        (float(labels["le"]), v)
        for labels, v in _named(samples, f"{name}_bucket")
        if labels["group"] == "inc"
    )
    assert [le for le, _ in buckets] == [*DURATION_BUCKETS, float("inf")]
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and counts[-1] == 2
    assert dict(buckets)[0.005] == 1 and dict(buckets)[5.0] == 1 and dict(buckets)[10.0] == 2
    every = durations(sim.state)["all"]
    assert sum(v for _, v in _named(samples, f"{name}_count")) == every["count"] == 3


def test_label_values_are_escaped_and_runs_are_left_out_without_a_queue() -> None:
    sim = RecordingCluster(SchedulerConfig())
    sim.add_client("c1")
    sim.allow(Notice, KeysDone)
    awkward = 'we"ird\\name\nx'
    sim.add_worker(awkward)
    key = 'odd"\\group\nkey'
    sim.submit(key)
    sim.place()
    sim.finish(key)
    text = _render(sim)
    samples, types = _samples(text)
    assert _get(samples, "apportion_worker_threads", worker=awkward) == 1
    (group,) = [g["name"] for g in status(sim.state)["groups"]]
    assert group == key  # a key without a token to strip is its own group
    assert _get(samples, "apportion_tasks_done_total", group=group) == 1
    assert _get(samples, "apportion_task_duration_seconds_count", group=group) == 1
    assert "apportion_runs" not in types
    assert text.count("\n") == len(text.splitlines())  # no raw newline inside a label


def test_cancelled_tasks_have_a_counter_of_their_own() -> None:
    sim = _cluster()
    sim.submit("drop-" + "2" * 32, resources="gpu=2")  # waits: one of the two GPUs is held
    sim.place()
    sim.client_says("c1", CancelKeys(["drop-" + "2" * 32]))
    samples, types = _samples(_render(sim))
    assert types["apportion_tasks_cancelled"] == "counter"
    assert _get(samples, "apportion_tasks_cancelled_total", group="drop") == 1
    assert _get(samples, "apportion_tasks_failed_total", group="drop") == 0
    assert _get(samples, "apportion_tasks_cancelled_total", group="load") == 0


def test_each_share_s_figures_are_gauges_labelled_by_share() -> None:
    sim = RecordingCluster(SchedulerConfig())
    sim.add_client("c1")
    sim.client_says("c1", AddPerson(1, "alice", 3.0, "gpu=1 threads=2"))
    sim.add_client("a1", person="alice")
    sim.add_worker("a", nthreads=4, resources="gpu=[0,1] MEMORY=16GiB")
    for i in range(3):
        sim.submit(f"a-{i}", client="a1", resources="gpu=1 MEMORY=1GiB")
    sim.submit("o-0", resources="gpu=1")
    sim.submit("o-1", resources="gpu=1")
    sim.place()
    rows = {row["share"]: row for row in status(sim.state)["shares"]}
    samples, types = _samples(_render(sim))
    info = {labels["share"]: labels for labels, _ in _named(samples, "apportion_share_info")}
    assert info["alice"] == {"share": "alice", "name": "alice", "kind": "person"}
    assert info["c1"] == {"share": "c1", "name": "c1", "kind": "client"}
    assert _get(samples, "apportion_share_held", share="alice", resource="gpu") == 1
    assert _get(samples, "apportion_share_held", share="alice", resource="MEMORY") == 2**30
    assert _get(samples, "apportion_share_held", share="alice", resource="threads") == 1
    assert _get(samples, "apportion_share_held", share="c1", resource="gpu") == 1
    assert _get(samples, "apportion_share_dominant_ratio", share="alice") == 0.5
    assert _get(samples, "apportion_share_fair_ratio", share="alice") == 0.75
    assert _get(samples, "apportion_share_fair_ratio", share="c1") == 0.25
    assert _get(samples, "apportion_share_weight", share="alice") == 3
    assert _get(samples, "apportion_share_quota", share="alice", resource="gpu") == 1
    assert _get(samples, "apportion_share_quota", share="alice", resource="threads") == 2
    assert not [
        labels for labels, _ in _named(samples, "apportion_share_quota") if labels["share"] == "c1"
    ]
    assert _get(samples, "apportion_share_waiting_tasks", share="alice") == 2
    assert _get(samples, "apportion_share_waiting_tasks", share="c1") == 1
    assert _get(samples, "apportion_share_quota_held_tasks", share="alice") == 2
    assert _get(samples, "apportion_share_quota_held_tasks", share="c1") == 0
    assert rows["alice"]["waiting"]["count"] == 2
    assert types["apportion_share_held"] == "gauge"
