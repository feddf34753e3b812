"""Each share's figures in the status: held, dominant and fair share, quota, waiting
work and what a quota holds (``scheduler/share_status.py``); quotas of every
resource, threads included (``scheduler/shares.py``).

Pure: simulated workers, milliseconds each.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from apportion.core.resources import SCALE
from apportion.protocol.cluster import StatusReply, StatusRequest
from apportion.protocol.people import AddPerson, PersonAdded
from apportion.protocol.tasks import SubmitTasks, TaskSpec
from apportion.scheduler.events import ClientJoined
from apportion.scheduler.explain import explain
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import PROCESSING, QUEUED
from apportion.scheduler.share_status import share_rows
from apportion.scheduler.status import status
from apportion.testing import RecordingCluster
from apportion.testing.simulation import SimulatedCluster
from share_sims import cluster, queue

Make = Callable[..., RecordingCluster]


def by_share(sim: SimulatedCluster) -> dict[str, dict[str, object]]:
    return {row["share"]: row for row in share_rows(sim.state)}


def test_two_clients_hold_their_units_and_each_is_owed_half() -> None:
    sim = cluster("a", "b")
    sim.add_worker("w", nthreads=4, resources={"GPU": 4, "memory": "8GiB"})
    queue(sim, "a", 5, {"GPU": 1, "memory": "1GiB"})
    sim.place()  # a alone waits: it takes all four GPUs
    queue(sim, "b", 2, {"GPU": 1})
    rows = by_share(sim)
    assert rows["a"] == {
        "share": "a",
        "name": "a",
        "kind": "client",
        "weight": 1.0,
        "held": {"GPU": 4.0, "memory": 4 * 2**30, "threads": 4},
        "dominant": {"resource": "GPU", "fraction": 1.0},
        "fair": 0.5,
        "quota": None,
        "waiting": {"count": 1, "requests": [{"request": "GPU=1 memory=1 GiB", "count": 1}]},
        "quota_holds": None,
    }
    assert rows["b"]["held"] == {} and rows["b"]["fair"] == 0.5
    assert rows["b"]["dominant"] == {"resource": None, "fraction": 0.0}
    assert rows["b"]["waiting"] == {"count": 2, "requests": [{"request": "GPU=1", "count": 2}]}
    # The first freed GPU goes to b, which is furthest below its fair share.
    sim.finish("a-0")
    sim.place()
    assert sim.state.tasks["b-0"].state == PROCESSING
    rows = by_share(sim)
    assert rows["a"]["held"]["GPU"] == 3.0 and rows["b"]["held"] == {"GPU": 1.0, "threads": 1}
    assert rows["b"]["dominant"] == {"resource": "GPU", "fraction": 0.25}
    # The status carries the same rows; shares holding most come first.
    assert [row["share"] for row in status(sim.state)["shares"]] == ["a", "b"]


def test_fair_shares_follow_the_weights_of_the_active_shares_and_idle_ones_are_owed_theirs() -> (
    None
):
    sim = cluster("a", "b", "idle")
    sim.state.shares.set("a", weight=3)
    sim.add_worker("w", nthreads=2)
    queue(sim, "a", 3)
    queue(sim, "b", 3)
    rows = by_share(sim)
    assert (rows["a"]["fair"], rows["b"]["fair"]) == (0.75, 0.25)
    assert "idle" not in rows  # a client holding and waiting for nothing is not listed
    sim.state.shares.set("idle", weight=4)
    sim.state.people["idle"] = object()  # type: ignore[assignment]  # listed as a person is
    row = by_share(sim)["idle"]
    # What it would be owed if it asked now: its weight over the active ones' and its own.
    assert row["fair"] == 0.5 and row["kind"] == "person" and row["waiting"]["count"] == 0


def test_a_share_held_by_its_quota_says_which_cap_holds_how_many() -> None:
    sim = cluster("a", "b")
    sim.state.shares.set("a", quota={"GPU": 2 * SCALE})
    sim.add_worker("w", nthreads=8, resources={"GPU": 8})
    queue(sim, "a", 5, {"GPU": 1})
    queue(sim, "b", 1, {"GPU": 1})
    sim.place()
    row = by_share(sim)["a"]
    assert row["quota"] == {"GPU": 2.0} and row["held"] == {"GPU": 2.0, "threads": 2}
    assert row["waiting"]["count"] == 3
    assert row["quota_holds"] == {"count": 3, "resources": {"GPU": 2.0}}
    assert by_share(sim)["b"]["quota_holds"] is None


def test_a_request_with_an_alternative_under_the_quota_is_not_held_by_it() -> None:
    sim = cluster("a")
    sim.state.shares.set("a", quota={"GPU": SCALE})
    sim.add_worker("w", nthreads=1, resources={"GPU": 2, "cpus": 4})
    options = [{"GPU": SCALE}, {"cpus": SCALE}]
    specs = [TaskSpec(f"a-{i}", "f", b"", [], options[0], 0, 0, options) for i in range(3)]
    sim.client_says("a", SubmitTasks(specs, {"f": b"func"}, [s.key for s in specs]))
    sim.place()  # one thread: a-0 runs on a GPU, the others wait for the thread
    row = by_share(sim)["a"]
    assert row["waiting"]["count"] == 2 and row["quota_holds"] is None


def test_a_quota_of_threads_caps_the_share_s_plain_tasks_on_an_idle_cluster() -> None:
    sim = cluster("a", "b")
    sim.state.shares.set("a", quota={"threads": 2 * SCALE})
    sim.add_worker("w", nthreads=8)
    for client in ("a", "b"):
        for i in range(6):
            sim.measured(f"{client}-{i}", 1.0)  # long work: one per thread, none queued ahead
    a_keys = queue(sim, "a", 6)
    sim.place()
    assert [k for k in a_keys if sim.state.tasks[k].state == PROCESSING] == ["a-0", "a-1"]
    waiting = "a-2"
    assert sim.state.tasks[waiting].state == QUEUED
    text = explain(sim.state, waiting)
    assert "quota of threads: it holds threads=2 of threads=2" in text, text
    assert "asks for threads=1 more" in text
    # Another share takes the threads a's quota leaves.
    queue(sim, "b", 6)
    sim.place()
    assert sum(sim.state.tasks[f"b-{i}"].state == PROCESSING for i in range(6)) == 6
    row = by_share(sim)["a"]
    assert row["quota_holds"] == {"count": 4, "resources": {"threads": 2.0}}
    sim.finish("a-0", duration=1.0)
    sim.place()
    assert sum(sim.state.tasks[k].state == PROCESSING for k in a_keys) == 2
    check_invariants(sim.state)


def test_a_quota_of_threads_caps_resource_tasks_too() -> None:
    sim = cluster("a")
    sim.state.shares.set("a", quota={"threads": SCALE})
    sim.add_worker("w", nthreads=4, resources={"GPU": 4})
    keys = queue(sim, "a", 3, {"GPU": 1})
    assert len(sim.place()) == 1
    assert "quota of threads" in explain(sim.state, keys[1])
    check_invariants(sim.state)


@pytest.mark.parametrize("spec", ["licence=1", "memory=1GiB", "threads=1", "GPU=0.5"])
def test_a_person_s_quota_of_any_resource_caps_them(make_sim: Make, spec: str) -> None:
    sim = make_sim()
    sim.client_says("c1", AddPerson(1, "alice", 1.0, spec))
    sim.add_client("a1", person="alice")
    sim.add_worker("w1", nthreads=4, resources="GPU=4 licence=4 memory=8GiB")
    name = spec.split("=")[0]
    per_task = {"threads": None, "memory": "1GiB", "GPU": 0.5}.get(name, 1)
    for i in range(3):
        resources = None if per_task is None else {name: per_task}
        sim.submit(f"a-{i}", client="a1", resources=resources)
    started = sim.place()
    assert [key for _, key in started] == ["a-0"]
    (row,) = [r for r in share_rows(sim.state) if r["share"] == "alice"]
    assert row["kind"] == "person" and row["quota_holds"]["count"] == 2  # type: ignore[index]
    assert f"quota of {name}: it holds {name}=" in explain(sim.state, "a-1")


def test_a_person_sees_their_own_share_only_and_the_owner_sees_all(make_sim: Make) -> None:
    sim = make_sim()
    for name in ("alice", "bob"):
        sim.client_says("c1", AddPerson(1, name, 2.0 if name == "bob" else 1.0, ""))
    sim.add_client("a1", person="alice")
    sim.add_worker("w1", nthreads=2, resources="gpu=2")
    sim.submit("o-gpu", resources="gpu=1")
    sim.submit("a-gpu", client="a1", resources="gpu=1")
    sim.submit("a-more", client="a1", resources="gpu=1")
    sim.place()
    sim.client_says("a1", StatusRequest(1, 0, 0, 100))
    (hers,) = sim.got(StatusReply, "a1")
    (row,) = hers.status["shares"]
    assert row["share"] == "alice" and row["held"] == {"gpu": 1.0, "threads": 1}
    # Against every active share (hers and the owner's client's); bob is idle.
    assert row["fair"] == 0.5 and row["waiting"]["count"] == 1
    sim.client_says("c1", StatusRequest(2, 0, 0, 100))
    (full,) = sim.got(StatusReply, "c1")
    shares = {r["share"]: r for r in full.status["shares"]}
    assert set(shares) == {"alice", "bob", "c1"}
    assert shares["bob"]["fair"] == pytest.approx(0.5) and shares["c1"]["kind"] == "client"


@pytest.mark.parametrize(
    ("quota", "error"),
    [
        ("gpu=1", "invalid quota: no connected worker offers gpu: did you mean GPU (not gpu)?"),
        ("thread=2", "invalid quota: no connected worker offers thread: did you mean threads"),
        ("licence=1", ""),  # no worker offers it yet: one that does may join
        ("GPU=1 threads=2", ""),
    ],
)
def test_a_quota_naming_a_slip_of_an_offered_resource_is_refused(
    make_sim: Make, quota: str, error: str
) -> None:
    sim = make_sim()
    sim.add_worker("w1", nthreads=4, resources="GPU=4")
    sim.client_says("c1", AddPerson(1, "alice", 1.0, quota))
    if error:
        (reply,) = sim.got(PersonAdded, "c1")
        assert reply.error.startswith(error), reply.error
        assert "alice" not in sim.state.people and not sim.people_effects
    else:  # admitted: the service issues the credential and answers
        assert "alice" in sim.state.people and len(sim.people_effects) == 2


def test_a_client_s_share_is_named_by_the_name_it_gave_cut_and_printable() -> None:
    sim = SimulatedCluster()
    sim.handle(ClientJoined("peer-1", 0.0, name="notebook\x1b[2J" + "x" * 100))
    sim.handle(ClientJoined("peer-2", 0.0, durable=True, name="runs"))
    sim.add_worker("w", nthreads=2)
    queue(sim, "peer-1", 1)
    queue(sim, "peer-2", 1)
    rows = by_share(sim)
    assert rows["peer-1"]["name"] == "notebook?[2J" + "x" * 52
    assert (rows["peer-1"]["kind"], rows["peer-2"]["kind"]) == ("client", "service")
    assert rows["peer-2"]["name"] == "runs"


def test_a_person_with_a_quota_of_zero_gets_none_of_it(make_sim: Make) -> None:
    sim = make_sim()
    sim.client_says("c1", AddPerson(1, "alice", 1.0, "GPU=0"))
    sim.add_client("a1", person="alice")
    sim.add_worker("w1", nthreads=4, resources="GPU=4")
    sim.submit("a-gpu", client="a1", resources="GPU=1")
    sim.submit("a-plain", client="a1")
    assert [key for _, key in sim.place()] == ["a-plain"]
    (row,) = [r for r in share_rows(sim.state) if r["share"] == "alice"]
    assert row["quota"] == {"GPU": 0.0}
    assert row["quota_holds"] == {"count": 1, "resources": {"GPU": 0.0}}
