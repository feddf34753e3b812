"""The pytest fixtures Dask's synchronous tests ask for, on apportion.

``c``/``client`` is a ``Client`` connected to a fresh ``cluster()`` (a scheduler and two
one-thread worker processes), ``s``/``a``/``b`` describe those processes by address as
Dask's do, and ``loop`` is ``None``: apportion's client runs its own event loop, so a
test's ``Client(..., loop=loop)`` gets the default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import apportion
from as_distributed.utils_test import cluster

Described = tuple[dict[str, Any], list[dict[str, Any]]]


@pytest.fixture
def cleanup() -> Iterator[None]:
    yield None


@pytest.fixture(autouse=True)
def _close_leftover_clients() -> Iterator[None]:
    yield
    # A client a test left open must not become the next test's default.
    for _ in range(10):
        try:
            leftover = apportion.default_client()
        except ValueError:
            break
        with contextlib.suppress(Exception):
            leftover.close()


@pytest.fixture
def loop_in_thread(cleanup: None) -> Iterator[None]:
    yield None


@pytest.fixture
def loop(loop_in_thread: None) -> Iterator[None]:
    yield loop_in_thread


@pytest.fixture
def cluster_fixture(loop: None) -> Iterator[Described]:
    with cluster() as described:
        yield described


@pytest.fixture
def s(cluster_fixture: Described) -> dict[str, Any]:
    return cluster_fixture[0]


@pytest.fixture
def a(cluster_fixture: Described) -> dict[str, Any]:
    return cluster_fixture[1][0]


@pytest.fixture
def b(cluster_fixture: Described) -> dict[str, Any]:
    return cluster_fixture[1][1]


@pytest.fixture
def client(loop: None, cluster_fixture: Described) -> Iterator[apportion.Client]:
    with apportion.Client(cluster_fixture[0]["address"], loop=loop) as client:
        yield client


c = client


@pytest.fixture
def client_no_amm(client: apportion.Client) -> apportion.Client:
    # apportion has no active memory manager to turn off.
    return client


@pytest.fixture
def client_secondary(loop: None, cluster_fixture: Described) -> Iterator[apportion.Client]:
    with apportion.Client(cluster_fixture[0]["address"], loop=loop) as client:
        yield client
