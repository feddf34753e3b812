"""The execution pool's thread rows (``TaskRunner``, without a worker service): each
outcome says which of the worker's threads ran it, ``0 .. nthreads-1``, and a task
that secedes moves off those rows for the thread that replaces it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from apportion import rejoin, secede
from apportion.core.allocation import NOTHING
from apportion.core.payload import dumps_function, function_id, pack_call
from apportion.worker.events import Execute
from apportion.worker.execution import Finished, Outcome, TaskRunner

#: How long a task waits for its partner before the test fails rather than hangs.
WAIT = 5.0


class Pool:
    """A ``TaskRunner`` whose outcomes the test waits for on its own event loop."""

    def __init__(self, nthreads: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.outcomes: list[Outcome] = []
        self._want = 0
        self._enough: asyncio.Future[None] | None = None
        # What the runner asks of its worker when a task secedes or rejoins: the
        # state machine is not here, so nothing waits for the scheduler.
        worker = SimpleNamespace(
            units={}, post_from_thread=lambda make: None, wait_to_rejoin=lambda key: None
        )
        self.runner = TaskRunner(nthreads, {}, self._deliver, self.loop, worker)

    def _deliver(self, batch: list[Outcome]) -> None:
        self.outcomes.extend(batch)
        enough = self._enough
        if enough is not None and not enough.done() and len(self.outcomes) >= self._want:
            enough.set_result(None)

    def submit(self, key: str, func: Callable[..., Any], *args: Any) -> None:
        blob = dumps_function(func)
        self.runner.functions.add(function_id(blob), blob)
        packed, _ = pack_call(args, {})
        self.runner.submit(Execute(key, function_id(blob), packed, (), NOTHING), {})

    def rows(self, count: int) -> dict[str, int]:
        """Wait until ``count`` outcomes came in all; the row of each, by key."""
        if len(self.outcomes) < count:
            self._want = count
            self._enough = self.loop.create_future()
            self.loop.run_until_complete(asyncio.wait_for(self._enough, WAIT))
        return {o.key: o.thread for o in self.outcomes}

    def values(self) -> dict[str, Any]:
        return {o.key: o.value for o in self.outcomes if isinstance(o, Finished)}

    def close(self) -> None:
        self.runner.close()
        self.loop.close()


@pytest.fixture
def pool(request: pytest.FixtureRequest) -> Iterator[Pool]:
    p = Pool(request.param)
    try:
        yield p
    finally:
        p.close()


#: Shared with the tasks, which run in this process (functions pickle by reference).
BARRIER = threading.Barrier(2, timeout=WAIT)
CHILD_STARTED = threading.Event()
PARENT_REJOINED = threading.Event()
CHILD_THREAD: list[threading.Thread] = []


def meet() -> str:
    """Return only once the other task called too: both run at the same time."""
    BARRIER.wait()
    return threading.current_thread().name


def parent() -> str:
    secede()
    assert CHILD_STARTED.wait(WAIT)
    rejoin()
    PARENT_REJOINED.set()
    # Back on a thread that counts, the pool has one thread too many: the child's
    # leaves once its task returns; this one stays, and takes the row it freed.
    CHILD_THREAD[0].join(WAIT)
    assert not CHILD_THREAD[0].is_alive()
    return threading.current_thread().name


def child() -> str:
    CHILD_THREAD.append(threading.current_thread())
    CHILD_STARTED.set()
    assert PARENT_REJOINED.wait(WAIT)
    return threading.current_thread().name


def whose_thread() -> str:
    return threading.current_thread().name


@pytest.mark.timeout(10)
@pytest.mark.parametrize("pool", [2], indirect=True)
def test_two_tasks_running_at_once_report_different_threads(pool: Pool) -> None:
    BARRIER.reset()
    pool.submit("a", meet)
    pool.submit("b", meet)
    rows = pool.rows(2)
    assert sorted(rows.values()) == [0, 1]
    assert len(set(pool.values().values())) == 2  # two threads indeed
    # A thread keeps its row: one more task runs on one of the same two.
    pool.submit("c", whose_thread)
    assert pool.rows(3)["c"] in (0, 1)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("pool", [1], indirect=True)
def test_a_seceded_task_moves_off_the_pool_rows_and_its_thread_comes_back_to_them(
    pool: Pool,
) -> None:
    CHILD_STARTED.clear()
    PARENT_REJOINED.clear()
    CHILD_THREAD.clear()
    pool.submit("parent", parent)
    pool.submit("child", child)  # runs on the thread started when the parent seceded
    rows = pool.rows(2)
    assert rows == {"parent": 1, "child": 0}
    # The parent's thread is the only one left: it runs the next task, on row 0.
    pool.submit("next", whose_thread)
    assert pool.rows(3)["next"] == 0
    values = pool.values()
    assert values["next"] == values["parent"] != values["child"]
