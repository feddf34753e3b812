"""Clusters the real-process tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion import Client
from apportion.deploy.local_shape import cluster_shape


@pytest.fixture
def default_client() -> Iterator[Client]:
    """``Client()`` as a user makes it: on this machine's default shape when that is two
    workers of one thread (a 2-core machine), else that shape asked for by name."""
    default = cluster_shape(None, None, True) == (2, 1)
    made = Client() if default else Client(n_workers=2, threads_per_worker=1)
    with made as client:
        client.wait_for_workers(2, timeout=30)
        yield client
