"""Recording clusters for the scheduler's tests: invariants checked and every message
accounted for after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.state import SchedulerConfig
from apportion.testing import RecordingCluster


@pytest.fixture
def make_sim() -> Iterator[Callable[..., RecordingCluster]]:
    """Build clusters (with a client "c1"); after the test, check their invariants and
    that every message they sent was taken by the test (or allowed by it).
    ``answers_steals=False``: workers answer steal requests only as the test says."""
    made: list[RecordingCluster] = []

    def make(
        config: SchedulerConfig | None = None, answers_steals: bool = True
    ) -> RecordingCluster:
        cluster = RecordingCluster(config or SchedulerConfig(), answers_steals=answers_steals)
        cluster.add_client("c1")
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        check_invariants(cluster.state)
        cluster.check_all_taken()


@pytest.fixture
def sim(make_sim: Callable[..., RecordingCluster]) -> RecordingCluster:
    return make_sim()
