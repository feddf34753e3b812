"""A minimal fake scheduler: accepts workers and lets a test speak the scheduler's side."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from apportion.net.connection import Connection
from apportion.net.handshake import accept_connection
from apportion.net.security import Security, listening
from apportion.net.stream import Listener, Stream
from apportion.net.transport import transport_for
from apportion.protocol.base import Message
from apportion.protocol.worker import RegisterWorker

M = TypeVar("M", bound=Message)
#: Seconds a test waits for what the worker should send.
WAIT = 10.0


class FakeScheduler:
    """Accepts workers and lets a test speak the scheduler's side of the protocol."""

    def __init__(self, host: str = "inproc://") -> None:
        #: The secret its workers prove: found by them through ``security_for``.
        self.security = (
            Security.of_this_process()
            if host.startswith("inproc://")
            else Security.from_environment(create=True)  # as worker processes find it
        )
        self.address = ""
        self._host = host
        self._server: Listener | None = None
        self._workers: asyncio.Queue[Connection] = asyncio.Queue()
        self._inbox: dict[Connection, list[Message]] = {}

    async def start(self) -> FakeScheduler:
        self._server = await transport_for(self._host).listen(self._host, 0, self._accept)
        self.address = self._server.address
        listening(self.address, self.security)
        return self

    async def _accept(self, stream: Stream) -> None:
        conn = Connection(stream)
        await accept_connection(conn, {"worker"}, "w", {}, security=self.security)
        self._inbox[conn] = []
        await self._workers.put(conn)

    async def next_worker(self) -> tuple[Connection, RegisterWorker]:
        conn = await asyncio.wait_for(self._workers.get(), WAIT)
        return conn, await self.expect(conn, RegisterWorker)

    async def expect(self, conn: Connection, cls: type[M]) -> M:
        """The next message of type ``cls``; others are kept for later ``expect`` calls."""
        inbox = self._inbox[conn]
        while True:
            for i, message in enumerate(inbox):
                if isinstance(message, cls):
                    del inbox[i]
                    return message
            inbox.extend(await asyncio.wait_for(conn.recv(), WAIT))

    async def close(self) -> None:
        for conn in self._inbox:
            await conn.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
