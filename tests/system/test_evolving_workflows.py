"""Dask's "evolving workflows" and tasks from tasks, on CLI workers, with the blocking
client (the coroutine run by ``client.sync``, its calls awaited on the client's own
loop) and the asynchronous one. The same on ``Client()`` runs as the scripts
``dask_examples/evolving_workflows.py`` and ``tasks_from_tasks.py``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

from apportion import Client, as_completed, get_client, rejoin, secede, wait
from cli_processes import Processes

pytestmark = [pytest.mark.process, pytest.mark.tcp]

# Worker processes are fresh interpreters that cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def inc(x: int) -> int:
    return x + 1


def fib(n: int) -> int:
    if n < 2:
        return n
    client = get_client()
    halves = [client.submit(fib, n - 1), client.submit(fib, n - 2)]
    secede()
    smaller, smallest = client.gather(halves)
    rejoin()
    return int(smaller + smallest)


async def evolving(client: Client, budget: int) -> dict[str, Any]:
    """Start three tasks; as each result comes in, start one more from it until
    ``budget`` results have come; then the tasks from tasks, awaited."""
    futures = client.map(inc, range(3))
    results = as_completed(futures, with_results=True)
    seen: list[int] = []
    async for _, value in results:
        seen.append(value)
        if len(seen) + results.count() < budget:
            results.add(client.submit(inc, value * 10))
    done, _ = await wait(futures)
    return {
        "seen": len(seen),
        "grown": sum(value > 10 for value in seen),
        "gathered": await client.gather(futures),
        "done": len(done),
        "fib": await client.submit(fib, 10),
        "asynchronous": client.asynchronous,
    }


EXPECTED = {"seen": 9, "grown": 6, "gathered": [1, 2, 3], "done": 3, "fib": 55}


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``apportion scheduler`` and two ``apportion worker`` processes of one thread."""
    procs = Processes(tmp_path_factory.mktemp("logs"))
    try:
        yield procs.two_workers()
    finally:
        procs.stop_all()


@pytest.mark.timeout(60)
def test_a_blocking_client_runs_an_evolving_workflow_with_sync(address: str) -> None:
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        assert client.sync(evolving, client, 9) == {**EXPECTED, "asynchronous": True}
        assert not client.asynchronous
        assert client.submit(fib, 8).result() == 21


@pytest.mark.timeout(60)
def test_an_asynchronous_client_runs_it_awaited_and_with_sync(address: str) -> None:
    async def main() -> None:
        async with Client(address, asynchronous=True) as client:
            await client.wait_for_workers(2, timeout=30)
            assert await evolving(client, 9) == {**EXPECTED, "asynchronous": True}
            assert await client.sync(evolving, client, 9) == {**EXPECTED, "asynchronous": True}

    asyncio.run(main())
