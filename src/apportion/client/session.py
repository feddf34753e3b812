"""The client's wire: one connection to the scheduler, data connections to workers.

``Client`` never touches a socket; it posts to this session's outbox and makes
requests through it. User threads only append to the outbox and wake the loop
once per burst; the loop thread sends everything queued, in order, merging runs
of tasks into one ``SubmitTasks`` (10,000 submits in a tight loop leave as a few
messages, each function pickled once per batch).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from apportion.client.asynchronous import awaited
from apportion.client.errors import SchedulerGoneError
from apportion.client.state import PendingRequests
from apportion.clock import SYSTEM_CLOCK
from apportion.core.payload import size_of
from apportion.loop_thread import LoopThread, in_running_loop
from apportion.net.address import check_address
from apportion.net.connection import Connection, ConnectionClosed
from apportion.net.handshake import open_connection
from apportion.net.retry import FIRST_BACKOFF, retry_until
from apportion.net.security import Security
from apportion.protocol.base import Message
from apportion.protocol.codec import ProtocolError
from apportion.protocol.handshake import Welcome
from apportion.protocol.peer_data import DataReply
from apportion.protocol.people import NotPermitted
from apportion.protocol.tasks import ReleaseKeys, SubmitTasks, TaskSpec

logger = logging.getLogger("apportion.client")

#: A graph (or one task) for the outbox: (spec, function blob, whether a future wants it).
TaskBatch = list[tuple[TaskSpec, bytes, bool]]


#: Most bytes of arguments and functions merged into one SubmitTasks: past this a
#: larger message gains nothing, and the scheduler starts on what came sooner.
MAX_BATCH = 64 * 2**20

#: Seconds a client waits for a scheduler that refuses it before saying it waits:
#: one started just before the client is usually listening well before then.
SAY_WAITING_AFTER = 2.0

#: Seconds to send what is queued and close the connections when a client closes.
SHUTDOWN_SECONDS = 10.0
#: Released keys are sent once none came for this many seconds (``post``)...
RELEASE_QUIET = 0.002
#: ... or this long after the first of them.
RELEASE_WAIT = 0.05

T = TypeVar("T")


class _Merged:
    """One flush of the outbox: runs of task batches become one SubmitTasks each (up
    to MAX_BATCH; a batch, a whole graph, is never split), runs of released keys one
    ReleaseKeys; order is kept."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._tasks: list[TaskSpec] = []
        self._functions: dict[str, bytes] = {}
        self._wanted: list[str] = []
        self._size = 0
        self._releases: list[str] = []

    def tasks(self, batch: TaskBatch) -> None:
        self.send_releases()
        size = _batch_size(batch, self._functions)
        if self._tasks and self._size + size > MAX_BATCH:
            self.send_tasks()
            size = _batch_size(batch, self._functions)
        self._size += size
        for spec, blob, want in batch:
            self._tasks.append(spec)
            self._functions.setdefault(spec.func_id, blob)
            if want:
                self._wanted.append(spec.key)

    def release(self, key: str) -> None:
        self.send_tasks()
        self._releases.append(key)

    def message(self, message: Message) -> None:
        self.send_tasks()
        self.send_releases()
        self._conn.send(message)

    def send_tasks(self) -> None:
        if self._tasks:
            self._conn.send(SubmitTasks(self._tasks, self._functions, self._wanted))
            self._tasks, self._functions, self._wanted, self._size = [], {}, [], 0

    def send_releases(self) -> None:
        if self._releases:
            self._conn.send(ReleaseKeys(self._releases))
            self._releases = []


def _refused(failure: Exception) -> bool:
    """Whether ``failure`` says that nothing listens at the address (yet)."""
    return isinstance(failure, ConnectionRefusedError)


def _batch_size(batch: TaskBatch, functions: dict[str, bytes]) -> int:
    """What ``batch`` adds to a SubmitTasks already carrying ``functions``."""
    size = 0
    new: set[str] = set()
    for spec, blob, _ in batch:
        size += size_of(spec.args)
        if spec.func_id not in functions and spec.func_id not in new:
            new.add(spec.func_id)
            size += len(blob)
    return size


#: Sessions not closed yet; closed at interpreter exit (see ``_close_all``).
_open: weakref.WeakSet[Session] = weakref.WeakSet()


@atexit.register
def close_all() -> None:
    """Close the sessions of clients a script never closed, as Dask does at exit.

    A daemon loop thread is frozen at exit: its pending tasks would be destroyed
    ("Task was destroyed but it is pending!") and its sockets collected unclosed.
    """
    for session in list(_open):
        session.close()


class Session:
    """Connection, outbox and request/reply bookkeeping of one ``Client``."""

    def __init__(
        self,
        address: str,
        name: str,
        timeout: float,
        on_message: Callable[[Message], None],
        on_lost: Callable[[str], None],
        *,
        security: Security,
        asynchronous: bool = False,
        wait_for_scheduler: bool = True,
    ) -> None:
        # A malformed address is the caller's mistake, said at once in one line
        # (ValueError), before any thread or connection is started.
        check_address(address)
        self.address = address
        self.name = name
        self._security = security
        self._timeout = timeout
        #: Whether ``connect`` tries again while nothing listens (``_connect_patiently``).
        self._wait_for_scheduler = wait_for_scheduler
        self._on_message = on_message
        self._on_lost = on_lost
        # Re-entrant: garbage collection can run ``Future.__del__`` (which posts a
        # release here) in the middle of any allocation made while the lock is held.
        self._lock = threading.RLock()
        self._outbox: list[TaskBatch | str | Message] = []
        self._wake_scheduled = False
        self._release_wake_scheduled = False  # a flush of releases waits (``post``)
        self._first_release = self._last_release = 0.0  # when posted, of this burst
        #: Which requests are pending, where each went, and the parts forwarded ahead
        #: of a reply, as data (client/state.py); ``_requests`` their awaitables.
        self._pending = PendingRequests()
        self._requests: dict[int, asyncio.Future[Any]] = {}
        self._peers: dict[str, Connection] = {}
        #: Data connections being opened, by address.
        self._opening: dict[str, asyncio.Future[Connection]] = {}
        #: Worker data addresses that could not be reached from here: their data goes
        #: through the scheduler instead (``client/transfers.py``).
        self.unreachable: set[str] = set()
        self._readers: set[asyncio.Task[None]] = set()
        self._conn: Connection | None = None
        self.closed = False
        #: The session of an asynchronous client: a blocking call from a running event
        #: loop is refused (``run``) instead of stalling that loop.
        self.asynchronous = asynchronous
        self.loop = LoopThread("apportion-client")
        if asynchronous:
            return  # the client awaits ``connect`` on this loop
        try:
            # open_connection keeps to ``timeout`` and says what it found; the margin
            # only guards against a loop that never answers.
            self.loop.run(self.connect(), self.connect_timeout)
        except BaseException:
            self.loop.stop()
            raise

    @property
    def connect_timeout(self) -> float:
        """How long to wait for ``connect``: ``open_connection`` keeps to the client's
        timeout and says what it found; the margin only guards against a loop that
        never answers."""
        return self._timeout + 5.0

    async def connect(self) -> None:
        """On the loop thread: connect to the scheduler and start reading from it."""
        self._conn, _ = await self._connect_patiently()
        self._watch(self._conn, scheduler=True)
        _open.add(self)

    async def _connect_patiently(self) -> tuple[Connection, Welcome]:
        """Connect within the client's timeout, trying again while the connection is
        refused: a scheduler started just before its client (in the background, by
        the same script) is not listening yet, and Dask's client waits for it too.
        Only a refusal means that; a peer that is silent, or answers wrongly, or
        does not know the secret, fails at once, as does a refusal without
        ``wait_for_scheduler`` (the command line's one try)."""
        timeout = self._timeout
        start = SYSTEM_CLOCK.monotonic()
        tries = 0

        def attempt() -> Awaitable[tuple[Connection, Welcome]]:
            # A try after a refusal keeps to what is left of the timeout, so that the
            # whole does; the first has all of it (a silent peer: "no answer within 1s").
            nonlocal tries
            tries += 1
            left = start + timeout - SYSTEM_CLOCK.monotonic()
            return open_connection(
                self.address,
                "client",
                self.name,
                security=self._security,
                timeout=timeout if tries == 1 else max(left, FIRST_BACKOFF),
            )

        def waiting(failure: Exception) -> None:
            logger.warning(
                "waiting for the scheduler at %s (connection refused) for up to %gs",
                self.address,
                timeout,
            )

        if not self._wait_for_scheduler:
            return await attempt()
        try:
            return await retry_until(
                attempt,
                _refused,
                clock=SYSTEM_CLOCK,
                timeout=timeout,
                waiting=waiting,
                say_after=SAY_WAITING_AFTER,
            )
        except ConnectionRefusedError as exc:
            if tries == 1:  # no time to try again (timeout=0): said as it was found
                raise
            raise ConnectionRefusedError(f"{exc} (tried for {timeout:g}s)") from None

    def _watch(self, conn: Connection, *, scheduler: bool) -> None:
        reader = asyncio.create_task(self._read_loop(conn, scheduler))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)

    async def _read_loop(self, conn: Connection, scheduler: bool) -> None:
        try:
            while True:
                # Taken in a call of its own: a local of this coroutine would keep the
                # last message (a fetched result's memory) alive until the next frame.
                self._take_frame(await conn.recv(), None if scheduler else conn)
        except (ConnectionClosed, ProtocolError) as exc:
            if not scheduler:
                self._peer_lost(conn, exc)
            elif not self.closed:
                reason = f"connection to the scheduler {self.address} lost: {exc}"
                logger.error("%s", reason)
                for fut in self._requests.values():
                    if not fut.done():
                        fut.set_exception(SchedulerGoneError(reason))
                self._on_lost(reason)

    def _take_frame(self, messages: list[Message], peer: Connection | None) -> None:
        """Settle the requests the messages of one frame answer (from the scheduler, or
        from ``peer``); the rest are notices."""
        for msg in messages:
            received = self._pending.receive(msg, peer)
            if received == "notice":
                self._on_message(msg)
            elif isinstance(received, int):
                fut = self._requests.pop(received, None)
                if fut is not None and not fut.done() and isinstance(msg, NotPermitted):
                    # A person asked for what is not theirs: said in one line.
                    fut.set_exception(PermissionError(msg.reason))
                elif fut is not None and not fut.done():
                    fut.set_result(msg)
                else:  # given up (cancelled, timed out): its forwarded parts too
                    self._pending.drop_parts(received)

    def _peer_lost(self, conn: Connection, exc: Exception) -> None:
        """A worker's data connection closed: what was asked of it gets no answer."""
        for request_id in self._pending.peer_lost(conn):
            fut = self._requests.pop(request_id, None)
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError(f"connection to a worker lost: {exc}"))

    # --- requests -------------------------------------------------------------------

    def next_id(self) -> int:
        return self._pending.next_id()

    async def request(self, msg: Message, conn: Connection | None = None) -> Any:
        """Send a message carrying a ``request_id`` and wait for the reply with that id."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        request_id: int = msg.request_id  # type: ignore[attr-defined]
        self.flush()  # keep order: everything queued before this request goes first
        target = conn or self._conn
        if target is None or target.closed:
            if conn is not None:
                raise ConnectionError("the connection to that worker is closed")
            raise SchedulerGoneError(f"not connected to the scheduler {self.address}")
        self._requests[request_id] = fut
        self._pending.send(request_id, conn)
        target.send(msg)
        return await fut

    def take_parts(self, request_id: int) -> list[DataReply]:
        """The results forwarded ahead of the reply to ``request_id``, once."""
        return self._pending.take_parts(request_id)

    @property
    def connected(self) -> bool:
        return not self.closed and self._conn is not None and not self._conn.closed

    def call(self, make: Callable[[int], Message], timeout: float | None = None) -> Any:
        """From a user thread: send a request built with a fresh id; return the reply."""
        if not self.connected:
            raise SchedulerGoneError(f"not connected to the scheduler {self.address}")
        return self.run(self.request(make(self.next_id())), timeout)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """From a user thread: run ``coro`` on the loop and wait for its outcome."""
        if self.asynchronous and in_running_loop():
            coro.close()
            raise RuntimeError(
                "this Client is asynchronous, and this call would block the running event "
                "loop: await the call's asynchronous form where it has one (see "
                "'Asynchronous use' in apportion's README), or make it from a thread "
                "without a running loop (await asyncio.to_thread(...))"
            )
        try:
            return self.loop.run(coro, timeout)
        except concurrent.futures.CancelledError:  # the session closed while waiting
            raise SchedulerGoneError(f"the connection to {self.address} was closed") from None

    async def peer(self, address: str, timeout: float | None = None) -> Connection:
        """A data connection to the worker at ``address``, opened once and reused;
        ``timeout`` bounds the connecting (default: the client's)."""
        conn = self._peers.get(address)
        if conn is not None and not conn.closed:
            return conn
        # Callers that come while it is being opened share the one connection.
        opening = self._opening.get(address)
        if opening is None:
            limit = self._timeout if timeout is None else timeout
            opening = asyncio.ensure_future(self._open_peer(address, limit))
            self._opening[address] = opening
            opening.add_done_callback(lambda _: self._opening.pop(address, None))
        return await asyncio.shield(opening)

    async def _open_peer(self, address: str, timeout: float) -> Connection:
        conn, _ = await open_connection(
            address, "client", self.name, security=self._security, timeout=timeout, borrow=True
        )
        self._peers[address] = conn
        self._watch(conn, scheduler=False)
        return conn

    # --- the outbox -----------------------------------------------------------------

    def post(self, item: TaskBatch | str | Message) -> None:
        """Queue tasks, a key to release, or a message; wake the loop once per burst.

        Releases alone wait until none came for ``RELEASE_QUIET`` (at most
        ``RELEASE_WAIT``): dropping a list of 20,000 futures posts 20,000 keys one by
        one, and a flush at each wake-up of the loop sent them in a dozen messages or
        more, each making the scheduler tell every worker holding one of them to free
        it. Anything else posted meanwhile flushes at once, the releases before it, in
        order."""
        release = isinstance(item, str)
        with self._lock:
            if self.closed:
                return
            self._outbox.append(item)
            if release:
                self._last_release = time.monotonic()
            if self._wake_scheduled or (release and self._release_wake_scheduled):
                return
            if release:
                self._release_wake_scheduled = True
                self._first_release = self._last_release
            else:
                self._wake_scheduled = True
        with contextlib.suppress(RuntimeError):  # loop already stopped at shutdown
            if release:
                self.loop.loop.call_soon_threadsafe(self._flush_releases)
            else:
                self.loop.loop.call_soon_threadsafe(self.flush)

    def _flush_releases(self) -> None:
        """On the loop thread: flush once releases stopped coming (``post``)."""
        with self._lock:
            now = time.monotonic()
            wait = min(self._last_release + RELEASE_QUIET, self._first_release + RELEASE_WAIT) - now
            if wait <= 0:
                self._release_wake_scheduled = False
        if wait > 0:
            self.loop.loop.call_later(wait, self._flush_releases)
            return
        self.flush()

    def flush(self) -> None:
        """On the loop thread: send the outbox in order, merging runs of tasks."""
        with self._lock:
            items, self._outbox = self._outbox, []
            self._wake_scheduled = False
        conn = self._conn
        if not items or conn is None:
            return
        out = _Merged(conn)
        for item in items:
            if isinstance(item, list):
                out.tasks(item)
            elif isinstance(item, str):
                out.release(item)
            else:
                out.message(item)
        out.send_tasks()
        out.send_releases()

    # --- closing --------------------------------------------------------------------

    async def _shutdown(self) -> None:
        self.flush()
        self.closed = True
        for conn in [self._conn, *self._peers.values()]:
            if conn is not None:
                await conn.close()

    def close(self) -> None:
        """Send what is queued, close every connection and stop the loop; idempotent."""
        if self.closed:
            return
        with contextlib.suppress(Exception):
            self.loop.run(self._shutdown(), timeout=SHUTDOWN_SECONDS)
        self.closed = True
        self.loop.stop()

    async def close_async(self) -> None:
        """``close``, awaited from another event loop instead of blocking it."""
        if self.closed:
            return
        with contextlib.suppress(Exception):
            await awaited(self.loop, self._shutdown, timeout=SHUTDOWN_SECONDS)
        self.closed = True
        self.loop.stop()  # quick: nothing is left running on it
