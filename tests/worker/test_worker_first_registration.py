"""A worker's first registration with a busy scheduler: dropped handshakes are retried."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from apportion import Scheduler
from apportion.net.connection import Connection
from apportion.net.security import Security
from apportion.worker.service import Worker


@pytest.mark.tcp
@pytest.mark.timeout(30)
def test_a_worker_whose_handshake_was_dropped_by_the_gate_retries() -> None:
    """Many workers starting at once from one host fill the scheduler's handshake gate,
    which drops the oldest pending handshake (``net/gate.py``): that worker must try
    again, as it does when nothing listens yet, rather than exit."""

    async def main() -> None:
        security = Security.in_memory()
        scheduler = await Scheduler("127.0.0.1", 0, security=security).start()
        door = scheduler._door
        admit = door.admit
        dropped: list[str] = []

        async def drop_the_first(conn: Connection, peer_id: str, info: dict[str, Any]) -> Any:
            if not dropped:  # as the gate drops an evicted connection: closed, no word
                dropped.append(conn.peer)
                conn.abort()
                return None
            return await admit(conn, peer_id, info)

        door.admit = drop_the_first  # type: ignore[method-assign]
        try:
            worker = Worker(scheduler.address, nthreads=1, connect_timeout=10, security=security)
            await asyncio.wait_for(worker.start(), 20)
            assert dropped and worker.sessions == 1 and worker.connected
            await worker.close()
        finally:
            await scheduler.close()

    asyncio.run(main())
