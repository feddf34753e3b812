"""People the owner admits, in the pure scheduler: the registry, and who may see what."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from apportion.core.people import Person
from apportion.core.resources import SCALE
from apportion.protocol.cluster import (
    ClusterFactsReply,
    ClusterFactsRequest,
    RestartRequest,
    StatusReply,
    StatusRequest,
)
from apportion.protocol.codec import encode_message
from apportion.protocol.coordination import CoordinationReply, LeaseRequest
from apportion.protocol.people import (
    AddPerson,
    ListPeople,
    NotPermitted,
    PeopleListed,
    PersonAdded,
    PersonRemoved,
    RemovePerson,
)
from apportion.protocol.services import ForwardedRequest, RegisterService
from apportion.protocol.shared_data import (
    DatasetReply,
    DatasetRequest,
    PublishDataset,
    SharedDataAck,
    UnpublishDataset,
)
from apportion.protocol.tasks import (
    CancelKeys,
    GatherRequest,
    KeysDone,
    KeysFailed,
    SubmitTasks,
    TaskErred,
    TaskSpec,
    WhoHasReply,
    WhoHasRequest,
)
from apportion.protocol.worker import FreeKeys
from apportion.runs.messages import CancelPersonRuns, QueryRuns
from apportion.scheduler import people_gate
from apportion.scheduler.events import IssueCredential, SavePeople
from apportion.scheduler.explain import explain
from apportion.scheduler.records import ERRED, PROCESSING
from apportion.testing import RecordingCluster

Make = Callable[..., RecordingCluster]


def _admitted(sim: RecordingCluster, name: str = "alice", **extra: object) -> None:
    """The owner's client c1 admits ``name``."""
    weight = float(extra.get("weight", 1.0))  # type: ignore[arg-type]
    sim.client_says("c1", AddPerson(1, name, weight, str(extra.get("quota", ""))))


def test_the_owner_admits_a_person_who_is_kept_and_issued_a_credential(make_sim: Make) -> None:
    sim = make_sim()
    _admitted(sim, "alice", weight=2.0, quota="gpu=2")
    assert sim.state.people == {"alice": Person("alice", 2.0, {"gpu": 2 * SCALE})}
    issued, saved = sim.people_effects
    assert issued == IssueCredential("c1", 1, "alice")  # the service makes the secret
    assert saved == SavePeople((Person("alice", 2.0, {"gpu": 2 * SCALE}),))
    sim.add_client("a1", person="alice")
    sim.client_says("c1", ListPeople(2))
    (listed,) = sim.got(PeopleListed)
    assert listed.people == [{"name": "alice", "weight": 2.0, "quota": "gpu=2", "clients": 1}]


@pytest.mark.parametrize(
    ("name", "weight", "quota", "said"),
    [
        ("alice", 1.0, "", "alice is already admitted"),
        ("Alice", 1.0, "", "invalid person name 'Alice'"),
        ("bob", 0.0, "", "invalid weight 0.0"),
        ("bob", 1.0, "gpu=lots", "invalid quota 'gpu=lots'"),
    ],
)
def test_a_bad_admission_is_refused_in_one_line(
    make_sim: Make, name: str, weight: float, quota: str, said: str
) -> None:
    sim = make_sim()
    _admitted(sim, "alice")
    sim.people_effects.clear()
    sim.client_says("c1", AddPerson(2, name, weight, quota))
    (refused,) = sim.got(PersonAdded)
    assert said in refused.error and "\n" not in refused.error and not refused.token
    assert list(sim.state.people) == ["alice"] and not sim.people_effects


@pytest.mark.parametrize(
    "request_",
    [
        AddPerson(5, "mallory", 1.0, ""),
        RemovePerson(5, "alice"),
        ListPeople(5),
        RestartRequest(5, "because"),
        RegisterService(["SubmitRuns"], "run-"),
    ],
)
def test_a_person_may_not_do_what_only_the_owner_may(make_sim: Make, request_: object) -> None:
    sim = make_sim()
    _admitted(sim)
    sim.add_client("a1", person="alice")
    sim.client_says("a1", request_)  # type: ignore[arg-type]
    refusals = sim.got(NotPermitted, "a1")
    if hasattr(request_, "request_id"):
        (refusal,) = refusals
        assert refusal.reason == f"only the cluster's owner may send {type(request_).__name__}"
    else:  # no request to answer: dropped, said in the log
        assert not refusals and "only the cluster's owner" in sim.logs[-1].text
    assert list(sim.state.people) == ["alice"] and sim.state.services.requests == {}


def _two_people(make_sim: Make) -> RecordingCluster:
    """Owner's client c1 with task ``o``, alice's client a1 with task ``a``, both done."""
    sim = make_sim()
    sim.allow(TaskErred)
    _admitted(sim)
    sim.add_client("a1", person="alice")
    sim.add_worker("w1", nthreads=2)
    sim.submit("o")
    sim.submit("a", client="a1")
    sim.place()
    sim.finish("o")
    sim.finish("a")
    assert sim.done("c1") == ["o"] and sim.done("a1") == ["a"]
    return sim


def test_tasks_belong_to_whom_submitted_them(make_sim: Make) -> None:
    sim = _two_people(make_sim)
    assert sim.state.tasks["o"].person == "" and sim.state.tasks["a"].person == "alice"
    assert sim.state.clients["a1"].person == "alice"


def test_a_person_is_refused_another_s_results_and_where_they_are(make_sim: Make) -> None:
    sim = _two_people(make_sim)
    sim.client_says("a1", WhoHasRequest(7, ["a", "o"]), GatherRequest(8, ["o"]))
    refusals = sim.got(NotPermitted, "a1")
    assert [r.request_id for r in refusals] == [7, 8]
    assert refusals[0].reason == "alice may not use another person's tasks: 'o'"
    sim.client_says("a1", WhoHasRequest(9, ["a"]))
    (own,) = sim.got(WhoHasReply, "a1")
    assert list(own.who_has) == ["a"]
    sim.client_says("c1", WhoHasRequest(10, ["a", "o"]))  # the owner sees all
    (everything,) = sim.got(WhoHasReply, "c1")
    assert set(everything.who_has) == {"a", "o"}


def test_a_person_s_gathers_are_relayed_never_sent_to_a_worker_s_port(make_sim: Make) -> None:
    sim = _two_people(make_sim)
    client = sim.state.clients["a1"]
    (kept,) = people_gate.admit(sim.state, client, [GatherRequest(3, ["a"], 1 << 20)])
    assert isinstance(kept, GatherRequest) and kept.direct_from == people_gate.RELAY_ALL


def test_a_person_cannot_take_another_s_key_or_input(make_sim: Make) -> None:
    sim = _two_people(make_sim)
    spec = TaskSpec("o", "f", b"", [], {}, 0, 0)
    uses = TaskSpec("mine", "f", b"", ["o"], {}, 0, 0)
    sim.client_says("a1", SubmitTasks([spec], {"f": b"func"}, ["o"]))
    sim.client_says("a1", SubmitTasks([uses], {"f": b"func"}, ["mine"]))
    first, second = sim.got(KeysFailed, "a1")
    assert first.keys == ["o"] and second.keys == ["mine"]
    assert second.message == "alice may not use another person's tasks: 'o'"
    assert "mine" not in sim.state.tasks and "a1" not in (sim.state.tasks["o"].wanted_by or ())


def test_a_person_cancels_only_their_own(make_sim: Make) -> None:
    sim = make_sim()
    sim.allow(TaskErred, KeysFailed)
    _admitted(sim)
    sim.add_client("a1", person="alice")
    sim.submit("o")  # no worker: both wait
    sim.submit("a", client="a1")
    sim.client_says("a1", CancelKeys(["o", "a"]))
    assert sim.state.tasks["o"].state != ERRED
    assert sim.state.tasks["a"].state == ERRED


def test_a_person_s_view_of_who_holds_what_shows_their_own_keys(make_sim: Make) -> None:
    sim = _two_people(make_sim)
    sim.client_says("a1", ClusterFactsRequest(4))
    (facts,) = sim.got(ClusterFactsReply, "a1")
    assert list(facts.who_has) == ["a"] and list(facts.has_what.values()) == [["a"]]


def test_the_job_queue_hears_who_asks_and_a_person_cannot_cancel_everyone_s_runs(
    make_sim: Make,
) -> None:
    sim = make_sim()
    _admitted(sim)
    sim.add_client("queue", durable=True)
    sim.client_says("queue", RegisterService(["QueryRuns", "CancelPersonRuns"], "run-"))
    sim.add_client("a1", person="alice")
    sim.client_says("a1", QueryRuns(1, []), CancelPersonRuns(2, "bob"))
    (forwarded,) = sim.got(ForwardedRequest, "queue")
    assert forwarded.person == "alice"
    assert forwarded.request == encode_message(QueryRuns(1, []))
    (refused,) = sim.got(NotPermitted, "a1")
    assert refused.reason == "only the cluster's owner may send CancelPersonRuns"


def test_removing_a_person_disconnects_them_and_cancels_their_work_only(make_sim: Make) -> None:
    sim = make_sim()
    sim.allow(TaskErred, KeysFailed)
    _admitted(sim)
    sim.add_client("a1", person="alice")
    sim.add_client("a2", person="alice")
    sim.add_worker("w1", nthreads=1)
    sim.submit("a-running", client="a1")
    sim.place()
    sim.submit("a-queued", client="a2")
    sim.submit("o-queued")
    sim.people_effects.clear()
    sim.client_says("c1", RemovePerson(4, "alice"))
    (removed,) = sim.got(PersonRemoved)
    assert (removed.error, removed.disconnected, removed.cancelled) == ("", 2, 2)
    assert sorted(sim.disconnected) == ["a1", "a2"]
    assert set(sim.state.clients) == {"c1"} and sim.state.people == {}
    assert sim.people_effects == [SavePeople(())]  # the service forgets their secret
    # Their queued task is gone; the running one is cancelled where it runs, its
    # resources given back when its worker reports; the owner's work is untouched.
    assert "a-queued" not in sim.state.tasks
    running = sim.state.tasks.get("a-running")
    assert running is None or (running.state == PROCESSING and running.cancelled)
    assert sim.state.tasks["o-queued"].state not in (ERRED,)
    sim.finish("a-running")
    assert sim.freed("w1") == ["a-running"]
    sim.place()
    assert sim.state.tasks["o-queued"].state == PROCESSING
    sim.client_says("c1", RemovePerson(5, "alice"))
    again = sim.got(PersonRemoved)[-1]
    assert again.error == "nobody named 'alice' is admitted (`apportion user list` shows who is)"


def test_a_person_s_status_shows_their_own_work_and_everyone_s_totals(make_sim: Make) -> None:
    sim = make_sim()
    sim.allow(TaskErred)
    _admitted(sim)
    sim.add_client("a1", person="alice")
    sim.add_worker("w1", nthreads=1, resources="gpu=1")
    sim.submit("o-gpu", resources="gpu=1")
    sim.submit("o-next", resources="gpu=1")
    sim.submit("a-gpu", client="a1", resources="gpu=1")
    sim.place()
    sim.client_says("a1", StatusRequest(1, 0, 0, 100))
    (reply,) = sim.got(StatusReply, "a1")
    seen = reply.status
    assert seen["tasks"]["queued"] == 1 and seen["tasks"]["processing"] == 0
    assert [g["name"] for g in seen["groups"]] == ["a-gpu"]
    (worker,) = seen["workers"]
    assert worker["tasks"] == [] and worker["pools"][0]["used"] == 1.0  # busy, not with what
    # Waiting work by kind and share: the owner's only counted, hers in full (her
    # share holds nothing, so her task holds the reservation: the next freed GPU).
    owners, hers = seen["pending"]
    assert owners["count"] == 1 and owners["oldest"] == "(another person's)"
    assert owners["why"] == ""
    assert hers["count"] == 1 and hers["oldest"] == "a-gpu" and "reservation" in hers["why"]
    sim.client_says("c1", StatusRequest(2, 0, 0, 100))
    (full,) = sim.got(StatusReply, "c1")
    assert full.status["workers"][0]["tasks"][0]["key"] == "o-gpu"
    assert full.status["pending"][0]["oldest"] == "o-next"


def test_the_owner_s_service_submits_a_person_s_run_as_theirs_a_person_cannot(
    make_sim: Make,
) -> None:
    sim = make_sim()
    _admitted(sim)
    sim.add_client("queue", durable=True)
    sim.add_client("a1", person="alice")
    run = TaskSpec("run-1", "f", b"", [], {}, 0, 0, person="alice")
    sim.client_says("queue", SubmitTasks([run], {"f": b"func"}, ["run-1"]))
    forged = TaskSpec("a-1", "f", b"", [], {}, 0, 0, person="bob")
    sim.client_says("a1", SubmitTasks([forged], {"f": b"func"}, ["a-1"]))
    assert sim.state.tasks["run-1"].person == "alice"
    assert sim.state.tasks["a-1"].person == "alice"  # a person's tasks are always theirs


def test_a_person_is_one_share_with_their_weight_and_quota_runs_included(
    make_sim: Make,
) -> None:
    """All of a person's clients and runs are one share in the fair division, held to
    their quota; the owner's clients stay shares of their own."""
    sim = make_sim()
    _admitted(sim, weight=3.0, quota="gpu=1")
    sim.add_client("a1", person="alice")
    sim.add_client("a2", person="alice")
    sim.add_client("queue", durable=True)
    sim.add_worker("w1", nthreads=4, resources="gpu=4")
    assert sim.state.shares.weight("alice") == 3.0
    assert sim.state.shares.quota("alice") == {"gpu": SCALE}
    sim.submit("a1-gpu", client="a1", resources="gpu=1")
    sim.submit("a2-gpu", client="a2", resources="gpu=1")
    run = TaskSpec("run-1", "f", b"", [], {"gpu": SCALE}, 0, 0, person="alice")
    sim.client_says("queue", SubmitTasks([run], {"f": b"func"}, ["run-1"]))
    sim.submit("o-gpu", resources="gpu=1")
    sim.place()
    states = {key: sim.state.tasks[key].state for key in ("a1-gpu", "a2-gpu", "run-1", "o-gpu")}
    # One GPU for her whole share, though three are free; the owner's task runs.
    assert sorted(states.values()) == [PROCESSING, PROCESSING, "queued", "queued"]
    assert states["o-gpu"] == PROCESSING
    waiting = next(k for k in ("a2-gpu", "run-1", "a1-gpu") if states[k] == "queued")
    assert "its share 'alice' is at its quota" in explain(sim.state, waiting)
    sim.client_says("c1", RemovePerson(2, "alice"))
    (removed,) = sim.got(PersonRemoved)
    assert removed.cancelled == 3 and removed.disconnected == 2
    sim.got(KeysFailed, "queue")  # her run: no job queue here to cancel it
    sim.got(FreeKeys, "w1")
    assert sim.state.shares.weight("alice") == 1.0 and sim.state.shares.quota("alice") is None


def test_removing_a_person_leaves_their_runs_tasks_to_the_job_queue(make_sim: Make) -> None:
    sim = make_sim()
    _admitted(sim)
    sim.add_client("queue", durable=True)
    sim.client_says("queue", RegisterService(["CancelPersonRuns"], "run-"))
    run = TaskSpec("run-1", "f", b"", [], {}, 0, 0, person="alice")
    sim.client_says("queue", SubmitTasks([run], {"f": b"func"}, ["run-1"]))
    sim.client_says("c1", RemovePerson(2, "alice"))
    (removed,) = sim.got(PersonRemoved)
    assert removed.cancelled == 0 and not sim.state.tasks["run-1"].cancelled


def test_a_person_sees_and_unpublishes_only_their_own_datasets(make_sim: Make) -> None:
    sim = _two_people(make_sim)
    sim.allow(KeysDone)  # to the datasets' holders
    sim.client_says("c1", PublishDataset(1, "owners", b"d", ["o"], 0))
    sim.client_says("a1", PublishDataset(2, "hers", b"d", ["a"], 0))
    sim.client_says("a1", PublishDataset(3, "stolen", b"d", ["o"], 0))
    sim.client_says("a1", PublishDataset(4, "owners", b"d", ["a"], 1))
    acks = sim.got(SharedDataAck, "a1")
    assert [a.error for a in acks] == [
        "",
        "alice may not publish another person's tasks: 'o'",
        "dataset owners is another person's",
    ]
    sim.client_says("a1", DatasetRequest(5, "owners"), DatasetRequest(6, "hers"))
    theirs, own = sim.got(DatasetReply, "a1")
    assert (theirs.found, theirs.names) == (0, ["hers"])
    assert (own.found, own.keys) == (1, ["a"])
    sim.client_says("a1", UnpublishDataset(7, ["owners"]))
    sim.got(SharedDataAck, "a1")
    sim.client_says("c1", DatasetRequest(8, "owners"))
    (still,) = sim.got(DatasetReply, "c1")
    assert still.found == 1 and still.names == ["hers", "owners"]  # the owner sees all
    sim.got(SharedDataAck, "c1")


def test_a_person_s_locks_live_in_a_namespace_of_their_own(make_sim: Make) -> None:
    sim = make_sim()
    _admitted(sim)
    sim.add_client("a1", person="alice")

    def lock(client: str, request_id: int, name: str, lease: str) -> None:
        acquire = LeaseRequest(request_id, "acquire", "semaphore", [name], lease, 1, 1, 0.0, 0.0)
        sim.client_says(client, acquire)

    lock("a1", 1, "box", "alice-lease")  # hers
    lock("c1", 2, "box", "owner-lease")  # the owner's "box" is another lock
    lock("c1", 3, "alice/box", "owner-2")  # hers, reached by the owner: taken
    (hers,) = sim.got(CoordinationReply, "a1")
    first, second = sim.got(CoordinationReply, "c1")
    assert (hers.ok, first.ok, second.ok) == (1, 1, 0)
