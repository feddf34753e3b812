"""Services beside the scheduler: started before workers are admitted, closed first."""

from __future__ import annotations

import asyncio
import logging

import pytest

from apportion.net.handshake import open_connection
from apportion.net.security import Security, security_for
from apportion.scheduler.companions import SchedulerAddresses
from apportion.scheduler.service import Scheduler
from apportion.worker.service import Worker

pytestmark = pytest.mark.timeout(30)


class Recorder:
    """A companion that connects as a client and records what it saw of its scheduler."""

    loggers: tuple[str, ...] = ("companion.test",)

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        #: Set by the test to let ``start`` finish.
        self.gate = asyncio.Event()
        self.gate.set()
        self.scheduler: Scheduler | None = None
        self.given: SchedulerAddresses | None = None
        #: Set once ``start`` was called (``given`` is known).
        self.started = asyncio.Event()
        #: Workers the scheduler had admitted when this was closed.
        self.workers_at_close: int | None = None
        self.closed = False

    async def start(self, scheduler: SchedulerAddresses) -> None:
        self.given = scheduler
        self.started.set()
        conn, _ = await open_connection(
            scheduler.local, "client", "companion", security=security_for(scheduler.local)
        )
        await conn.close()
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("this companion cannot start")

    async def close(self) -> None:
        if self.scheduler is not None:
            self.workers_at_close = len(self.scheduler.state.workers)
        self.closed = True


async def _turns(n: int = 50) -> None:
    """Let in-memory frames already sent arrive (each is one loop callback)."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_workers_are_admitted_once_the_companions_are_ready_and_outlive_them() -> None:
    async def scenario() -> Recorder:
        recorder = Recorder()
        recorder.gate.clear()
        scheduler = recorder.scheduler = Scheduler("inproc://", companions=[recorder])
        starting = asyncio.create_task(scheduler.start())
        await asyncio.wait_for(recorder.started.wait(), 10)
        async with Worker(scheduler.address, nthreads=1):  # registers at once
            await _turns()
            assert not scheduler.state.workers, "admitted before the companion was ready"
            recorder.gate.set()
            await starting
            while not scheduler.state.workers:
                await asyncio.sleep(0.001)
            await scheduler.close()
        return recorder

    recorder = asyncio.run(scenario())
    assert recorder.closed and recorder.workers_at_close == 1, "closed after its workers"
    assert recorder.given is not None
    assert recorder.given.public == recorder.given.local  # in memory already


def test_a_companion_that_cannot_start_fails_the_start_and_closes_the_others() -> None:
    async def scenario() -> tuple[Recorder, Recorder, str]:
        first, second = Recorder(), Recorder(fail=True)
        scheduler = first.scheduler = second.scheduler = Scheduler(
            "inproc://", companions=[first, second]
        )
        with pytest.raises(RuntimeError, match="cannot start"):
            await scheduler.start()
        return first, second, scheduler.address

    first, second, address = asyncio.run(scenario())
    assert first.closed and not second.closed  # a failed start cleans up after itself

    async def connect() -> None:
        await open_connection(address, "client", "late", security=Security.in_memory())

    with pytest.raises(OSError):
        asyncio.run(connect())


def test_the_scheduler_keeps_its_companions_records_in_its_log_ring() -> None:
    async def scenario() -> list[str]:
        async with Scheduler("inproc://", companions=[Recorder()]) as scheduler:
            logging.getLogger("companion.test.part").warning("said by the companion")
            logging.getLogger("elsewhere").warning("said by someone else")
            return [text for _, text in scheduler.logs.recent(100)]

    said = "\n".join(asyncio.run(scenario()))
    assert "said by the companion" in said and "someone else" not in said


@pytest.mark.tcp
def test_a_tcp_scheduler_gives_its_companions_an_address_in_memory() -> None:
    recorder = Recorder()
    with Scheduler(port=0, companions=[recorder]) as scheduler:
        recorder.scheduler = scheduler
        assert recorder.given is not None
        assert recorder.given.public == scheduler.address
        assert recorder.given.local.startswith("inproc://")
    assert recorder.closed
