"""The type of each result reaches the clients that want it (``Future.type``).

The scheduler keeps it as the plain text its worker sent, once per task group,
with the rare result of another type named apart, and never imports anything.
"""

from __future__ import annotations

from apportion.protocol.tasks import KeysDone, KeysPending, ReleaseKeys
from apportion.testing import RecordingCluster


def test_keys_done_names_each_results_type(sim: RecordingCluster) -> None:
    sim.add_worker(nthreads=4)
    for key in ("inc-1", "inc-2", "inc-3"):
        sim.submit(key)
    sim.place()
    sim.finish("inc-1", type_name="int")
    sim.finish("inc-2", type_name="NoneType")
    sim.finish("inc-3", type_name="int")
    sent = sim.got(KeysDone)
    assert [(m.keys, m.types) for m in sent] == [
        (["inc-1"], ["int"]),
        (["inc-2"], ["NoneType"]),
        (["inc-3"], ["int"]),
    ]
    # Kept once for the group; only the odd one is named apart.
    assert sim.state.tasks["inc-1"].group is not None
    assert sim.state.tasks["inc-1"].group.result_type == "int"
    assert sim.state.result_types == {"inc-2": "NoneType"}
    sim.client_says("c1", ReleaseKeys(["inc-2"]))
    assert sim.freed("w1") == ["inc-2"]
    assert sim.state.result_types == {}
    assert sim.state.result_type("inc-2") == ""


def test_a_client_that_wants_a_finished_key_later_is_told_its_type(
    sim: RecordingCluster,
) -> None:
    sim.add_worker()
    sim.add_client("c2")
    sim.submit("frame-1")
    sim.place()
    sim.finish("frame-1", type_name="pandas.core.frame.DataFrame")
    assert sim.got(KeysDone)[-1].types == ["pandas.core.frame.DataFrame"]
    sim.submit("frame-1", client="c2")
    (told,) = sim.got(KeysDone, "c2")
    assert (told.keys, told.types) == (["frame-1"], ["pandas.core.frame.DataFrame"])


def test_a_recomputed_result_of_another_type_replaces_the_old_one(
    sim: RecordingCluster,
) -> None:
    w = sim.add_worker(nthreads=2)
    sim.submit("x-1")
    sim.submit("x-2")
    sim.place()
    sim.finish("x-1", type_name="int")
    sim.finish("x-2", type_name="str")
    assert sim.state.result_types == {"x-2": "str"}
    sim.remove_worker(w)  # both results are lost and computed again
    assert sim.state.result_types == {}
    w2 = sim.add_worker(nthreads=2)
    assert sorted(k for _, k in sim.place()) == ["x-1", "x-2"]
    sim.finish("x-2", type_name="int")
    assert sim.state.result_type("x-2") == "int" and sim.state.result_types == {}
    sim.finish("x-1", type_name="float")
    assert sim.state.result_types == {"x-1": "float"}
    assert w2
    sim.allow(KeysDone, KeysPending)
