"""Wire messages and frames: every message round-trips; garbage is a ProtocolError."""

from __future__ import annotations

import dataclasses
import itertools
import re

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.core.allocation import Allocation
from apportion.net.address import DEFAULT_PORT, format_address, parse_address
from apportion.protocol.base import PROTOCOL_VERSION, Message, message_class
from apportion.protocol.cluster import (
    BacklogReply,
    BacklogRequest,
    CheckDemands,
    ClusterFactsReply,
    ClusterFactsRequest,
    DemandsChecked,
    DumpReply,
    DumpRequest,
    InfoReply,
    InfoRequest,
    LogsReply,
    LogsRequest,
    NbytesReply,
    NbytesRequest,
    RestartReply,
    RestartRequest,
    StatusReply,
    StatusRequest,
    StoryReply,
    StoryRequest,
    VersionsReply,
    VersionsRequest,
    WhyReply,
    WhyRequest,
)
from apportion.protocol.codec import (
    BUFFER_LENGTH,
    HEADER,
    LENT,
    MAX_BODY,
    MAX_BUFFERS,
    MAX_FRAME,
    MAX_HANDSHAKE_FRAME,
    ProtocolError,
    buffer_lengths,
    decode_body,
    decode_frame,
    encode_frame,
    frame_sizes,
)
from apportion.protocol.coordination import (
    NO_TIMEOUT,
    CoordinationReply,
    EventRequest,
    LeaseRequest,
    Publish,
    RefreshLeases,
    Subscribe,
    TopicMessage,
    Unsubscribe,
    ValueReply,
    ValueRequest,
)
from apportion.protocol.handshake import (
    AuthChallenge,
    AuthHello,
    AuthProof,
    BuffersReturned,
    Hello,
    LendBuffers,
    Refused,
    Welcome,
)
from apportion.protocol.peer_data import (
    ActorCall,
    ActorReply,
    DataReply,
    DataStored,
    GetData,
    PutData,
)
from apportion.protocol.people import (
    AddPerson,
    ListPeople,
    NotPermitted,
    PeopleListed,
    PersonAdded,
    PersonRemoved,
    RemovePerson,
)
from apportion.protocol.remote_calls import (
    CallAnswered,
    CallOnWorkers,
    Install,
    InstallOnWorkers,
    RemoteCall,
    Uninstall,
    UninstallFromWorkers,
    WorkersAnswered,
)
from apportion.protocol.services import (
    AdoptTask,
    ForwardedReply,
    ForwardedRequest,
    RegisterService,
    StopTasks,
    TaskNote,
    TaskNoted,
    TasksStillRunning,
    Unserved,
    WorkerDeparted,
)
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
    CancelKeys,
    FireAndForget,
    GatherReply,
    GatherRequest,
    KeysDone,
    KeysFailed,
    KeysPending,
    Notice,
    RecipeRequest,
    ReleaseKeys,
    RetryKeys,
    ScatterPlaced,
    ScatterReply,
    ScatterRequest,
    SubmitTasks,
    TaskErred,
    TaskPreempted,
    TaskRecipe,
    TaskSpec,
    WhoHasReply,
    WhoHasRequest,
)
from apportion.protocol.worker import (
    ComputeTask,
    CopiesKept,
    DrainDone,
    DropPrefetch,
    FreeKeys,
    Heartbeat,
    HeartbeatInterval,
    InterruptTasks,
    LoadFunction,
    MissingDependency,
    Prefetch,
    RegisterWorker,
    RejoinGranted,
    RestartWorker,
    ResultTooLarge,
    StealRequest,
    StealResponse,
    TaskFinished,
    TaskRaised,
    TaskRejoining,
    TasksDropped,
    TaskSeceded,
    WorkerClosing,
    WorkerDied,
    WorkerDraining,
)
from apportion.runs.messages import (
    CancelPersonRuns,
    CancelRuns,
    QueryRuns,
    RunEnded,
    RunOutput,
    RunsReport,
    RunsSubmitted,
    RunStarted,
    SubmitRuns,
)


def _whole(frame: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(frame)


def _body(frame: list[bytes | bytearray | memoryview]) -> bytes:
    """The msgpack body of a frame without payloads."""
    (head,) = frame
    return bytes(head[HEADER.size :])


SPEC = TaskSpec("x-1", "fid", b"\x80args", ["a", "b"], {"GPU": 10_000}, 3, 2)

SAMPLES: list[Message] = [
    Hello(PROTOCOL_VERSION, "client", "alice"),
    Welcome(PROTOCOL_VERSION, "c7", {"scheduler": "s", "n": 1}),
    Refused("bad token"),
    SubmitTasks(
        [SPEC, TaskSpec("y", "fid", b"", [], {}, 0, 0, actor=1, preemptible=1)],
        {"fid": b"fn"},
        ["x-1"],
    ),
    ReleaseKeys(["x-1"]),
    CancelKeys(["x-1", "y"]),
    GatherRequest(1, ["x-1"]),
    ScatterRequest(2, {"d": b"\x00\x01"}),
    WhoHasRequest(3, ["d"]),
    WhyRequest(4, ["x-1"]),
    InfoRequest(5),
    StoryRequest(6, "x-1"),
    KeysDone(["x-1"]),
    TaskErred("x-1", b"exc", b"tb", 3),
    Heartbeat(2, 2**30),
    Heartbeat(1, 2**30, 2**20, 1),
    WorkerDraining(30.0),
    DrainDone(3),
    WorkerDied("w-0", 123, "was killed by SIGKILL"),
    WorkerDied("w-0", 124, "was killed by its supervisor: ... - out of memory", 1),
    DumpRequest(4),
    DumpReply(4, {"workers": {}}),
    KeysFailed(["x-1"], "cancelled", "'x-1' was cancelled"),
    GatherReply(1, {"x-1": b"v"}, ["y"], {"z": "cannot pickle"}),
    ScatterReply(2, ["d"]),
    WhoHasReply(3, {"d": ["tcp://h:1"]}),
    WhyReply(4, {"x-1": "queued"}),
    InfoReply(5, {"workers": {"tcp://h:1": {"nthreads": 2}}}),
    StoryReply(6, [[0.5, "x-1", "new", "queued", "submitted"]]),
    Notice("warning", "nobody offers GPU"),
    RegisterWorker("w", "tcp://h:1", 4, {"GPU": 20_000}, 123, 2**33, {}, 99, ["run-7"]),
    TaskFinished("x-1", 8, 0.25, "int"),
    TaskRaised("x-1", b"exc", b"tb", 0.5),
    ResultTooLarge("x-1", 400 * 2**20, "numpy.ndarray", 300 * 2**20, 285 * 2**20, 0.5),
    MissingDependency("x-1", "a", ["tcp://h:1"], ""),
    DataReply(7, {"a": b"1"}, [], {}),
    DataStored(8, ["d"], {"d": 2}),
    LoadFunction("fid", b"fn"),
    ComputeTask(
        "x-1",
        "fid",
        b"args",
        {"a": ["tcp://h:1"]},
        3,
        Allocation({"gpu": 10_000}, {"gpu": ["1"]}, 1),
    ),
    FreeKeys(["a"]),
    InterruptTasks(["run-7"]),
    HeartbeatInterval(5.0),
    GetData(9, ["a"]),
    GetData(9, ["a", "b"], in_parts=True),
    Prefetch({"a": ["tcp://127.0.0.1:1"], "b": []}),
    DropPrefetch(["a"]),
    PutData(10, {"d": b"\xff"}),
    TasksDropped(["x-1"]),
    StealRequest(["x-1", "x-2"]),
    StealResponse(["x-1"], ["x-2"]),
    CopiesKept(["x-1"]),
    ScatterPlaced(11, {"d": ["tcp://h:1", 4]}),
    WorkerClosing("shutting down"),
    KeysPending(["x-1"]),
    TaskPreempted("run-7", "w1", "preempted for share 'bob'"),
    RunStarted(7, 4242, "gpu=[0] foo=5"),
    RunOutput(7, 128, b"Run 7 start\n"),
    RunEnded(7, 0, 0, "completed", "exit code 0"),
    TaskNote("run-7", b"\x91\x93\x01\x02\x03", 1),
    TaskNoted("run-7", "w1", b"note"),
    RegisterService(["SubmitRuns", "QueryRuns"], "run-"),
    ForwardedRequest("peer-3", b"request"),
    ForwardedReply("peer-3", b"reply"),
    TasksStillRunning("peer-2", "w1", ["run-7", "run-8"], {"run-7": "queued"}),
    AdoptTask(
        "peer-2", TaskSpec("run-7", "f1", b"args", [], {"gpu": 10_000}, 0, 1), {}, {"gpu": ["1"]}
    ),
    StopTasks("peer-2", ["run-8"]),
    WorkerDeparted("w1"),
    Unserved("SubmitRuns"),
    SubmitRuns(12, [{"command": ["true"], "cwd": "/", "env": {}, "resources": ""}]),
    RunsSubmitted(12, [7, 8], ""),
    RunsSubmitted(12, [7], "", [["unsatisfiable", "no connected worker can ever provide it"]]),
    CheckDemands(18, [{"GPU": 10_000}, {}]),
    DemandsChecked(18, [["", ""], ["no workers", "no worker is connected yet"]]),
    QueryRuns(13, [7]),
    CancelRuns(14, [7]),
    RunsReport(13, [{"id": 7, "state": "running"}]),
    # code run on workers outside tasks
    CallOnWorkers(15, b"call", ["w", "tcp://h:1"]),
    InstallOnWorkers(16, "upload", "mod.py", b"X = 1", 1, 1),
    UninstallFromWorkers(17, "plugin-a"),
    WorkersAnswered(15, {"tcp://h:1": ["ok", b"v", b""]}, ""),
    RemoteCall(3, b"call"),
    Install(4, "plugin", "plugin-a", b"p", 0),
    Uninstall(5, "plugin-a"),
    CallAnswered(3, "error", b"exc", b"tb"),
    VersionsRequest(18),
    VersionsReply(18, {"packages": {"python": "3.11.2"}}),
    LogsRequest(19, 0),
    LogsReply(19, [["WARNING", "something"]]),
    # --- shared data: datasets, metadata, who has what, retry, replicate, rebalance ---
    PublishDataset(20, "x", b"\x80pickle", ["a"], 0),
    UnpublishDataset(21, ["x"]),
    DatasetRequest(22, "x"),
    DatasetReply(22, 1, b"\x80pickle", ["a"], ["x"]),
    SharedDataAck(21, ""),
    SetMetadata(23, ["x", "y"], {"z": [1, 2.5, "s"]}),
    MetadataRequest(24, ["x"]),
    MetadataReply(24, 1, {"y": 1}),
    ClusterFactsRequest(25),
    ClusterFactsReply(25, {"a": ["tcp://w:1"]}, {"tcp://w:1": ["a"]}, {"tcp://w:1": 2}, {}),
    RetryKeys(["a"]),
    ReplicateKeys(26, ["a"], 0, []),
    RebalanceKeys(27, [], 1, ["tcp://w:1"]),
    CopiesDone(26, 1, 0),
    # --- cluster lifecycle (restart) ---
    RestartRequest(15, "Client.restart"),
    RestartReply(15, 3, ["plain"]),
    RestartWorker("the cluster was restarted"),
    LendBuffers(1 << 20),
    BuffersReturned(2),
    # --- tasks that wait on other tasks ---
    TaskSeceded("fib-9", False),
    TaskRejoining("fib-9"),
    RejoinGranted(["fib-9", "fib-8"]),
    ActorCall(20, "counter-1", "increment", b"\x80\x05N.", False),
    ActorReply(20, b"\x80\x05K\x01.", b"", b""),
    # --- coordination ---
    LeaseRequest(7, "acquire", "semaphore", ["db"], "l-1", 1, 2, 1.5, 30.0),
    RefreshLeases(["l-1", "l-2"]),
    EventRequest(8, "wait", "go", NO_TIMEOUT),
    CoordinationReply(8, 1, 0, ""),
    ValueRequest(9, "put", "queue", "q", [b"\x80item"], ["x-1"], 1, 10, 0.0),
    ValueReply(9, [b"\x80item"], ["x-1"], 3, 0, ""),
    Subscribe(10, "news"),
    Unsubscribe("news"),
    Publish("news", b"\x80msg"),
    TopicMessage("news", b"\x80msg"),
    FireAndForget(["x-1"]),
    AuthHello(b"n" * 32),
    AuthChallenge(b"s" * 32, b"p" * 32),
    AuthProof(b"p" * 32),
    BacklogRequest(7),
    BacklogReply(
        7,
        [{"options": [{"gpu": 10_000}], "count": 3, "restricted": False}],
        [{"name": "w", "address": "tcp://10.0.0.1:4000", "running": 0, "leaving": False}],
    ),
    StatusRequest(8, 120, 3, 5_000),
    StatusReply(8, {"version": 1, "tasks": {"queued": 2}, "stream": {"seq": 0, "items": []}}),
    RecipeRequest(9, ["x-1", "y"], 1),
    TaskRecipe(9, "x-1", b"fn", b"\x80args", ["a"], ""),
    NbytesRequest(10, [], 1),
    NbytesReply(10, {"x-1": 28}),
    AddPerson(11, "alice", 2.0, "gpu=2"),
    PersonAdded(11, "alice", "person:alice:secret", "", "/home/o/.apportion/runs-people.json"),
    RemovePerson(12, "alice"),
    PersonRemoved(12, "alice", "", 3, 1),
    ListPeople(13),
    PeopleListed(13, [{"name": "alice", "weight": 2.0, "quota": "gpu=2", "clients": 1}]),
    NotPermitted(14, "only the cluster's owner may send RestartRequest"),
    CancelPersonRuns(15, "alice"),
    AuthHello(b"n" * 32, "alice"),
    ForwardedRequest("peer-3", b"request", "alice"),
]


def _all_classes() -> list[type[Message]]:
    out = []
    for tag in itertools.count(1):
        cls = message_class(tag)
        if cls is None:
            return out
        out.append(cls)
    raise AssertionError("unreachable")


def test_samples_cover_every_message_class() -> None:
    assert {type(s) for s in SAMPLES} == set(_all_classes())


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_each_message_round_trips(msg: Message) -> None:
    frame = _whole(encode_frame([msg]))
    body, count = frame_sizes(frame[: HEADER.size], MAX_FRAME)
    assert count == 0 and body == len(frame) - HEADER.size
    (back,) = decode_frame(frame)
    assert type(back) is type(msg)
    assert back == msg


def test_one_frame_carries_many_messages_in_order() -> None:
    assert decode_frame(_whole(encode_frame(SAMPLES))) == SAMPLES


def test_submit_tasks_decodes_task_specs() -> None:
    (back,) = decode_frame(_whole(encode_frame([SAMPLES[3]])))
    assert isinstance(back, SubmitTasks)
    assert all(isinstance(t, TaskSpec) for t in back.tasks)
    assert back.tasks[0].resources == {"GPU": 10_000}


def test_tags_are_unique_and_stable() -> None:
    classes = _all_classes()
    assert [c.TAG for c in classes] == list(range(1, len(classes) + 1))
    assert message_class(0) is None
    assert message_class(len(classes) + 1) is None


def test_empty_frame() -> None:
    assert decode_frame(_whole(encode_frame([]))) == []


# --- garbage ------------------------------------------------------------------------


def _pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"", "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
        (_pack([1]) + b"\x00", "not valid msgpack"),
        (_pack({"a": 1}), "list of messages"),
        (_pack(3), "list of messages"),
        (_pack([3]), r"\[tag, fields"),
        (_pack([[]]), r"\[tag, fields"),
        (_pack([["Hello", 1]]), r"\[tag, fields"),
        (_pack([[10_000, 1]]), "unknown message tag 10000"),
        (_pack([[-1]]), "unknown message tag -1"),
        (_pack([[Refused.TAG]]), "Refused takes 1 fields, got 0"),
        (_pack([[Refused.TAG, "a", "b"]]), "Refused takes 1 fields, got 2"),
        (_pack([[SubmitTasks.TAG, [1], {}, []]]), "SubmitTasks.tasks has the wrong type"),
        (_pack([[SubmitTasks.TAG, [["k"]], {}, []]]), "SubmitTasks.tasks has the wrong type"),
        (_pack([[SubmitTasks.TAG, None, {}, []]]), "SubmitTasks.tasks has the wrong type"),
        (_pack([KeysDone(["a"]).to_wire(), [999]]), "unknown message tag 999"),
    ],
)
def test_garbage_bodies_raise_protocol_error(body: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_body(body)


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_error(body: bytes) -> None:
    try:
        out = decode_body(body)
    except ProtocolError:
        return
    assert all(isinstance(msg, Message) for msg in out)


_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5)
_value = st.recursive(
    _leaf | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=10,
)


@settings(max_examples=50)
@given(
    st.lists(
        st.tuples(st.integers(-2, len(SAMPLES) + 2), st.lists(_value, max_size=8)),
        max_size=4,
    )
)
def test_wrongly_shaped_messages_raise_only_protocol_error(
    items: list[tuple[int, list[object]]],
) -> None:
    """Known tags with fields of any type and count: decoded or refused, never a crash."""
    body = _pack([[tag, *fields] for tag, fields in items])
    try:
        out = decode_body(body)
    except ProtocolError:
        return
    assert len(out) == len(items)


def test_frame_sizes_refuse_huge_announcements() -> None:
    with pytest.raises(ProtocolError, match=str(MAX_FRAME)):
        frame_sizes(HEADER.pack(MAX_FRAME, 0), MAX_FRAME - 1)
    big = HEADER.pack(MAX_HANDSHAKE_FRAME + 1, 0)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        frame_sizes(big, MAX_HANDSHAKE_FRAME)
    many_buffers = HEADER.pack(0, MAX_HANDSHAKE_FRAME)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        frame_sizes(many_buffers, MAX_HANDSHAKE_FRAME)


def test_frame_sizes_accept_up_to_the_limit() -> None:
    limit = MAX_HANDSHAKE_FRAME
    assert frame_sizes(HEADER.pack(limit, 0), limit) == (limit, 0)
    assert frame_sizes(HEADER.pack(0, 0), limit) == (0, 0)


def test_a_real_hello_fits_the_handshake_limit() -> None:
    frame = encode_frame([Hello(PROTOCOL_VERSION, "worker", "x" * 200)])
    body, count = frame_sizes(frame[0][: HEADER.size], MAX_HANDSHAKE_FRAME)
    assert count == 0 and body < MAX_HANDSHAKE_FRAME


# --- addresses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tcp://h:1", ("h", 1)),
        ("h:1", ("h", 1)),
        ("h", ("h", DEFAULT_PORT)),
        ("tcp://h", ("h", DEFAULT_PORT)),
        ("  scheduler:8786 ", ("scheduler", 8786)),
        ("[::1]:8786", ("::1", 8786)),
        ("tcp://[::1]:9000", ("::1", 9000)),
        ("[::1]", ("::1", DEFAULT_PORT)),
        ("10.0.0.1:0", ("10.0.0.1", 0)),
        ("h:65535", ("h", 65535)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


def test_parse_address_default_port_is_a_parameter() -> None:
    assert parse_address("h", default_port=1234) == ("h", 1234)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("h:abc", "the port 'abc' is not a number"),
        ("h:65536", "the port 65536 is not in 0-65535"),
        ("h:99999", "the port 99999 is not in 0-65535"),
        ("h:-1", "the port '-1' is not a number"),
        ("[::1]:x", "the port 'x' is not a number"),
        ("udp://h:1", "the scheme 'udp://' is not supported"),
        ("tls://h:x", "the port 'x' is not a number"),
        ("http://h:8786", "the scheme 'http://' is not supported"),
        (":8786", "no host"),
        ("tcp://", "no host"),
        ("", "it is empty"),
        ("h:8786/status", "the port '8786/status' is not a number"),
        ("tcp://h h:1", "'h h' is not a host name"),
        ("::1:8786", "an IPv6 host goes in brackets"),
    ],
)
def test_parse_address_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        parse_address(text)
    # One line naming the address as written and every accepted form.
    assert "\n" not in str(info.value)
    assert repr(text) in str(info.value)
    assert "tcp://host:port, tls://host:port, host:port or host" in str(info.value)


@pytest.mark.parametrize(("host", "port"), [("h", 1), ("::1", 8786), ("10.0.0.1", 80)])
def test_format_address_round_trips(host: str, port: int) -> None:
    assert parse_address(format_address(host, port)) == (host, port)


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ([ReleaseKeys.TAG, [1, 2]], "ReleaseKeys.keys"),
        ([ReleaseKeys.TAG, [["nested"]]], "ReleaseKeys.keys"),
        ([TaskFinished.TAG, "k", "many", 0.1, "int", 0], "TaskFinished.nbytes"),
        ([TaskFinished.TAG, "k", True, 0.1, "int", 0], "TaskFinished.nbytes"),
        ([CancelKeys.TAG, "not-a-list"], "CancelKeys.keys"),
        ([SubmitTasks.TAG, [["k", "f", b"", [], {"GPU": "1"}, 0, 0, []]], {}, []], "tasks"),
        (
            [SubmitTasks.TAG, [["k", "f", b"", [], {}, 0, 0, [], [], 0, 0, "", 0]], {}, [("x", 1)]],
            "wanted",
        ),
        (
            [SubmitTasks.TAG, [["k", "f", b"", [], {}, 0, 0, [], ["a"], True, 0, "", 0]], {}, []],
            "tasks",
        ),
        (
            [SubmitTasks.TAG, [["k", "f", b"", [], {}, 0, 0, [], [], 0, "yes", "", 0]], {}, []],
            "tasks",
        ),
        ([SubmitTasks.TAG, [["k", "f", b"", [], {}, 0, 0, [], [], 0, 0, 7, 0]], {}, []], "tasks"),
        # One dict or record field checked alone (no column of one): keys, values,
        # a record's width and each of its fields.
        ([ComputeTask.TAG, "k", "f", b"", {"d": "w"}, 0, [{}, {}, 0], {}, 0], "who_has"),
        ([ComputeTask.TAG, "k", "f", b"", {1: ["w"]}, 0, [{}, {}, 0], {}, 0], "who_has"),
        ([ComputeTask.TAG, "k", "f", b"", [], 0, [{}, {}, 0], {}, 0], "who_has"),
        ([ComputeTask.TAG, "k", "f", b"", {}, 0, [{}, {}], {}, 0], "allocation"),
        ([ComputeTask.TAG, "k", "f", b"", {}, 0, [{"G": "1"}, {}, 0], {}, 0], "allocation"),
        ([ComputeTask.TAG, "k", "f", b"", {}, 0, [{}, {}, "0"], {}, 0], "allocation"),
        ([ComputeTask.TAG, "k", "f", b"", {}, 0, "alloc", {}, 0], "allocation"),
        ([ComputeTask.TAG, "k", "f", b"", {}, 0, [{}, {}, 0], {"d": 1.5}, 0], "sizes"),
    ],
)
def test_fields_of_the_wrong_type_are_protocol_errors(message: list[object], field: str) -> None:
    body = msgpack.packb([message], use_bin_type=True)
    with pytest.raises(ProtocolError, match=re.escape(field)):
        decode_body(body)


# --- frame limits -------------------------------------------------------------------


def _listing(*lengths: int) -> bytes:
    return b"".join(BUFFER_LENGTH.pack(n) for n in lengths)


def test_limits_after_authentication_are_large_but_finite() -> None:
    assert MAX_BODY == 1 << 30
    assert MAX_BUFFERS == 1_000_000
    assert MAX_FRAME == 64 << 30
    assert MAX_HANDSHAKE_FRAME == 64 * 1024


def test_a_body_over_max_body_is_refused_naming_the_limit_and_the_figures() -> None:
    assert frame_sizes(HEADER.pack(MAX_BODY, 0)) == (MAX_BODY, 0)
    with pytest.raises(ProtocolError, match=f"body of {MAX_BODY + 1} bytes .* {MAX_BODY}"):
        frame_sizes(HEADER.pack(MAX_BODY + 1, 0))


def test_more_buffers_than_max_buffers_are_refused_naming_the_limit_and_the_figures() -> None:
    assert frame_sizes(HEADER.pack(0, MAX_BUFFERS)) == (0, MAX_BUFFERS)
    with pytest.raises(ProtocolError, match=f"{MAX_BUFFERS + 1} buffers .* {MAX_BUFFERS}"):
        frame_sizes(HEADER.pack(0, MAX_BUFFERS + 1))
    with pytest.raises(ProtocolError, match="buffers"):
        frame_sizes(HEADER.pack(0, 2**32 - 1))


def test_buffers_over_max_frame_in_all_are_refused_lent_ones_included() -> None:
    head = HEADER.size  # stands for a body of this many bytes
    room = MAX_FRAME - head - 2 * BUFFER_LENGTH.size
    assert buffer_lengths(_listing(room - 5, 5), 2, head) == ([room - 5, 5], ())
    with pytest.raises(ProtocolError, match=f"frame of {MAX_FRAME + 1} bytes .*{MAX_FRAME}"):
        buffer_lengths(_listing(room - 5, 6), 2, head)
    # A lent buffer is received into memory of its own as well: it counts.
    with pytest.raises(ProtocolError, match="whole frame"):
        buffer_lengths(_listing(room | LENT, 1), 2, head)
    lengths, lent = buffer_lengths(_listing(room | LENT, 0), 2, head)
    assert lengths == [room, 0] and lent == (0,)


def test_the_handshake_limit_still_counts_body_and_buffer_lengths() -> None:
    with pytest.raises(ProtocolError, match=str(MAX_HANDSHAKE_FRAME)):
        buffer_lengths(_listing(MAX_HANDSHAKE_FRAME), 1, 0, MAX_HANDSHAKE_FRAME)
    assert frame_sizes(HEADER.pack(MAX_HANDSHAKE_FRAME - 8, 1), MAX_HANDSHAKE_FRAME) == (
        MAX_HANDSHAKE_FRAME - 8,
        1,
    )


@pytest.mark.parametrize("size", [0, 1, HEADER.size - 1, HEADER.size + 1])
def test_a_header_of_the_wrong_size_is_a_protocol_error(size: int) -> None:
    with pytest.raises(ProtocolError, match="header"):
        frame_sizes(bytes(size))


@pytest.mark.parametrize("listed", [b"", b"\x00" * 7, b"\x00" * 9, b"\x00" * 24])
def test_a_listing_of_the_wrong_size_is_a_protocol_error(listed: bytes) -> None:
    with pytest.raises(ProtocolError, match="announces 2 buffers"):
        buffer_lengths(listed, 2, 0)


def test_a_whole_frame_over_the_limit_is_refused_by_decode_frame() -> None:
    frame = _whole(encode_frame([ReleaseKeys(["x" * 100])]))
    assert decode_frame(frame, len(frame))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode_frame(frame, len(frame) - HEADER.size - 1)


_SMALL = st.integers(0, 64)
_HEADERS = st.one_of(
    st.binary(max_size=2 * HEADER.size),
    st.builds(HEADER.pack, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)),
    st.builds(HEADER.pack, _SMALL, st.integers(0, 8)),
)
_LENGTHS = st.one_of(_SMALL, st.integers(0, 2**64 - 1), _SMALL.map(lambda n: n | LENT))
_LISTINGS = st.one_of(
    st.binary(max_size=80), st.lists(_LENGTHS, max_size=8).map(lambda ns: _listing(*ns))
)


@settings(max_examples=500, deadline=None)
@given(
    header=_HEADERS,
    listed=_LISTINGS,
    limit=st.one_of(st.integers(0, 256), st.just(MAX_FRAME), st.just(MAX_HANDSHAKE_FRAME)),
    max_body=st.one_of(st.integers(0, 128), st.just(MAX_BODY)),
    max_buffers=st.one_of(st.integers(0, 8), st.just(MAX_BUFFERS)),
)
def test_no_header_passes_the_limits_or_raises_anything_but_a_protocol_error(
    header: bytes, listed: bytes, limit: int, max_body: int, max_buffers: int
) -> None:
    """Whatever bytes a peer sends as a frame's head, what is accepted fits every limit."""
    try:
        body, count = frame_sizes(header, limit, max_body=max_body, max_buffers=max_buffers)
        assert 0 <= body <= max_body and 0 <= count <= max_buffers
        assert body + count * BUFFER_LENGTH.size <= limit
        lengths, lent = buffer_lengths(listed[: count * BUFFER_LENGTH.size], count, body, limit)
    except ProtocolError:
        return
    assert len(lengths) == count and all(0 <= n < LENT for n in lengths)
    assert set(lent) <= set(range(count))
    assert body + count * BUFFER_LENGTH.size + sum(lengths) <= limit


def test_messages_compare_show_and_hash_by_their_fields_and_stay_frozen() -> None:
    # Shared by every message (not made per class: a worker's start builds ~140).
    beat = Heartbeat(2, 2**30)
    assert beat == Heartbeat(2, 2**30) and hash(beat) == hash(Heartbeat(2, 2**30))
    assert beat != Heartbeat(3, 2**30)
    assert FreeKeys(["a"]) != ["a"] and FreeKeys(["a"]) == FreeKeys(["a"])
    assert repr(FreeKeys(["a"])) == "FreeKeys(keys=['a'])"
    with pytest.raises(dataclasses.FrozenInstanceError):
        beat.executing = 4  # type: ignore[misc]
