"""A client whose cluster is checked when it closes, for in-process cluster tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from apportion import Client, LocalCluster
from apportion.scheduler.invariants import check_invariants
from apportion.testing import InMemoryCluster

#: Either kind of cluster that runs its scheduler in this process.
InProcess = LocalCluster | InMemoryCluster


def settle(cluster: InProcess, timeout: float = 5.0) -> None:
    """Wait until the scheduler holds no tasks (every release has been processed)."""
    deadline = time.monotonic() + timeout
    while cluster.scheduler.state.tasks and time.monotonic() < deadline:
        time.sleep(0.01)  # releases travel asynchronously; no event says "all processed"


@contextmanager
def checked_client(cluster: InProcess, **options: Any) -> Iterator[Client]:
    """A client of ``cluster``; once closed, the scheduler must let everything go and
    keep its invariants (nothing held for a client that left, ledgers intact)."""
    with Client(cluster.scheduler.address, **options) as client:
        yield client
    settle(cluster)
    check_invariants(cluster.scheduler.state)
