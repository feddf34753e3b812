"""Locks, semaphores, multi-locks, events, variables, queues, topics and fire-and-forget
in the scheduler's state machine: no sockets, time passed in by ``Tick``.

Every test ends with ``check_invariants`` and ``check_all_taken``: an answer the test
did not expect fails it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import pytest

from apportion.core.payload import Pickled
from apportion.protocol.base import Message
from apportion.protocol.cluster import RestartReply, RestartRequest
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
from apportion.protocol.tasks import (
    FireAndForget,
    KeysDone,
    KeysFailed,
    KeysPending,
    Notice,
    ReleaseKeys,
    TaskErred,
)
from apportion.protocol.worker import FreeKeys, TaskFinished
from apportion.scheduler.events import Tick
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import ERRED, FORGOTTEN, MEMORY
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import RecordingCluster

M = TypeVar("M", bound=Message)
NEVER = NO_TIMEOUT


@pytest.fixture
def sim() -> Iterator[RecordingCluster]:
    """A cluster with clients "c1", "c2" and "c3"; checked after the test."""
    cluster = RecordingCluster(SchedulerConfig())
    for client in ("c1", "c2", "c3"):
        cluster.add_client(client)
    yield cluster
    check_invariants(cluster.state)
    cluster.check_all_taken()


def take(sim: RecordingCluster, kind: type[M], client: str = "c1") -> list[M]:
    """The messages of ``kind`` sent to ``client`` since the last ``take``; takes them."""
    found = sim.got(kind, client)
    sim.inbox[client] = [msg for msg in sim.inbox[client] if not isinstance(msg, kind)]
    return found


def done(sim: RecordingCluster, client: str = "c1") -> list[str]:
    """Keys reported finished to ``client`` since the last call."""
    return [key for msg in take(sim, KeysDone, client) for key in msg.keys]


def freed(sim: RecordingCluster, worker: str) -> list[str]:
    """Keys the worker was told to free since the last call."""
    found = sim.worker_got(worker, FreeKeys)
    sim.to_workers[worker] = [
        msg for msg in sim.to_workers[worker] if not isinstance(msg, FreeKeys)
    ]
    return [key for msg in found for key in msg.keys]


def answers(sim: RecordingCluster, client: str = "c1") -> list[tuple[int, int, str]]:
    """(request id, ok, error) of each ``CoordinationReply`` since the last call."""
    return [(r.request_id, r.ok, r.error) for r in take(sim, CoordinationReply, client)]


def tick(sim: RecordingCluster, now: float) -> None:
    sim.now = now
    sim.handle(Tick(now))


def acquire(
    sim: RecordingCluster,
    client: str,
    rid: int,
    *names: str,
    timeout: float = NEVER,
    max_leases: int = 1,
    kind: str = "semaphore",
    count: int = 1,
    lease_timeout: float = 0.0,
    lease: str = "",
) -> None:
    lease_id = lease or f"{client}-{rid}"
    msg = LeaseRequest(
        rid, "acquire", kind, list(names), lease_id, count, max_leases, timeout, lease_timeout
    )
    sim.client_says(client, msg)


def release(
    sim: RecordingCluster, client: str, rid: int, name: str, lease: str, kind: str = "semaphore"
) -> None:
    sim.client_says(client, LeaseRequest(rid, "release", kind, [name], lease, 0, 1, 0.0, 0.0))


def value(sim: RecordingCluster, name: str, client: str = "c1") -> int:
    sim.client_says(client, LeaseRequest(99, "value", "semaphore", [name], "", 0, 0, 0.0, 0.0))
    (reply,) = take(sim, CoordinationReply, client)
    return reply.value


# --- semaphores and locks -------------------------------------------------------------


def test_a_semaphore_grants_max_leases_then_first_come_first_served(
    sim: RecordingCluster,
) -> None:
    acquire(sim, "c1", 1, "db", max_leases=2)
    acquire(sim, "c2", 2, "db", max_leases=2)
    acquire(sim, "c3", 3, "db", max_leases=2)
    acquire(sim, "c1", 4, "db", max_leases=2)
    assert answers(sim, "c1") == [(1, 1, "")] and answers(sim, "c2") == [(2, 1, "")]
    assert answers(sim, "c3") == [] and value(sim, "db") == 2
    release(sim, "c2", 5, "db", "c2-2")
    assert answers(sim, "c2") == [(5, 1, "")]
    assert answers(sim, "c3") == [(3, 1, "")] and answers(sim, "c1") == []  # c3 came first
    release(sim, "c1", 6, "db", "c1-1")
    assert answers(sim, "c1") == [(4, 1, ""), (6, 1, "")]  # its lease passed to itself


def test_an_acquire_times_out_at_its_deadline_on_a_tick(sim: RecordingCluster) -> None:
    acquire(sim, "c1", 1, "lock")
    acquire(sim, "c2", 2, "lock", timeout=5.0)
    assert answers(sim, "c1") == [(1, 1, "")] and answers(sim, "c2") == []
    tick(sim, 4.9)
    assert answers(sim, "c2") == []
    tick(sim, 5.0)
    assert answers(sim, "c2") == [(2, 0, "")]  # not granted, and gone from the queue
    release(sim, "c1", 3, "lock", "c1-1")
    assert answers(sim, "c1") == [(3, 1, "")] and answers(sim, "c2") == []
    assert sim.state.coordination.pools["semaphore"] == {}  # nothing kept for an idle lock


def test_a_non_blocking_acquire_is_answered_at_once(sim: RecordingCluster) -> None:
    acquire(sim, "c1", 1, "lock", timeout=0)
    acquire(sim, "c2", 2, "lock", timeout=0)
    assert answers(sim, "c1") == [(1, 1, "")] and answers(sim, "c2") == [(2, 0, "")]


def test_a_crashed_holder_releases_and_its_waiters_are_dropped(sim: RecordingCluster) -> None:
    acquire(sim, "c1", 1, "lock")
    acquire(sim, "c2", 2, "lock")
    acquire(sim, "c3", 3, "lock")
    assert answers(sim, "c1") == [(1, 1, "")]
    sim.remove_client("c2")  # a waiter leaves: never answered, never granted
    sim.remove_client("c1")  # the holder crashes
    assert answers(sim, "c3") == [(3, 1, "")]
    assert not any(
        w.client_id == "c2"
        for p in sim.state.coordination.pools["semaphore"].values()
        for w in p.queue
    )


def test_a_lease_not_refreshed_expires_and_the_next_waiter_gets_it(sim: RecordingCluster) -> None:
    acquire(sim, "c1", 1, "db", lease_timeout=2.0)
    acquire(sim, "c2", 2, "db", lease_timeout=2.0)
    assert answers(sim, "c1") == [(1, 1, "")]
    sim.now = 1.5
    sim.client_says("c1", RefreshLeases(["c1-1", "unknown-lease"]))
    tick(sim, 3.0)  # 1.5 s since the refresh: alive
    assert answers(sim, "c2") == []
    tick(sim, 3.6)  # 2.1 s since: the holder is stuck
    (notice,) = take(sim, Notice, "c1")
    assert "expired" in notice.text and "'db'" in notice.text
    assert answers(sim, "c2") == [(2, 1, "")]
    assert any("expired" in log.text for log in sim.logs)
    release(sim, "c1", 3, "db", "c1-1")  # the stuck holder wakes up and releases
    ((rid, ok, error),) = answers(sim, "c1")
    assert (rid, ok) == (3, 0) and "expired" in error
    assert value(sim, "db", "c2") == 1  # c2's lease is untouched


def test_a_lease_without_timeout_never_expires(sim: RecordingCluster) -> None:
    acquire(sim, "c1", 1, "db", lease_timeout=0.0)
    tick(sim, 10_000.0)
    assert answers(sim, "c1") == [(1, 1, "")] and value(sim, "db") == 1


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (LeaseRequest(1, "acquire", "mutex", ["x"], "l", 1, 1, -1.0, 0.0), "unknown kind"),
        (LeaseRequest(1, "steal", "semaphore", ["x"], "l", 1, 1, -1.0, 0.0), "operation"),
        (LeaseRequest(1, "acquire", "semaphore", [], "l", 1, 1, -1.0, 0.0), "needs a name"),
        (LeaseRequest(1, "acquire", "semaphore", ["x", "y"], "l", 1, 1, -1, 0.0), "one name"),
        (LeaseRequest(1, "acquire", "multilock", ["x", "x"], "l", 2, 1, -1, 0.0), "twice"),
        (LeaseRequest(1, "acquire", "multilock", ["x"], "l", 2, 1, -1.0, 0.0), "cannot take"),
        (LeaseRequest(1, "acquire", "semaphore", ["x"], "l", 1, 0, -1.0, 0.0), "at least 1"),
        (LeaseRequest(1, "acquire", "semaphore", ["x"], "", 1, 1, -1.0, 0.0), "lease id"),
        (LeaseRequest(1, "acquire", "semaphore", ["x"], "l", 1, 1, -1.0, -2.0), "timeout"),
        (LeaseRequest(1, "release", "semaphore", ["nope"], "l", 0, 1, 0.0, 0.0), "no lease"),
    ],
)
def test_a_malformed_lease_request_gets_a_clear_error(
    sim: RecordingCluster, msg: LeaseRequest, error: str
) -> None:
    sim.client_says("c1", msg)
    ((rid, ok, text),) = answers(sim)
    assert (rid, ok) == (1, 0) and error in text
    acquire(sim, "c1", 2, "x")  # and the scheduler goes on
    assert answers(sim) == [(2, 1, "")]


def test_semaphore_users_must_agree_on_max_leases_and_on_who_releases(
    sim: RecordingCluster,
) -> None:
    acquire(sim, "c1", 1, "db", max_leases=2)
    acquire(sim, "c2", 2, "db", max_leases=3)
    assert answers(sim, "c1") == [(1, 1, "")]
    ((_, ok, error),) = answers(sim, "c2")
    assert not ok and error == "Inconsistent max leases for 'db': 3, expected: 2"
    release(sim, "c2", 3, "db", "c1-1")  # not its lease
    ((_, ok, error),) = answers(sim, "c2")
    assert not ok and "another client" in error
    acquire(sim, "c1", 1, "db", max_leases=2)  # the same lease asked again: held already
    assert answers(sim, "c1") == [(1, 1, "")] and value(sim, "db") == 1


# --- multi-locks ----------------------------------------------------------------------


def test_multilocks_in_opposite_orders_neither_deadlock_nor_overtake(
    sim: RecordingCluster,
) -> None:
    acquire(sim, "c1", 1, "x", "y", kind="multilock", count=2)
    acquire(sim, "c2", 2, "y", "x", kind="multilock", count=2)
    acquire(sim, "c3", 3, "x", kind="multilock")
    assert answers(sim, "c1") == [(1, 1, "")]
    assert answers(sim, "c2") == [] and answers(sim, "c3") == []
    release(sim, "c1", 4, "x", "c1-1", kind="multilock")
    assert answers(sim, "c1") == [(4, 1, "")]
    assert answers(sim, "c2") == [(2, 1, "")]  # both names at once
    assert answers(sim, "c3") == []  # came after c2, which wanted x too
    release(sim, "c2", 5, "y", "c2-2", kind="multilock")
    assert answers(sim, "c2") == [(5, 1, "")] and answers(sim, "c3") == [(3, 1, "")]


def test_a_waiting_multilock_holds_nothing_and_reserves_its_names(sim: RecordingCluster) -> None:
    acquire(sim, "c1", 1, "y", kind="multilock")
    acquire(sim, "c2", 2, "x", "y", kind="multilock", count=2, timeout=3.0)
    acquire(sim, "c3", 3, "x", kind="multilock")
    # x is free, but c2 asked for it first: c3 waits behind, c2 holds nothing.
    assert answers(sim, "c1") == [(1, 1, "")] and answers(sim, "c3") == []
    assert not sim.state.coordination.pools["multilock"]["x"].holders
    tick(sim, 3.0)
    assert answers(sim, "c2") == [(2, 0, "")]
    assert answers(sim, "c3") == [(3, 1, "")]  # c2 gave up: x is c3's


def test_a_multilock_takes_num_locks_of_its_names(sim: RecordingCluster) -> None:
    acquire(sim, "c1", 1, "b", kind="multilock")
    acquire(sim, "c2", 2, "a", "b", "c", kind="multilock", count=2)
    assert answers(sim, "c1") == [(1, 1, "")] and answers(sim, "c2") == [(2, 1, "")]
    assert sim.state.coordination.leases["c2-2"].names == ("a", "c")
    acquire(sim, "c3", 3, "a", kind="semaphore")  # another namespace: free
    assert answers(sim, "c3") == [(3, 1, "")]


# --- events ---------------------------------------------------------------------------


def event(sim: RecordingCluster, client: str, rid: int, op: str, timeout: float = 0.0) -> None:
    sim.client_says(client, EventRequest(rid, op, "go", timeout))


def test_an_event_wakes_every_waiter_and_a_wait_times_out(sim: RecordingCluster) -> None:
    event(sim, "c1", 1, "wait", NEVER)
    event(sim, "c2", 2, "wait", 2.0)
    event(sim, "c3", 3, "wait", 0.0)
    assert answers(sim, "c3") == [(3, 0, "")]  # not set, not waiting
    tick(sim, 2.0)
    assert answers(sim, "c2") == [(2, 0, "")]
    event(sim, "c3", 4, "set")
    assert answers(sim, "c3") == [(4, 1, "")] and answers(sim, "c1") == [(1, 1, "")]
    event(sim, "c2", 5, "wait", NEVER)
    event(sim, "c2", 6, "is_set")
    assert answers(sim, "c2") == [(5, 1, ""), (6, 1, "")]
    event(sim, "c1", 7, "clear")
    event(sim, "c1", 8, "is_set")
    assert answers(sim, "c1") == [(7, 0, ""), (8, 0, "")]
    assert sim.state.coordination.events == {}  # clear with nobody waiting: forgotten
    event(sim, "c1", 9, "toggle")
    ((_, _, error),) = answers(sim, "c1")
    assert "unknown event operation" in error


def test_an_event_waiter_that_leaves_is_dropped(sim: RecordingCluster) -> None:
    event(sim, "c1", 1, "wait", NEVER)
    sim.remove_client("c1")
    assert sim.state.coordination.events == {}


# --- variables ------------------------------------------------------------------------


def computed(sim: RecordingCluster, *keys: str) -> None:
    """Submit, place and finish each key for c1."""
    for key in keys:
        sim.submit(key)
        sim.place()
        sim.finish(key)
    assert sorted(done(sim)) == sorted(keys)


def values(
    sim: RecordingCluster,
    client: str,
    rid: int,
    op: str,
    *,
    kind: str = "variable",
    name: str = "v",
    item: bytes | None = None,
    keys: tuple[str, ...] = (),
    count: int = 1,
    maxsize: int = 0,
    timeout: float = NEVER,
) -> None:
    items: list[Pickled] = [] if item is None else [item]
    msg = ValueRequest(rid, op, kind, name, items, list(keys), count, maxsize, timeout)
    sim.client_says(client, msg)


def replies(sim: RecordingCluster, client: str = "c1") -> list[ValueReply]:
    return take(sim, ValueReply, client)


def test_a_future_in_a_variable_outlives_its_client_until_replaced(
    sim: RecordingCluster,
) -> None:
    w = sim.add_worker()
    computed(sim, "a", "b")
    values(sim, "c1", 1, "set", item=b"ref-a", keys=("a",))
    assert replies(sim) == [ValueReply(1, [], [], 0, 0, "")]
    sim.remove_client("c1")
    assert sim.state_of("a") == MEMORY  # the variable holds it
    values(sim, "c2", 2, "get")
    assert replies(sim, "c2") == [ValueReply(2, [b"ref-a"], ["a"], 0, 0, "")]
    assert done(sim, "c2") == ["a"]  # c2 wants it now, in the same step
    sim.client_says("c2", ReleaseKeys(["a"]))
    assert sim.state_of("a") == MEMORY
    values(sim, "c3", 3, "set", item=b"plain")
    assert replies(sim, "c3") == [ValueReply(3, [], [], 0, 0, "")]
    assert sim.state_of("a") == FORGOTTEN and freed(sim, w) == ["b", "a"]  # b: c1 left
    assert "variable:v" not in sim.state.clients
    values(sim, "c3", 4, "delete")
    assert replies(sim, "c3") == [ValueReply(4, [], [], 0, 0, "")]
    assert sim.state.coordination.variables == {}


def test_a_get_waits_for_the_variable_to_be_set_or_times_out(sim: RecordingCluster) -> None:
    values(sim, "c1", 1, "get", timeout=NEVER)
    values(sim, "c2", 2, "get", timeout=1.0)
    values(sim, "c3", 3, "get", timeout=0.0)
    assert replies(sim, "c3") == [ValueReply(3, [], [], 0, 1, "")]  # not set: at once
    tick(sim, 1.0)
    assert replies(sim, "c2") == [ValueReply(2, [], [], 0, 1, "")]
    values(sim, "c3", 4, "set", item=b"x")
    assert replies(sim, "c1") == [ValueReply(1, [b"x"], [], 0, 0, "")]
    assert replies(sim, "c3") == [ValueReply(4, [], [], 0, 0, "")]


def test_deleting_a_variable_frees_its_future(sim: RecordingCluster) -> None:
    w = sim.add_worker()
    computed(sim, "a")
    values(sim, "c1", 1, "set", item=b"ref-a", keys=("a",))
    sim.client_says("c1", ReleaseKeys(["a"]))
    values(sim, "c2", 2, "delete")
    assert sim.state_of("a") == FORGOTTEN and freed(sim, w) == ["a"]
    assert len(replies(sim)) == 1 and len(replies(sim, "c2")) == 1


@pytest.mark.parametrize(
    ("kind", "op", "item", "keys", "error"),
    [
        ("dict", "get", None, (), "unknown kind"),
        ("variable", "put", b"x", (), "unknown variable operation"),
        ("queue", "set", b"x", (), "unknown queue operation"),
        ("queue", "put", None, (), "one value"),
        ("variable", "set", b"x", ("never-submitted",), "unknown to the scheduler"),
    ],
)
def test_a_malformed_value_request_gets_a_clear_error(
    sim: RecordingCluster, kind: str, op: str, item: bytes | None, keys: tuple[str, ...], error: str
) -> None:
    values(sim, "c1", 1, op, kind=kind, item=item, keys=keys)
    (reply,) = replies(sim)
    assert error in reply.error
    values(sim, "c1", 2, "set", item=b"ok")  # and the scheduler goes on
    assert replies(sim) == [ValueReply(2, [], [], 0, 0, "")]


# --- queues ---------------------------------------------------------------------------


def test_futures_in_a_queue_stay_until_taken_first_in_first_out(sim: RecordingCluster) -> None:
    w = sim.add_worker()
    computed(sim, "a", "b")
    values(sim, "c1", 1, "put", kind="queue", item=b"ref-a", keys=("a",))
    values(sim, "c1", 2, "put", kind="queue", item=b"ref-a-again", keys=("a",))
    values(sim, "c1", 3, "put", kind="queue", item=b"ref-b", keys=("b",))
    sim.client_says("c1", ReleaseKeys(["a", "b"]))
    assert (sim.state_of("a"), sim.state_of("b")) == (MEMORY, MEMORY)
    values(sim, "c2", 4, "size", kind="queue")
    values(sim, "c2", 5, "get", kind="queue")
    values(sim, "c2", 6, "get", kind="queue")
    assert replies(sim, "c2") == [
        ValueReply(4, [], [], 3, 0, ""),
        ValueReply(5, [b"ref-a"], ["a"], 0, 0, ""),
        ValueReply(6, [b"ref-a-again"], ["a"], 0, 0, ""),
    ]
    assert done(sim, "c2") == ["a", "a"]
    sim.client_says("c2", ReleaseKeys(["a"]))
    assert sim.state_of("a") == FORGOTTEN  # taken twice, released: gone
    values(sim, "c3", 7, "get", kind="queue", count=0)  # batch=True
    assert replies(sim, "c3") == [ValueReply(7, [b"ref-b"], ["b"], 0, 0, "")]
    assert done(sim, "c3") == ["b"]
    sim.client_says("c3", ReleaseKeys(["b"]))
    assert sim.state_of("b") == FORGOTTEN and freed(sim, w) == ["a", "b"]
    assert sim.state.coordination.queues == {} and "queue:v" not in sim.state.clients
    assert len(replies(sim)) == 3


def test_a_full_queue_makes_puts_wait_in_order_or_time_out(sim: RecordingCluster) -> None:
    sim.add_worker()
    computed(sim, "a")
    values(sim, "c1", 1, "put", kind="queue", item=b"1", maxsize=1)
    values(sim, "c2", 2, "put", kind="queue", item=b"2", maxsize=1, timeout=NEVER)
    values(sim, "c3", 3, "put", kind="queue", item=b"ref-a", keys=("a",), maxsize=1, timeout=2.0)
    values(sim, "c3", 4, "put", kind="queue", item=b"4", maxsize=1, timeout=0.0)
    assert replies(sim) == [ValueReply(1, [], [], 0, 0, "")]
    assert replies(sim, "c3") == [ValueReply(4, [], [], 0, 1, "")]  # full: at once
    assert "a" in sim.state.clients["queue:v"].wanted  # held while its put waits
    sim.client_says("c1", ReleaseKeys(["a"]))
    tick(sim, 2.0)
    assert replies(sim, "c3") == [ValueReply(3, [], [], 0, 1, "")]
    assert sim.state_of("a") == FORGOTTEN  # its put gave up: nobody holds it
    values(sim, "c1", 5, "get", kind="queue", maxsize=1)
    assert replies(sim) == [ValueReply(5, [b"1"], [], 0, 0, "")]
    assert replies(sim, "c2") == [ValueReply(2, [], [], 0, 0, "")]  # room: it went in
    values(sim, "c1", 6, "get", kind="queue", maxsize=5)
    ((reply),) = replies(sim)
    assert "Inconsistent maxsize for queue 'v': 5, expected: 1" in reply.error
    sim.allow(FreeKeys)


def test_a_batch_get_waits_for_all_its_items_and_keeps_its_turn(sim: RecordingCluster) -> None:
    values(sim, "c1", 1, "get", kind="queue", count=2, timeout=NEVER)
    values(sim, "c2", 2, "get", kind="queue", count=1, timeout=NEVER)
    values(sim, "c3", 3, "put", kind="queue", item=b"x")
    values(sim, "c3", 4, "get", kind="queue", count=0)  # batch=True: gets waiting go first
    assert replies(sim) == [] and replies(sim, "c2") == []
    assert replies(sim, "c3") == [
        ValueReply(3, [], [], 0, 0, ""),
        ValueReply(4, [], [], 0, 0, ""),
    ]
    values(sim, "c3", 5, "put", kind="queue", item=b"y")
    values(sim, "c3", 6, "put", kind="queue", item=b"z")
    assert replies(sim) == [ValueReply(1, [b"x", b"y"], [], 0, 0, "")]
    assert replies(sim, "c2") == [ValueReply(2, [b"z"], [], 0, 0, "")]
    assert len(replies(sim, "c3")) == 2


def test_a_queue_forgets_the_waiters_and_puts_of_a_client_that_left(
    sim: RecordingCluster,
) -> None:
    sim.add_worker()
    computed(sim, "a")
    values(sim, "c2", 1, "get", kind="queue", count=3, timeout=NEVER)
    values(sim, "c1", 2, "put", kind="queue", item=b"1", maxsize=0)
    values(sim, "c3", 3, "put", kind="queue", item=b"ref-a", keys=("a",))
    sim.client_says("c1", ReleaseKeys(["a"]))
    sim.remove_client("c2")
    values(sim, "c1", 4, "get", kind="queue", count=0)
    assert replies(sim)[-1] == ValueReply(4, [b"1", b"ref-a"], ["a"], 0, 0, "")
    assert done(sim) == ["a"]
    assert len(replies(sim, "c3")) == 1 and sim.state.coordination.queues == {}


# --- topics ---------------------------------------------------------------------------


def test_a_topic_message_goes_once_to_each_client_subscribed_then(sim: RecordingCluster) -> None:
    sim.client_says("c2", Publish("news", b"too early"))
    sim.client_says("c1", Subscribe(1, "news"), Subscribe(2, "news"))
    sim.client_says("c2", Subscribe(3, "news"))
    sim.client_says("c3", Publish("news", b"hello"), Publish("other", b"not for them"))
    assert answers(sim) == [(1, 1, ""), (2, 1, "")] and answers(sim, "c2") == [(3, 1, "")]
    assert take(sim, TopicMessage) == [TopicMessage("news", b"hello")]  # once per client
    assert take(sim, TopicMessage, "c2") == [TopicMessage("news", b"hello")]
    sim.client_says("c1", Unsubscribe("news"))
    sim.client_says("c3", Publish("news", b"again"))
    assert take(sim, TopicMessage) == [TopicMessage("news", b"again")]  # one left
    assert take(sim, TopicMessage, "c2") == [TopicMessage("news", b"again")]
    sim.client_says("c1", Unsubscribe("news"), Unsubscribe("news"))  # once too often
    sim.remove_client("c2")
    assert sim.state.coordination.topics == {}


def test_what_a_task_prints_reaches_subscribers_ahead_of_its_outcome(
    sim: RecordingCluster,
) -> None:
    """A worker publishes what tasks ``print`` (``apportion.print``) on its own
    connection, in the same frame as, and ahead of, the task's outcome."""
    w = sim.add_worker()
    sim.client_says("c1", Subscribe(1, "print"))
    sim.client_says("c2", Subscribe(2, "warn"))
    assert answers(sim) == [(1, 1, "")] and answers(sim, "c2") == [(2, 1, "")]
    sim.submit("chatty")
    sim.place()
    del sim.running[w]["chatty"]
    finished = TaskFinished("chatty", 8, 0.001, "int", 0)
    sim.worker_says(w, Publish("print", b"hello"), finished)
    said = [m for m in sim.got(Message) if isinstance(m, TopicMessage | KeysDone)]
    assert said == [TopicMessage("print", b"hello"), KeysDone(["chatty"], ["int"])]
    assert take(sim, TopicMessage, "c2") == []  # subscribed to "warn" only
    sim.worker_says(w, Publish("warn", b"careful"))
    assert take(sim, TopicMessage, "c2") == [TopicMessage("warn", b"careful")]


# --- fire and forget ------------------------------------------------------------------


def test_fire_and_forget_runs_a_task_nobody_wants_then_frees_it(sim: RecordingCluster) -> None:
    w = sim.add_worker()
    sim.submit("write-file")
    sim.client_says("c1", FireAndForget(["write-file"]))
    sim.remove_client("c1")
    assert [key for _, key in sim.place()] == ["write-file"]
    sim.finish("write-file")
    assert sim.state_of("write-file") == FORGOTTEN and freed(sim, w) == ["write-file"]
    assert "fire-and-forget" not in sim.state.clients


def test_fire_and_forget_lets_failed_and_finished_tasks_go(sim: RecordingCluster) -> None:
    sim.add_worker()
    sim.submit("boom")
    sim.place()
    sim.client_says("c1", FireAndForget(["boom"]), ReleaseKeys(["boom"]))
    sim.raise_("boom")
    assert sim.state_of("boom") == FORGOTTEN
    computed(sim, "done-already")
    sim.client_says("c1", FireAndForget(["done-already"]))
    assert sim.state_of("done-already") == MEMORY  # c1 still wants it
    sim.client_says("c1", ReleaseKeys(["done-already"]))
    assert sim.state_of("done-already") == FORGOTTEN
    sim.client_says("c1", FireAndForget([]), FireAndForget(["never-submitted"]))
    assert "fire-and-forget" not in sim.state.clients  # an unknown key is let go at once
    sim.allow(FreeKeys)


def test_a_failed_future_in_a_variable_stays_failed_for_its_readers(
    sim: RecordingCluster,
) -> None:
    sim.add_worker()
    sim.submit("boom")
    sim.place()
    sim.raise_("boom")
    assert [msg.key for msg in take(sim, TaskErred)] == ["boom"]
    values(sim, "c1", 1, "set", item=b"ref", keys=("boom",))
    sim.client_says("c1", ReleaseKeys(["boom"]))
    assert sim.state_of("boom") == ERRED
    values(sim, "c2", 2, "get")
    assert [msg.key for msg in take(sim, TaskErred, "c2")] == ["boom"]
    assert len(replies(sim)) == 1 and len(replies(sim, "c2")) == 1


# --- restart --------------------------------------------------------------------------


def test_a_restart_drops_values_that_refer_to_results(sim: RecordingCluster) -> None:
    sim.add_worker()
    computed(sim, "a")
    values(sim, "c1", 1, "set", item=b"ref-a", keys=("a",))
    values(sim, "c1", 2, "set", name="plain", item=b"1")
    values(sim, "c1", 3, "put", kind="queue", name="q", item=b"ref-a", keys=("a",))
    values(sim, "c1", 4, "put", kind="queue", name="q", item=b"2")
    sim.client_says("c1", FireAndForget(["a"]))
    sim.client_says("c1", RestartRequest(5, ""))
    book = sim.state.coordination
    assert list(book.variables) == ["plain"] and [i for i, _ in book.queues["q"].items] == [b"2"]
    assert book.owners == set() and not [c for c in sim.state.clients if ":" in c]
    assert len(replies(sim)) == 4
    assert take(sim, KeysFailed)[0].keys == ["a"]
    sim.allow(RestartReply, KeysPending)


def test_invariants_hold_after_every_kind_of_request(sim: RecordingCluster) -> None:
    """A smoke check that the invariants themselves see a busy book as consistent."""
    acquire(sim, "c1", 1, "db", max_leases=2, lease_timeout=5.0)
    acquire(sim, "c2", 2, "x", "y", kind="multilock", count=2, timeout=9.0)
    event(sim, "c3", 3, "wait", 4.0)
    values(sim, "c3", 4, "get", name="later", timeout=6.0)
    values(sim, "c2", 5, "get", kind="queue", name="q", timeout=7.0)
    check_invariants(sim.state)
    assert sim.state.coordination.next_due == 4.0
    tick(sim, 100.0)
    check_invariants(sim.state)
    # What waited timed out and the lease with a timeout expired; the multi-lock,
    # granted at once, has none.
    assert list(sim.state.coordination.leases) == ["c2-2"]
    assert sim.state.coordination.next_due == float("inf")
    take(sim, Notice)
    answers(sim)
    answers(sim, "c2")
    answers(sim, "c3")
    replies(sim, "c2")
    replies(sim, "c3")
