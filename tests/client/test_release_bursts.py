"""Released keys travel in bursts: futures dropped together go in one message, and
nothing posted after them waits for the burst to end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion.protocol.tasks import ReleaseKeys
from apportion.scheduler.events import Event, FromClient
from apportion.testing import InMemoryCluster
from cluster_checks import checked_client, settle

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster(workers=[{"nthreads": 1}, {"nthreads": 1}]) as c:
        yield c


def inc(x: int) -> int:
    return x + 1


def test_futures_dropped_together_are_released_in_one_message(
    cluster: InMemoryCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    releases: list[ReleaseKeys] = []
    scheduler = cluster.scheduler
    handle = scheduler._handle

    def spy(event: Event) -> None:
        if isinstance(event, FromClient):
            releases.extend(m for m in event.messages if isinstance(m, ReleaseKeys))
        handle(event)

    # Before the client connects: its reader looks the method up before each wait.
    monkeypatch.setattr(scheduler, "_handle", spy)
    with checked_client(cluster) as client:
        futures = client.map(inc, range(20_000), pure=False)
        assert client.gather(futures)[-1] == 20_000
        assert not releases
        del futures  # 20,000 keys posted one by one
        settle(cluster)
        assert sum(len(m.keys) for m in releases) == 20_000
        # Flushed at each wake-up of the client's loop, they went in a dozen or more.
        assert len(releases) <= 3, [len(m.keys) for m in releases]


def test_a_submit_after_a_release_goes_at_once_behind_it(cluster: InMemoryCluster) -> None:
    with checked_client(cluster) as client:
        first = client.submit(inc, 1, key="inc-again")
        assert first.result(timeout=10) == 2
        del first  # its release waits for more to come...
        again = client.submit(inc, 1, key="inc-again")  # ... and goes now, before this
        assert again.result(timeout=10) == 2
        del again
