"""Datasets, metadata, who has what, retry, replicate and rebalance.

First the scheduler's state machine alone (``SimulatedCluster``, invariants checked
after every test), then the client API on in-process clusters, in the shape of
Dask's documented usage.
"""

from __future__ import annotations

import operator
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from apportion import Client, Future, LocalCluster
from apportion.protocol.base import Message
from apportion.protocol.cluster import ClusterFactsReply, ClusterFactsRequest
from apportion.protocol.peer_data import DataReply, DataStored, GetData, PutData
from apportion.protocol.shared_data import (
    CopiesDone,
    DatasetReply,
    DatasetRequest,
    MetadataReply,
    MetadataRequest,
    PublishDataset,
    RebalanceKeys,
    ReplicateKeys,
    SetMetadata,
    SharedDataAck,
    UnpublishDataset,
)
from apportion.protocol.tasks import (
    KeysDone,
    KeysFailed,
    KeysPending,
    ReleaseKeys,
    RetryKeys,
    SubmitTasks,
    TaskErred,
    TaskSpec,
    WhoHasReply,
    WhoHasRequest,
)
from apportion.protocol.worker import FreeKeys, MissingDependency, WorkerDraining
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import (
    ERRED,
    FORGOTTEN,
    MEMORY,
    PROCESSING,
    QUEUED,
    RELEASED,
    WAITING,
)
from apportion.testing import InMemoryCluster, SimulatedCluster
from cluster_checks import InProcess, checked_client, settle

M = TypeVar("M", bound=Message)


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
    return [key for msg in sent(sim, worker_id, FreeKeys) for key in msg.keys]


def state_of(sim: SimulatedCluster, key: str) -> str:
    task = sim.state.tasks.get(key)
    return FORGOTTEN if task is None else task.state


def computed(sim: SimulatedCluster, *keys: str, nbytes: int = 8) -> None:
    """Submit, place and finish each key (a plain task), one after the other."""
    for key in keys:
        sim.submit(key)
        sim.place()
        sim.finish(key, nbytes=nbytes)


def graph(sim: SimulatedCluster, deps: dict[str, list[str]], wanted: list[str]) -> None:
    """Submit tasks in one message, as ``compute`` does: unwanted inputs included."""
    specs = [TaskSpec(key, "f", b"", d, {}, 0, 0) for key, d in deps.items()]
    sim.client_says("c1", SubmitTasks(specs, {"f": b"func"}, wanted))


def copy_through(sim: SimulatedCluster, source: str, *receivers: str) -> None:
    """Play the workers' part of a copy job: the source sends, the receivers store."""
    (ask,) = sent(sim, source, GetData)[-1:]
    sim.worker_says(source, DataReply(ask.request_id, dict.fromkeys(ask.keys, b"v"), [], {}))
    for receiver in receivers:
        (put,) = sent(sim, receiver, PutData)[-1:]
        sim.worker_says(receiver, DataStored(put.request_id, sorted(put.data), {}))


# --- datasets -------------------------------------------------------------------------


def test_a_published_result_outlives_its_client_until_unpublished(sim: SimulatedCluster) -> None:
    w = sim.add_worker()
    computed(sim, "a")
    sim.client_says("c1", PublishDataset(1, "x", b"pickled", ["a"], 0))
    assert got(sim, SharedDataAck) == [SharedDataAck(1, "")]
    sim.remove_client("c1")
    assert state_of(sim, "a") == MEMORY  # the dataset holds it, not the client

    sim.add_client("c2")
    sim.client_says("c2", DatasetRequest(2, "x"))
    assert got(sim, DatasetReply, "c2") == [DatasetReply(2, 1, b"pickled", ["a"], ["x"])]
    sim.client_says("c2", SubmitTasks([], {}, ["a"]))  # the reader wants its futures
    assert [k for msg in got(sim, KeysDone, "c2") for k in msg.keys] == ["a"]

    sim.client_says("c2", UnpublishDataset(3, ["x"]))
    assert state_of(sim, "a") == MEMORY  # the reader still holds a future
    sim.client_says("c2", ReleaseKeys(["a"]))
    assert state_of(sim, "a") == FORGOTTEN and freed(sim, w) == ["a"]
    assert "dataset:x" not in sim.state.clients


def test_publishing_a_taken_name_needs_override(sim: SimulatedCluster) -> None:
    sim.add_worker()
    computed(sim, "a", "b")
    sim.client_says("c1", PublishDataset(1, "x", b"1", ["a"], 0))
    sim.client_says("c1", PublishDataset(2, "x", b"2", ["b"], 0))
    assert got(sim, SharedDataAck)[-1] == SharedDataAck(2, "Dataset x already exists")
    sim.client_says("c1", PublishDataset(3, "x", b"3", ["b"], 1))
    assert got(sim, SharedDataAck)[-1] == SharedDataAck(3, "")
    sim.client_says("c1", ReleaseKeys(["a", "b"]))
    # The replaced dataset let "a" go; the new one holds "b".
    assert (state_of(sim, "a"), state_of(sim, "b")) == (FORGOTTEN, MEMORY)
    sim.client_says("c1", DatasetRequest(4, "y"))
    assert got(sim, DatasetReply)[-1] == DatasetReply(4, 0, b"", [], ["x"])


def test_republishing_the_same_keys_keeps_them(sim: SimulatedCluster) -> None:
    sim.add_worker()
    computed(sim, "a", "b")
    sim.client_says("c1", PublishDataset(1, "x", b"1", ["a", "b"], 0))
    sim.client_says("c1", PublishDataset(2, "x", b"2", ["a"], 1))
    sim.remove_client("c1")
    # "a" is in both versions: still held; "b" only in the replaced one: let go.
    assert (state_of(sim, "a"), state_of(sim, "b")) == (MEMORY, FORGOTTEN)


def test_plain_objects_are_kept_as_opaque_bytes(sim: SimulatedCluster) -> None:
    sim.client_says("c1", PublishDataset(1, "config", b"\x80opaque", [], 0))
    sim.remove_client("c1")
    sim.add_client("c2")
    sim.client_says("c2", DatasetRequest(2, "config"))
    assert got(sim, DatasetReply, "c2")[0].data == b"\x80opaque"


# --- metadata -------------------------------------------------------------------------


def test_metadata_paths_make_nested_dictionaries(sim: SimulatedCluster) -> None:
    sim.client_says("c1", SetMetadata(1, ["x", "y"], 123))
    sim.client_says("c1", SetMetadata(2, ["x", "w", "z"], 456))
    sim.client_says("c1", MetadataRequest(3, ["x"]))
    sim.client_says("c1", MetadataRequest(4, ["x", "w", "z"]))
    sim.client_says("c1", MetadataRequest(5, ["x", "nope"]))
    sim.client_says("c1", MetadataRequest(6, ["x", "y", "deeper"]))
    replies = got(sim, MetadataReply)
    assert replies == [
        MetadataReply(3, 1, {"y": 123, "w": {"z": 456}}),
        MetadataReply(4, 1, 456),
        MetadataReply(5, 0, None),
        MetadataReply(6, 0, None),
    ]
    sim.client_says("c1", SetMetadata(7, ["x", "y", "z"], 1))  # a value on the way: replaced
    assert sim.state.shared.metadata == {"x": {"y": {"z": 1}, "w": {"z": 456}}}


# --- who has what, replicate ------------------------------------------------------------


def test_replicated_results_are_listed_on_every_holder(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.submit("b")
    ((runs_b, _),) = sim.place()
    sim.client_says("c1", ReplicateKeys(1, ["a"], 0, []))
    copy_through(sim, w1, w2)
    assert got(sim, CopiesDone) == [CopiesDone(1, 1, 0)]

    sim.client_says("c1", ClusterFactsRequest(2), WhoHasRequest(3, ["a"]))
    (facts,) = got(sim, ClusterFactsReply)
    assert facts.who_has == {"a": ["sim://w1", "sim://w2"], "b": []}
    assert facts.has_what == {"sim://w1": ["a"], "sim://w2": ["a"]}
    assert facts.nthreads == {"sim://w1": 1, "sim://w2": 1}
    assert facts.processing == {f"sim://{w}": ["b"] if w == runs_b else [] for w in (w1, w2)}
    assert got(sim, WhoHasReply) == [WhoHasReply(3, {"a": ["sim://w1", "sim://w2"]})]
    assert any("copied from w1 to w2" in row[4] for row in sim.state.story("a"))


def test_a_replicated_result_survives_losing_a_holder(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.client_says("c1", ReplicateKeys(1, ["a"], 0, []))
    copy_through(sim, w1, w2)
    sim.remove_worker(w1)
    assert state_of(sim, "a") == MEMORY and sim.state.tasks["a"].worker == w2
    assert not got(sim, KeysPending)  # nothing was lost
    sim.remove_worker(w2)  # the last copy: now it is computed again
    assert got(sim, KeysPending) == [KeysPending(["a"])]
    assert state_of(sim, "a") == QUEUED


def test_a_task_is_told_of_every_holder_and_a_failed_one_is_dropped(
    sim: SimulatedCluster,
) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.client_says("c1", ReplicateKeys(1, ["a"], 0, []))
    copy_through(sim, w1, w2)
    sim.submit("b", deps=["a"])
    ((worker, _),) = sim.place()
    compute = sim.running[worker]["b"]
    assert sorted(compute.who_has["a"]) == ["sim://w1", "sim://w2"]
    # Only w1 was tried and failed (say w2 was unreachable): w1's copy is dropped.
    del sim.running[worker]["b"]
    sim.worker_says(worker, MissingDependency("b", "a", ["sim://w1"], ""))
    assert sim.state.tasks["a"].worker == w2 and sim.state.tasks["a"].replicas is None
    assert state_of(sim, "a") == MEMORY and not got(sim, KeysPending)
    assert "a" in freed(sim, w1)


def test_replicate_to_n_workers_adds_and_removes_copies(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2, w3 = sim.add_worker(), sim.add_worker()
    sim.client_says("c1", ReplicateKeys(1, ["a"], 2, []))
    (ask,) = sent(sim, w1, GetData)
    sim.worker_says(w1, DataReply(ask.request_id, {"a": b"v"}, [], {}))
    receivers = [w for w in (w2, w3) if sent(sim, w, PutData)]
    assert len(receivers) == 1  # two holders wanted: one copy
    (receiver,) = receivers
    sim.worker_says(receiver, DataStored(ask.request_id, ["a"], {}))
    assert len(sim.state.tasks["a"].replicas or ()) == 1
    sim.client_says("c1", ReplicateKeys(2, ["a"], 1, []))  # back to one copy
    assert got(sim, CopiesDone)[-1] == CopiesDone(2, 0, 1)
    assert sim.state.tasks["a"].worker == w1 and sim.state.tasks["a"].replicas is None
    assert freed(sim, receiver) == ["a"]


def test_a_result_released_while_copied_is_not_kept_by_the_receiver(
    sim: SimulatedCluster,
) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.client_says("c1", ReplicateKeys(1, ["a"], 0, []))
    sim.client_says("c1", ReleaseKeys(["a"]))
    copy_through(sim, w1, w2)
    assert freed(sim, w2) == ["a"] and state_of(sim, "a") == FORGOTTEN
    assert got(sim, CopiesDone) == [CopiesDone(1, 0, 0)]


def test_a_receiver_lost_mid_copy_ends_the_request(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a")
    w2 = sim.add_worker()
    sim.client_says("c1", ReplicateKeys(1, ["a"], 0, []))
    (ask,) = sent(sim, w1, GetData)
    sim.worker_says(w1, DataReply(ask.request_id, {"a": b"v"}, [], {}))
    sim.remove_worker(w2)
    assert got(sim, CopiesDone) == [CopiesDone(1, 0, 0)]
    assert not sim.state.shared.copies


def test_rebalance_moves_results_from_the_fullest_worker(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, *"abcdef", nbytes=100)
    w2 = sim.add_worker()
    sim.client_says("c1", RebalanceKeys(1, [], 1, []))
    copy_through(sim, w1, w2)
    assert got(sim, CopiesDone) == [CopiesDone(1, 3, 3)]
    assert len(sim.state.workers[w1].has_what) == len(sim.state.workers[w2].has_what) == 3
    assert sim.state.workers[w1].nbytes == sim.state.workers[w2].nbytes == 300
    assert sorted(freed(sim, w1)) == sorted(sim.state.workers[w2].has_what)
    sim.client_says("c1", RebalanceKeys(2, [], 1, []))  # already even: nothing moves
    assert got(sim, CopiesDone)[-1] == CopiesDone(2, 0, 0)


def test_rebalance_of_chosen_keys_moves_only_those(sim: SimulatedCluster) -> None:
    w1 = sim.add_worker()
    computed(sim, "a", "b", "c", "d")
    w2 = sim.add_worker()
    sim.client_says("c1", RebalanceKeys(1, ["a"], 0, []))
    copy_through(sim, w1, w2)
    assert sim.state.workers[w2].has_what == {"a"}


# --- retry ----------------------------------------------------------------------------


def test_retrying_a_task_failed_while_still_running_answers_at_once() -> None:
    """``b`` ran on B when its input, lost and recomputed, raised: it failed while still
    running. A retry cannot start it again yet, so the client hears the failure again
    instead of waiting on a future nothing would settle."""
    sim = SimulatedCluster()
    sim.add_client("c1")
    first = sim.add_worker("A")
    sim.add_worker("B")
    specs = [
        TaskSpec("a", "f", b"", [], {}, 0, 0, [], ["A"]),
        TaskSpec("b", "f", b"", ["a"], {}, 0, 0, [], ["B"]),
    ]
    sim.client_says("c1", SubmitTasks(specs, {"f": b"func"}, ["b"]))
    sim.place()
    sim.finish("a")
    sim.place()
    sim.remove_worker(first)  # "a" is lost, to be recomputed on the new A
    sim.add_worker("A")
    sim.place()
    sim.raise_("a")
    assert state_of(sim, "b") == PROCESSING and sim.state.tasks["b"].cancelled
    before = len(got(sim, TaskErred))
    sim.client_says("c1", RetryKeys(["b"]))
    assert [msg.key for msg in got(sim, TaskErred)[before:]] == ["b"]
    check_invariants(sim.state)


def test_retry_runs_an_erred_task_again(sim: SimulatedCluster) -> None:
    sim.add_worker()
    sim.submit("a")
    sim.place()
    sim.raise_("a")
    assert state_of(sim, "a") == ERRED
    sim.client_says("c1", RetryKeys(["a"]))
    assert state_of(sim, "a") == QUEUED
    sim.place()
    sim.finish("a")
    assert [k for msg in got(sim, KeysDone) for k in msg.keys] == ["a"]
    assert any("retried by client c1" in row[4] for row in sim.state.story("a"))


def test_retry_runs_the_failed_chain_from_its_root(sim: SimulatedCluster) -> None:
    sim.add_worker()
    graph(sim, {"a": [], "b": ["a"], "c": ["b"]}, ["c"])
    sim.place()
    sim.raise_("a")
    assert [state_of(sim, k) for k in "abc"] == [ERRED] * 3  # kept to be retried
    sim.client_says("c1", RetryKeys(["c"]))
    assert [state_of(sim, k) for k in "abc"] == [QUEUED, WAITING, WAITING]
    sim.run({})
    assert [k for msg in got(sim, KeysDone) for k in msg.keys] == ["c"]
    assert [state_of(sim, k) for k in "abc"] == ["released", "released", MEMORY]


def test_retry_recomputes_released_inputs(sim: SimulatedCluster) -> None:
    sim.add_worker()
    graph(sim, {"a": [], "b": ["a"]}, ["b"])
    sim.place()
    sim.finish("a")
    sim.place()
    sim.raise_("b")
    assert state_of(sim, "a") == RELEASED
    sim.client_says("c1", RetryKeys(["b"]))
    assert (state_of(sim, "a"), state_of(sim, "b")) == (QUEUED, WAITING)
    sim.run({})
    assert [k for msg in got(sim, KeysDone) for k in msg.keys] == ["b"]


def test_releasing_a_failed_chain_forgets_its_kept_inputs(sim: SimulatedCluster) -> None:
    sim.add_worker()
    graph(sim, {"a": [], "b": ["a"]}, ["b"])
    sim.place()
    sim.raise_("a")
    sim.client_says("c1", ReleaseKeys(["b"]))
    assert sim.state.tasks == {}


def test_retry_of_a_forgotten_or_finished_key_says_so(sim: SimulatedCluster) -> None:
    sim.add_worker()
    computed(sim, "done")
    sim.client_says("c1", RetryKeys(["gone", "done"]))
    (failed,) = got(sim, KeysFailed)
    assert failed.keys == ["gone"] and "no longer knows it" in failed.message
    assert [k for msg in got(sim, KeysDone) for k in msg.keys] == ["done", "done"]


# --- copies under random events ----------------------------------------------------------


class CopiesMachine(RuleBasedStateMachine):
    """Results computed, copied, moved, lost, released and drained in random order:
    the invariants (every holder listed, every listed holder real, byte counts right)
    hold after every step, and every wanted result is still there or computed again."""

    def __init__(self) -> None:
        super().__init__()
        self.sim = SimulatedCluster()
        self.sim.add_client("c1")
        self.next_key = 0

    @initialize(n=st.integers(2, 3))
    def workers(self, n: int) -> None:
        for _ in range(n):
            self.sim.add_worker(nthreads=2)

    def _done(self) -> list[str]:
        return sorted(k for k, t in self.sim.state.tasks.items() if t.state == MEMORY)

    @rule(data=st.data(), wanted=st.booleans())
    def compute(self, data: st.DataObject, wanted: bool) -> None:
        """A task, perhaps on earlier results; everything running finishes."""
        key = f"t{self.next_key}"
        self.next_key += 1
        done = self._done()
        deps = data.draw(st.lists(st.sampled_from(done), max_size=2, unique=True)) if done else []
        self.sim.submit(key, deps, wanted=wanted or not deps)
        self.sim.place()
        for running in sorted(self.sim.all_running()):
            self.sim.finish(running, nbytes=data.draw(st.integers(0, 50)))
        self.sim.place()

    @precondition(lambda self: self._done())
    @rule(data=st.data(), n=st.integers(0, 3))
    def replicate(self, data: st.DataObject, n: int) -> None:
        keys = data.draw(st.lists(st.sampled_from(self._done()), min_size=1, max_size=3))
        self.sim.client_says("c1", ReplicateKeys(1, keys, n, []))

    @rule()
    def rebalance(self) -> None:
        self.sim.client_says("c1", RebalanceKeys(2, [], 1, []))

    @rule()
    def workers_answer(self) -> None:
        """Sources send, receivers store, drained workers leave."""
        self.sim.answer_transfers()

    @rule()
    def add_worker(self) -> None:
        self.sim.add_worker(nthreads=2)

    @precondition(lambda self: len(self.sim.running) > 1)
    @rule(data=st.data(), drain=st.booleans())
    def worker_goes(self, data: st.DataObject, drain: bool) -> None:
        worker_id = data.draw(st.sampled_from(sorted(self.sim.running)))
        if drain:
            self.sim.worker_says(worker_id, WorkerDraining(30.0))
        else:
            self.sim.remove_worker(worker_id)
        self.sim.place()

    @precondition(lambda self: self._done())
    @rule(data=st.data())
    def a_holder_lacks_it(self, data: st.DataObject) -> None:
        """A task finds that some holders of its input do not have it."""
        dep = data.draw(st.sampled_from(self._done()))
        key = f"t{self.next_key}"
        self.next_key += 1
        self.sim.submit(key, [dep])
        self.sim.place()
        if key not in self.sim.all_running():
            return
        worker_id = self.sim.worker_of(key)
        holders = self.sim.running[worker_id][key].who_has[dep]
        tried = data.draw(st.lists(st.sampled_from(holders), min_size=1, unique=True))
        del self.sim.running[worker_id][key]
        self.sim.worker_says(worker_id, MissingDependency(key, dep, tried, ""))

    @precondition(lambda self: self.sim.state.clients["c1"].wanted)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.sim.state.clients["c1"].wanted)))
        self.sim.client_says("c1", ReleaseKeys([key]))

    @invariant()
    def consistent(self) -> None:
        check_invariants(self.sim.state)

    def teardown(self) -> None:
        """Everything settles: every wanted key is in memory again, where it says."""
        sim = self.sim
        sim.add_worker("last", nthreads=4)
        for _ in range(1_000):
            self.workers_answer()
            for key in sorted(sim.all_running()):
                sim.finish(key)
            sim.place()
            if not sim.all_running() and not any(sim.to_workers.values()):
                break
        check_invariants(sim.state)
        for key in sim.state.clients["c1"].wanted:
            task = sim.state.tasks[key]
            if task.state == ERRED:
                # Running when enough workers died to count it poison (Dask's
                # KilledWorker): failed on purpose, the only way a wanted key may end.
                assert sim.state.story(key)[-1][-1] == "too many worker deaths", key
            else:
                assert task.state == MEMORY, key
        assert not sim.state.shared.copies


CopiesMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCopies = CopiesMachine.TestCase


# --- the client API on an in-process cluster ---------------------------------------------


#: "pin" lets a test put every task on the first worker (Dask would say workers=).
WORKERS = [
    {"name": "first", "nthreads": 2, "resources": "pin=100"},
    {"name": "second", "nthreads": 2},
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster(WORKERS) as c:
        yield c


@pytest.fixture
def client(cluster: InProcess) -> Iterator[Client]:
    with checked_client(cluster) as c:
        yield c


def inc(x: int) -> int:
    return x + 1


def addresses(cluster: InProcess) -> list[str]:
    return sorted(w.address for w in cluster.scheduler.state.workers.values())


def test_a_dataset_outlives_the_client_that_published_it(cluster: InProcess) -> None:
    with Client(cluster.address) as first:
        total = first.submit(operator.add, 1, 2)
        first.publish_dataset(total=total)
        assert first.list_datasets() == ["total"]
    with Client(cluster.address) as second:
        got_back = second.get_dataset("total")
        assert isinstance(got_back, Future) and got_back.key == total.key
        assert got_back.result() == 3
        second.unpublish_dataset("total")
        assert second.list_datasets() == []
        assert got_back.result() == 3  # the reader's own future still holds it
    settle(cluster)
    assert not cluster.scheduler.state.tasks


def test_datasets_behave_as_a_dictionary(client: Client) -> None:
    future = client.submit(inc, 10)
    client.datasets["x"] = future
    client.publish_dataset(client.submit(inc, 20), name="y")
    client.publish_dataset({"config": {"alpha": 0.5, "layers": [1, 2]}})
    assert "x" in client.datasets and "z" not in client.datasets
    assert len(client.datasets) == 3 and sorted(client.datasets) == ["config", "x", "y"]
    assert client.datasets["x"].result() == 11
    assert client.get_dataset("y").result() == 21
    assert client.get_dataset("config") == {"alpha": 0.5, "layers": [1, 2]}
    assert client.get_dataset(["x", "config"])[1]["alpha"] == 0.5

    with pytest.raises(KeyError, match="already exists"):
        client.publish_dataset(x=1)
    client.publish_dataset(x=2, override=True)
    assert client.datasets["x"] == 2
    with pytest.raises(KeyError, match=r"'nope' not found; published: \['config', 'x', 'y'\]"):
        client.get_dataset("nope")
    assert client.get_dataset("nope", default=None) is None
    with pytest.raises(ValueError, match="publish_dataset\\(df, name='ds'\\)"):
        client.publish_dataset(name="empty")

    assert client.datasets.get("nope") is None
    assert client.datasets.get("nope", "fallback") == "fallback"
    with pytest.raises(TypeError, match=r"'async for'.*needs an asynchronous client"):
        client.datasets.__aiter__()
    del client.datasets["x"]
    del client.datasets["x"]  # not published any more: as in Dask, not an error
    client.unpublish_dataset(["y", "config"])
    assert dict(client.datasets) == {}


def test_a_persisted_collection_is_rebuilt_for_another_client(cluster: InProcess) -> None:
    db = pytest.importorskip("dask.bag")
    with Client(cluster.address) as first:
        bag = first.persist(db.from_sequence(range(10), npartitions=3).map(inc))
        first.publish_dataset(numbers=bag)
    with Client(cluster.address) as second:
        numbers = second.get_dataset("numbers")
        parts = [getattr(v, "value", v) for v in dict(numbers.__dask_graph__()).values()]
        assert {type(p) for p in parts} == {Future} and parts[0]._client is second
        assert second.compute(numbers.sum()).result() == sum(range(1, 11))
        assert sorted(second.compute(numbers, sync=True)) == list(range(1, 11))
        second.replicate(numbers)  # a collection stands for its parts, as in Dask
        assert [len(where) for where in second.who_has(numbers).values()] == [2, 2, 2]
        second.unpublish_dataset("numbers")


def test_metadata_is_kept_by_key_or_nested_path(client: Client) -> None:
    client.set_metadata("x", 123)
    assert client.get_metadata("x") == 123
    client.set_metadata(["x", "y"], 123)
    client.set_metadata(["x", "w", "z"], 456)
    assert client.get_metadata("x") == {"y": 123, "w": {"z": 456}}
    assert client.get_metadata(["x", "w"]) == {"z": 456}
    with pytest.raises(KeyError):
        client.get_metadata(["x", "missing"])
    assert client.get_metadata("missing", default="d") == "d"
    with pytest.raises(TypeError, match="plain data"):
        client.set_metadata("obj", object())


def test_retry_runs_a_task_that_failed_the_first_time(client: Client, tmp_path: Path) -> None:
    flag = str(tmp_path / "ran-once")
    first = client.submit(fails_once, flag)
    second = client.submit(inc, first)
    with pytest.raises(RuntimeError, match="first run fails"):
        second.result()
    assert first.status == second.status == "error"
    client.retry([second])  # the failed input runs again too
    assert second.result(timeout=10) == 43
    assert first.result(timeout=10) == 42


def fails_once(flag: str) -> int:
    if not os.path.exists(flag):
        with open(flag, "w"):
            pass
        raise RuntimeError("first run fails")
    return 42


def test_replicate_puts_a_copy_on_every_worker(client: Client, cluster: InProcess) -> None:
    x = client.submit(inc, 1)
    client.replicate([x])
    assert sorted(client.who_has([x])[x.key]) == addresses(cluster)
    assert sorted(client.who_has()[x.key]) == addresses(cluster)
    assert {w: keys for w, keys in client.has_what().items()} == {
        w: [x.key] for w in addresses(cluster)
    }
    client.replicate([x], n=1)
    assert len(client.who_has([x])[x.key]) == 1
    for n in (0, -1):  # as Dask: replicate never deletes the last copies
        with pytest.raises(ValueError, match="cannot delete data"):
            client.replicate([x], n=n)
    assert len(client.who_has([x])[x.key]) == 1
    assert x.result() == 2


def test_rebalance_evens_out_what_each_worker_holds(client: Client, cluster: InProcess) -> None:
    futures = client.map(inc, range(10), resources={"pin": 1})
    assert [f.result() for f in futures] == list(range(1, 11))
    counts = {w: len(keys) for w, keys in client.has_what().items()}
    assert sorted(counts.values()) == [0, 10]
    client.rebalance()
    counts = {w: len(keys) for w, keys in client.has_what().items()}
    assert sorted(counts.values()) == [5, 5]
    assert client.gather(futures) == list(range(1, 11))
    assert all(len(holders) == 1 for holders in client.who_has(futures).values())


def test_worker_facts_have_dasks_shapes(client: Client, cluster: InProcess) -> None:
    both = addresses(cluster)
    assert client.nthreads() == dict.fromkeys(both, 2)
    assert client.ncores(both[:1]) == {both[0]: 2}
    assert sorted(client.processing()) == both
    assert client.has_what(both[0]) == {both[0]: []}
    assert client.who_has([]) == {}


PUBLISHER = """
import sys
from apportion import Client

def square(x):
    return x * x

client = Client(sys.argv[1])
client.publish_dataset(squares=client.map(square, range(5)), note={"by": "a script"})
# Exits without closing: the dataset must not depend on a clean goodbye.
"""


@pytest.mark.process
def test_a_dataset_published_by_a_script_that_exited() -> None:
    # The script is another process: it reaches the scheduler over TCP.
    with LocalCluster(workers=WORKERS, processes=False) as cluster:
        done = subprocess.run(
            [sys.executable, "-c", PUBLISHER, cluster.scheduler_address],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **cluster.security.environment("client")},  # its secret
        )
        assert done.returncode == 0, done.stderr
        with Client(cluster) as reader:
            assert reader.list_datasets() == ["note", "squares"]
            assert reader.gather(reader.get_dataset("squares")) == [0, 1, 4, 9, 16]
            assert reader.datasets["note"] == {"by": "a script"}
            reader.unpublish_dataset(["note", "squares"])
        settle(cluster)
        assert not cluster.scheduler.state.tasks
