"""Datasets, metadata, who has what, retry, replicate and rebalance.

First the scheduler's state machine alone (``SimulatedCluster``, invariants checked
after every test), then the client API on in-process clusters, in the shape of
Dask's documented usage.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import pytest

from apportion.protocol import messages as m
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, MEMORY, QUEUED, WAITING
from apportion.testing import SimulatedCluster

M = TypeVar("M", bound=m.Message)


@pytest.fixture
def sim() -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster()
    cluster.add_client("c1")
    yield cluster
    check_invariants(cluster.state)


def got(sim: SimulatedCluster, kind: type[M], client: str = "c1") -> list[M]:
    return [msg for msg in sim.inbox.get(client, []) if isinstance(msg, kind)]


def sent(sim: SimulatedCluster, worker_id: str, kind: type[M]) -> list[M]:
    return [msg for msg in sim.to_workers.get(worker_id, []) if isinstance(msg, kind)]


def freed(sim: SimulatedCluster, worker_id: str) -> list[str]:
    return [key for msg in sent(sim, worker_id, m.FreeKeys) for key in msg.keys]


def state_of(sim: SimulatedCluster, key: str) -> str:
    task = sim.state.tasks.get(key)
    return "forgotten" if task is None else task.state


def computed(sim: SimulatedCluster, *keys: str, nbytes: int = 8) -> None:
    """Submit, place and finish each key (a plain task), one after the other."""
    for key in keys:
        sim.submit(key)
        sim.place()
        sim.finish(key, nbytes=nbytes)


def graph(sim: SimulatedCluster, deps: dict[str, list[str]], wanted: list[str]) -> None:
    """Submit tasks in one message, as ``compute`` does: unwanted inputs included."""
    specs = [m.TaskSpec(key, "f", b"", d, {}, 0, 0) for key, d in deps.items()]
    sim.client_says("c1", m.SubmitTasks(specs, {"f": b"func"}, wanted))


def copy_through(sim: SimulatedCluster, source: str, *receivers: str) -> None:
    """Play the workers' part of a copy job: the source sends, the receivers store."""
    (ask,) = sent(sim, source, m.GetData)[-1:]
    sim.worker_says(source, m.DataReply(ask.request_id, dict.fromkeys(ask.keys, b"v"), [], {}))
    for receiver in receivers:
        (put,) = sent(sim, receiver, m.PutData)[-1:]
        sim.worker_says(receiver, m.DataStored(put.request_id, sorted(put.data), {}))


# --- datasets -------------------------------------------------------------------------


def test_a_published_result_outlives_its_client_until_unpublished(sim: SimulatedCluster) -> None:
    w = sim.add_worker()
    computed(sim, "a")
    sim.client_says("c1", m.PublishDataset(1, "x", b"pickled", ["a"], 0))
    assert got(sim, m.SharedDataAck) == [m.SharedDataAck(1, "")]
    sim.remove_client("c1")
    assert state_of(sim, "a") == MEMORY  # the dataset holds it, not the client

    sim.add_client("c2")
    sim.client_says("c2", m.DatasetRequest(2, "x"))
    assert got(sim, m.DatasetReply, "c2") == [m.DatasetReply(2, 1, b"pickled", ["a"], ["x"])]
    sim.client_says("c2", m.SubmitTasks([], {}, ["a"]))  # the reader wants its futures
    assert [k for msg in got(sim, m.KeysDone, "c2") for k in msg.keys] == ["a"]

    sim.client_says("c2", m.UnpublishDataset(3, ["x"]))
    assert state_of(sim, "a") == MEMORY  # the reader still holds a future
    sim.client_says("c2", m.ReleaseKeys(["a"]))
    assert state_of(sim, "a") == "forgotten" and freed(sim, w) == ["a"]
    assert "dataset:x" not in sim.state.clients


def test_publishing_a_taken_name_needs_override(sim: SimulatedCluster) -> None:
    sim.add_worker()
    computed(sim, "a", "b")
    sim.client_says("c1", m.PublishDataset(1, "x", b"1", ["a"], 0))
    sim.client_says("c1", m.PublishDataset(2, "x", b"2", ["b"], 0))
    assert got(sim, m.SharedDataAck)[-1] == m.SharedDataAck(2, "Dataset x already exists")
    sim.client_says("c1", m.PublishDataset(3, "x", b"3", ["b"], 1))
    assert got(sim, m.SharedDataAck)[-1] == m.SharedDataAck(3, "")
    sim.client_says("c1", m.ReleaseKeys(["a", "b"]))
    # The replaced dataset let "a" go; the new one holds "b".
    assert (state_of(sim, "a"), state_of(sim, "b")) == ("forgotten", MEMORY)
    sim.client_says("c1", m.DatasetRequest(4, "y"))
    assert got(sim, m.DatasetReply)[-1] == m.DatasetReply(4, 0, b"", [], ["x"])


def test_plain_objects_are_kept_as_opaque_bytes(sim: SimulatedCluster) -> None:
    sim.client_says("c1", m.PublishDataset(1, "config", b"\x80opaque", [], 0))
    sim.remove_client("c1")
    sim.add_client("c2")
    sim.client_says("c2", m.DatasetRequest(2, "config"))
    assert got(sim, m.DatasetReply, "c2")[0].data == b"\x80opaque"


# --- metadata -------------------------------------------------------------------------


def test_metadata_paths_make_nested_dictionaries(sim: SimulatedCluster) -> None:
    sim.client_says("c1", m.SetMetadata(1, ["x", "y"], 123))
    sim.client_says("c1", m.SetMetadata(2, ["x", "w", "z"], 456))
    sim.client_says("c1", m.MetadataRequest(3, ["x"]))
    sim.client_says("c1", m.MetadataRequest(4, ["x", "w", "z"]))
    sim.client_says("c1", m.MetadataRequest(5, ["x", "nope"]))
    sim.client_says("c1", m.MetadataRequest(6, ["x", "y", "deeper"]))
    replies = got(sim, m.MetadataReply)
    assert replies == [
        m.MetadataReply(3, 1, {"y": 123, "w": {"z": 456}}),
        m.MetadataReply(4, 1, 456),
        m.MetadataReply(5, 0, None),
        m.MetadataReply(6, 0, None),
    ]
    sim.client_says("c1", m.SetMetadata(7, ["x", "y", "z"], 1))  # a value on the way: replaced
    assert sim.state.shared.metadata == {"x": {"y": {"z": 1}, "w": {"z": 456}}}


# --- who has what, replicate ------------------------------------------------------------


def test_replicated_results_are_listed_on_every_holder(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.submit("b")
    ((runs_b, _),) = sim.place()
    sim.client_says("c1", m.ReplicateKeys(1, ["a"], 0, []))
    copy_through(sim, w1, w2)
    assert got(sim, m.CopiesDone) == [m.CopiesDone(1, 1, 0)]

    sim.client_says("c1", m.ClusterFactsRequest(2), m.WhoHasRequest(3, ["a"]))
    (facts,) = got(sim, m.ClusterFactsReply)
    assert facts.who_has == {"a": ["sim://w1", "sim://w2"], "b": []}
    assert facts.has_what == {"sim://w1": ["a"], "sim://w2": ["a"]}
    assert facts.nthreads == {"sim://w1": 1, "sim://w2": 1}
    assert facts.processing == {f"sim://{w}": ["b"] if w == runs_b else [] for w in (w1, w2)}
    assert got(sim, m.WhoHasReply) == [m.WhoHasReply(3, {"a": ["sim://w1", "sim://w2"]})]
    assert any("copied from w1 to w2" in row[4] for row in sim.state.story_of("a"))


def test_a_replicated_result_survives_losing_a_holder(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.client_says("c1", m.ReplicateKeys(1, ["a"], 0, []))
    copy_through(sim, w1, w2)
    sim.remove_worker(w1)
    assert state_of(sim, "a") == MEMORY and sim.state.tasks["a"].worker == w2
    assert not got(sim, m.KeysPending)  # nothing was lost
    sim.remove_worker(w2)  # the last copy: now it is computed again
    assert got(sim, m.KeysPending) == [m.KeysPending(["a"])]
    assert state_of(sim, "a") == QUEUED


def test_a_task_is_told_of_every_holder_and_a_failed_one_is_dropped(
    sim: SimulatedCluster,
) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.client_says("c1", m.ReplicateKeys(1, ["a"], 0, []))
    copy_through(sim, w1, w2)
    sim.submit("b", deps=["a"])
    ((worker, _),) = sim.place()
    compute = sim.running[worker]["b"]
    assert sorted(compute.who_has["a"]) == ["sim://w1", "sim://w2"]
    # Only w1 was tried and failed (say w2 was unreachable): w1's copy is dropped.
    del sim.running[worker]["b"]
    sim.worker_says(worker, m.MissingDependency("b", "a", ["sim://w1"], ""))
    assert sim.state.tasks["a"].worker == w2 and sim.state.tasks["a"].replicas is None
    assert state_of(sim, "a") == MEMORY and not got(sim, m.KeysPending)
    assert "a" in freed(sim, w1)


def test_replicate_to_n_workers_adds_and_removes_copies(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2, w3 = sim.add_worker(), sim.add_worker()
    sim.client_says("c1", m.ReplicateKeys(1, ["a"], 2, []))
    (ask,) = sent(sim, w1, m.GetData)
    sim.worker_says(w1, m.DataReply(ask.request_id, {"a": b"v"}, [], {}))
    receivers = [w for w in (w2, w3) if sent(sim, w, m.PutData)]
    assert len(receivers) == 1  # two holders wanted: one copy
    (receiver,) = receivers
    sim.worker_says(receiver, m.DataStored(ask.request_id, ["a"], {}))
    assert len(sim.state.tasks["a"].replicas or ()) == 1
    sim.client_says("c1", m.ReplicateKeys(2, ["a"], 1, []))  # back to one copy
    assert got(sim, m.CopiesDone)[-1] == m.CopiesDone(2, 0, 1)
    assert sim.state.tasks["a"].worker == w1 and sim.state.tasks["a"].replicas is None
    assert freed(sim, receiver) == ["a"]


def test_a_result_released_while_copied_is_not_kept_by_the_receiver(
    sim: SimulatedCluster,
) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.client_says("c1", m.ReplicateKeys(1, ["a"], 0, []))
    sim.client_says("c1", m.ReleaseKeys(["a"]))
    copy_through(sim, w1, w2)
    assert freed(sim, w2) == ["a"] and state_of(sim, "a") == "forgotten"
    assert got(sim, m.CopiesDone) == [m.CopiesDone(1, 0, 0)]


def test_a_receiver_lost_mid_copy_ends_the_request(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.client_says("c1", m.ReplicateKeys(1, ["a"], 0, []))
    (ask,) = sent(sim, w1, m.GetData)
    sim.worker_says(w1, m.DataReply(ask.request_id, {"a": b"v"}, [], {}))
    sim.remove_worker(w2)
    assert got(sim, m.CopiesDone) == [m.CopiesDone(1, 0, 0)]
    assert not sim.state.shared.copies


def test_rebalance_moves_results_from_the_fullest_worker(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, *"abcdef", nbytes=100)
    w2 = sim.add_worker()
    sim.client_says("c1", m.RebalanceKeys(1, [], 1, []))
    copy_through(sim, w1, w2)
    assert got(sim, m.CopiesDone) == [m.CopiesDone(1, 3, 3)]
    assert len(sim.state.workers[w1].has_what) == len(sim.state.workers[w2].has_what) == 3
    assert sim.state.workers[w1].nbytes == sim.state.workers[w2].nbytes == 300
    assert sorted(freed(sim, w1)) == sorted(sim.state.workers[w2].has_what)
    sim.client_says("c1", m.RebalanceKeys(2, [], 1, []))  # already even: nothing moves
    assert got(sim, m.CopiesDone)[-1] == m.CopiesDone(2, 0, 0)


def test_rebalance_of_chosen_keys_moves_only_those(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a", "b", "c", "d")
    w2 = sim.add_worker()
    sim.client_says("c1", m.RebalanceKeys(1, ["a"], 0, []))
    copy_through(sim, w1, w2)
    assert sim.state.workers[w2].has_what == {"a"}


# --- retry ----------------------------------------------------------------------------


def test_retry_runs_an_erred_task_again(sim: SimulatedCluster) -> None:
    sim.add_worker()
    sim.submit("a")
    sim.place()
    sim.raise_("a")
    assert state_of(sim, "a") == ERRED
    sim.client_says("c1", m.RetryKeys(["a"]))
    assert state_of(sim, "a") == QUEUED
    sim.place()
    sim.finish("a")
    assert [k for msg in got(sim, m.KeysDone) for k in msg.keys] == ["a"]
    assert any("retried by client c1" in row[4] for row in sim.state.story_of("a"))


def test_retry_runs_the_failed_chain_from_its_root(sim: SimulatedCluster) -> None:
    sim.add_worker()
    graph(sim, {"a": [], "b": ["a"], "c": ["b"]}, ["c"])
    sim.place()
    sim.raise_("a")
    assert [state_of(sim, k) for k in "abc"] == [ERRED] * 3  # kept to be retried
    sim.client_says("c1", m.RetryKeys(["c"]))
    assert [state_of(sim, k) for k in "abc"] == [QUEUED, WAITING, WAITING]
    sim.run({})
    assert [k for msg in got(sim, m.KeysDone) for k in msg.keys] == ["c"]
    assert [state_of(sim, k) for k in "abc"] == ["released", "released", MEMORY]


def test_retry_recomputes_released_inputs(sim: SimulatedCluster) -> None:
    sim.add_worker()
    graph(sim, {"a": [], "b": ["a"]}, ["b"])
    sim.place()
    sim.finish("a")
    sim.place()
    sim.raise_("b")
    assert state_of(sim, "a") == "released"
    sim.client_says("c1", m.RetryKeys(["b"]))
    assert (state_of(sim, "a"), state_of(sim, "b")) == (QUEUED, WAITING)
    sim.run({})
    assert [k for msg in got(sim, m.KeysDone) for k in msg.keys] == ["b"]


def test_releasing_a_failed_chain_forgets_its_kept_inputs(sim: SimulatedCluster) -> None:
    sim.add_worker()
    graph(sim, {"a": [], "b": ["a"]}, ["b"])
    sim.place()
    sim.raise_("a")
    sim.client_says("c1", m.ReleaseKeys(["b"]))
    assert sim.state.tasks == {}


def test_retry_of_a_forgotten_or_finished_key_says_so(sim: SimulatedCluster) -> None:
    sim.add_worker()
    computed(sim, "done")
    sim.client_says("c1", m.RetryKeys(["gone", "done"]))
    (failed,) = got(sim, m.KeysFailed)
    assert failed.keys == ["gone"] and "no longer knows it" in failed.message
    assert [k for msg in got(sim, m.KeysDone) for k in msg.keys] == ["done", "done"]
