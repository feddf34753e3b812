"""The worker process's asyncio shell around ``WorkerState``.

It decodes what arrives (scheduler messages, fetch replies, finished executions),
hands it to the state machine with the time inside, and carries out the commands
that come back. Every decision lives in ``state.py``; this file only does I/O.

Losing the scheduler connection (the scheduler stopped, restarted, or declared this
worker lost after missing its heartbeats) ends a *session*: the scheduler has
already rescheduled this worker's tasks and forgotten its results, so the worker
forgets them too (a fresh ``WorkerState``, an empty data store, a fresh task runner
whose predecessor discards what its threads still finish) and registers afresh,
retrying with exponential backoff for up to ``reconnect_timeout`` seconds. The
data server keeps listening throughout, so the worker's address never changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import uuid
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, cast

from apportion.clock import SYSTEM_CLOCK, Clock, wait_event
from apportion.core.durations import Duration, seconds
from apportion.core.resources import ResourceSpec, describe_resources, from_ticks, parse_supply
from apportion.core.sizes import format_bytes
from apportion.gc_thresholds import hold_gc_thresholds, release_gc_thresholds
from apportion.loop_thread import BackgroundService
from apportion.net.address import RemoteScheduler
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.handshake import HandshakeError, open_connection
from apportion.net.receive_pool import POOL
from apportion.net.security import Security, security_for
from apportion.net.transport import serving_host
from apportion.protocol.base import Message
from apportion.protocol.codec import ProtocolError
from apportion.protocol.handshake import Refused
from apportion.protocol.peer_data import DIRECT_PUT, DataReply, DataStored, GetData, PutData
from apportion.protocol.remote_calls import Install, RemoteCall, Uninstall
from apportion.protocol.worker import (
    ComputeTask,
    DrainDone,
    DropPrefetch,
    FreeKeys,
    Heartbeat,
    HeartbeatInterval,
    InterruptTasks,
    LoadFunction,
    Prefetch,
    RegisterWorker,
    RejoinGranted,
    RestartWorker,
    StealRequest,
    WorkerClosing,
    WorkerDraining,
)
from apportion.worker.actors import ActorHost
from apportion.worker.arrivals import store_fetched, store_put
from apportion.worker.context import current_worker
from apportion.worker.cpu_use import CpuUse
from apportion.worker.data_server import DataServer, data_reply
from apportion.worker.events import (
    Execute,
    ExecutionOk,
    ExecutionRaised,
    ExecutionTooLarge,
    Fetch,
    FetchFailed,
    ForgetData,
    FreeArrived,
    Paused,
    Rejoining,
    Resumed,
    ResumeTask,
    SendToScheduler,
    WorkerCommand,
    WorkerEvent,
    arrival,
)
from apportion.worker.execution import Finished, Outcome, Raised, TaskRunner
from apportion.worker.long_lived import DEFAULT_KILL_GRACE, LongLivedTasks, WorkerLink
from apportion.worker.memory_manager import MemoryConfig, MemoryManager
from apportion.worker.outbox import Outbox
from apportion.worker.peers import PeerPool
from apportion.worker.registration import first_registration, reconnect
from apportion.worker.rejoin_waits import RejoinWaits
from apportion.worker.remote_calls import RemoteCallRunner
from apportion.worker.state import WorkerState
from apportion.worker.still_pickled import LoadingView

logger = logging.getLogger("apportion.worker")

#: Short tasks handed to each busy thread ahead of its free time
#: (``WorkerState.started_ahead``): a burst of tiny tasks then costs the event loop
#: one wake-up and one report frame per several tasks, not per task. As many as the
#: scheduler queues on a thread at most (``SchedulerConfig.max_pipeline``): what it
#: queues is about 2 ms of work per thread, so no task waits long for those ahead.
AHEAD_PER_THREAD = 32


class Worker(BackgroundService):
    """Runs tasks the scheduler sends and serves their results to peers and clients.

    Use ``async with Worker(addr)`` inside an event loop, or ``with Worker(addr)``
    from plain code (it then runs on a background loop thread).

    ``heartbeat_interval``: seconds between ``Heartbeat`` messages, sent from the event
    loop so that a frozen worker falls silent; keep it well under the scheduler's
    worker timeout. A scheduler of many workers stretches it (past 200 workers, to
    one beat every ``ceil(workers / 200)`` seconds, at least five per its worker
    timeout). ``reconnect_timeout``: how long to keep trying to reconnect after
    losing the scheduler before closing; 0 closes at once. ``kill_grace``: seconds
    long-lived work (a command run) gets between SIGTERM and SIGKILL when it is
    cancelled or stopped.
    ``connect_timeout``: how long ``start`` keeps trying to reach a scheduler that is
    not listening yet (a worker started before its scheduler, as Dask's waits too);
    0 tries once. Something that answers but is not an apportion scheduler fails at once.
    ``death_timeout`` (Dask's name; seconds or text like ``"60s"``) sets both: a worker
    that cannot reach its scheduler for that long, at start or after losing it, closes.
    ``clock`` (default: the system's) paces all of these and stamps every event.
    A ``scheduler_address`` of ``inproc://name`` puts the data port in memory too.
    ``long_lived`` executes the tasks whose work outlives scheduler sessions (the job
    queue's command runs: ``LiveRuns(launcher)`` of ``apportion.runs.live``); by
    default there is none, and such a task fails saying so. The worker package cannot
    pick real processes as the default (those live in ``apportion.runs``), and an
    in-process worker should not start them unasked: ``apportion worker`` injects them.
    ``memory_limit`` (bytes, 0 for none) makes the worker spill results to disk and
    pause under memory pressure, as ``memory`` (thresholds, monitor interval, scratch
    directory, how memory is read) says; see ``worker/memory_manager.py``.
    """

    def __init__(
        self,
        scheduler_address: str,
        nthreads: int | None = None,
        resources: ResourceSpec = None,
        data: MutableMapping[str, Any] | None = None,
        name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        memory_limit: int = 0,
        heartbeat_interval: float = 1.0,
        reconnect_timeout: float = 120.0,
        supervisor: int = 0,
        kill_grace: float = DEFAULT_KILL_GRACE,
        connect_timeout: float = 0.0,
        clock: Clock | None = None,
        long_lived: LongLivedTasks | None = None,
        memory: MemoryConfig | None = None,
        security: Security | None = None,
        allow_plaintext: bool = False,
        death_timeout: Duration | None = None,
    ) -> None:
        if death_timeout is not None:  # Dask's one option for both
            connect_timeout = reconnect_timeout = seconds(death_timeout, "death_timeout") or 0.0
        self.scheduler_address = scheduler_address
        #: The secret (and TLS) of every connection: to the scheduler, to peers, and
        #: the data port's. An in-process scheduler's own, else the environment's.
        self.security = security_for(scheduler_address, security)
        #: Paces heartbeats, drain deadlines and reconnection; the time in every event.
        self.clock: Clock = clock or SYSTEM_CLOCK
        self.nthreads = nthreads if nthreads is not None else os.cpu_count() or 1
        if self.nthreads < 1:
            raise ValueError(f"nthreads must be at least 1, got {self.nthreads}")
        if not heartbeat_interval > 0:
            raise ValueError(f"heartbeat_interval must be positive, got {heartbeat_interval}")
        if not reconnect_timeout >= 0:
            raise ValueError(f"reconnect_timeout must be 0 or more, got {reconnect_timeout}")
        self.heartbeat_interval = heartbeat_interval
        #: The least the scheduler asked to leave between heartbeats (``HeartbeatInterval``:
        #: one of many workers beats less often); 0 in a new session until it says.
        self._heartbeat_floor = 0.0
        self.reconnect_timeout = reconnect_timeout
        if not connect_timeout >= 0:
            raise ValueError(f"connect_timeout must be 0 or more, got {connect_timeout}")
        self.connect_timeout = connect_timeout
        #: Supply in ticks, as registered with the scheduler.
        self.supply, self.units = parse_supply(resources)
        #: Supply in units (``{"GPU": 2.0}``), as users write and read it.
        self.resources = from_ticks(self.supply)
        self.name = name or f"worker-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.host = host
        self.port = port
        self.memory_limit = memory_limit
        #: The data store (spilling under a limit), its directory and memory monitor.
        self.memory_manager = MemoryManager(memory_limit, memory, data, self.name)
        #: The data store itself: values arrived from elsewhere are still pickled in
        #: it (``still_pickled``); the worker's own code reads and writes this.
        self.store: MutableMapping[str, Any] = self.memory_manager.data
        #: The data store as user code sees it (``get_worker().data``, a
        #: ``dask_worker`` function's): real values, unpickled on the reading thread.
        self.data: MutableMapping[str, Any] = LoadingView(self.store)
        #: pid of the supervisor that restarts this process, 0 if none (told to the
        #: scheduler, which then waits for the supervisor's word on how we died).
        self.supervisor = supervisor
        #: Where peers and clients fetch data (``tcp://host:port`` or ``inproc://name``);
        #: set by ``start``.
        self.address = ""
        self.state = self._new_state()
        # In memory when the scheduler is: peers in this process reach it there.
        data_host = serving_host(scheduler_address, host)
        #: Actors built by tasks here, taking calls on the data port.
        self.actors = ActorHost(self)
        self._server = DataServer(
            self.store,
            self.name,
            data_host,
            port,
            self._put_direct,
            self.actors.serve,
            security=self.security,
            allow_plaintext=allow_plaintext,
        )
        self._peers = PeerPool(self.name, self.security)
        #: The CPU use each heartbeat reports, since the worker was made at first.
        self._cpu = CpuUse()
        self._runner: TaskRunner | None = None
        #: The live scheduler connection; None while reconnecting (and before start).
        self._scheduler: Connection | None = None
        self._receiver: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        #: Sessions (registrations) so far: 1 after start, +1 per reconnection.
        self.sessions = 0
        self._fetches: set[asyncio.Task[None]] = set()
        self._started = False
        self._closing = False
        self._holds_gc = False  # ``gc_thresholds``: raised from start to close
        self._closed = asyncio.Event()
        #: Set by ``drain``: leave once the scheduler says so (``DrainDone``).
        self._draining = False
        self._drained = asyncio.Event()
        #: Seconds stopped long-lived work gets between SIGTERM and SIGKILL.
        self.kill_grace = kill_grace
        #: Executes the tasks whose work outlives scheduler sessions, if any.
        self.long_lived = long_lived
        if long_lived is not None:
            long_lived.attach(WorkerLink(self.send_threadsafe, kill_grace))
        #: Messages from task threads, and those kept while no scheduler is connected.
        self._outbox = Outbox()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: ``client.run`` calls, uploads, plugins and the log ring of this worker.
        self.remote_calls = RemoteCallRunner(self)
        #: Why the scheduler refused this worker's registration (a taken name), if it did.
        self.refused: str | None = None
        #: The scheduler asked for a fresh process (a restart): set before closing.
        self.restart_requested = False
        self._leaving: asyncio.Task[None] | None = None  #: keeps that close referenced
        #: Task threads blocked in ``rejoin``.
        self._rejoins = RejoinWaits()
        #: The client tasks here share (``get_client()``), made by the first that asks;
        #: closed with the worker.
        self.task_client: Any = None
        self.task_client_lock = threading.Lock()

    # --- lifecycle ----------------------------------------------------------------

    async def start(self) -> Worker:
        """Open the data port, connect and register with the scheduler, start receiving."""
        if self._started:
            raise RuntimeError(f"worker {self.name} was already started")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self.remote_calls.start()
        try:
            self.address = await self._server.start()
            self.state.address = self.address
            self._runner = self._new_runner()
            self._connected(
                await first_registration(
                    self._register, self.clock, self.connect_timeout, self.name
                )
            )
        except BaseException:
            await self.close()
            raise
        self._receiver = asyncio.create_task(self._serve(), name=f"worker-{self.name}")
        self._heartbeat = asyncio.create_task(self._beat(), name=f"heartbeat-{self.name}")
        hold_gc_thresholds()  # released by ``close``
        self._holds_gc = True
        self.memory_manager.start(self.clock, lambda: self.state.paused, self._memory_changed)
        logger.info(
            "worker %s: data at %s, %d threads, resources %s, scheduler %s",
            self.name,
            self.address,
            self.nthreads,
            describe_resources(self.supply, self.units) or "none",
            self.scheduler_address,
        )
        return self

    async def close(self) -> None:
        """Stop: no new tasks, running ones are abandoned to their threads; idempotent."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            self._rejoins.fail_all(f"worker {self.name} is closing")
            await self._cancel_tasks(self._receiver, *self._fetches)
            if self._runner is not None:
                self._runner.close()
            if self.task_client is not None:
                await asyncio.to_thread(self.task_client.close)
            await self.remote_calls.close()
            long_lived = self.long_lived
            if long_lived is not None and long_lived.keys():
                if self._scheduler is not None:
                    # Leaving, not lost: heartbeats go on while the work is stopped, so
                    # the scheduler starts none of it again while a copy still runs.
                    self._scheduler.send(WorkerClosing("stopping its long-lived tasks"))
                left = await asyncio.to_thread(long_lived.stop_all, self.kill_grace + 5.0)
                if left:
                    logger.error(
                        "worker %s: %d long-lived tasks could not be stopped", self.name, left
                    )
            await self._cancel_tasks(self._heartbeat)
            await self._peers.close()
            if self._scheduler is not None:
                # Sent before the close flushes, so the scheduler logs a departure,
                # not a lost worker.
                self._scheduler.send(WorkerClosing("closed"))
                await self._scheduler.close()
            await self._server.close()
            await self.actors.close()
            await self.memory_manager.close()
        finally:
            if self._holds_gc:
                self._holds_gc = False
                release_gc_thresholds()
            self._closed.set()

    async def _cancel_tasks(self, *tasks: asyncio.Task[None] | None) -> None:
        """Cancel these tasks (not the one calling) and wait until they are done."""
        mine = asyncio.current_task()
        found = [t for t in tasks if t is not None and t is not mine]
        for task in found:
            task.cancel()
        for task in found:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def drain(self, grace: float) -> None:
        """Leave without losing work: no new tasks, running ones finish, results handed off.

        The scheduler answers ``DrainDone`` when nothing here is needed any more;
        after ``grace`` seconds the worker leaves anyway (its unfinished tasks then
        run elsewhere, as after any graceful departure, not counted as a crash).
        """
        if self._closing or self._draining:
            return
        self._draining = True
        if self._scheduler is not None:
            self._scheduler.send(WorkerDraining(grace))
            logger.info("worker %s: draining (for up to %gs)", self.name, grace)
            if not await wait_event(self._drained, grace, self.clock):
                logger.warning(
                    "worker %s: not drained after %gs; leaving with %d tasks running",
                    self.name,
                    grace,
                    len(self.state.executing),
                )
        await self.close()

    async def finished(self) -> None:
        """Wait until the worker is closed (by ``close`` or by losing its scheduler)."""
        await self._closed.wait()

    async def __aenter__(self) -> Worker:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- sessions with the scheduler ---------------------------------------------

    def _new_runner(self) -> TaskRunner:
        loop = asyncio.get_running_loop()
        limits = self.memory_manager.limits
        return TaskRunner(self.nthreads, self.store, self._on_outcomes, loop, self, limits)

    async def _register(self) -> Connection:
        """Connect, complete the handshake and register; raises ``OSError``/``HandshakeError``."""
        conn, _ = await open_connection(
            self.scheduler_address, "worker", self.name, security=self.security
        )
        conn.send(
            RegisterWorker(
                self.name,
                self.address,
                self.nthreads,
                self.supply,
                os.getpid(),
                self.memory_limit,
                self.units,
                self.supervisor,
                self.long_lived.keys() if self.long_lived is not None else [],
            )
        )
        self.sessions += 1
        return conn

    def _connected(self, conn: Connection) -> None:
        """``conn`` is the live session now: send what waited for one, in order."""
        self._scheduler = conn
        self._heartbeat_floor = 0.0  # a scheduler of many workers says so again
        for message in self._outbox.take_unsent():
            conn.send(message)

    @property
    def local_directory(self) -> str:
        """This worker's own directory (Dask's ``local_directory``): uploaded files
        and directories go there. On ``sys.path``; removed when the worker closes."""
        return str(self.remote_calls.upload_directory())

    @property
    def connected(self) -> bool:
        """A scheduler session is live now."""
        return self._scheduler is not None

    @property
    def scheduler(self) -> RemoteScheduler:
        """The scheduler this worker serves, as Dask's ``get_worker().scheduler``:
        ``.address`` is its address."""
        return RemoteScheduler(self.scheduler_address)

    def send_threadsafe(self, message: Message) -> None:
        """Send to the scheduler from any thread; kept until reconnected if it is away."""
        if self._loop is None or self._closing:
            return
        if self._outbox.from_thread(message):
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is gone
                self._loop.call_soon_threadsafe(self._flush_from_threads)

    def post_from_thread(self, make: Callable[[float], WorkerEvent]) -> None:
        """From a task thread: have the loop hand ``make(now)`` to the state machine."""
        if self._loop is None or self._closing:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is gone
            self._loop.call_soon_threadsafe(self._event_from_thread, make)

    def _event_from_thread(self, make: Callable[[float], WorkerEvent]) -> None:
        self._handle([make(self.clock.time())])

    def wait_to_rejoin(self, key: str) -> None:
        """From the seceded task ``key``'s thread: block until it may run on."""
        wait = self._rejoins.add(key)
        if self._loop is None or self._closing:
            self._rejoins.fail(key, f"worker {self.name} is closing")
        else:
            try:
                self._loop.call_soon_threadsafe(self._rejoining, key)
            except RuntimeError:
                self._rejoins.fail(key, f"worker {self.name} is closed")
        self._rejoins.wait(key, wait)

    def _rejoining(self, key: str) -> None:
        if self._scheduler is None or key not in self.state.seceded:
            # This session's scheduler never knew it seceded: it was lost with the last.
            self._rejoins.fail(key, "the worker lost its scheduler, which runs it elsewhere")
            return
        self._handle([Rejoining(key, self.clock.time())])

    def _flush_from_threads(self) -> None:
        """Send what task threads said, in order. Also called before task outcomes are
        reported, so that a run's start and end always precede its task's result."""
        for message in self._outbox.take_from_threads():
            self._outbox.send_or_keep(self._scheduler, message)

    async def _serve(self) -> None:
        """Receive from the scheduler, reconnecting when it goes away, until giving up."""
        while True:
            reason = await self._receive()
            if self._draining:
                break  # leaving anyway; what we ran is rescheduled by whoever comes back
            if self.refused is not None:
                # Final: registering again under the same name is refused again.
                logger.error(
                    "worker %s: the scheduler at %s refused it: %s",
                    self.name,
                    self.scheduler_address,
                    self.refused,
                )
                break
            if self.reconnect_timeout <= 0:
                logger.warning(
                    "worker %s: %s at %s; closing this worker",
                    self.name,
                    reason,
                    self.scheduler_address,
                )
                break
            logger.warning(
                "worker %s: %s at %s; dropping its tasks and data and reconnecting (for up to %gs)",
                self.name,
                reason,
                self.scheduler_address,
                self.reconnect_timeout,
            )
            self._forget_session()
            outcome = await reconnect(self._register, self.clock, self.reconnect_timeout, self.name)
            if isinstance(outcome, str):
                logger.error(
                    "worker %s: could not reconnect to %s within %gs (%s); closing this worker",
                    self.name,
                    self.scheduler_address,
                    self.reconnect_timeout,
                    outcome,
                )
                break
            self._connected(outcome)
            logger.warning(
                "worker %s: reconnected to %s and registered afresh",
                self.name,
                self.scheduler_address,
            )
        await self.close()

    async def _receive(self) -> str:
        """Handle frames until the connection ends; return why it ended."""
        assert self._scheduler is not None
        try:
            while True:
                self._on_messages(await self._scheduler.recv())
        except ConnectionClosed:
            reason = "the scheduler closed the connection"
        except ProtocolError as exc:
            reason = f"the scheduler sent invalid data ({exc})"
        self._scheduler.abort()
        self._scheduler = None
        return reason

    def _forget_session(self) -> None:
        """Forget what the lost scheduler knew: it has rescheduled and forgotten it all.

        Tasks still running in threads belong to the old runner, which is closed: it
        discards their results rather than store or report them. Fetches in flight
        are cancelled for the same reason.
        """
        for task in list(self._fetches):
            task.cancel()
        self._rejoins.fail_all("the worker lost its scheduler, which runs the task elsewhere")
        if self._runner is not None:
            self._runner.close()
        self._runner = self._new_runner()
        self.store.clear()
        self.actors.clear()
        self.state = self._new_state()

    def _new_state(self) -> WorkerState:
        budget = self.memory_manager.limits.fetch_budget
        return WorkerState(
            self.nthreads, self.address, fetch_budget=budget, ahead=AHEAD_PER_THREAD * self.nthreads
        )

    async def _beat(self) -> None:
        """Tell the scheduler this worker is alive, from the loop: a frozen loop falls silent.
        Each tick also unmaps the receive memory no transfer used for a while (the
        memory monitor does it more often where there is one). The ticks keep the
        worker's own interval; a scheduler of many workers only thins out the beats
        sent (``_heartbeat_floor``), so that a floor lowered or cleared (a new
        session) counts from the next tick."""
        last = -math.inf
        while True:
            await self.clock.sleep(self.heartbeat_interval)
            POOL.release_idle()
            now = self.clock.monotonic()
            # A tenth of a tick of slack: ticks that add up to the floor in floats
            # (ten of 0.1 s) may fall a hair short of it.
            due = now - last >= self._heartbeat_floor - self.heartbeat_interval / 10
            if self._scheduler is not None and due:
                self._scheduler.send(self._heartbeat_message())
                last = now

    def _heartbeat_message(self) -> Heartbeat:
        """How busy: tasks running, resident memory (so the scheduler can tell a likely
        OOM), bytes spilled, whether paused (then it gets no new task), the process's
        CPU use since the last heartbeat (% of one core; every worker of a process
        reports the whole process's) and the bytes of results fetched from and served
        to peers since the worker started (``PeerPool.received``, ``DataServer.sent``:
        worker to worker only; what clients fetch or the scheduler relays is not
        counted)."""
        return Heartbeat(
            len(self.state.executing),
            self.memory_manager.measure(),
            self.memory_manager.spilled,
            int(self.state.paused),
            self._cpu.since_last(),
            self._peers.received,
            self._server.sent,
        )

    def _memory_changed(self, event: Paused | Resumed) -> None:
        """The memory monitor paused or resumed this worker. The state machine takes it
        even between sessions, so the monitor does not decide (and log) it twice;
        the scheduler hears it at once rather than at the next heartbeat."""
        commands = self.state.handle(event)
        if self._scheduler is not None and not self._closing:
            self._carry_out(commands)
            self._scheduler.send(self._heartbeat_message())

    # --- from the scheduler -------------------------------------------------------

    def _stop_work(
        self, message: FreeKeys | InterruptTasks, events: list[WorkerEvent]
    ) -> list[WorkerEvent]:
        """Stop the work of tasks freed or interrupted (preempted); the events to go on
        with. Executions started by earlier messages of the frame are handled first,
        so that the stop reaches them too. An interrupted task is reported as it ends,
        its result kept if it completes first; a freed one's result is dropped."""
        assert self._runner is not None
        self._handle(events)
        if isinstance(message, InterruptTasks):
            # Only the tasks' cancel events, marked as an interruption: a command run
            # stops its processes and says it was preempted. Its long-lived work is
            # not forgotten here, so that a scheduler that restarts before hearing of
            # its end still adopts it and learns how it ended.
            self._runner.cancel(message.keys, interrupt=True)
            return []
        self._runner.cancel(message.keys)
        if self.long_lived is not None:
            self.long_lived.cancel_keys(message.keys)
        return [FreeArrived(tuple(message.keys), self.clock.time())]

    def _on_messages(self, messages: Iterable[Message]) -> None:
        """Turn one frame into events; a ``GetData`` sees the state of the messages before it."""
        assert self._scheduler is not None and self._runner is not None
        now = self.clock.time()
        events: list[WorkerEvent] = []
        for message in messages:
            match message:
                case LoadFunction():
                    self._runner.functions.add(message.func_id, message.blob)
                case ComputeTask() | Prefetch() | DropPrefetch() | RejoinGranted() | StealRequest():
                    events.append(arrival(message, now))
                case FreeKeys() | InterruptTasks():
                    events = self._stop_work(message, events)
                case RemoteCall() | Install() | Uninstall():
                    self.remote_calls.handle(message)
                case DrainDone():
                    self._drained.set()
                case HeartbeatInterval():
                    self._heartbeat_floor = message.seconds
                case Refused():
                    # The scheduler closes the connection after this; _serve says why.
                    self.refused = message.reason
                case RestartWorker():
                    logger.info(
                        "worker %s: %s; leaving for a fresh process", self.name, message.reason
                    )
                    self.restart_requested = True
                    self._leaving = asyncio.get_running_loop().create_task(self.close())
                case PutData():
                    events.append(store_put(self.store, message, now))
                case GetData():
                    self._handle(events)
                    events = []
                    self._scheduler.send(data_reply(self.store, message.request_id, message.keys))
                case _:
                    logger.warning("worker %s: ignored unexpected %r", self.name, message)
        self._handle(events)

    def _put_direct(self, message: PutData) -> DataStored:
        """A client put data on the data port: store it, answer the client directly."""
        if self._scheduler is None:
            # Between sessions nothing stored here would be known to the scheduler.
            logger.warning(
                "worker %s: refused data put while reconnecting to the scheduler", self.name
            )
            return DataStored(message.request_id, [], {})
        event = store_put(self.store, PutData(DIRECT_PUT, message.data), self.clock.time())
        self._handle([event])
        nbytes = {key: info.nbytes for key, info in event.stored.items()}
        return DataStored(message.request_id, list(event.stored), nbytes)

    # --- state machine ------------------------------------------------------------

    def _handle(self, events: list[WorkerEvent]) -> None:
        if events and not self._closing and self._scheduler is not None:
            self._carry_out(self.state.handle(*events))

    def _carry_out(self, commands: list[WorkerCommand]) -> None:
        assert self._scheduler is not None and self._runner is not None
        for command in commands:
            match command:
                case SendToScheduler():
                    self._scheduler.send(command.message)
                case Execute():
                    inputs = {}
                    for dep in command.deps:
                        # Absent, or spilled and lost: the task then says which input.
                        with contextlib.suppress(KeyError):
                            inputs[dep] = self.store[dep]
                    self._runner.submit(command, inputs)
                case Fetch():
                    task = asyncio.create_task(self._fetch(command.address, command.keys))
                    self._fetches.add(task)
                    task.add_done_callback(self._fetches.discard)
                case ForgetData():
                    for key in command.keys:
                        if key in self.store:  # not pop: it reads a spilled value back
                            del self.store[key]
                        if self.actors:
                            self.actors.drop(key)
                case ResumeTask():
                    self._rejoins.resume(command.key)

    def _on_outcomes(self, outcomes: list[Outcome]) -> None:
        """A batch of finished executions, values already stored by the runner."""
        if self._outbox.threads_waiting():
            self._flush_from_threads()
        now = self.clock.time()
        events: list[WorkerEvent] = []
        for o in outcomes:
            if isinstance(o, Finished):
                events.append(ExecutionOk(o.key, o.info, o.duration, now, o.thread))
            elif isinstance(o, Raised):
                events.append(
                    ExecutionRaised(
                        o.key, o.exception, o.traceback, o.duration, now, o.thread, o.interrupted
                    )
                )
            else:
                logger.warning(
                    "worker %s: the result of %r (%s of %s) is larger than the %s this worker "
                    "keeps (memory limit %s): dropped; the task fails, out of memory",
                    self.name,
                    o.key,
                    o.info.type_name,
                    format_bytes(o.info.nbytes),
                    format_bytes(o.largest),
                    format_bytes(o.limit),
                )
                events.append(ExecutionTooLarge(o.key, o.info, o.limit, o.largest, o.duration, now))
        self._handle(events)

    async def _fetch(self, address: str, keys: tuple[str, ...]) -> None:
        arrived: set[str] = set()

        def on_part(part: DataReply) -> None:
            arrived.update(part.data, part.missing, part.errors)
            self._handle([store_fetched(self.store, address, part, self.clock.time())])

        try:
            await self._peers.get_data(address, keys, on_part)
        except (OSError, ConnectionClosed, HandshakeError) as exc:
            rest = tuple(key for key in keys if key not in arrived)
            logger.warning(
                "worker %s: fetch of %d keys from %s failed: %s", self.name, len(rest), address, exc
            )
            self._handle([FetchFailed(address, rest, str(exc), self.clock.time())])

    def __repr__(self) -> str:
        return f"<Worker {self.name} {self.address or 'not started'} threads={self.nthreads}>"


def get_worker() -> Worker:
    """The ``Worker`` running the current task (Dask's ``get_worker``);
    ``RuntimeError`` outside a task."""
    # Only a Worker runs tasks; the task context holds it by the narrower type it
    # reads, as it cannot import this module back.
    return cast(Worker, current_worker("get_worker"))
