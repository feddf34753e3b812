"""The state machine's commands as wire messages (``scheduler/wire.py``)."""

from __future__ import annotations

from typing import get_args

from apportion.core.allocation import Allocation
from apportion.protocol import messages as m
from apportion.scheduler import wire
from apportion.scheduler.events import (
    AssignTask,
    Installation,
    PeerCommand,
    RemoteInstall,
    TaskFailed,
    TasksFailed,
)


def test_every_command_has_a_message() -> None:
    assert set(get_args(PeerCommand)) == set(wire._CONVERTERS)


def test_an_assignment_carries_its_allocation() -> None:
    allocation = Allocation({"GPU": 1000}, {"GPU": ["1"]}, 0)
    who_has = {"d": ["tcp://a:1"]}
    command = AssignTask("w1", "k", "f", b"args", who_has, 3, allocation, {"d": 64}, 7)
    assert wire.to_wire(command) == (
        "w1",
        m.ComputeTask("k", "f", b"args", who_has, 3, allocation, {"d": 64}, 7),
    )


def test_a_raised_task_fails_with_its_exception_and_a_lost_one_with_a_text() -> None:
    raised = TaskFailed("c1", "k", ("exception", b"exc", b"tb"), 2)
    assert wire.to_wire(raised) == ("c1", m.TaskErred("k", b"exc", b"tb", 2))
    lost = TaskFailed("c1", "k", ("lost", "gone", b""), 1)
    assert wire.to_wire(lost) == ("c1", m.KeysFailed(["k"], "lost", "gone"))
    several = TasksFailed("c1", ["a", "b"], "cancelled", "restarted")
    assert wire.to_wire(several) == ("c1", m.KeysFailed(["a", "b"], "cancelled", "restarted"))


def test_an_installation_replayed_to_a_joining_worker_asks_no_answer() -> None:
    command = RemoteInstall("w2", m.NO_REPLY, Installation("upload", "mod.py", b"x = 1", 1))
    assert wire.to_wire(command) == ("w2", m.Install(m.NO_REPLY, "upload", "mod.py", b"x = 1", 1))
