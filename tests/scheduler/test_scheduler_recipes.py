"""A task's recipe handed back unopened (``recreate_*_locally``), the failure's origin
found through failed inputs, and the sizes of results (``nbytes``): pure scheduler
tests on a recording cluster."""

from __future__ import annotations

from apportion.protocol.cluster import NbytesReply, NbytesRequest
from apportion.protocol.peer_data import DataStored, PutData
from apportion.protocol.tasks import (
    KeysDone,
    RecipeRequest,
    ScatterReply,
    ScatterRequest,
    SubmitTasks,
    TaskErred,
    TaskRecipe,
    TaskSpec,
)
from apportion.scheduler.records import ERRED, MEMORY, RELEASED
from apportion.testing import RecordingCluster


def chain(sim: RecordingCluster) -> None:
    """a -> b -> c, only c wanted; b raises."""
    sim.add_worker("w", nthreads=1)
    specs = [
        TaskSpec("a", "fa", b"args-a", [], {}, 0, 0),
        TaskSpec("b", "fb", b"args-b", ["a"], {}, 0, 0),
        TaskSpec("c", "fc", b"args-c", ["b"], {}, 0, 0),
    ]
    sim.client_says("c1", SubmitTasks(specs, {"fa": b"A", "fb": b"B", "fc": b"C"}, ["c"]))
    sim.place()
    sim.finish("a", nbytes=28)
    sim.place()
    sim.raise_("b", exception=b"ZeroDivisionError")
    sim.got(TaskErred)
    assert sim.freed("w1") == ["a"]  # no unfinished task needs it: released


def test_the_recipe_of_a_failure_is_the_input_whose_own_run_raised(
    sim: RecordingCluster,
) -> None:
    chain(sim)
    assert (sim.state_of("a"), sim.state_of("b"), sim.state_of("c")) == (RELEASED, ERRED, ERRED)

    sim.client_says("c1", RecipeRequest(5, ["c"], 1))

    (recipe,) = sim.got(TaskRecipe)
    # The bytes as the client sent them: the scheduler never opened them.
    assert recipe == TaskRecipe(5, "b", b"B", b"args-b", ["a"], "")


def test_a_recipe_asked_for_by_key_is_that_task_s_whatever_its_state(
    sim: RecordingCluster,
) -> None:
    chain(sim)
    sim.client_says("c1", RecipeRequest(6, ["c"], 0), RecipeRequest(7, ["a"], 0))
    assert sim.got(TaskRecipe) == [
        TaskRecipe(6, "c", b"C", b"args-c", ["b"], ""),
        TaskRecipe(7, "a", b"A", b"args-a", [], ""),  # released, its recipe kept
    ]


def test_a_recipe_the_scheduler_cannot_give_says_why(sim: RecordingCluster) -> None:
    w = sim.add_worker("w", nthreads=1)
    sim.client_says("c1", ScatterRequest(1, {"d": b"data"}))
    (put,) = sim.worker_got(w, PutData)
    sim.worker_says(w, DataStored(put.request_id, ["d"], {"d": 4}))
    assert sim.got(ScatterReply) == [ScatterReply(1, ["d"])]
    assert sim.done() == ["d"]
    sim.client_says(
        "c1",
        RecipeRequest(2, ["gone"], 0),
        RecipeRequest(3, ["gone"], 1),
        RecipeRequest(4, ["d"], 0),
    )
    unknown, forgotten, scattered = sim.got(TaskRecipe)
    assert (unknown.key, unknown.function, unknown.deps) == ("", b"", [])
    assert "does not know 'gone'" in unknown.problem
    assert "no longer knows the failed tasks ['gone']" in forgotten.problem
    assert scattered.key == "d" and "scattered data, not a task" in scattered.problem


def test_nbytes_of_every_result_in_memory_or_of_the_keys_asked(sim: RecordingCluster) -> None:
    sim.add_worker("w", nthreads=2)
    sim.submit("x")
    sim.submit("y")
    sim.submit("z", deps=["x"])
    sim.place()
    sim.finish("x", nbytes=28)
    sim.finish("y", nbytes=100)
    assert sim.state_of("x") == MEMORY and sim.state_of("z") != MEMORY
    sim.got(KeysDone)

    sim.client_says(
        "c1",
        NbytesRequest(1, [], 1),
        NbytesRequest(2, ["y", "z", "unknown"], 0),
    )

    assert sim.got(NbytesReply) == [
        NbytesReply(1, {"x": 28, "y": 100}),
        NbytesReply(2, {"y": 100}),  # z has no result yet; an unknown key has none
    ]
