"""Two connected ends of a stream, over a socket pair or in memory, for the stream tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from apportion.net.memory import MEMORY
from apportion.net.stream import SocketStream, Stream

Pair = Callable[[], Awaitable[tuple[Stream, Stream]]]


async def socket_pair() -> tuple[Stream, Stream]:
    """Two ends of a connected socket pair (a real socket, no port bound)."""
    loop = asyncio.get_running_loop()
    left, right = socket.socketpair()
    return SocketStream(left, loop), SocketStream(right, loop)


async def memory_pair() -> tuple[Stream, Stream]:
    """Two ends of an in-memory connection."""
    accepted: asyncio.Queue[Stream] = asyncio.Queue()

    async def on_connect(stream: Stream) -> None:
        await accepted.put(stream)

    listener = await MEMORY.listen("inproc://", 0, on_connect)
    try:
        near = await MEMORY.connect(listener.address)
        return near, await accepted.get()
    finally:
        listener.close()


PAIRS = [pytest.param(socket_pair, id="socket"), pytest.param(memory_pair, id="memory")]


@asynccontextmanager
async def opened(pair: Pair = socket_pair) -> AsyncIterator[tuple[Stream, Stream]]:
    """Both ends of a new pair, aborted at the end whatever happens."""
    a, b = await pair()
    try:
        yield a, b
    finally:
        a.abort()
        b.abort()


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]
