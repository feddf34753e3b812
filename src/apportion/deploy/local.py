"""An embedded cluster on this machine: the default that needs no set-up.

The scheduler runs on a background thread of this process. Workers are separate
processes started as fresh interpreters running apportion's own worker entry point
(``python -m apportion.cli.main worker``), never forks or spawns of the user's
``__main__``: a script without an ``if __name__ == "__main__":`` guard works, and
functions defined in it travel by value. They are supervised from a thread of this
process (``local_processes.py``): one that dies is started again, a task that kills
worker after worker fails with ``WorkerCrashedError``, and none outlives this process.

With ``processes=False`` the workers run on the scheduler's event loop, in this
process: nothing to supervise, and no memory limit can be enforced.

The arguments are Dask's (``cluster_options.py`` sorts them): a script written for
``distributed.LocalCluster`` runs with the import changed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import inspect
import itertools
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from functools import partial
from typing import Any

from apportion.core.durations import Duration, seconds
from apportion.core.resources import ResourceSpec, format_resources
from apportion.core.sizes import format_bytes
from apportion.deploy import notebook
from apportion.deploy.cluster_options import (
    DASK_CLIENT_OPTIONS,
    DASK_CLUSTER_OPTIONS,
    host_for_protocol,
    log_levels,
    memory_limit_bytes,
    memory_thresholds,
    sort_options,
    take_own_loop,
    warn_ignored,
)
from apportion.deploy.local_processes import LOG_LINES, WorkerProcesses
from apportion.deploy.local_shape import (
    LOCAL_RECONNECT_SECONDS,
    cluster_shape,
    default_resources,
    worker_command,
    worker_spec,
)
from apportion.loop_thread import (
    LoopThread,
    in_running_loop,
    in_thread,
    on_loop_thread,
    within,
)
from apportion.net.security import Security
from apportion.protocol.worker import WorkerDied
from apportion.scheduler.events import WorkerDeathReport
from apportion.scheduler.service import Scheduler
from apportion.scheduler.state import SchedulerConfig
from apportion.worker.memory_policy import THRESHOLD_NAMES, threshold_text

#: What ``get_client`` calls: the current client of the cluster, else a new one.
#: ``apportion.client.client`` sets it as it loads (``get_client`` loads it by name
#: if nothing has yet): the client imports deployment, since ``Client()`` starts a
#: LocalCluster, so deployment must not import it back, not even for a type (``get_client`` is typed
#: ``Any`` for that reason: it gives a ``Client``).
client_type: Callable[[LocalCluster], Any] | None = None

#: What closes at interpreter exit before the clusters do: the clients' sessions,
#: which ``apportion.client.client`` puts here as it loads (deployment does not import
#: the client).
close_first: list[Callable[[], None]] = []

#: Seconds a worker removed by ``scale`` gets to finish its tasks and hand off results.
DRAIN_SECONDS = 30.0


#: Clusters not closed yet: closed at interpreter exit (see ``_close_at_exit``).
_open_clusters: weakref.WeakSet[LocalCluster] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close what a script left open, clients first, as Dask does at exit.

    Left alone, the loop thread is frozen at exit with its tasks pending ("Task was
    destroyed but it is pending!", unclosed sockets). Clients go first so that none
    sees its scheduler vanish and reports it as a lost connection.
    """
    for close in close_first:
        close()
    for cluster in list(_open_clusters):
        with contextlib.suppress(Exception):
            cluster.close()


class _ThreadLogs(logging.Handler):
    """Keeps what each cluster's event loop logs (scheduler, in-process workers).

    One handler for every cluster of the process, on the ``apportion`` logger. A
    handler there would stop Python's last-resort output of warnings to stderr,
    so this one gives those records to it where no other handler would take them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.by_thread: dict[int | None, deque[str]] = {}
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        lines = self.by_thread.get(record.thread)
        if lines is not None:
            lines.append(self.format(record) + "\n")
        last = logging.lastResort
        if last is not None and record.levelno >= last.level and not self._others(record.name):
            last.handle(record)

    def _others(self, name: str) -> bool:
        logger: logging.Logger | None = logging.getLogger(name)
        while logger is not None:
            if any(h is not self for h in logger.handlers):
                return True
            if not logger.propagate:
                return False
            logger = logger.parent
        return False


_THREAD_LOGS = _ThreadLogs()
logging.getLogger("apportion").addHandler(_THREAD_LOGS)


class LocalCluster:
    """A scheduler and workers on this machine, with Dask's arguments.

    ``LocalCluster(n_workers=2, threads_per_worker=1, resources="GPU=2")`` gives every
    worker the same shape; ``workers=[{"nthreads": 4, "resources": {"GPU": 2}}, ...]``
    describes each worker. A local cluster has only the workers it is given, so a
    task asking for more than any worker offers fails at once with
    ``UnsatisfiableError``.

    ``memory_limit`` (each worker: ``"4GiB"``, bytes, a fraction of the machine,
    ``"auto"`` for an even share, ``0``/``None`` for none) has each worker spill
    results to disk (in a directory under Dask's ``local_directory``) and pause
    under memory pressure, and its supervisor kill and restart a worker past the
    terminate fraction, its task told it ran out of memory; the fractions are Dask's
    ``memory_target_fraction``, ``memory_spill_fraction``, ``memory_pause_fraction``
    and ``memory_terminate_fraction`` (docs/memory.md). ``silence_logs`` is the
    level from which workers' log lines reach this process's stderr (``get_logs``
    keeps more). Both need worker processes: with ``processes=False`` the workers
    share this process and its logging, and have no memory limit.
    ``dashboard_address`` (``":8787"``: on the scheduler's host, loopback unless
    ``host`` says otherwise; a free port if 8787 is taken) serves the live dashboard
    (docs/dashboard.md); None serves none. Dask's ``protocol``: ``"tcp://"`` (the
    default), ``"tls://"`` (with ``security``'s certificates) or, with
    ``processes=False``, ``"inproc://"``: in memory, no socket at all. Options that
    only tune Dask's internals (``nanny=``, ``interface=``...) are ignored with one
    ``IgnoredOptionWarning`` naming them.
    """

    def __init__(
        self,
        n_workers: int | None = None,
        threads_per_worker: int | None = None,
        processes: bool = True,
        memory_limit: str | float | None = "auto",
        resources: ResourceSpec = None,
        dashboard_address: str | None = ":8787",
        silence_logs: int | str | bool | None = logging.WARN,
        host: str | None = None,
        scheduler_port: int = 0,
        name: str | None = None,
        workers: Sequence[Mapping[str, Any]] | None = None,
        *,
        timeout: Duration = 60.0,
        asynchronous: bool = False,
        security: Security | bool | None = None,
        allow_plaintext: bool = False,
        **kwargs: Any,
    ) -> None:
        #: Made with ``asynchronous=True``: ``await`` starts it, ``await close()`` stops it.
        self._asynchronous = asynchronous
        #: Starting, for an asynchronous cluster being awaited (``__await__``).
        self._starting: asyncio.Future[LocalCluster] | None = None
        self._start_timeout = timeout
        #: When each worker spills, pauses and is killed, as fractions of its limit.
        self.memory_thresholds = memory_thresholds(kwargs, os.environ)
        #: Where each worker process makes its scratch directory (None: the system's).
        self.local_directory = _directory(kwargs.pop("local_directory", None))
        take_own_loop(kwargs)
        #: Dask's ``death_timeout``: each worker that cannot reach the scheduler this
        #: long exits (None: the local default, ``LOCAL_RECONNECT_SECONDS``), and, as
        #: Dask's servers must start within it, a cluster not up by then fails to start.
        self.death_timeout = seconds(kwargs.pop("death_timeout", None), "death_timeout")
        host = host_for_protocol(kwargs.pop("protocol", None), host, processes)
        warn_ignored(
            sort_options(kwargs, DASK_CLUSTER_OPTIONS | DASK_CLIENT_OPTIONS, "LocalCluster()"),
            "LocalCluster",
        )
        if n_workers is not None and n_workers < 0:
            raise ValueError(f"n_workers must be 0 or more, got {n_workers}")
        count, threads = cluster_shape(n_workers, threads_per_worker, processes)
        if workers is None:
            resources = default_resources() if resources is None else resources
            workers = [{"nthreads": threads, "resources": resources}] * count
        self.name = name or f"LocalCluster-{os.getpid()}-{id(self):x}"
        self.processes = processes
        self.memory_limit = memory_limit_bytes(memory_limit, max(1, len(workers)))
        self.dashboard_address = dashboard_address
        self.specs = [worker_spec(i, w) for i, w in enumerate(workers)]
        names = [spec["name"] for spec in self.specs]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            # Two live workers never share a name (the scheduler refuses the second).
            raise ValueError(f"worker names must be distinct; given more than once: {twice}")
        #: The shape ``scale`` gives new workers: the last one described.
        self._template = (
            dict(self.specs[-1])
            if self.specs
            else worker_spec(0, {"nthreads": threads, "resources": resources})
        )
        self._names = itertools.count(len(self.specs))
        self._log_level, self._show_from = log_levels(silence_logs)
        self._scheduler_log: deque[str] = deque(maxlen=LOG_LINES)
        #: This cluster's credentials: a secret of its own, made here, unless given
        #: (``security=True``: that and TLS with a temporary certificate, as Dask's).
        self.security = (
            Security.temporary() if security is True else security or Security.in_memory()
        )
        self.scheduler = Scheduler(
            host or "127.0.0.1",
            scheduler_port,
            config=SchedulerConfig(fail_unsatisfiable=True),
            security=self.security,
            allow_plaintext=allow_plaintext,
            dashboard_address=dashboard_address,
        )
        #: The worker processes (None in-process, and until started).
        self._pool: WorkerProcesses | None = None
        self._workers: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False
        #: Torn down: everything started has been stopped (``_close_blocking``).
        self._stopped = False
        #: The scheduler's address; "" until started.
        self.scheduler_address = ""
        #: None until started: the loop thread the scheduler runs on.
        self._loop: LoopThread | None = None
        #: The notebook widget ``_ipython_display_`` made (notebook.py), once shown.
        self._cached_widget: Any = None
        if not asynchronous:
            self._start()

    def _start(self) -> None:
        """Start the scheduler and the workers, and wait for the workers to connect;
        blocks (an asynchronous cluster runs it on a thread of its own)."""
        loop = self._loop = LoopThread("apportion-cluster")
        self._loop_ident = loop.run(_thread_ident())
        _THREAD_LOGS.by_thread[self._loop_ident] = self._scheduler_log
        if self.processes:
            self._pool = WorkerProcesses(
                self._report_death,
                memory_limit=self.memory_limit,
                memory_terminate=self.memory_thresholds.terminate,
                log_level=self._log_level,
                show_from=self._show_from,
                credentials=self.security.environment("worker"),
            )
        self._finalizer = weakref.finalize(self, _finalize, loop, self._pool)
        # At exit ``_close_at_exit`` closes the cluster properly; run first (atexit
        # order), this would stop the loop that closing needs.
        self._finalizer.atexit = False
        _open_clusters.add(self)
        began = time.monotonic()
        try:
            loop.run(self.scheduler.start())
            self.scheduler_address = self.scheduler.address
            if self._pool is not None:
                for spec in self.specs:
                    self._pool.add(self._command(spec), spec["name"])
            else:
                loop.run(self._start_in_process(self.specs))
            limit, what = seconds(self._start_timeout), "workers did not connect"
            late = "the cluster did not start within its death_timeout"
            if self.death_timeout is not None and (limit is None or self.death_timeout < limit):
                limit, what = self.death_timeout, late
            self._wait(self._started(len(self.specs)), limit, what)
            if self._closed:
                raise RuntimeError("the cluster was closed while it started")
            if self.death_timeout is not None and time.monotonic() - began > self.death_timeout:
                raise TimeoutError(f"{late} after {self.death_timeout}s")
        except BaseException:
            self._close_blocking()
            raise

    # --- starting and stopping asynchronously ----------------------------------------

    def __await__(self) -> Generator[Any, None, LocalCluster]:
        """``await LocalCluster(..., asynchronous=True)`` starts it (on a thread of its
        own, so the caller's loop runs on meanwhile) and gives the cluster; a started
        one at once."""
        return self._started_async().__await__()

    async def _started_async(self) -> LocalCluster:
        if self._loop is not None and self._starting is None:
            return self  # started by the constructor
        if self._closed:
            raise RuntimeError("this cluster is closed")
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start_async())
        # Shielded: several awaiters share one start; one giving up must not stop it.
        return await asyncio.shield(self._starting)

    async def _start_async(self) -> LocalCluster:
        await in_thread(self._start, "apportion-cluster-start")
        return self

    async def __aenter__(self) -> LocalCluster:
        return await self

    async def __aexit__(self, *exc: object) -> None:
        await self._close_async()

    @property
    def asynchronous(self) -> bool:
        """True when this cluster's ``close``, ``scale`` and ``wait_for_workers`` return
        awaitables: made with ``asynchronous=True`` and called from a running loop, or
        called from the cluster's own loop (``sync``), where blocking would never end."""
        return (self._asynchronous and in_running_loop()) or on_loop_thread(self._loop)

    def sync(
        self,
        func: Callable[..., Any],
        *args: Any,
        asynchronous: bool | None = None,
        callback_timeout: Duration | None = None,
        **kwargs: Any,
    ) -> Any:
        """Dask's ``sync``: call ``func(*args, **kwargs)``, a coroutine function or a
        plain one, for a caller of either kind.

        Where this cluster's calls are awaited (``asynchronous``): what ``func``
        returns, an awaitable to await (a plain function's value as it is).
        Otherwise ``func`` runs on the cluster's own event loop, the scheduler's, a
        coroutine it returns is awaited there, and the outcome comes back here.
        ``callback_timeout`` (seconds or Dask's text) raises ``TimeoutError`` after.
        """
        limit = seconds(callback_timeout)
        if self.asynchronous if asynchronous is None else asynchronous:
            outcome = func(*args, **kwargs)
            return within(outcome, limit) if inspect.isawaitable(outcome) else outcome
        return self._thread.call(partial(func, *args, **kwargs), timeout=limit)

    def _command(self, spec: Mapping[str, Any]) -> list[str]:
        cmd = worker_command(self.scheduler_address, spec)
        cmd += ["--memory-limit", str(self.memory_limit), "--no-supervisor"]
        for name in THRESHOLD_NAMES:
            cmd += [f"--memory-{name}", threshold_text(getattr(self.memory_thresholds, name))]
        if self.local_directory is not None:
            cmd += ["--local-directory", self.local_directory]
        if self.death_timeout is not None:
            cmd += ["--death-timeout", repr(self.death_timeout)]
        return cmd

    def _report_death(self, report: WorkerDied) -> None:
        """How a worker died, straight into the scheduler's state (from the supervisor)."""
        event = WorkerDeathReport(report, self.scheduler.clock.monotonic())
        with contextlib.suppress(RuntimeError):  # the loop stopped: the cluster is closing
            self._thread.loop.call_soon_threadsafe(self.scheduler.handle, event)

    @property
    def _thread(self) -> LoopThread:
        """The loop thread the scheduler runs on, once started."""
        if self._loop is None:
            raise RuntimeError(
                "this LocalCluster is asynchronous and not started yet: await it first "
                "(cluster = await LocalCluster(..., asynchronous=True), or async with)"
            )
        return self._loop

    async def _start_in_process(self, specs: list[dict[str, Any]]) -> None:
        from apportion.worker.service import Worker

        for spec in specs:
            worker = Worker(
                self.scheduler_address,
                nthreads=spec["nthreads"],
                resources=format_resources(spec["resources"], spec["units"]),
                name=spec["name"],
                reconnect_timeout=LOCAL_RECONNECT_SECONDS,
                death_timeout=self.death_timeout,
            )
            await worker.start()
            self._workers.append(worker)

    # --- what scripts look at -------------------------------------------------------

    @property
    def workers(self) -> dict[str, Any]:
        """Worker name -> its spec (processes) or its ``Worker`` (in-process), as Dask's
        name -> worker mapping; ``len()`` counts the workers kept alive."""
        if self._pool is not None:
            specs = {spec["name"]: spec for spec in self.specs}
            return {name: dict(specs[name]) for name in self._pool.names}
        return {w.name: w for w in self._workers}

    @property
    def _procs(self) -> list[Any]:
        """The worker processes running now (for tests that kill one)."""
        return [] if self._pool is None else self._pool.processes

    @property
    def dashboard_link(self) -> str | None:
        """A fresh one-time login link to this cluster's dashboard (a new one on each
        access, see ``Client.dashboard_link``); None without a dashboard or before
        the cluster has started. Dask's ``distributed.dashboard.link`` setting, where
        set, gives the link instead (``dashboard.link_template``)."""
        dashboard = self.scheduler.dashboard
        if dashboard is None or dashboard.origin is None or self._stopped:
            return None
        return dashboard.user_link()

    def get_client(self) -> Any:
        """The current client (``Client.current()``) if it is this cluster's, else a
        new client of this cluster (close it when done), as Dask's."""
        if client_type is None:  # by name: deployment may not import the client
            importlib.import_module("apportion.client.client")
        assert client_type is not None, "apportion.client.client sets it as it loads"
        return client_type(self)

    def get_logs(self) -> dict[str, str]:
        """Recent log text: ``"scheduler"`` (everything this cluster's event loop logged,
        in-process workers included) and one entry per worker process, restarts
        included, at the level its workers log (INFO unless ``silence_logs`` is lower)."""
        out = {"scheduler": "".join(self._scheduler_log)}
        if self._pool is not None:
            out.update((name, log.text()) for name, log in self._pool.logs.items())
        return out

    def wait_for_workers(self, n_workers: int = 1, timeout: Duration | None = None) -> Any:
        """Block until at least ``n_workers`` workers are connected to the scheduler
        (an asynchronous cluster: an awaitable that waits)."""
        if self.asynchronous:
            return self._wait_async(n_workers, seconds(timeout))
        self._wait(
            lambda: len(self.scheduler.state.workers) >= n_workers,
            timeout,
            f"fewer than {n_workers} workers connected",
        )

    def _started(self, n: int) -> Callable[[], bool]:
        """True once ``n`` workers are connected; raises if one keeps dying on the way
        (a broken environment), instead of restarting it until the timeout."""

        def check() -> bool:
            failing = self._pool.failing() if self._pool is not None else []
            if failing:
                name = failing[0]
                raise RuntimeError(
                    f"worker {name} exited again and again while starting; its log:\n"
                    + self.get_logs().get(name, "")[-3000:]
                )
            return len(self.scheduler.state.workers) >= n

        return check

    async def _wait_async(self, n_workers: int, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while len(self.scheduler.state.workers) < n_workers:
            if self._closed:
                raise RuntimeError("the cluster was closed")
            if deadline is not None and loop.time() > deadline:
                raise TimeoutError(f"fewer than {n_workers} workers connected after {timeout}s")
            await asyncio.sleep(0.02)  # no event says "a worker joined" outside the loop

    def _wait(self, done: Callable[[], bool], timeout: Duration | None, what: str) -> None:
        timeout = seconds(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            if self._closed:
                raise RuntimeError("the cluster was closed")
            if deadline is not None and time.monotonic() > deadline:
                logs = self.get_logs()
                tail = "".join(text[-2000:] for name, text in logs.items() if name != "scheduler")
                raise TimeoutError(
                    f"{what} after {timeout}s" + (f"; worker logs:\n{tail}" if tail else "")
                )
            time.sleep(0.02)

    # --- changing the workers ---------------------------------------------------------

    def scale(self, n: int, timeout: Duration = DRAIN_SECONDS + 30.0) -> Any:
        """Grow or shrink to ``n`` workers; returns once there are ``n`` (an
        asynchronous cluster: an awaitable, the work done on a thread of its own).

        New workers take the shape of the last one described. Workers leave newest
        first, each drained: its running tasks finish and the results still needed
        are handed to the workers that stay, so no accepted work is lost.
        """
        if n < 0:
            raise ValueError(f"scale: n must be 0 or more, got {n}")
        limit = seconds(timeout) or 0.0
        if self.asynchronous:
            return in_thread(partial(self._scale, n, limit), "apportion-cluster-scale")
        self._scale(n, limit)
        return None

    def _scale(self, n: int, timeout: float) -> None:
        with self._lock:
            current = list(self.workers)
            if n > len(current):
                new = [
                    {**self._template, "name": self._new_name()} for _ in range(n - len(current))
                ]
                self.specs += new
                if self._pool is not None:
                    for spec in new:
                        self._pool.add(self._command(spec), spec["name"])
                else:
                    self._thread.run(self._start_in_process(new))
            elif n < len(current):
                self._retire(current[n:][::-1], timeout)
            self._wait(lambda: self._connected() == n, timeout, f"not {n} workers")

    def _new_name(self) -> str:
        """``worker-N`` for the next N no worker of this cluster was ever named."""
        taken = {spec["name"] for spec in self.specs}
        while (name := f"worker-{next(self._names)}") in taken:
            pass
        return name

    def _connected(self) -> int:
        return len(self.scheduler.state.workers)

    def _retire(self, names: list[str], timeout: float) -> None:
        if self._pool is not None:
            for name in names:
                self._pool.retire(name)
            self._pool.wait_retired(timeout)
            return
        leaving = [w for w in self._workers if w.name in names]
        self._workers = [w for w in self._workers if w.name not in names]

        async def drain() -> None:
            for worker in leaving:
                await worker.drain(DRAIN_SECONDS)

        self._thread.run(drain(), timeout)

    def quiet_workers(self) -> None:
        """Stop showing the running workers' logs: a restart is about to disconnect them."""
        if self._pool is not None:
            self._pool.mute()

    def restart_workers(self, timeout: Duration | None = None, wait: bool = True) -> None:
        """Replace every worker process by a fresh one; with ``wait``, return once all
        are back. In-process workers are not replaced (``Client.restart`` resets them).
        """
        if self._pool is None:
            if wait:
                self.wait_for_workers(len(self._workers), timeout)
            return
        old = self.worker_pids()
        self._pool.mute()
        self._pool.replace_all()
        if wait:
            self.wait_replaced(old, timeout)

    def worker_pids(self) -> set[int]:
        """The pids of the worker processes running now (none in-process)."""
        return {proc.pid for proc in self._procs}

    def wait_replaced(self, old: set[int], timeout: Duration | None) -> None:
        """Return once every worker kept alive is connected from a process not in ``old``."""
        expected = len(self.workers)

        def fresh() -> bool:
            pids = {w.pid for w in list(self.scheduler.state.workers.values())}
            return len(pids) >= expected and not old & pids

        self._wait(fresh, timeout, "the workers did not come back")

    # --- closing ----------------------------------------------------------------------

    def close(self, timeout: Duration = 5.0) -> Any:
        """Stop the workers (drained, then killed after ``timeout``) and the scheduler;
        idempotent. An asynchronous cluster returns an awaitable that does it."""
        limit = seconds(timeout) or 0.0
        if self.asynchronous:
            return self._close_async(limit)
        self._close_blocking(limit)
        return None

    async def _close_async(self, timeout: float = 5.0) -> None:
        """``close`` from a running loop: after a start under way, on a thread of its own."""
        self._closed = True  # a start under way stops at its next check
        starting = self._starting
        if starting is not None and not starting.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(starting)
        if self._loop is not None and not self._stopped:
            await in_thread(partial(self._close_blocking, timeout), "apportion-cluster-close")

    def _close_blocking(self, timeout: float = 5.0) -> None:
        self._closed = True  # a start under way on another thread stops at its next check
        loop = self._loop
        if loop is None or self._stopped:
            return  # nothing started, or stopped already
        self._stopped = True

        async def stop_in_process() -> None:
            for worker in self._workers:
                with contextlib.suppress(Exception):
                    await worker.close()
            await self.scheduler.close()

        if self._pool is not None:
            self._pool.close(timeout)
        with contextlib.suppress(Exception):
            loop.run(stop_in_process(), timeout=15)
        loop.stop()
        _THREAD_LOGS.by_thread.pop(self._loop_ident, None)
        self._finalizer.detach()

    def __enter__(self) -> LocalCluster:
        if self._loop is None:
            raise TypeError("this LocalCluster is asynchronous: use 'async with', not 'with'")
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_blocking()

    def _repr_html_(self) -> str:
        """The card Jupyter shows (``notebook.card``): scheduler, workers, each pool's
        free and total units, the dashboard link; never raises."""
        return notebook.card(self)

    def _ipython_display_(self) -> None:
        """Jupyter's display: a card that keeps itself current with ipywidgets, the
        card alone without (``notebook.display``)."""
        notebook.display(self)

    def __repr__(self) -> str:
        kind = "processes" if self.processes else "in-process"
        address = self.scheduler_address or "(not started)"
        threads = sum(spec["nthreads"] for spec in self.specs if spec["name"] in self.workers)
        count = len(self.workers)
        limited = self.memory_limit and self.processes  # nothing enforces it in-process
        memory = f", memory={format_bytes(self.memory_limit * count, digits=2)}" if limited else ""
        return (
            f"LocalCluster({self.name!r}, {address!r}, workers={count}, "
            f"threads={threads}{memory}, {kind})"
        )


async def _thread_ident() -> int:
    """The identity of the thread running this coroutine's loop."""
    return threading.get_ident()


def _finalize(loop: LoopThread, pool: WorkerProcesses | None) -> None:
    """A cluster dropped without ``close``: its workers must not outlive it."""
    if pool is not None:
        pool.close(1.0)
    loop.stop()


def _directory(value: object) -> str | None:
    """Dask's ``local_directory`` as a path text (None: the system's temporary one)."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"local_directory must be a path, not {value!r}")
    return os.fspath(value)
