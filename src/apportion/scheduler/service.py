"""The scheduler process: a thin asyncio shell around ``SchedulerState``.

It accepts connections, runs the handshake, turns each received frame into one
event, and carries out the commands the state machine returns: decisions and
replies become messages through ``wire.to_wire``, the one place that knows which
message carries which decision. Placement runs at
most once per loop turn: events only mark it due, and ``call_soon`` runs the pass
after every frame that arrived in the same turn has been handled.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from apportion.clock import SYSTEM_CLOCK, Clock
from apportion.dashboard.events import RunsSource
from apportion.dashboard.server import DashboardServer
from apportion.gc_thresholds import hold_gc_thresholds, release_gc_thresholds
from apportion.log_ring import LogRing
from apportion.loop_lag import LoopLag
from apportion.loop_thread import BackgroundService, call_in_loop
from apportion.net.address import DEFAULT_PORT, INPROC, is_inproc, parse_address
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.door import Door
from apportion.net.handshake import HandshakeError, open_connection
from apportion.net.person_token import person_token
from apportion.net.pipe import forward_buffers
from apportion.net.security import (
    Security,
    check_exposure,
    listening,
    new_token,
    stopped_listening,
)
from apportion.net.stream import MAX_UNSENT, Listener, Stream
from apportion.net.transport import listener_for, transport_for
from apportion.people_file import read_people_file, write_people_file
from apportion.protocol.base import Message
from apportion.protocol.codec import ProtocolError, decode_body
from apportion.protocol.peer_data import DataReply, GetData
from apportion.protocol.people import PersonAdded
from apportion.protocol.worker import RegisterWorker, WorkerDied
from apportion.scheduler import views
from apportion.scheduler.companions import Companion, SchedulerAddresses
from apportion.scheduler.dispatch import handle
from apportion.scheduler.events import (
    ClientJoined,
    ClientLeft,
    Command,
    Disconnect,
    Event,
    FromClient,
    FromWorker,
    IssueCredential,
    Log,
    PipeData,
    PipeEnded,
    PlacementDue,
    SavePeople,
    Tick,
    WorkerDeathReport,
    WorkerJoined,
    WorkerLeft,
)
from apportion.scheduler.people import admit_share
from apportion.scheduler.readout import Readout
from apportion.scheduler.state import SchedulerConfig, SchedulerState
from apportion.scheduler.wire import to_wire
from apportion.versions import versions

logger = logging.getLogger("apportion.scheduler")

#: How often the state machine is told the time, to find workers gone silent.
TICK_SECONDS = 0.5
#: Seconds a view asked for from another thread (``info``, ``workers``) may wait for
#: the scheduler's loop: it is a copy of a few records, so only a stuck loop waits.
VIEW_TIMEOUT = 10.0
#: Seconds to reach a worker's data port when forwarding its results to a client.
PIPE_CONNECT_TIMEOUT = 10.0


class Scheduler(BackgroundService):
    """Owns all task, worker and client state; never runs or unpickles user code.

    Use ``async with Scheduler(port=0) as s`` inside an event loop, or
    ``with Scheduler(port=0) as s`` from plain code (it then runs on a background
    thread). ``s.address`` is where workers and clients connect. A ``host`` of
    ``inproc://name`` (or ``inproc://`` for a fresh name) listens in memory instead of
    on TCP, for clusters within one process (``port`` is then not used). ``clock``
    (default: the system's) gives the time of every event and paces the tick that
    finds silent workers. ``companions`` are services started beside it once it
    listens, before any worker is admitted, and closed first when it closes
    (``scheduler.companions``: the job queue is one). ``dashboard_address``
    (``"host:port"``, ``":port"``: on the scheduler's host) serves the web dashboard
    there (``DashboardServer``; ``dashboard_runs`` reads the job queue's journal for
    it), started once the scheduler listens and closed first; None serves none.
    With ``port_fallback``, a ``port`` already taken is replaced by a free one, with a
    warning naming both, as the dashboard's is: ``apportion scheduler`` given no
    ``--port`` must not fail because another user's scheduler has 8786.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        config: SchedulerConfig | None = None,
        clock: Clock | None = None,
        companions: Sequence[Companion] = (),
        security: Security | None = None,
        allow_plaintext: bool = False,
        dashboard_address: str | None = None,
        dashboard_runs: RunsSource | None = None,
        port_fallback: bool = False,
        people_file: Path | None = None,
    ) -> None:
        self.host = host
        #: Listen on a non-loopback host without TLS all the same (``check_exposure``).
        self.allow_plaintext = allow_plaintext
        #: What every peer must prove (the secret) and, on ``tls://``, show: the
        #: environment's, made first if the user has none (``net/security.py``); a
        #: scheduler in memory has a secret of its own.
        self.security = security or (
            Security.of_this_process()
            if is_inproc(host)
            else Security.from_environment(create=True)
        )
        self.port = port
        self.port_fallback = port_fallback
        self.state = SchedulerState(config)
        self.id = f"scheduler-{uuid.uuid4().hex[:8]}"
        #: The time in every event, and the pace of the tick.
        self.clock: Clock = clock or SYSTEM_CLOCK
        self.address = ""
        #: Where the people the owner admits are kept across restarts, with their
        #: secrets (``people_file.py``); None: in memory only.
        self.people_file = people_file
        #: Each admitted person's secret, by name: what their handshake proves.
        self._secrets: dict[str, str] = {}
        if people_file is not None:
            people, self._secrets = read_people_file(people_file)
            self.state.people = {person.name: person for person in people}
            for person in people:
                admit_share(self.state, person)
            self.state.people_stored = str(people_file)
        #: Admits connections: the handshake, bounded while unauthenticated.
        self._door = Door(
            {"client", "worker", "supervisor"}, self.security, logger, people=self._person_key
        )
        self._server: Listener | None = None
        self._conns: dict[str, Connection] = {}
        self._ids = itertools.count(1)
        self._placement_scheduled = False
        self._closed: asyncio.Event | None = None
        #: The loop it runs on, once started: views for other threads are read there.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._holds_gc = False  # ``gc_thresholds``: raised from start to close
        #: An extra tick at the earliest coordination deadline (an acquire's timeout,
        #: a lease's expiry) when that comes before the next regular tick, and when.
        self._wake: asyncio.Task[None] | None = None
        self._wake_due = math.inf
        #: Results being forwarded from workers to clients (``PipeData``).
        self._pipes: set[asyncio.Task[None]] = set()
        #: Services beside this scheduler, in the order they start.
        self.companions = tuple(companions)
        #: The companions started and not closed yet.
        self._started: list[Companion] = []
        #: Where the companions connect when the public address is not in memory.
        self._local_server: Listener | None = None
        #: Set once every companion is ready: workers are admitted from then on.
        self._companions_ready = asyncio.Event()
        #: Recent records of the scheduler's loggers (``client.get_scheduler_logs``).
        loggers = [name for companion in self.companions for name in companion.loggers]
        self.logs = LogRing(only=("apportion.scheduler", *loggers))
        #: How late this scheduler's event loop wakes up, for ``/metrics``.
        self.loop_lag = LoopLag()
        #: The web dashboard, if one is served; its ``url`` once started.
        self.dashboard = (
            None
            if dashboard_address is None
            else DashboardServer(
                dashboard_address,
                Readout(self.state, self.loop_lag),
                self.security,
                scheduler_host=host,
                allow_plaintext=allow_plaintext,
                runs=dashboard_runs,
            )
        )

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> Scheduler:
        """Listen; return once connections are accepted."""
        check_exposure(self.host, self.security, allow_plaintext=self.allow_plaintext)
        if self.dashboard is not None:
            self.dashboard.check()  # refused before anything listens
        self._closed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._server = await self._listen()
        self.address = self._server.address
        if not is_inproc(self.address):
            # The port it listens on, once known (Dask's ``scheduler.port``): a free
            # one when 0, or another than asked when that one was taken.
            self.port = parse_address(self.address)[1]
        listening(self.address, self.security)
        # "started": the wall-clock time it started, as Dask's ``scheduler_info`` says.
        self.state.identity = {"id": self.id, "address": self.address, "started": self.clock.time()}
        self.state.remote.versions = versions()
        self.state.remote.logs = lambda n: [list(r) for r in self.logs.recent(n)]
        try:
            if self.dashboard is not None:
                await self.dashboard.start()
                self.state.identity["dashboard"] = self.dashboard.url
            await self._start_companions()
        except BaseException:
            if self.dashboard is not None:
                await self.dashboard.close()
            self._server.close()
            raise
        self._companions_ready.set()
        self.logs.attach()
        self._ticker = asyncio.create_task(self._tick(), name="scheduler-tick")
        self.loop_lag.start()
        hold_gc_thresholds()
        self._holds_gc = True
        logger.info("scheduler listening at %s", self.address)
        if self.dashboard is not None:
            logger.info("dashboard at %s", self.dashboard.login_link())
        return self

    async def _listen(self) -> Listener:
        transport = listener_for(self.host, self.security, "scheduler")
        try:
            return await transport.listen(self.host, self.port, self._on_connect)
        except OSError as exc:
            if not self.port_fallback or self.port == 0 or exc.errno != errno.EADDRINUSE:
                raise
        server = await transport.listen(self.host, 0, self._on_connect)
        logger.warning(
            "port %d is taken (another scheduler, perhaps another user's); "
            "listening on port %d instead",
            self.port,
            parse_address(server.address)[1],
        )
        return server

    async def _tick(self) -> None:
        """Let time pass in the state machine, so silent workers are noticed."""
        while True:
            await self.clock.sleep(TICK_SECONDS)
            self._handle(Tick(self.clock.monotonic()))

    async def _start_companions(self) -> None:
        """Start every companion, giving each the address it connects to.

        That address is in memory even when the scheduler listens on TCP: the
        in-memory transport works across the loops and threads of one process and
        carries the same frames through the same handshake, without a socket, so a
        companion's traffic (a chatty run's output) costs no system calls.
        """
        if not self.companions:
            return
        local = self.address
        if not is_inproc(local):
            self._local_server = await transport_for(INPROC).listen(INPROC, 0, self._on_connect)
            local = self._local_server.address
            listening(local, self.security)
        where = SchedulerAddresses(self.address, local)
        try:
            for companion in self.companions:
                await companion.start(where)
                self._started.append(companion)
        except BaseException:
            await self._close_companions()
            raise

    async def _close_companions(self) -> None:
        """Close the companions started, last first, then their in-memory listener."""
        while self._started:
            await self._started.pop().close()
        if self._local_server is not None:
            stopped_listening(self._local_server.address)
            self._local_server.close()
            self._local_server = None

    async def close(self) -> None:
        """Stop listening and drop every connection; idempotent."""
        self.loop_lag.stop()
        if self.dashboard is not None:
            await self.dashboard.close()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        if self._server is not None:
            stopped_listening(self.address)
            self._server.close()
            self._server = None
        # First, so that the workers leaving below reach no companion: the job queue
        # would requeue their runs, which must stay running in the journal for the
        # next scheduler to adopt.
        await self._close_companions()
        for pipe in list(self._pipes):
            pipe.cancel()
        for conn in list(self._conns.values()):
            await conn.close()
        self._conns.clear()
        self.logs.detach()
        if self._holds_gc:
            self._holds_gc = False
            release_gc_thresholds()
        if self._closed is not None:
            self._closed.set()

    async def finished(self) -> None:
        """Wait until ``close`` has been called."""
        assert self._closed is not None, "start() first"
        await self._closed.wait()

    async def __aenter__(self) -> Scheduler:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- connections ----------------------------------------------------------------

    async def _on_connect(self, stream: Stream) -> None:
        conn = Connection(stream)
        peer_id = f"peer-{next(self._ids)}"
        try:
            admitted = await self._door.admit(conn, peer_id, {"id": self.id})
            if admitted is None:
                return
            hello = admitted.hello
            # A peer that never reads cannot make the scheduler hold its replies
            # without limit: past this much unsent, it is dropped.
            conn.limit_unsent(MAX_UNSENT)
            if hello.role == "worker":
                await self._serve_worker(conn, peer_id)
            elif hello.role == "supervisor":
                await self._serve_supervisor(conn)
            else:
                await self._serve_client(conn, peer_id, admitted.person, hello.name)
        except ProtocolError as exc:
            # The text, not the exception: a handler that keeps records (a test's log
            # capture) would otherwise keep its traceback, and with it the connection.
            logger.warning("closing connection from %s: %s", conn.peer, str(exc))
        except ConnectionClosed:
            pass
        finally:
            if not conn.closed:
                conn.abort()
            self._conns.pop(peer_id, None)

    async def _serve_worker(self, conn: Connection, peer_id: str) -> None:
        first = await conn.recv()
        if not first or not isinstance(first[0], RegisterWorker):
            raise ProtocolError("a worker must register first")
        await self._companions_ready.wait()  # its live tasks are offered to a ready one
        self._conns[peer_id] = conn
        registration = first[0]
        self._handle(WorkerJoined(peer_id, registration, self.clock.monotonic()))
        if peer_id not in self.state.workers:  # refused (its name is taken): told why
            self._conns.pop(peer_id, None)
            await conn.close()
            return
        try:
            if first[1:]:
                self._from_worker(peer_id, first[1:])
            while True:
                self._from_worker(peer_id, await conn.recv())
        finally:
            self._conns.pop(peer_id, None)
            self._handle(WorkerLeft(peer_id, self.clock.monotonic()))

    def _from_worker(self, peer_id: str, batch: list[Message]) -> None:
        self._handle(FromWorker(peer_id, batch, self.clock.monotonic()))

    async def _serve_supervisor(self, conn: Connection) -> None:
        """A worker supervisor reporting how its processes ended; nothing is sent back."""
        while True:
            for message in await conn.recv():
                if not isinstance(message, WorkerDied):
                    raise ProtocolError(f"a supervisor sent {type(message).__name__}")
                self._handle(WorkerDeathReport(message, self.clock.monotonic()))

    async def _serve_client(self, conn: Connection, peer_id: str, person: str, name: str) -> None:
        self._conns[peer_id] = conn
        self._handle(ClientJoined(peer_id, self.clock.monotonic(), person=person, name=name))
        try:
            while True:
                self._handle(FromClient(peer_id, await conn.recv(), self.clock.monotonic()))
        finally:
            self._conns.pop(peer_id, None)
            self._handle(ClientLeft(peer_id, self.clock.monotonic()))

    # --- the shell around the state machine -----------------------------------------

    def handle(self, event: Event) -> None:
        """Apply one event that came another way than a connection (a local cluster's
        supervisor reports)."""
        self._handle(event)

    def _handle(self, event: Event) -> None:
        self._execute(handle(self.state, event))
        if self.state.placement_due and not self._placement_scheduled:
            self._placement_scheduled = True
            asyncio.get_running_loop().call_soon(self._place)
        due = self.state.coordination.next_due
        if due < self._wake_due and self._ticker is not None:
            self._wake_at(due)

    def _wake_at(self, due: float) -> None:
        """Tick at ``due``, so that a timeout shorter than the tick is kept to."""
        if self._wake is not None:
            self._wake.cancel()
        self._wake_due = due
        self._wake = asyncio.create_task(self._woken(due), name="scheduler-wake")

    async def _woken(self, due: float) -> None:
        await self.clock.sleep(max(0.0, due - self.clock.monotonic()))
        self._wake = None
        self._wake_due = math.inf
        # Not before ``due``: a sleep that returns a hair early must not wake again.
        self._handle(Tick(max(due, self.clock.monotonic())))

    def _place(self) -> None:
        self._placement_scheduled = False
        self._execute(handle(self.state, PlacementDue(self.clock.monotonic())))

    def _execute(self, commands: list[Command]) -> None:
        conns = self._conns
        for command in commands:
            if isinstance(command, Log):
                level = logging.WARNING if command.level == "warning" else logging.INFO
                logger.log(level, "%s", command.text)
                continue
            if isinstance(command, SavePeople | IssueCredential):
                self._people_effect(command)
                continue
            if isinstance(command, PipeData):
                pipe = asyncio.create_task(self._pipe(command), name="scheduler-pipe")
                self._pipes.add(pipe)
                pipe.add_done_callback(self._pipes.discard)
                continue
            if isinstance(command, Disconnect):
                # Already gone as far as the state knows; closing makes a frozen worker
                # that wakes up reconnect and register afresh, never double-counted.
                gone = conns.pop(command.peer_id, None)
                if gone is not None:
                    gone.abort()
                continue
            peer_id, message = to_wire(command)
            conn = conns.get(peer_id)
            if conn is not None:
                conn.send(message)

    # --- people ---------------------------------------------------------------------

    def _person_key(self, name: str) -> bytes | None:
        """What person ``name`` proves in the handshake; None if nobody by that name
        is admitted (removed, or never added)."""
        secret = self._secrets.get(name)
        return None if secret is None or name not in self.state.people else secret.encode()

    def _people_effect(self, command: SavePeople | IssueCredential) -> None:
        """Make a new person's secret and answer with their token; or keep the people
        (``people_file``), forgetting the secrets of those removed."""
        if isinstance(command, IssueCredential):
            self._secrets[command.name] = new_token()
            token = person_token(command.name, self._secrets[command.name])
            where = self.state.people_stored
            added = PersonAdded(command.request_id, command.name, token, "", where)
            conn = self._conns.get(command.peer_id)
            if conn is not None:
                conn.send(added)
            return
        names = {person.name for person in command.people}
        self._secrets = {name: s for name, s in self._secrets.items() if name in names}
        if self.people_file is None:
            return
        try:
            write_people_file(self.people_file, list(command.people), self._secrets)
        except OSError as exc:
            logger.warning("could not keep the people in %s: %s", self.people_file, exc)

    async def _pipe(self, command: PipeData) -> None:
        """Forward ``command.keys`` from the worker's data port to the client: the reply's
        head first, then its buffers through ``forward_buffers``. The state hears
        ``PipeEnded`` in every case, so the client's gather always gets its answer."""
        broken = list(command.keys)
        source = None
        try:
            source, _ = await open_connection(
                command.address,
                "scheduler",
                self.id,
                security=self.security,
                timeout=PIPE_CONNECT_TIMEOUT,
            )
            source.send(GetData(command.request_id, command.keys))
            head = await source.recv_head()
            if head.lent:  # never asked for: a relay forwards bytes, not addresses
                raise ProtocolError(f"{command.address} lent buffers to a relay")
            # Placeholders for the buffers: the keys are read here, the values never.
            (reply,) = decode_body(head.body, [b""] * len(head.lengths))
            if not isinstance(reply, DataReply) or reply.request_id != command.request_id:
                raise ProtocolError(f"a data port answered GetData with {reply!r:.80}")
            sink = self._conns.get(command.client_id)
            if sink is None:
                return  # the client left: nobody waits for these
            async with sink.exclusive():
                sink.write_raw(head.raw)
                whole = await forward_buffers(source, sink, head.lengths)
            if whole:
                broken = []
        except (OSError, HandshakeError, ConnectionClosed, ProtocolError, ValueError) as exc:
            logger.warning(
                "could not forward %d results from %s: %s", len(broken), command.address, exc
            )
        finally:
            if source is not None:
                source.abort()
            now = self.clock.monotonic()
            self._handle(PipeEnded(command.relay_id, command.worker_id, broken, now))

    # --- views for tools --------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """The same picture ``Client.scheduler_info()`` returns, taken on the
        scheduler's loop (whichever thread asks: a ``LocalCluster``'s runs on its own)."""
        return call_in_loop(self._loop, partial(views.snapshot, self.state), VIEW_TIMEOUT)

    @property
    def workers(self) -> Mapping[str, views.WorkerSnapshot]:
        """The workers connected now, by address, as Dask's ``Scheduler.workers``: each
        with its ``pid``, ``name``, ``address``, ``nthreads``, ``memory_limit``,
        ``resources`` and ``status``. A read-only copy taken on each access (the
        scheduler's records live on its loop and run no user code): read it again
        for news."""
        return call_in_loop(self._loop, partial(views.worker_snapshots, self.state), VIEW_TIMEOUT)


async def serve(host: str, port: int, config: SchedulerConfig | None = None) -> None:
    """Run a scheduler until cancelled (the CLI's main loop)."""
    scheduler = Scheduler(host, port, config=config)
    await scheduler.start()
    try:
        await scheduler.finished()
    finally:
        with contextlib.suppress(Exception):
            await scheduler.close()
