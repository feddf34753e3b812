"""The state machine's commands as wire messages (``scheduler/wire.py``)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, get_args, get_type_hints

from apportion.core.allocation import Allocation
from apportion.core.payload import Pickled
from apportion.protocol.remote_calls import NO_REPLY, Install
from apportion.protocol.tasks import KeysFailed, Notice, TaskErred
from apportion.protocol.worker import ComputeTask
from apportion.scheduler import wire
from apportion.scheduler.events import (
    Installation,
    PeerCommand,
    Reply,
    SendComputeTask,
    SendInstall,
    SendKeysFailed,
    failure_notice,
)


def test_every_command_has_a_message() -> None:
    assert set(get_args(PeerCommand)) == set(wire._CONVERTERS)


def test_an_assignment_carries_its_allocation() -> None:
    allocation = Allocation({"GPU": 1000}, {"GPU": ["1"]}, 0)
    who_has = {"d": ["tcp://a:1"]}
    command = SendComputeTask("w1", "k", "f", b"args", who_has, 3, allocation, {"d": 64}, 7)
    assert wire.to_wire(command) == (
        "w1",
        ComputeTask("k", "f", b"args", who_has, 3, allocation, {"d": 64}, 7),
    )


def test_a_raised_task_fails_with_its_exception_and_a_lost_one_with_a_text() -> None:
    raised = failure_notice("c1", "k", ("exception", b"exc", b"tb"), 2)
    assert wire.to_wire(raised) == ("c1", TaskErred("k", b"exc", b"tb", 2))
    lost = failure_notice("c1", "k", ("lost", "gone", b""), 1)
    assert wire.to_wire(lost) == ("c1", KeysFailed(["k"], "lost", "gone"))
    several = SendKeysFailed("c1", ["a", "b"], "cancelled", "restarted")
    assert wire.to_wire(several) == ("c1", KeysFailed(["a", "b"], "cancelled", "restarted"))


def test_an_installation_replayed_to_a_joining_worker_asks_no_answer() -> None:
    command = SendInstall("w2", NO_REPLY, Installation("upload", "mod.py", b"x = 1", 1))
    assert wire.to_wire(command) == ("w2", Install(NO_REPLY, "upload", "mod.py", b"x = 1", 1))


def _sample(command_type: type[Any]) -> Any:
    """One instance of a command, any values of the declared types."""
    values = {
        str: "x",
        int: 1,
        float: 1.5,
        bytes: b"blob",
        list[str]: ["k"],
        dict[str, int]: {"k": 1},
        dict[str, str]: {"k": "memory"},
        dict[str, list[str]]: {"k": ["tcp://a:1"]},
        dict[str, Pickled]: {"k": b"v"},
        Pickled: b"v",
        Allocation: Allocation({}, {}, 0),
        Installation: Installation("upload", "mod.py", b"x = 1", 1),
    }
    hints = get_type_hints(command_type)
    return command_type(*(values[hints[f.name]] for f in fields(command_type)))


def test_each_command_is_named_for_the_message_it_sends() -> None:
    decisions = set(get_args(PeerCommand)) - {Reply}
    assert decisions
    for command_type in decisions:
        _, message = wire.to_wire(_sample(command_type))
        assert command_type.__name__ == f"Send{type(message).__name__}"
    assert wire.to_wire(Reply("c1", Notice("warning", "hi"))) == ("c1", Notice("warning", "hi"))
