"""Coordination primitives as Dask's documentation uses them, with the import changed:
a variable that stops a running task, a queue of futures between tasks and the
client, a lock around a critical section, a semaphore in front of a database, an
event between tasks, Pub/Sub, and fire-and-forget. In memory: real scheduler,
workers and clients in this process, no sockets.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from apportion import (
    Client,
    Event,
    Future,
    Lock,
    MultiLock,
    Pub,
    Queue,
    SchedulerGoneError,
    Semaphore,
    Sub,
    Variable,
    fire_and_forget,
    get_client,
)
from apportion.protocol.coordination import EventRequest, LeaseRequest
from apportion.scheduler.invariants import check_invariants
from apportion.testing import InMemoryCluster
from cli_processes import poll

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster([{"name": "w", "nthreads": 12}]) as cluster:
        yield cluster
        check_invariants(cluster.scheduler.state)


@pytest.fixture
def client(cluster: InMemoryCluster) -> Client:
    return cluster.client()


# --- Variable ---------------------------------------------------------------------------


def run_until_stopped(stop: Variable, started: Event) -> int:
    started.set()
    laps = 0
    while not stop.get():
        laps += 1
        time.sleep(0.01)
    return laps


def test_a_variable_stops_a_running_task(client: Client) -> None:
    stop = Variable("stop")
    stop.set(False)
    started = Event()
    future = client.submit(run_until_stopped, stop, started)
    assert started.wait(timeout=10)
    stop.set(True)
    assert future.result(timeout=10) >= 0


def test_a_future_in_a_variable_outlives_the_client_that_set_it(cluster: InMemoryCluster) -> None:
    first = cluster.client()
    Variable("model", first).set(first.submit(sum, [1, 2, 3]))
    first.close()
    second = cluster.client()
    future = Variable("model", second).get(timeout=10)
    assert isinstance(future, Future) and future.client is second
    assert future.result(timeout=10) == 6
    Variable("model", second).delete()
    with pytest.raises(TimeoutError):
        Variable("model", second).get(timeout=0.1)


# --- Queue ------------------------------------------------------------------------------


def square(x: int) -> int:
    return x * x


def produce(q: Queue, n: int) -> int:
    client = get_client()
    for i in range(n):
        q.put(client.submit(square, i))
    return n


def consume(q: Queue, n: int) -> int:
    return sum(q.get(timeout=10).result(timeout=10) for _ in range(n))


def test_a_queue_passes_futures_between_tasks_and_the_client(
    cluster: InMemoryCluster, client: Client
) -> None:
    q = Queue("work")
    assert client.submit(produce, q, 3).result(timeout=10) == 3
    assert q.qsize() == 3
    assert client.gather([q.get(timeout=5) for _ in range(3)]) == [0, 1, 4]
    for i in range(4):
        q.put(client.submit(square, i))  # the client drops its futures at once
    assert client.submit(consume, q, 4).result(timeout=20) == 0 + 1 + 4 + 9
    q.put("plain")
    q.put({"also": "plain"})
    assert q.get(batch=True) == ["plain", {"also": "plain"}]
    with pytest.raises(TimeoutError):
        q.get(timeout=0.1)
    del q
    poll(lambda: not cluster.scheduler.state.tasks, 10, "every result to be let go")


def test_a_bounded_queue_makes_put_wait(client: Client) -> None:
    q = Queue("bounded", maxsize=1)
    q.put(1)
    with pytest.raises(TimeoutError):
        q.put(2, timeout=0.1)
    assert q.get() == 1 and q.qsize() == 0
    with pytest.raises(ValueError, match="Inconsistent maxsize"):
        q.put(1)
        Queue("bounded", maxsize=5).put(2)


# --- Lock -------------------------------------------------------------------------------


def add_one(i: int, lock: Lock, counter: Variable) -> int:
    with lock:
        value = counter.get()
        time.sleep(0.001)
        counter.set(value + 1)
    return i


def test_a_lock_makes_a_read_modify_write_from_many_tasks_safe(client: Client) -> None:
    counter = Variable("counter")
    counter.set(0)
    lock = Lock("counter-lock")
    futures = client.map(add_one, range(20), lock=lock, counter=counter)
    client.gather(futures)
    assert counter.get() == 20
    assert not lock.locked()


def test_a_lock_is_held_across_clients_and_times_out(cluster: InMemoryCluster) -> None:
    a, b = cluster.client(), cluster.client()
    held = Lock("x", a)
    assert held.acquire()
    started = time.monotonic()
    assert not Lock("x", b).acquire(timeout=0.3)
    assert 0.25 < time.monotonic() - started < 3
    assert not Lock("x", b).acquire(blocking=False)
    assert Lock("x", b).locked()
    held.release()
    with Lock("x", b):
        assert held.locked()
    assert not held.locked()


def test_a_held_lease_is_refreshed_past_its_lease_timeout(client: Client) -> None:
    lock = Lock("kept", lease_timeout=0.4)
    assert lock.acquire()
    time.sleep(1.2)  # three lease timeouts: only refreshes keep it
    assert lock.locked() and not client.notices
    assert lock.release()


# --- Semaphore --------------------------------------------------------------------------


def query_database(i: int, sem: Semaphore) -> tuple[float, float]:
    with sem:
        start = time.monotonic()
        time.sleep(0.05)
        return start, time.monotonic()


def peak(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = best = 0
    for _, delta in edges:  # at the same time, an end (-1) comes before a start
        running += delta
        best = max(best, running)
    return best


def test_a_semaphore_limits_concurrent_access_to_a_database(client: Client) -> None:
    sem = Semaphore(max_leases=2, name="database")
    intervals = client.gather(client.map(query_database, range(10), sem=sem))
    assert peak(intervals) == 2  # 12 threads, yet never more than two at once
    assert sem.get_value() == 0
    with pytest.raises(RuntimeError, match="Released too often"):
        sem.release()


# --- Event ------------------------------------------------------------------------------


def wait_for_go(i: int, go: Event, box: Variable) -> str:
    assert go.wait(timeout=10)
    return str(box.get(timeout=1))


def give_go(go: Event, box: Variable) -> bool:
    box.set("the data is ready")
    go.set()
    return True


def test_an_event_coordinates_tasks(client: Client) -> None:
    go, box = Event("go"), Variable("box")
    waiting = client.map(wait_for_go, range(3), go=go, box=box)
    assert not go.wait(timeout=0.1) and not any(f.done() for f in waiting)
    assert client.submit(give_go, go, box).result(timeout=10)
    assert client.gather(waiting) == ["the data is ready"] * 3
    assert go.is_set()
    go.clear()
    assert not go.is_set() and not go.wait(timeout=0)


# --- Pub/Sub ----------------------------------------------------------------------------


def announce(i: int, topic: str) -> int:
    Pub(topic).put(("hello", i))
    return i


def listen(ready: Event) -> str:
    sub = Sub("to-tasks")
    ready.set()
    return str(sub.get(timeout=10))


def test_pub_sub_between_tasks_and_the_client(client: Client) -> None:
    sub = Sub("news")
    client.gather(client.map(announce, range(5), topic="news"))
    assert sorted(sub.get(timeout=5) for _ in range(5)) == [("hello", i) for i in range(5)]
    with pytest.raises(TimeoutError):
        sub.get(timeout=0.1)
    ready = Event()
    heard = client.submit(listen, ready)
    assert ready.wait(timeout=10)
    Pub("to-tasks").put("hi")
    assert heard.result(timeout=10) == "hi"
    late = Sub("news")  # what was published before it is not delivered to it
    Pub("news").put("later")
    assert next(iter(late)) == "later" and sub.get(timeout=5) == "later"
    assert not late.buffer and not sub.buffer
    with pytest.raises(TypeError, match="futures cannot be published"):
        Pub("news").put(client.submit(square, 2))


def refuse_to_unpickle() -> None:
    raise ValueError("not here")


class Unwelcome:
    """Pickles fine; unpickling it raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        return refuse_to_unpickle, ()


def test_a_message_is_unpickled_by_get_which_says_when_it_cannot_be(client: Client) -> None:
    sub = Sub("odd")
    Pub("odd").put(Unwelcome())
    Pub("odd").put("fine")
    with pytest.raises(RuntimeError, match="published on 'odd' cannot be unpickled here"):
        sub.get(timeout=5)
    assert sub.get(timeout=5) == "fine"  # the next one is still there


# --- fire_and_forget --------------------------------------------------------------------


def write_when_told(path: str, go: Event) -> str:
    assert go.wait(timeout=20)
    Path(path).write_text("written")
    return path


def test_fire_and_forget_runs_a_task_after_its_client_closed(
    cluster: InMemoryCluster, tmp_path: Path
) -> None:
    target = tmp_path / "out.txt"
    first = cluster.client()
    future = first.submit(write_when_told, str(target), Event("closed", first))
    key = future.key
    fire_and_forget(future)
    first.close()  # every future of it is released
    other = cluster.client()
    assert key in cluster.scheduler.state.tasks
    Event("closed", other).set()
    poll(target.exists, 10, "the forgotten task to write its file")
    poll(lambda: key not in cluster.scheduler.state.tasks, 10, "its result to be let go")


# --- errors and pickling ----------------------------------------------------------------


def test_misuse_gets_clear_errors_and_the_scheduler_goes_on(
    cluster: InMemoryCluster, client: Client
) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Semaphore(max_leases=0)
    with pytest.raises(TypeError, match="must be an int"):
        Semaphore(max_leases="2")  # type: ignore[arg-type]
    assert Semaphore(2, "db").acquire()
    with pytest.raises(ValueError, match="Inconsistent max leases"):
        Semaphore(3, "db").acquire()
    with pytest.raises(RuntimeError, match="Released too often"):
        Lock("never-taken").release()
    with pytest.raises(ValueError, match="non-blocking"):
        Lock("x").acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError, match="at least one name"):
        MultiLock([]).acquire()
    with pytest.raises(ValueError, match="not yet acquired"):
        MultiLock(["a"]).release()
    with pytest.raises(ValueError, match="lease timeout"):
        Lock("x", lease_timeout=0)
    unknown = Future("never-submitted", client)
    with pytest.raises(ValueError, match="unknown to the scheduler"):
        Variable("v").set(unknown)
    reply = client._session.call(
        lambda rid: LeaseRequest(rid, "release", "semaphore", ["nope"], "l", 0, 1, 0.0, 0.0)
    )
    assert "no lease 'l' is held on semaphore 'nope'" in reply.error
    # Fields of the wrong type: the scheduler drops that connection, and only that one.
    rogue = cluster.client()
    with pytest.raises(SchedulerGoneError):
        rogue._session.call(lambda rid: EventRequest(rid, "set", ["not", "a", "name"], 0.0))  # type: ignore[arg-type]
    with Lock("still-works", client):
        assert client.submit(square, 3).result(timeout=10) == 9


def test_primitives_pickle_as_their_names() -> None:
    for obj in (
        Lock("l", lease_timeout=5),
        Semaphore(3, "s"),
        MultiLock(["a", "b"]),
        Event("e"),
        Variable("v"),
        Queue("q", maxsize=4),
        Pub("p"),
    ):
        back = pickle.loads(pickle.dumps(obj))
        assert type(back) is type(obj) and repr(back) == repr(obj)
        assert back._client is None  # bound where it is used, as Dask's
    assert pickle.loads(pickle.dumps(Lock("l", lease_timeout=5)))._lease_timeout == 5


def test_primitives_are_awaited_with_an_asynchronous_client(cluster: InMemoryCluster) -> None:
    """Dask's asynchronous form: ``await lock.acquire()``, ``async with lock``."""

    async def main() -> None:
        async with Client(cluster.address, asynchronous=True) as client:
            lock = Lock("async-lock", client=client)
            async with lock:
                assert await lock.locked()
            assert not await lock.locked()
            assert await lock.acquire(blocking=False)
            assert not await Lock("async-lock", client=client).acquire(timeout=0.1)
            await lock.release()
            sem = Semaphore(2, "async-db", client=client)
            assert await sem.acquire()
            assert await sem.get_value() == 1
            await sem.release()
            async with MultiLock(["a", "b"], client=client):
                pass
            queue = Queue("async-q", client=client)
            await queue.put(client.submit(pow, 2, 5))
            assert await queue.qsize() == 1
            assert await (await queue.get()) == 32
            assert await queue.get(batch=0) == []
            variable = Variable("async-v", client=client)
            await variable.set(41)
            assert await variable.get() == 41
            await variable.delete()
            with pytest.raises(TimeoutError):
                await variable.get(timeout=0.1)
            event = Event("async-e", client=client)
            assert not await event.wait(0.05)
            await event.set()
            assert await event.wait(1) and await event.is_set()

    asyncio.run(asyncio.wait_for(main(), 30))
