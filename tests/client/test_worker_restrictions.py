"""Dask's ``workers=`` placement restrictions and the other scheduling keywords.

First the scheduler's state machine alone (``SimulatedCluster``, invariants checked
after every test), then an in-process cluster with two named workers, used as
Dask's documentation uses ``workers=``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from apportion import Client, LocalCluster, UnsatisfiableError, get_worker
from apportion.core.resources import ResourceSpec, parse_demand
from apportion.protocol.tasks import KeysFailed, Notice, SubmitTasks, TaskSpec
from apportion.scheduler.explain import explain
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, FORGOTTEN, PROCESSING, QUEUED
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import InMemoryCluster
from apportion.testing.simulation import SimulatedCluster
from cluster_checks import checked_client

# --- the state machine -----------------------------------------------------------------


class Sim(SimulatedCluster):
    """A simulated cluster whose tasks may name the workers they run on."""

    def submit_on(
        self,
        key: str,
        workers: list[str],
        resources: ResourceSpec = None,
        *,
        loose: bool = False,
        deps: tuple[str, ...] = (),
    ) -> None:
        spec = TaskSpec(
            key, "f", b"", list(deps), parse_demand(resources), 0, 0, [], workers, int(loose)
        )
        self.client_says("c1", SubmitTasks([spec], {"f": b"func"}, [key]))

    def where(self, key: str) -> str:
        """The name of the worker running ``key``."""
        return self.state.workers[self.worker_of(key)].name

    def state_of(self, key: str) -> str:
        task = self.state.tasks.get(key)
        return FORGOTTEN if task is None else task.state

    def notices(self) -> list[str]:
        return [msg.text for msg in self.inbox["c1"] if isinstance(msg, Notice)]

    def failures(self) -> list[KeysFailed]:
        return [msg for msg in self.inbox["c1"] if isinstance(msg, KeysFailed)]


@pytest.fixture
def make_sim() -> Iterator[Callable[..., Sim]]:
    made: list[Sim] = []

    def make(config: SchedulerConfig | None = None) -> Sim:
        sim = Sim(config or SchedulerConfig())
        sim.add_client("c1")
        made.append(sim)
        return sim

    yield make
    for sim in made:
        check_invariants(sim.state)


@pytest.fixture
def sim(make_sim: Callable[..., Sim]) -> Sim:
    return make_sim()


def test_a_restricted_task_waits_for_its_worker_and_runs_when_it_joins(sim: Sim) -> None:
    sim.add_worker("a", nthreads=4)
    sim.submit_on("x", ["b"])
    assert sim.place() == []
    assert sim.state_of("x") == QUEUED
    assert "may run only on workers matching b" in explain(sim.state, "x")
    sim.add_worker("b", nthreads=1)
    assert [sim.where(k) for _, k in sim.place()] == ["b"]


def test_workers_are_named_by_name_address_or_host(sim: Sim) -> None:
    w1 = sim.add_worker("alpha", nthreads=4)
    w2 = sim.add_worker("beta", nthreads=4)
    sim.submit_on("by-name", ["beta"])
    sim.submit_on("by-address", [f"sim://{w1}"])
    sim.submit_on("by-host", [w2])  # a sim address's host is the worker id
    sim.submit_on("one-of-two", ["nobody", "alpha"])
    sim.place()
    assert {k: sim.where(k) for k in sim.all_running()} == {
        "by-name": "beta",
        "by-address": "alpha",
        "by-host": "beta",
        "one-of-two": "alpha",
    }


def test_resources_are_still_free_now_on_the_named_worker(sim: Sim) -> None:
    sim.add_worker("a", nthreads=4, resources="GPU=1")
    sim.add_worker("b", nthreads=4, resources="GPU=1")
    sim.submit_on("g1", ["a"], "GPU=1")
    sim.submit_on("g2", ["a"], "GPU=1")
    assert [sim.where(k) for _, k in sim.place()] == ["a"]
    assert sim.state_of("g2") == QUEUED  # b's free GPU is not a's
    assert "a: GPU 0 of 1 free" in explain(sim.state, "g2")
    sim.finish("g1")
    assert [(sim.where(k), k) for _, k in sim.place()] == [("a", "g2")]


def test_a_restricted_task_does_not_hold_up_unrestricted_ones(sim: Sim) -> None:
    sim.add_worker("a", nthreads=1, resources="GPU=1")
    sim.add_worker("b", nthreads=1, resources="GPU=1")
    sim.submit_on("busy", ["b"], "GPU=1")
    sim.place()
    sim.submit_on("pinned", ["b"], "GPU=1")  # older than "free", same demand
    sim.submit("free", resources="GPU=1")
    started = sim.place()
    assert [(sim.where(k), k) for _, k in started] == [("a", "free")]
    # It reserved the worker it may run on, not the one the others use.
    assert sim.state.tasks["pinned"].reserved_on == sim.worker_of("busy")


def test_a_restricted_plain_task_is_not_starved_by_plain_work_queued_ahead(sim: Sim) -> None:
    a = sim.add_worker("a", nthreads=1)
    for i in range(3):
        sim.submit(f"p{i}")
    sim.place()
    sim.submit_on("pinned", ["a"])
    for i in range(3, 10):
        sim.submit(f"p{i}")
    sim.place()
    assert sim.state.tasks["pinned"].reserved_on == a
    while "pinned" not in sim.all_running():
        sim.finish(next(iter(sim.running[a])))
        sim.place()
    assert sim.state_of("p9") == QUEUED  # it overtook the plain work submitted after it


def test_loose_goes_elsewhere_only_when_no_named_worker_could_run_it(sim: Sim) -> None:
    sim.add_worker("a", nthreads=1, resources="GPU=1")
    sim.add_worker("small", nthreads=1)
    sim.submit_on("absent", ["nobody"], loose=True)
    sim.submit_on("too-small", ["small"], "GPU=1", loose=True)
    started = {k: sim.where(k) for _, k in sim.place()}
    assert started == {"absent": "a"} or started == {"absent": "small"}
    assert sim.state_of("too-small") in (QUEUED, PROCESSING)
    for key in list(sim.all_running()):
        sim.finish(key)
    sim.place()
    assert sim.where("too-small") == "a"
    story = [row[4] for row in sim.state.story("too-small")]
    assert "submitted, preferring workers small" in story
    assert any("not one of its preferred workers (small)" in cause for cause in story)


def test_loose_waits_for_a_busy_named_worker(sim: Sim) -> None:
    sim.add_worker("a", nthreads=1)
    sim.add_worker("b", nthreads=1)
    sim.submit_on("first", ["a"])
    sim.place()
    sim.submit_on("second", ["a"], loose=True)
    assert sim.place() == []  # b is idle, but a is connected and could run it
    assert "prefers workers matching a (allow_other_workers)" in explain(sim.state, "second")
    sim.finish("first")
    assert [sim.where(k) for _, k in sim.place()] == ["a"]


def test_loose_fallback_reservation_is_dropped_when_a_named_worker_joins(sim: Sim) -> None:
    other = sim.add_worker("other", nthreads=1, resources="GPU=1")
    sim.submit("hog", resources="GPU=1")
    sim.place()
    sim.submit_on("pref", ["gpubox"], "GPU=1", loose=True)
    sim.place()
    assert sim.state.tasks["pref"].reserved_on == other
    sim.add_worker("gpubox", nthreads=1, resources="GPU=1")
    assert [(sim.where(k), k) for _, k in sim.place()] == [("gpubox", "pref")]
    assert sim.state.workers[other].reserved_by is None


def test_unsatisfiable_restriction_warns_once_and_says_why(sim: Sim) -> None:
    sim.add_worker("a", nthreads=2, resources="GPU=1")
    sim.submit_on("x1", ["b"])
    sim.submit_on("x2", ["b"])
    sim.submit_on("big", ["a"], "GPU=2")
    sim.place()
    notices = sim.notices()
    assert len([n for n in notices if "matching b" in n]) == 1
    assert "no connected worker matches (connected: a)" in notices[0]
    assert any("matching a (a), and none of them can ever provide" in n for n in notices)
    assert "no connected worker matches" in explain(sim.state, "x2")
    assert sim.state_of("x1") == sim.state_of("big") == QUEUED
    sim.add_worker("b")
    sim.place()
    assert sim.where("x1") == "b"


def test_unsatisfiable_restriction_fails_at_once_where_nothing_can_grow(
    make_sim: Callable[..., Sim],
) -> None:
    sim = make_sim(SchedulerConfig(fail_unsatisfiable=True))
    sim.add_worker("a", nthreads=2)
    sim.submit_on("x", ["b"])
    sim.submit_on("loose", ["b"], loose=True)
    (failed,) = sim.failures()
    assert failed.keys == ["x"] and failed.kind == "unsatisfiable"
    assert "may run only on workers matching b" in failed.message
    assert sim.state_of("x") == ERRED
    assert [sim.where(k) for _, k in sim.place()] == ["a"]


def test_a_restricted_task_runs_again_only_on_an_allowed_worker(sim: Sim) -> None:
    a = sim.add_worker("a", nthreads=1)
    sim.add_worker("b", nthreads=1)
    sim.submit_on("x", ["a"])
    sim.place()
    sim.remove_worker(a)
    assert sim.place() == []
    sim.add_worker("a", nthreads=1)
    assert [sim.where(k) for _, k in sim.place()] == ["a"]


# --- an in-process cluster with two named workers --------------------------------------


def worker_name(*_: Any) -> str:
    return str(get_worker().name)


#: Set to let ``held`` tasks finish (the workers run in this process).
RELEASE = threading.Event()
#: Released once by each ``held`` task as it starts.
STARTED = threading.Semaphore(0)


def held(_: Any) -> bool:
    STARTED.release()
    return RELEASE.wait(10)


def echo_kwargs(*_: Any, **kwargs: Any) -> dict[str, Any]:
    return kwargs


WORKERS = [{"name": "a", "nthreads": 2}, {"name": "b", "nthreads": 2}]


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster(WORKERS) as cluster:
        yield cluster


@pytest.fixture
def client(cluster: InMemoryCluster) -> Iterator[Client]:
    with checked_client(cluster) as c:
        yield c


def test_submit_and_map_run_where_workers_says(client: Client) -> None:
    info = client.scheduler_info()["workers"]
    address_of = {w["name"]: address for address, w in info.items()}
    assert client.submit(worker_name, 1, workers="a").result() == "a"
    assert client.submit(worker_name, 2, workers=["b"]).result() == "b"
    assert client.submit(worker_name, 3, workers=[address_of["a"]]).result() == "a"
    futures = client.map(worker_name, range(8), workers=["b"])
    assert client.gather(futures) == ["b"] * 8


@pytest.mark.tcp
def test_workers_name_tcp_workers_by_bare_address_or_host() -> None:
    # Only TCP addresses have a host and a bare form.
    with (
        LocalCluster(processes=False, workers=WORKERS) as cluster,
        checked_client(cluster) as client,
    ):
        info = client.scheduler_info()["workers"]
        address_of = {w["name"]: address for address, w in info.items()}
        bare = address_of["b"].removeprefix("tcp://")
        assert client.submit(worker_name, 4, workers=bare).result() == "b"
        on_host = client.map(worker_name, range(8), workers="127.0.0.1", pure=False)
        assert set(client.gather(on_host)) <= {"a", "b"}


def test_no_scheduling_keyword_reaches_the_function(client: Client) -> None:
    keywords: dict[str, Any] = {
        "key": "kw-1",
        "workers": ["a"],
        "allow_other_workers": True,
        "loose_restrictions": True,
        "resources": None,
        "retries": 1,
        "priority": 5,
        "fifo_timeout": "10 ms",
        "actor": False,
        "actors": False,
        "pure": False,
    }
    assert client.submit(echo_kwargs, mine=1, **keywords).result() == {"mine": 1}
    keywords["key"] = "kw-map"
    many = client.map(echo_kwargs, [1, 2], batch_size=10, **keywords)
    assert client.gather(many) == [{}, {}]


def test_actors_of_functions_and_loose_without_workers_are_refused(client: Client) -> None:
    with pytest.raises(TypeError, match="actor=True needs a class"):
        client.submit(echo_kwargs, actor=True)
    with pytest.raises(TypeError, match="actor=True needs a class"):
        client.map(echo_kwargs, [1], actors=True)
    with pytest.raises(NotImplementedError, match="make an actor with"):
        client.compute([], actors=True)
    with pytest.raises(ValueError, match="Only use allow_other_workers= if using workers="):
        client.submit(echo_kwargs, allow_other_workers=True)
    with pytest.raises(TypeError, match="allow_other_workers= must be True or False"):
        client.submit(echo_kwargs, workers="a", allow_other_workers="yes")


def test_a_worker_nobody_has_fails_at_once_unless_others_are_allowed(client: Client) -> None:
    hard = client.submit(worker_name, 5, workers="gpu-box")
    with pytest.raises(UnsatisfiableError, match="may run only on workers matching gpu-box"):
        hard.result(timeout=10)
    assert "no connected worker matches (connected: a, b)" in client.why(hard)
    loose = client.submit(worker_name, 5, workers="gpu-box", allow_other_workers=True)
    assert loose.result(timeout=10) in ("a", "b")


def test_why_and_story_mention_the_restriction(client: Client) -> None:
    RELEASE.clear()
    blockers = [client.submit(held, i, workers="a") for i in range(2)]
    try:
        assert STARTED.acquire(timeout=10) and STARTED.acquire(timeout=10)
        waiting = client.submit(worker_name, 6, workers="a")
        text = client.why(waiting)
        assert "may run only on workers matching a (workers=)" in text
        assert "a: all 2 threads busy" in text
    finally:
        RELEASE.set()
    assert waiting.result(timeout=10) == "a"
    assert client.gather(blockers) == [True, True]
    causes = [row[4] for row in client.story(waiting)]
    assert causes[0] == "submitted, restricted to workers a"


def test_compute_persist_and_get_take_workers(client: Client) -> None:
    dask = pytest.importorskip("dask")
    parts = [dask.delayed(worker_name)(i) for i in range(4)]
    assert client.compute(parts, workers="b", sync=True) == ["b"] * 4
    (persisted,) = client.persist([dask.delayed(worker_name)("p")], workers=["a"])
    assert persisted.compute(scheduler=client.get) == "a"
    graph = {"x": (worker_name, 1), "y": (worker_name, "x")}
    assert client.get(graph, ["x", "y"], workers="a") == ["a", "a"]
    assert client.get(graph, "y", workers="nobody", allow_other_workers=True) in ("a", "b")
    with dask.annotate(workers="a"):
        pinned = dask.delayed(worker_name)("annotated")
    # A task's annotation wins over the graph-wide setting, as in Dask.
    assert client.compute(pinned, workers="b", sync=True) == "a"


def test_alternatives_are_chosen_among_the_allowed_workers_only(sim: Sim) -> None:
    sim.add_worker("gpu", nthreads=1, resources="GPU=1")
    sim.add_worker("cpu", nthreads=1)
    gpu, cpu = parse_demand("GPU=1"), parse_demand(None)
    spec = TaskSpec("x", "f", b"", [], gpu, 0, 0, [gpu, cpu], ["cpu"], 0)
    sim.client_says("c1", SubmitTasks([spec], {"f": b"func"}, ["x"]))
    assert [sim.where(k) for _, k in sim.place()] == ["cpu"]
    assert sim.running[sim.worker_of("x")]["x"].allocation.alternative == 1


# --- a scheduler that can grow --------------------------------------------------------


def test_a_missing_worker_is_warned_about_and_runs_the_task_when_it_joins() -> None:
    with InMemoryCluster([{"name": "a"}], config=SchedulerConfig()) as cluster:
        client = cluster.client()
        fut = client.submit(worker_name, 7, workers="b")
        deadline = time.monotonic() + 10
        while not client.notices and time.monotonic() < deadline:
            time.sleep(0.01)  # a notice arrives by message; the client has no event for it
        assert client.notices and "may run only on workers matching b" in client.notices[0]
        assert "no connected worker matches (connected: a)" in client.why(fut)
        assert not fut.done()
        cluster.run(cluster.add_worker(name="b"))
        assert fut.result(timeout=10) == "b"
