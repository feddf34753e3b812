"""A task retried after raising goes first to a worker it has not raised on.

A failure is often the worker's (a broken GPU, a full disk): the next attempt runs
elsewhere when another worker can take it now, and where it failed only when none
can. The choice is deterministic, and ``story`` and ``why`` say it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from apportion.protocol.tasks import ReleaseKeys, TaskErred
from apportion.protocol.worker import StealRequest
from apportion.scheduler.events import Tick
from apportion.scheduler.explain import explain
from apportion.scheduler.records import QUEUED
from apportion.testing import RecordingCluster


def _cause(sim: RecordingCluster, key: str) -> str:
    return sim.state.story(key)[-1][4]


def test_a_plain_retry_goes_to_the_worker_it_did_not_raise_on(sim: RecordingCluster) -> None:
    a = sim.add_worker("a")
    b = sim.add_worker("b")
    sim.submit("x", retries=4)
    assert sim.place() == [(a, "x")]
    sim.raise_("x")
    assert "it raised on a: it goes first to a worker where it raised less" in explain(
        sim.state, "x"
    )
    assert sim.place() == [(b, "x")]
    assert _cause(sim, "x") == "assigned to b, not where it raised before (a)"
    sim.raise_("x")
    # Once on each: the usual order picks, the same in every run (the first joined).
    assert sim.place() == [(a, "x")]
    sim.raise_("x")
    assert "it raised on a (2 times), b" in explain(sim.state, "x")
    assert sim.place() == [(b, "x")]  # fewest failures first: b failed once, a twice
    sim.finish("x")
    assert sim.done() == ["x"]
    assert sim.state.raised_on == {} and sim.state.retried == {}


def test_a_retry_runs_where_it_raised_when_no_other_worker_has_room(
    sim: RecordingCluster,
) -> None:
    a = sim.add_worker("a")
    b = sim.add_worker("b")
    sim.submit("x", retries=1)
    sim.submit("long")
    assert sim.place() == [(a, "x"), (b, "long")]
    sim.raise_("x")
    assert sim.place() == [(a, "x")]  # b's one thread is busy, unknown work is not queued
    assert _cause(sim, "x") == (
        "assigned to a, where it raised once before: no worker where it raised less "
        "often could take it now"
    )
    sim.raise_("x")
    assert [e.key for e in sim.got(TaskErred)] == ["x"]
    assert sim.got(TaskErred)[-1].attempts == 2
    sim.finish("long")
    assert sim.done() == ["long"]


def test_a_resource_retry_goes_to_another_worker_where_it_fits(sim: RecordingCluster) -> None:
    g1 = sim.add_worker("g1", resources="GPU=1")
    g2 = sim.add_worker("g2", resources="GPU=1")
    sim.submit("train", resources="GPU=1", retries=2)
    assert sim.place() == [(g1, "train")]
    sim.raise_("train")
    assert sim.free(g1) == {"GPU": 1.0}
    assert sim.place() == [(g2, "train")]
    assert _cause(sim, "train") == "assigned to g2, not where it raised before (g1)"
    sim.raise_("train")
    # Its other worker is taken now: the retry waits for none, it runs where it may.
    sim.submit("other", resources="GPU=1")
    assert sim.place() == [(g1, "train"), (g2, "other")]
    sim.finish("train")
    sim.finish("other")
    assert sorted(sim.done()) == ["other", "train"]


def test_the_preference_outranks_input_locality(sim: RecordingCluster) -> None:
    a = sim.add_worker("a")
    b = sim.add_worker("b")
    sim.submit("data")
    assert sim.place() == [(a, "data")]
    sim.finish("data", nbytes=10_000_000)
    sim.submit("use", deps=["data"], retries=1)
    assert sim.place() == [(a, "use")]  # where its input is
    sim.raise_("use")
    assert sim.place() == [(b, "use")]
    sim.finish("use")
    assert sorted(sim.done()) == ["data", "use"]


def test_the_memory_of_failures_goes_with_the_task(sim: RecordingCluster) -> None:
    sim.add_worker("a")
    sim.submit("x", retries=3)
    sim.place()
    sim.raise_("x")
    assert sim.state_of("x") == QUEUED and sim.state.raised_on == {"x": ["w1"]}
    sim.client_says("c1", ReleaseKeys(["x"]))
    assert sim.state.tasks == {} and sim.state.raised_on == {}


@pytest.fixture
def stealing_sim(make_sim: Callable[..., RecordingCluster]) -> RecordingCluster:
    return make_sim(answers_steals=False)


def test_an_idle_worker_it_raised_on_does_not_take_it_back(
    stealing_sim: RecordingCluster,
) -> None:
    sim = stealing_sim
    busy = sim.add_worker("busy")
    spare = sim.add_worker("spare")
    sim.measured("short-r", 0.001)
    sim.measured("blocker", 0.001)
    sim.submit("blocker")
    sim.submit("short-r", retries=1)
    assert sim.place() == [(busy, "blocker"), (spare, "short-r")]
    sim.raise_("short-r")
    assert sim.place() == [(busy, "short-r")]  # queued behind the blocker, away from spare
    sim.now = 5.0  # the blocker runs far past its millisecond; spare idles
    sim.handle(Tick(5.0))
    assert sim.worker_got(busy, StealRequest) == []
    sim.finish("blocker")
    sim.finish("short-r")
    assert sorted(sim.done()) == ["blocker", "short-r"]
