"""A whole cluster in this process, over the in-memory transport: no socket, no process.

The scheduler and workers are the real services (``Scheduler``, ``Worker``) on one
event loop; they reach each other at ``inproc://`` addresses, so every frame still
goes through the codec and every connection through the handshake. Clients are the
real synchronous ``Client``, on their own loop threads as always.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from apportion.client.client import Client
from apportion.clock import SYSTEM_CLOCK, Clock
from apportion.loop_thread import LoopThread
from apportion.net.address import INPROC
from apportion.scheduler.companions import Companion
from apportion.scheduler.service import Scheduler
from apportion.scheduler.state import SchedulerConfig
from apportion.worker.service import Worker

T = TypeVar("T")

#: Seconds (of the event loop, not of the cluster's clock) a started worker gets to
#: appear in the scheduler's state: in memory it takes a few loop turns.
REGISTRATION_TIMEOUT = 10.0
#: Seconds ``close`` waits for the scheduler to see the closed workers leave.
LEAVING_TIMEOUT = 2.0


class InMemoryCluster:
    """A scheduler and workers in this process, reached at ``cluster.address``.

    ``workers``: how many (each of one thread), or one mapping of ``Worker``
    keywords per worker (``{"name": "gpu", "nthreads": 2, "resources": "GPU=2"}``).
    ``config``: the scheduler's; by default, as in ``LocalCluster``, a request that
    no worker can meet fails at once. ``clock``: shared by the scheduler and every
    worker (a ``FakeClock`` lets a test decide when time passes). ``companions``:
    services started beside the scheduler (``Scheduler(companions=...)``), such as
    the job queue. ``dashboard_address``: serve the scheduler's dashboard there
    (none unless asked; ``"127.0.0.1:0"`` for any free port).

    ``async with`` runs the services on the running loop (drive the fake clock with
    ``await clock.advance(...)``); ``with`` runs them on a background loop thread,
    for synchronous tests and clients (``cluster.run(clock.advance(...))``). Either
    way leaving the block closes clients, workers and scheduler, and stops the thread.
    """

    def __init__(
        self,
        workers: int | Sequence[Mapping[str, Any]] = 1,
        *,
        config: SchedulerConfig | None = None,
        clock: Clock | None = None,
        name: str | None = None,
        companions: Sequence[Companion] = (),
        dashboard_address: str | None = None,
    ) -> None:
        self.clock: Clock = clock or SYSTEM_CLOCK
        self.name = name or f"cluster-{uuid.uuid4().hex[:8]}"
        config = config if config is not None else SchedulerConfig(fail_unsatisfiable=True)
        #: The real scheduler service, listening at ``inproc://<name>``.
        self.scheduler = Scheduler(
            INPROC + self.name,
            config=config,
            clock=self.clock,
            companions=companions,
            dashboard_address=dashboard_address,
        )
        self._specs = [{}] * workers if isinstance(workers, int) else [dict(w) for w in workers]
        #: The workers started and not removed, in order.
        self.workers: list[Worker] = []
        self._clients: list[Client] = []
        #: The loop thread of a ``with`` block; None under ``async with``.
        self._thread: LoopThread | None = None

    @property
    def address(self) -> str:
        """The scheduler's address, ``inproc://<name>``; what clients and workers connect to."""
        return self.scheduler.address or INPROC + self.name

    # --- asynchronous face ---------------------------------------------------------

    async def start(self) -> InMemoryCluster:
        """Start the scheduler, then every worker, each registered before this returns."""
        try:
            await self.scheduler.start()
            for spec in self._specs:
                await self.add_worker(**spec)
        except BaseException:
            await self.close()
            raise
        return self

    async def add_worker(self, **options: Any) -> Worker:
        """Start one more worker (``Worker`` keywords; one thread unless told) and wait
        until the scheduler has registered it."""
        options.setdefault("nthreads", 1)
        worker = Worker(self.address, clock=self.clock, **options)
        await worker.start()
        self.workers.append(worker)
        await self._until(lambda: self._registered(worker.name), f"{worker.name} to register")
        return worker

    async def remove_worker(self, worker: Worker) -> None:
        """Close ``worker`` as a graceful departure would."""
        await worker.close()
        if worker in self.workers:
            self.workers.remove(worker)

    def _registered(self, name: str) -> bool:
        return any(w.name == name for w in self.scheduler.state.workers.values())

    async def _until(self, done: Any, what: str, timeout: float = REGISTRATION_TIMEOUT) -> None:
        """Wait for ``done()``: nothing signals a registration, so it is polled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done():
            if loop.time() > deadline:
                raise TimeoutError(f"waited {timeout:g}s for {what}")
            await asyncio.sleep(0.001)

    async def close(self) -> None:
        """Close the clients made by ``client()``, the workers, then the scheduler;
        idempotent."""
        clients, self._clients = self._clients, []
        for client in clients:
            # A client blocks while it closes: off this loop, which must answer it.
            await asyncio.to_thread(client.close)
        workers, self.workers = self.workers, []
        for worker in reversed(workers):
            await worker.close()
        # Each worker's goodbye is still on its way (``call_soon``): closing the
        # scheduler's end first would drop it, and the scheduler would log the last
        # workers as lost rather than departed.
        names = {worker.name for worker in workers}
        with contextlib.suppress(TimeoutError):
            await self._until(
                lambda: names.isdisjoint(w.name for w in self.scheduler.state.workers.values()),
                "the workers to leave",
                LEAVING_TIMEOUT,
            )
        await self.scheduler.close()

    async def __aenter__(self) -> InMemoryCluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- synchronous face ----------------------------------------------------------

    def __enter__(self) -> InMemoryCluster:
        self._thread = LoopThread(f"apportion-{self.name}")
        try:
            self._thread.run(self.start())
        except BaseException:
            self._thread.stop()
            self._thread = None
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            try:
                thread.run(self.close(), timeout=30)
            finally:
                thread.stop()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = 30.0) -> T:
        """Run ``coroutine`` on the cluster's loop and return its result (``with`` only)."""
        if self._thread is None:
            coroutine.close()
            raise RuntimeError("run() needs the cluster started by `with`; under async, await")
        return self._thread.run(coroutine, timeout)

    def client(self, **options: Any) -> Client:
        """A synchronous ``Client`` of this cluster, closed with it at the latest.

        Not from inside the event loop that runs the cluster: the client would block
        it while waiting for the scheduler (there, use ``asyncio.to_thread``).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "a synchronous Client blocks the running event loop; "
                "use `await asyncio.to_thread(cluster.client)`"
            )
        client = Client(self.address, **options)
        self._clients.append(client)
        return client

    def __repr__(self) -> str:
        return f"<InMemoryCluster {self.address} workers={len(self.workers)}>"
