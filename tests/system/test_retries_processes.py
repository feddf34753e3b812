"""A retried task moves to another worker, with real processes: two CLI workers of
one thread, and a task that fails on the first worker it runs on (a broken GPU, a
full disk), with the blocking and the asynchronous client."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import cloudpickle
import pytest

from apportion import Client, get_worker
from cli_processes import Processes

pytestmark = [pytest.mark.process, pytest.mark.tcp]

# Worker processes are fresh interpreters that cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def fails_on_its_first_worker(mark: str) -> str:
    """Raise on the first worker this runs on (it writes its name in ``mark``);
    elsewhere, return the worker's name. Run again there, it raises again."""
    here = get_worker().name
    path = Path(mark)
    if not path.exists():
        path.write_text(here)
    if path.read_text() == here:
        raise OSError(f"no space left on device on {here}")
    return here


@pytest.mark.timeout(120)
def test_a_retry_runs_on_the_other_worker(procs: Processes, tmp_path: Path) -> None:
    address = procs.two_workers()
    with Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=30)
        mark = tmp_path / "blocking"
        future = client.submit(fails_on_its_first_worker, str(mark), retries=1)
        assert future.result(timeout=30) != mark.read_text()
        story = " | ".join(row[-1] for row in client.story(future.key))
        assert "raised on " in story and "not where it raised before" in story, story
        # Without a retry, the failure is the first worker's, as it was.
        other = tmp_path / "no-retry"
        with pytest.raises(OSError, match="no space left"):
            client.submit(fails_on_its_first_worker, str(other)).result(timeout=30)

    async def asynchronous() -> str:
        async with Client(address, asynchronous=True) as ac:
            mark = tmp_path / "asynchronous"
            name: str = await ac.submit(fails_on_its_first_worker, str(mark), retries=3)
            assert name != mark.read_text()
            return name

    assert asyncio.run(asynchronous()) in ("a", "b")
