"""What workers tell the scheduler for its status and dashboard, end to end on an
in-process cluster: the thread that ran each task (the task stream's rows), the
process's CPU use, and the bytes of results moved between workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from apportion import Client
from apportion.testing import InMemoryCluster
from cluster_checks import checked_client

NTHREADS = 2
WORKERS = [{"name": name, "nthreads": NTHREADS, "heartbeat_interval": 0.02} for name in ("a", "b")]
SIZE = 1_000_000

#: Shared with the tasks, which run in this process.
BARRIER = threading.Barrier(2, timeout=10)


def make_bytes(n: int) -> bytes:
    return b"x" * n


def length(value: bytes) -> int:
    return len(value)


def meet(_: int) -> str:
    """Return only once the other task called too: both run at the same time."""
    BARRIER.wait()
    return threading.current_thread().name


def wait_for(client: Client, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The cluster's status once ``ready`` says so: heartbeats come every 20 ms."""
    deadline = time.monotonic() + 10
    while True:
        status = client.cluster_status()
        if ready(status) or time.monotonic() > deadline:
            return status
        time.sleep(0.02)


def by_name(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in status["workers"]}


@pytest.mark.timeout(30)
def test_heartbeats_carry_cpu_and_bytes_moved_and_the_stream_rows_are_threads() -> None:
    BARRIER.reset()
    with InMemoryCluster(WORKERS) as cluster, checked_client(cluster) as client:
        before = by_name(wait_for(client, lambda s: len(s["workers"]) == 2))
        assert [(w["received"], w["sent"]) for w in before.values()] == [(0, 0), (0, 0)]
        assert all(w["cpu"] >= 0.0 for w in before.values())

        # ``x`` lives on b; ``n`` runs on a, which fetches it from b.
        x = client.submit(make_bytes, SIZE, workers=["b"])
        n = client.submit(length, x, workers=["a"])
        assert n.result() == SIZE

        def moved(status: dict[str, Any]) -> bool:
            workers = by_name(status)
            return workers["a"]["received"] > 0 and workers["b"]["sent"] > 0

        status = wait_for(client, moved)
        after = by_name(status)
        # One transfer, counted by both ends: the pickled value, at least its bytes.
        moved_bytes = after["a"]["received"]
        assert moved_bytes == after["b"]["sent"] >= SIZE
        # Neither fetched from the other in the other direction; the client's gather
        # of ``n`` is not a transfer between workers.
        assert after["a"]["sent"] == 0 and after["b"]["received"] == 0
        assert status["transfers"] == {"received": moved_bytes, "sent": moved_bytes}
        assert all(isinstance(w["cpu"], float) and w["cpu"] >= 0.0 for w in after.values())

        # Two tasks that run at the same time on a's two threads: two rows.
        pair = client.map(meet, range(2), workers=["a"], pure=False)
        assert len(set(client.gather(pair))) == 2
        keys = {x.key, n.key} | {f.key for f in pair}
        items = [i for i in client.cluster_status()["stream"]["items"] if i[3] in keys]
        assert len(items) == 4
        assert all(thread in range(NTHREADS) for _, _, thread, *_ in items)
        address_a = after["a"]["address"]
        pair_keys = {f.key for f in pair}
        rows = {i[2] for i in items if i[3] in pair_keys and i[1] == address_a}
        assert rows == {0, 1}
