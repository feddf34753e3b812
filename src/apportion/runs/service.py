"""The job queue as a client of the engine: its own thread, loop and connection.

``RunsService`` runs a ``RunQueue`` on an event loop of its own thread, connected to
the scheduler as any client is (the normal handshake), so that nothing of the job
queue runs on the scheduler's loop: a chatty run's output, the journal's commits
and the queue's decisions all happen beside it. The scheduler only forwards: notes
about run tasks, requests about runs, runs still alive on workers that come back.

It is a companion of its scheduler (``Scheduler(companions=[RunsService(...)])``):
it claims the journal under the scheduler's public address, so that ``apportion``
commands find where to connect, and connects at the scheduler's local address.
Starting waits until the scheduler has taken the queue's registration (a round
trip on the connection) and the journal has been read, so that a worker that
registers afterwards has its live runs offered to the queue, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time

from apportion.loop_thread import LoopThread
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.handshake import open_connection
from apportion.net.security import security_for
from apportion.protocol.base import Message
from apportion.protocol.cluster import InfoReply, InfoRequest
from apportion.runs.journal import Journal
from apportion.runs.queue import QueueOptions, RunQueue
from apportion.scheduler.companions import SchedulerAddresses

logger = logging.getLogger("apportion.runs")

#: Seconds between the queue's looks at the journal and at time passing.
TICK_SECONDS = 0.25


class _Link:
    """The queue's side of its connection: what it sends goes out in order."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def send(self, messages: list[Message]) -> None:
        """See ``QueueHost.send``."""
        if not self._conn.closed:
            for message in messages:
                self._conn.send(message)


class RunsService:
    """A ``RunQueue`` on its own thread: the companion of a scheduler serving ``journal``.

    ``start`` raises ``JournalBusy`` if another live scheduler serves the journal.
    """

    #: The scheduler's log ring keeps the queue's records too.
    loggers: tuple[str, ...] = ("apportion.runs",)

    def __init__(self, journal: Journal, options: QueueOptions | None = None) -> None:
        self.journal = journal
        self.options = options or QueueOptions()
        #: The queue, once connected (ready once ``start`` has answered).
        self.queue: RunQueue | None = None
        self._thread: LoopThread | None = None
        self._conn: Connection | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[Message]] = {}

    async def start(self, scheduler: SchedulerAddresses) -> None:
        """Claim the journal, start the thread, connect, register, resume the journal.

        Call on the scheduler's loop (``Companion.start``); returns once the queue is
        ready. On failure everything started is stopped and the claim released.
        """
        self.journal.claim(scheduler.public)
        try:
            self._thread = LoopThread("apportion-runs")
            future = asyncio.run_coroutine_threadsafe(
                self._start(scheduler.local), self._thread.loop
            )
            await asyncio.wrap_future(future)
        except BaseException:
            await asyncio.to_thread(self._stop)
            self.journal.release()
            raise
        logger.info("serving the run journal %s", self.journal.path)

    async def close(self) -> None:
        """Disconnect, let the writer finish, stop the thread, release the journal."""
        await asyncio.to_thread(self._stop)
        await asyncio.to_thread(self.journal.release)

    async def _start(self, address: str) -> RunQueue:
        conn, _ = await open_connection(address, "client", "runs", security=security_for(address))
        self._conn = conn
        queue = self.queue = RunQueue(self.journal, _Link(conn), self.options)  # registers
        self._tasks.append(asyncio.create_task(self._receive(conn, queue), name="runs-recv"))
        # Once this is answered, the scheduler has taken the registration before it.
        request_id = next(self._ids)
        answer = self._answers[request_id] = asyncio.get_running_loop().create_future()
        conn.send(InfoRequest(request_id))
        await answer
        await queue.start(time.monotonic(), time.time())
        self._tasks.append(asyncio.create_task(self._tick(queue), name="runs-tick"))
        return queue

    async def _receive(self, conn: Connection, queue: RunQueue) -> None:
        try:
            while True:
                for message in await conn.recv():
                    if isinstance(message, InfoReply):
                        answer = self._answers.pop(message.request_id, None)
                        if answer is not None and not answer.done():
                            answer.set_result(message)
                        continue
                    try:
                        queue.on_message(message)
                    except Exception:
                        logger.exception("job queue: %s failed", type(message).__name__)
        except ConnectionClosed:
            logger.info("job queue: the connection to the scheduler closed")
        finally:
            for answer in self._answers.values():
                if not answer.done():
                    answer.set_exception(ConnectionClosed("the scheduler went away"))

    async def _tick(self, queue: RunQueue) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                queue.tick(time.monotonic(), time.time())
            except Exception:
                logger.exception("job queue: tick failed")

    def _stop(self) -> None:
        """Disconnect, let the writer finish, stop the thread (blocking; from any thread
        but the service's own)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has stopped already
            thread.run(self._close(), timeout=60)
        thread.stop()

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._conn is not None:
            await self._conn.close()
        if self.queue is not None:
            await self.queue.close()
