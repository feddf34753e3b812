"""The user's handle on a cluster, with Dask's names: blocking, or asynchronous.

``Client`` turns calls into tasks and futures and keeps count of the futures alive
for each key; everything on the wire goes through its ``Session`` (session.py),
which runs on a background event loop, so user threads never touch a socket.
With ``asynchronous=True`` the calls Dask awaits return awaitables instead of
blocking (asynchronous.py says how they are awaited).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import logging
import os
import threading
import uuid
import warnings
from collections.abc import (
    Callable,
    Generator,
    Iterable,
    Iterator,
)
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from apportion.client import (
    cluster_control,
    connect,
    dask_calls,
    dask_default,
    data_calls,
    handles,
    printing,
    recreate,
    remote_calls,
    shapes,
    shared_data,
    submission,
    task_stream,
    topics,
)
from apportion.client.asynchronous import Ready, awaited
from apportion.client.connect import (
    cluster_address,
    from_scheduler_file,
    scheduler_file_from_environment,
)
from apportion.client.future import CallbackRunner, Future, KeyState
from apportion.client.link import ClientLink, SchedulerLink
from apportion.client.session import Session, close_all
from apportion.client.state import (
    ClientState,
    Deliver,
    NoticeText,
    Outcome,
    Release,
    Reset,
    Settled,
)
from apportion.core.durations import Duration, seconds
from apportion.core.sizes import format_bytes
from apportion.deploy import local
from apportion.deploy.cluster import ClusterManager
from apportion.deploy.cluster_options import take_own_loop
from apportion.deploy.local import LocalCluster
from apportion.loop_thread import within
from apportion.net.security import Security, security_for
from apportion.protocol.base import Message
from apportion.protocol.tasks import (
    CancelKeys,
)

if TYPE_CHECKING:
    from apportion.client.executor import ClientExecutor

logger = logging.getLogger("apportion.client")

_UNEXPECTED = "ignored unexpected %s from the scheduler"

P = ParamSpec("P")
R = TypeVar("R")


def _linked(
    function: Callable[Concatenate[SchedulerLink, P], R],
) -> Callable[Concatenate[Client, P], R]:
    """A ``Client`` method that is ``function`` given the client's link: its name,
    signature and docstring are ``function``'s (the link standing for ``self``)."""

    @functools.wraps(function)
    def method(client: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return function(client._link, *args, **kwargs)

    return method


class Client:
    """Connect to a scheduler (``Client("tcp://host:8786")``), a ``LocalCluster``,
    or, with no address, start an embedded local cluster sized to this machine.

    As in Dask, keywords the client does not take go to that ``LocalCluster``:
    ``Client(n_workers=2, threads_per_worker=1, processes=False, memory_limit="2GiB",
    resources="GPU=1")``. With an address they are an error, except Dask's own
    client tuning (``serializers=``, ``security=``...), ignored with one
    ``IgnoredOptionWarning``.

    With ``asynchronous=True``, as in Dask, the constructor does not connect:
    ``client = await Client(..., asynchronous=True)`` or ``async with Client(...,
    asynchronous=True) as client:`` does. Then, from the event loop, ``await`` the
    calls Dask awaits (``await future``, ``await client.gather(...)``,
    ``await client.close()``...); ``submit`` and ``map`` return futures at once.

    With ``set_as_default`` (the default), Dask's own ``compute`` and ``persist`` run
    on the newest such client until it is closed, whether Dask was imported before
    the client was made or after.

    With no address and no ``scheduler_file``, ``APPORTION_SCHEDULER_FILE`` (set by
    ``apportion slurm`` for its command) names the scheduler to connect to, so that
    one script runs unchanged on a laptop and in a batch job; options meant for a
    local cluster are then ignored, with one ``IgnoredOptionWarning``.

    As Dask's, a client whose scheduler refuses the connection (nothing listens
    there yet: a script that has just started ``apportion scheduler`` in the
    background) tries again, with backoff, for up to ``timeout`` seconds, saying
    once after two seconds that it is waiting; then it raises
    ``ConnectionRefusedError("cannot connect to ADDRESS: connection refused (tried
    for 30s)")``. Any other failure (no answer, a peer that is not an apportion
    scheduler, a wrong secret) is raised at once. ``wait_for_scheduler=False``
    (not Dask's) tries once: a refusal is raised at once, as the command line's
    clients do, where a mistyped address must not make a command wait.
    """

    def __init__(
        self,
        address: str | LocalCluster | ClusterManager | None = None,
        *,
        timeout: Duration = 30.0,
        direct_to_workers: bool | None = None,
        name: str | None = None,
        set_as_default: bool = True,
        asynchronous: bool = False,
        security: Security | bool | None = None,
        scheduler_file: str | os.PathLike[str] | None = None,
        wait_for_scheduler: bool = True,
        **cluster_options: Any,
    ) -> None:
        take_own_loop(cluster_options)  # ``loop=client.loop``, as Dask scripts pass it
        if address is None and scheduler_file is None:
            scheduler_file = scheduler_file_from_environment(cluster_options)
        limit = 30.0 if timeout is None else seconds(timeout, "Client timeout") or 0.0
        if scheduler_file is not None:
            address, security = from_scheduler_file(scheduler_file, address, security, limit)
        #: The scheduler file this client was made from, or last wrote (Dask's name).
        self.scheduler_file = scheduler_file
        #: How this client and its parts reach the scheduler (client/link.py).
        self._link = ClientLink("", asynchronous)
        self._own_cluster: LocalCluster | None = None
        self.cluster: LocalCluster | None = None
        #: Connecting, for an asynchronous client being awaited (``__await__``).
        self._starting: asyncio.Future[Client] | None = None
        address, given, self._own_cluster = connect.cluster_to_use(
            address, security, cluster_options, asynchronous
        )
        if isinstance(address, LocalCluster):
            self.cluster = address
        address, given = cluster_address(address, given, asynchronous)
        self.scheduler_address = address
        #: What this client proves to the scheduler and workers, and expects of them.
        self.security = security_for(address, given)
        # A person's credential opens the scheduler only (workers' data ports know
        # the cluster's secret alone): their data always travels through it.
        self.direct_to_workers = False if self.security.person else direct_to_workers
        #: Seconds to connect, and to wait for a scatter; Dask's texts (``"60s"``) too.
        self.timeout: float = limit
        #: Whether connecting tries again, within ``timeout``, while refused (not Dask's).
        self._wait_for_scheduler = wait_for_scheduler
        self.name = name or f"client-{uuid.uuid4().hex[:8]}"
        # Impure keys: one random prefix per client plus a counter is as unique as a
        # uuid4 per task, at a fraction of the cost on the submit path.
        self._unique = f"{uuid.uuid4().hex[:16]}-"
        self._counter = itertools.count()
        #: Warnings the scheduler sent (e.g. requests no worker can meet).
        self.notices: list[str] = []
        # Re-entrant: garbage collection can run ``Future.__del__`` (which takes this
        # lock) in the middle of any allocation made while the lock is held.
        self._lock = threading.RLock()
        #: The keys this client holds futures of, as data (client/state.py).
        self._state = ClientState()
        #: Each key of ``_state``'s waiters, woken as the state says: same keys.
        self._waiting: dict[str, KeyState] = {}
        self._function = submission.FunctionCache()
        self._callbacks = CallbackRunner()
        self._dask_default = set_as_default
        #: Undoes ``with client:``'s making it current (``dask_default.enter``).
        self._entered: dask_default.Entered | None = None
        if asynchronous:
            return  # ``await client`` connects (``_start``)
        try:
            self._link.session = Session(
                address,
                self.name,
                self.timeout,
                self._on_message,
                self._scheduler_gone,
                security=self.security,
                wait_for_scheduler=wait_for_scheduler,
            )
            session = self._link.session
            session.run(printing.subscribe(self, session), self.timeout)
            # What ``repr`` shows, as an asynchronous client learns it when it connects.
            cluster_control.fetch_identity(self._link, self.timeout)
        except BaseException:
            if self._link.session is not None:
                self._link.session.close()
            if self._own_cluster is not None:
                self._own_cluster.close()
            raise
        if self._dask_default:
            dask_default.register(self)

    # --- connecting asynchronously --------------------------------------------------

    def __await__(self) -> Generator[Any, None, Client]:
        """``await Client(..., asynchronous=True)`` connects (starting its cluster, if
        it has one to start) and gives the client; a connected client at once."""
        return self._started().__await__()

    async def _started(self) -> Client:
        if self._link.session is not None:
            return self
        if self._closed:
            raise RuntimeError("this client is closed")
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        # Shielded: several awaiters share one start, and one of them giving up
        # (cancelled) must not stop it for the others.
        return await asyncio.shield(self._starting)

    async def _start(self) -> Client:
        if self.cluster is not None:
            await self.cluster  # starts an asynchronous one not started yet
            self.scheduler_address = self.cluster.scheduler_address
        session: Session | None = None
        try:
            session, identity = await connect.session_async(
                self.scheduler_address,
                self.name,
                self.timeout,
                self._on_message,
                self._scheduler_gone,
                self.security,
                wait_for_scheduler=self._wait_for_scheduler,
            )
            await awaited(session.loop, printing.subscribe, self, session, timeout=self.timeout)
        except BaseException:
            if session is not None:
                session.close()
            if self._own_cluster is not None:
                await self._own_cluster._close_async()
            raise
        self._link.session = session
        self._link.remember(identity)
        if self._dask_default:
            dask_default.register(self)
        return self

    def start(self) -> None:
        """Dask's ``start``: a blocking client is connected once made; an asynchronous
        one starts connecting here (``await client`` waits for it)."""
        if self._link.wants_async and self._starting is None and self._link.session is None:
            self._starting = asyncio.get_running_loop().create_task(self._start())

    # --- what the scheduler tells us ------------------------------------------------

    def _scheduler_gone(self, reason: str, kind: str = "gone") -> None:
        """Nothing more will come from the scheduler: no future may wait forever.

        Futures still pending fail with ``SchedulerGoneError`` (``kind`` "gone"), or,
        when this client was closed, ``LostDataError`` ("lost").
        """
        self._apply(lambda state: state.scheduler_lost(reason, kind))

    def _on_message(self, msg: Message) -> None:
        self._apply(lambda state: state.handle(msg))

    def _apply(self, decide: Callable[[ClientState], Iterable[Outcome]]) -> None:
        """Let the state decide, holding ``_lock``, and carry out what it decided.

        Releases are posted holding the lock, so that a submit of the same key from
        another thread cannot overtake them on their way to the scheduler. The rest
        (waking waiters, running their callbacks, delivering to subscriptions) runs
        after it is released: a thread holding a waiter's or a subscription's lock may
        drop a future meanwhile, and its ``__del__`` then waits for ``_lock``.
        """
        later: list[Callable[[], None]] = []
        with self._lock:
            for outcome in decide(self._state):
                if isinstance(outcome, Settled):
                    waiter = self._waiting.get(outcome.key)
                    if waiter is not None:
                        later.append(functools.partial(waiter.wake, outcome.callbacks))
                elif isinstance(outcome, Reset):
                    later.append(self._waiting[outcome.key].rearm)
                elif isinstance(outcome, Release):
                    self._session.post(outcome.key)
                elif isinstance(outcome, Deliver):
                    later.append(functools.partial(topics.deliver, self, outcome.message))
                elif isinstance(outcome, NoticeText):
                    later.append(functools.partial(self._notice, outcome.text))
                else:
                    later.append(functools.partial(logger.warning, _UNEXPECTED, outcome.name))
        for step in later:
            step()

    def _add_callback(self, key: str, callback: Callable[[], None]) -> bool:
        with self._lock:
            return self._state.add_callback(key, callback)

    def _notice(self, text: str) -> None:
        self.notices.append(text)
        logger.warning("scheduler: %s", text)

    # --- reference counting ---------------------------------------------------------

    def _ref(self, key: str) -> KeyState:
        with self._lock:
            record = self._state.ref(key)
            waiter = self._waiting.get(key)
            if waiter is None:
                waiter = self._waiting[key] = KeyState(key, record, self._add_callback)
            return waiter

    def _unref(self, key: str) -> None:
        # Not through ``_apply``: run for every future dropped, and all it may do is
        # post a release, which must happen holding the lock anyway.
        with self._lock:
            release = self._state.unref(key)
            if key in self._state.keys:
                return
            self._waiting.pop(key, None)  # the waiter goes with its record
            if release is not None:
                self._session.post(key)

    def _again(self, key: str, retry: bool = False) -> None:
        """``key`` submitted again after a cancel (``retry``: run again after it
        failed): pending again, before the request goes."""

        def again(state: ClientState) -> list[Outcome]:
            reset = state.retried(key) if retry else state.resubmitted(key)
            return [] if reset is None else [reset]

        self._apply(again)

    # --- submitting -----------------------------------------------------------------

    submit = submission.submit
    map = submission.map
    _submit_graph = submission.submit_graph
    _caught_up = submission.caught_up
    retry = submission.retry

    # Dask's collections, and Dask's scheduler function (dask_calls.py).
    get = dask_calls.get
    compute = dask_calls.compute
    persist = dask_calls.persist
    normalize_collection = dask_calls.normalize_collection

    # Running one task here, under a debugger (recreate.py).
    recreate_error_locally = recreate.recreate_error_locally
    recreate_task_locally = recreate.recreate_task_locally

    # What Dask scripts read off a client (handles.py).
    scheduler = property(handles.scheduler)
    loop = property(handles.loop)
    futures = property(handles.futures)

    # --- results --------------------------------------------------------------------

    gather = data_calls.gather
    _gather_keys = data_calls.gather_keys
    _gather_keys_awaited = data_calls.gather_keys_awaited
    _gather_pickled = data_calls.gather_pickled
    scatter = data_calls.scatter

    def cancel(self, futures: Future | Iterable[Future]) -> Any:
        """Cancel queued or running tasks; their futures (and dependents) fail as cancelled.

        Done at once; an asynchronous client returns an awaitable as well, as Dask's.
        """
        found: list[Future] = []
        shapes.collect(futures, found)
        keys = [f.key for f in found]
        self._apply(lambda state: state.cancel(keys))  # a finished result stays finished
        self._session.post(CancelKeys(keys))
        return self._link.ready(None)

    @classmethod
    def current(cls, allow_global: bool = True) -> Client:
        """The newest open client made with ``set_as_default=True`` (the default), as
        Dask's ``Client.current``; ``ValueError`` if there is none."""
        return default_client()

    @contextlib.contextmanager
    def as_current(self) -> Iterator[Client]:
        """Within the ``with`` block (in this thread or task only), ``Client.current()``
        and ``default_client()`` give this client, and Dask's ``compute`` runs on it
        while Dask's scheduler is apportion's (a client made with ``set_as_default``
        is open), as Dask's ``as_current``."""
        token = dask_default.set_current(self)
        try:
            yield self
        finally:
            dask_default.reset_current(token)

    @staticmethod
    def futures_of(collection: Any) -> list[Future]:
        """The futures in ``collection`` (Dask's ``Client.futures_of``)."""
        from apportion.client.waiting import futures_of

        return futures_of(collection)

    def get_executor(self, **task_keywords: Any) -> ClientExecutor:
        """This client as a ``concurrent.futures.Executor``; ``task_keywords``
        (``resources``, ``priority``, ``retries``, ``pure``, ...) apply to every call."""
        from apportion.client.executor import ClientExecutor

        return ClientExecutor(self, **task_keywords)

    # --- introspection --------------------------------------------------------------

    def write_scheduler_file(self, scheduler_file: str | os.PathLike[str]) -> None:
        """Write the scheduler's address and this client's secret to ``scheduler_file``
        (mode 0600), for ``Client(scheduler_file=...)`` and ``apportion worker
        --scheduler-file`` elsewhere, as Dask's does for the address alone.

        ``SchedulerFileBusy`` (an ``OSError``) if a running scheduler holds that file
        (``$APPORTION_HOME/scheduler.json`` while ``apportion scheduler`` runs): it is
        that scheduler's, which the user's commands reach through it. ``ValueError``,
        as Dask's, if this client already has a scheduler file (it was made from one,
        or wrote one): its path is ``client.scheduler_file``."""
        if self.scheduler_file is not None:
            raise ValueError(
                f"this client's scheduler file is already {os.fspath(self.scheduler_file)!r}"
                " (Scheduler file already set)"
            )
        identity = self._link.identity.get("id", "")
        connect.write_client_file(scheduler_file, self.scheduler_address, self.security, identity)
        self.scheduler_file = scheduler_file

    def sync(
        self,
        func: Callable[..., Any],
        *args: Any,
        asynchronous: bool | None = None,
        callback_timeout: Duration | None = None,
        **kwargs: Any,
    ) -> Any:
        """Dask's ``sync``: call ``func(*args, **kwargs)``, a coroutine function or a
        plain one, and give its outcome as this client gives outcomes.

        Called where this client's calls are awaited (an asynchronous client, from a
        running loop), as in Dask: what ``func`` returns, an awaitable to await in that
        loop (a plain function's value comes back as it is). Otherwise the outcome: a
        plain function runs here, and a coroutine it returns runs to its end on the
        client's own loop, so a coroutine function works from a script, or from a
        notebook whose loop is running. ``callback_timeout`` (seconds or Dask's text)
        raises ``TimeoutError`` from an awaitable that takes longer.
        """
        limit = seconds(callback_timeout)
        outcome = func(*args, **kwargs)
        if not inspect.isawaitable(outcome):
            return outcome
        if self.asynchronous if asynchronous is None else asynchronous:
            return within(outcome, limit)
        return self._session.run(within(outcome, limit))

    # --- the link's state, as the client's ----------------------------------------

    @property
    def asynchronous(self) -> bool:
        """True when this client's calls return awaitables: it was made with
        ``asynchronous=True`` and is called from a running event loop (Dask's rule)."""
        return self._link.asynchronous

    @property
    def scheduler_address(self) -> str:
        """The scheduler's address ("" for a cluster that has not started yet)."""
        return self._link.address

    @scheduler_address.setter
    def scheduler_address(self, address: str) -> None:
        self._link.address = address

    @property
    def _session(self) -> Session:
        return self._link.connected

    @property
    def _closed(self) -> bool:
        return self._link.closed

    # --- the cluster, through the link (cluster_control, remote_calls, shared_data,
    # task_stream): what they do cannot reach this client's keys or futures --------

    scheduler_info = _linked(cluster_control.scheduler_info)
    run = _linked(remote_calls.run)
    run_on_scheduler = _linked(remote_calls.run_on_scheduler)
    upload_file = _linked(remote_calls.upload_file)
    register_plugin = _linked(remote_calls.register_plugin)
    register_worker_plugin = _linked(remote_calls.register_worker_plugin)
    unregister_worker_plugin = _linked(remote_calls.unregister_worker_plugin)
    get_versions = _linked(remote_calls.get_versions)
    get_worker_logs = _linked(remote_calls.get_worker_logs)
    get_scheduler_logs = _linked(remote_calls.get_scheduler_logs)
    publish_dataset = _linked(shared_data.publish_dataset)
    unpublish_dataset = _linked(shared_data.unpublish_dataset)
    list_datasets = _linked(shared_data.list_datasets)
    set_metadata = _linked(shared_data.set_metadata)
    get_metadata = _linked(shared_data.get_metadata)
    waiting_work = _linked(shared_data.waiting_work)
    cluster_status = _linked(shared_data.cluster_status)
    who_has = _linked(shared_data.who_has)
    has_what = _linked(shared_data.has_what)
    nthreads = _linked(shared_data.nthreads)
    #: Dask's older name for ``nthreads``.
    ncores = nthreads
    processing = _linked(shared_data.processing)
    replicate = _linked(shared_data.replicate)
    rebalance = _linked(shared_data.rebalance)
    get_task_stream = _linked(task_stream.get_task_stream)
    why = _linked(cluster_control.why)
    story = _linked(cluster_control.story)
    dump_cluster_state = _linked(cluster_control.dump_cluster_state)
    nbytes = _linked(cluster_control.nbytes)

    def wait_for_workers(self, n_workers: int = 1, timeout: Duration | None = None) -> Any:
        """Block (or, asynchronous, an awaitable) until at least ``n_workers`` workers are
        connected."""
        return cluster_control.wait_for_workers(self._link, n_workers, seconds(timeout))

    @property
    def dashboard_link(self) -> str | None:
        """A fresh one-time login link to the scheduler's dashboard; None if it serves
        none (``cluster_control.dashboard_link``)."""
        return cluster_control.dashboard_link(self._link, self.security)

    def restart(self, timeout: Duration | None = None, wait_for_workers: bool = True) -> Any:
        """Drop every task and result in the cluster and start every worker afresh
        (``cluster_control.restart``); ``timeout`` is four times the client's unless
        given."""
        limit = self.timeout * 4 if timeout is None else seconds(timeout) or 0.0
        return cluster_control.restart(self._link, self.cluster, limit, wait_for_workers)

    def get_dataset(self, name: Any, default: Any = shared_data.NO_DEFAULT) -> Any:
        """The object published as ``name`` (a list of them for a list of names), its
        futures now this client's; ``default`` (if given) for a name not published."""
        return shared_data.get_dataset(self._link, self._future, name, default)

    @property
    def datasets(self) -> shared_data.Datasets:
        """The published datasets as a mutable mapping: get, set, delete, ``in``, iterate
        (a blocking client's; an asynchronous one awaits ``get_dataset`` and the rest)."""
        return shared_data.datasets(self._link, self._future)

    def _future(self, key: str) -> Future:
        return Future(key, self)

    def _unique_name(self) -> str:
        return f"{self._unique}{next(self._counter)}"

    def shutdown(self) -> Any:
        """Close this client and its cluster, even one it did not start (as Dask's).

        Only a ``LocalCluster`` object can be closed from here: given just an
        address, the scheduler keeps running and a ``UserWarning`` says so. An
        asynchronous client returns an awaitable that does it.
        """
        cluster = self.cluster
        if cluster is None:
            warnings.warn(
                f"shutdown() closes the client, but the scheduler at {self.scheduler_address} "
                "was not started here and keeps running; stop it where it was started",
                UserWarning,
                stacklevel=2,
            )
        if self.asynchronous:
            return self._shutdown_async(cluster)
        self._close_blocking()
        if cluster is not None:
            cluster._close_blocking()
        return None

    async def _shutdown_async(self, cluster: LocalCluster | None) -> None:
        await self._close_async()
        if cluster is not None:
            await cluster._close_async()

    # --- closing --------------------------------------------------------------------

    def close(self) -> Any:
        """Release everything, disconnect, and stop an embedded cluster; idempotent.

        An asynchronous client returns an awaitable that does it.
        """
        if self.asynchronous:
            return self._close_async() if not self._closed else Ready(None)
        self._close_blocking()
        return None

    def _close_blocking(self) -> None:
        if self._closed:
            return
        self._link.closed = True
        self._state.close()
        if self._link.session is not None:
            self._link.session.close()
        self._after_close()
        if self._own_cluster is not None:
            self._own_cluster._close_blocking()

    async def _close_async(self) -> None:
        if self._closed:
            return
        self._link.closed = True
        self._state.close()
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            with contextlib.suppress(BaseException):
                await self._starting
        if self._link.session is not None:
            await self._link.session.close_async()
        self._after_close()
        if self._own_cluster is not None:
            await self._own_cluster._close_async()

    def _after_close(self) -> None:
        self._scheduler_gone(f"the client for {self.scheduler_address} was closed", "lost")
        self._callbacks.stop()
        if self._dask_default:
            dask_default.unregister(self)

    # Inside ``with client:`` (``async with``) a default client is the current one,
    # as with ``as_current``, for this thread or task: Dask's ``get_scheduler()`` is
    # its ``get`` there. Leaving in another thread or task than the one that entered
    # raises Dask's ValueError ("... was created in a different Context"), after
    # closing the client all the same.

    def __enter__(self) -> Client:
        if self.asynchronous:
            raise TypeError("this Client is asynchronous: use 'async with', not 'with'")
        self._entered = dask_default.enter(self) if self._dask_default else None
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            dask_default.leave(self._entered)
        finally:
            self._entered = None
            self._close_blocking()

    async def __aenter__(self) -> Client:
        await self
        self._entered = dask_default.enter(self) if self._dask_default else None
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            dask_default.leave(self._entered)
        finally:
            self._entered = None
            await self._close_async()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if not self._closed and self._own_cluster is not None:
                self._close_blocking()

    def __repr__(self) -> str:
        """Dask's shape, from the picture last fetched (when it connected, or at the
        last ``scheduler_info``, ``wait_for_workers`` or card): no I/O here."""
        info, status, address = self._link.identity, self._link.status, self.scheduler_address
        if status != "connected":
            where = f": {address!r}" if address else ""
            return f"<Client: No scheduler connected ({status}{where})>"
        if not info:
            return f"<Client: scheduler={address!r}>"
        workers = info.get("workers", {}).values()
        threads = sum(w.get("nthreads", 0) for w in workers)
        memory = sum(w.get("memory_limit") or 0 for w in workers)
        return (
            f"<Client: {self.scheduler_address!r} processes={len(workers)} "
            f"threads={threads}, memory={format_bytes(memory, digits=2)}>"
        )

    def _repr_html_(self) -> str:
        """The card Jupyter shows (``cluster_control.card``): scheduler, workers, each
        pool's free and total units, the dashboard link; never raises."""
        return cluster_control.card(self._link, self.name, lambda: self.dashboard_link)


def default_client(c: Client | None = None) -> Client:
    """``c`` if given, else the newest open client made with ``set_as_default=True``
    (the default), as Dask's ``default_client``; ``ValueError`` if there is none."""
    if c is not None:
        return c
    client = dask_default.current()
    if not isinstance(client, Client):  # None: every default client is a Client
        raise ValueError(
            "No clients found (no open client): start one first, e.g. client = Client() "
            "for a local cluster or Client('tcp://scheduler:8786')"
        )
    return client


def client_of_cluster(cluster: LocalCluster) -> Client:
    """``cluster.get_client()``: the current client (``Client.current()``) if it is
    ``cluster``'s, else a new client of it, as Dask's ``Cluster.get_client``."""
    current = dask_default.current()
    if isinstance(current, Client) and current.cluster is cluster:
        return current
    return Client(cluster)


local.client_type = client_of_cluster  # LocalCluster.get_client (see ``local.client_type``)
# At exit, clients close before the clusters they use, so that none reports its
# scheduler lost; deployment runs this without importing the client.
local.close_first.append(close_all)
