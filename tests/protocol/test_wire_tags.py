"""Wire tags are part of the protocol: each message states its own, and this pins them.

A message keeps its tag wherever its class is defined, so moving a class between
modules changes nothing on the wire; renumbering one fails here. A new message takes
a new tag (the next free number) and bumps ``PROTOCOL_VERSION`` with its line below.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from apportion.protocol.base import PROTOCOL_VERSION, Message, message, registered
from apportion.protocol.handshake import Hello, Refused, Welcome
from apportion.protocol.homes import HOME_OF, HOMES

#: Message name -> tag, as on the wire of ``PROTOCOL_VERSION`` 20.
TAGS = {
    "Hello": 1,
    "Welcome": 2,
    "Refused": 3,
    "AuthHello": 4,
    "AuthChallenge": 5,
    "AuthProof": 6,
    "LendBuffers": 7,
    "BuffersReturned": 8,
    "SubmitTasks": 9,
    "ReleaseKeys": 10,
    "CancelKeys": 11,
    "GatherRequest": 12,
    "ScatterRequest": 13,
    "WhoHasRequest": 14,
    "WhyRequest": 15,
    "InfoRequest": 16,
    "StoryRequest": 17,
    "KeysDone": 18,
    "TaskErred": 19,
    "KeysFailed": 20,
    "GatherReply": 21,
    "ScatterReply": 22,
    "WhoHasReply": 23,
    "WhyReply": 24,
    "InfoReply": 25,
    "StoryReply": 26,
    "Notice": 27,
    "RegisterWorker": 28,
    "TaskFinished": 29,
    "TaskRaised": 30,
    "ResultTooLarge": 31,
    "MissingDependency": 32,
    "DataReply": 33,
    "DataStored": 34,
    "LoadFunction": 35,
    "ComputeTask": 36,
    "FreeKeys": 37,
    "Prefetch": 38,
    "DropPrefetch": 39,
    "GetData": 40,
    "PutData": 41,
    "TasksDropped": 42,
    "StealRequest": 43,
    "StealResponse": 44,
    "CopiesKept": 45,
    "ScatterPlaced": 46,
    "WorkerClosing": 47,
    "KeysPending": 48,
    "Heartbeat": 49,
    "WorkerDraining": 50,
    "DrainDone": 51,
    "WorkerDied": 52,
    "DumpRequest": 53,
    "DumpReply": 54,
    "RunStarted": 55,
    "RunOutput": 56,
    "RunEnded": 57,
    "SubmitRuns": 58,
    "RunsSubmitted": 59,
    "CheckDemands": 60,
    "DemandsChecked": 61,
    "QueryRuns": 62,
    "CancelRuns": 63,
    "RunsReport": 64,
    "CallOnWorkers": 65,
    "InstallOnWorkers": 66,
    "UninstallFromWorkers": 67,
    "WorkersAnswered": 68,
    "RemoteCall": 69,
    "Install": 70,
    "Uninstall": 71,
    "CallAnswered": 72,
    "VersionsRequest": 73,
    "VersionsReply": 74,
    "LogsRequest": 75,
    "LogsReply": 76,
    "PublishDataset": 77,
    "UnpublishDataset": 78,
    "DatasetRequest": 79,
    "DatasetReply": 80,
    "SharedDataAck": 81,
    "SetMetadata": 82,
    "MetadataRequest": 83,
    "MetadataReply": 84,
    "ClusterFactsRequest": 85,
    "ClusterFactsReply": 86,
    "RetryKeys": 87,
    "ReplicateKeys": 88,
    "RebalanceKeys": 89,
    "CopiesDone": 90,
    "RestartRequest": 91,
    "RestartReply": 92,
    "RestartWorker": 93,
    "TaskNote": 94,
    "TaskNoted": 95,
    "RegisterService": 96,
    "ForwardedRequest": 97,
    "ForwardedReply": 98,
    "TasksStillRunning": 99,
    "AdoptTask": 100,
    "StopTasks": 101,
    "WorkerDeparted": 102,
    "Unserved": 103,
    "TaskSeceded": 104,
    "TaskRejoining": 105,
    "RejoinGranted": 106,
    "ActorCall": 107,
    "ActorReply": 108,
    "LeaseRequest": 109,
    "RefreshLeases": 110,
    "EventRequest": 111,
    "CoordinationReply": 112,
    "ValueRequest": 113,
    "ValueReply": 114,
    "Subscribe": 115,
    "Unsubscribe": 116,
    "Publish": 117,
    "TopicMessage": 118,
    "FireAndForget": 119,
    "BacklogRequest": 120,
    "BacklogReply": 121,
    "StatusRequest": 122,
    "StatusReply": 123,
    "RecipeRequest": 124,
    "TaskRecipe": 125,
    "NbytesRequest": 126,
    "NbytesReply": 127,
    "AddPerson": 128,
    "PersonAdded": 129,
    "RemovePerson": 130,
    "PersonRemoved": 131,
    "ListPeople": 132,
    "PeopleListed": 133,
    "NotPermitted": 134,
    "CancelPersonRuns": 135,
    "TaskPreempted": 136,
    "InterruptTasks": 137,
    "HeartbeatInterval": 138,
}


def test_every_message_keeps_its_tag() -> None:
    assert {cls.__name__: tag for tag, cls in registered().items()} == TAGS
    assert PROTOCOL_VERSION == 20


def _import_graph_tool() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "tools" / "import_graph.py"
    spec = importlib.util.spec_from_file_location("import_graph", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    return module


def _defining_modules() -> set[str]:
    tool = _import_graph_tool()
    return {
        tool.module_name(path)
        for path in tool.SRC.rglob("*.py")
        if re.search(r"^@message\(", path.read_text(), re.M)
    }


def test_each_tag_names_the_module_defining_its_message() -> None:
    defining = _defining_modules()
    for module in defining:
        importlib.import_module(module)
    assert "apportion.runs.messages" in defining
    assert set(HOMES) == defining
    assert {tag: cls.__module__ for tag, cls in registered().items()} == HOME_OF
    assert len(HOME_OF) == sum(len(tags) for tags in HOMES.values())  # no tag twice


def test_whatever_decodes_knows_every_tag_from_nothing() -> None:
    # A fresh process that loaded only the codec decodes every message: each tag's
    # module loads the first time the tag arrives, the job queue's too.
    program = (
        "import sys\n"
        "from apportion.protocol.codec import decode_message\n"
        "before = {m for m in sys.modules if m.startswith('apportion')}\n"
        "from apportion.protocol.base import message_class\n"
        f"tags = {sorted(TAGS.values())!r}\n"
        "names = [message_class(tag).__name__ for tag in tags]\n"
        "assert 'apportion.runs.messages' not in before, before\n"
        "print(','.join(names))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    by_tag = {tag: name for name, tag in TAGS.items()}
    assert done.stdout.strip().split(",") == [by_tag[tag] for tag in sorted(by_tag)]


def test_the_handshake_tags_never_change() -> None:
    # A peer of another version must still read Hello, Welcome and Refused, to be
    # told in words that the versions differ.
    assert (Hello.TAG, Welcome.TAG, Refused.TAG) == (1, 2, 3)


def test_a_tag_taken_twice_fails_at_import() -> None:
    with pytest.raises(ValueError, match="message tag 1 of Again is taken by Hello"):

        @message(1)
        class Again(Message):
            text: str

    assert registered()[1] is Hello


def test_a_name_taken_twice_fails_at_import() -> None:
    free = max(registered()) + 1
    with pytest.raises(ValueError, match="two messages are named Hello"):

        @message(free)
        class Hello(Message):  # type: ignore[no-redef]
            text: str

    assert free not in registered()


@pytest.mark.parametrize("tag", [0, -3, "7", 2.0, True])
def test_a_tag_is_a_positive_int(tag: object) -> None:
    with pytest.raises(TypeError, match="a message tag is a positive int"):
        message(tag)  # type: ignore[arg-type]
