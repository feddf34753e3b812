"""What a worker runs outside its task threads: ``client.run`` calls, uploads, plugins.

A ``RemoteCall`` runs on a thread of its own (a coroutine function on the event loop,
as Dask does), so a call reaches a worker whose task threads are all busy, and a
slow call never holds up the loop. Uploads and plugins are installed on the loop,
in the order they arrive: a task sent after an upload finds it importable.

Uploads are written to a worker directory of their own (removed by the next worker
started on its base if this one is killed first), put first on
``sys.path`` and removed when the worker closes; a ``.py`` upload with ``load`` is
imported, or reloaded when it was imported before, so a changed upload takes
effect (its cached bytecode is removed first: a file rewritten within the same
second with the same size would otherwise load the old code).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import pkgutil
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from apportion.core.payload import dumps, loads
from apportion.log_ring import LogRing
from apportion.protocol.remote_calls import NO_REPLY, CallAnswered, Install, RemoteCall, Uninstall
from apportion.worker.execution import pack_exception
from apportion.worker.local_directory import LocalDirectory

if TYPE_CHECKING:
    from apportion.protocol.base import Message
    from apportion.worker.memory_manager import MemoryManager

logger = logging.getLogger("apportion.worker")

#: Loggers whose records are the scheduler's or a client's, not a worker's, where
#: they share a process with workers (an in-process LocalCluster).
NOT_WORKER_LOGS = ("apportion.scheduler", "apportion.runs", "apportion.client")


class CallingWorker(Protocol):
    """What the runner reads of its worker (a ``worker.service.Worker``, which imports
    this module); plugins and ``dask_worker=`` functions get the worker itself."""

    @property
    def name(self) -> str: ...

    @property
    def memory_manager(self) -> MemoryManager: ...

    def send_threadsafe(self, message: Message) -> None: ...


class RemoteCallRunner:
    """One worker's calls from clients outside tasks, its uploads, plugins and log ring."""

    def __init__(self, worker: CallingWorker) -> None:
        self.worker = worker
        #: name -> (pickled plugin, the plugin): set up here, torn down at close.
        self.plugins: dict[str, tuple[bytes, Any]] = {}
        #: file name -> bytes written, so a replay of the same upload is not reloaded.
        self.uploads: dict[str, bytes] = {}
        #: Where uploads are written (made on the first one); on ``sys.path`` meanwhile.
        #: A worker directory of its own, so that the next worker removes it if this
        #: one is killed before it can.
        self.directory: LocalDirectory | None = None
        #: This worker's recent log records (``client.get_worker_logs``).
        self.logs = LogRing(skip=NOT_WORKER_LOGS)
        self._coroutines: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.logs.attach()

    def handle(self, message: RemoteCall | Install | Uninstall) -> None:
        """On the loop: start a call, or install or remove something, and answer."""
        if isinstance(message, RemoteCall):
            self._run(message)
        elif isinstance(message, Install):
            self._answer_soon(message.request_id, self._install, message)
        else:
            self._answer_soon(message.request_id, self._uninstall, message.name)

    async def close(self) -> None:
        """Tear plugins down (newest first), cancel calls, remove the uploads."""
        for task in self._coroutines:
            task.cancel()
        for name in reversed(list(self.plugins)):
            try:
                result = self._teardown(name)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("worker %s: plugin %s failed to tear down", self.worker.name, name)
        if self.directory is not None:
            with contextlib.suppress(ValueError):
                sys.path.remove(str(self.directory.path))
            self.directory.remove()
            self.directory = None
        self.logs.detach()

    # --- client.run ------------------------------------------------------------------

    def _run(self, message: RemoteCall) -> None:
        try:
            function, args, kwargs = loads(message.call)
            if "dask_worker" in parameter_names(function):
                kwargs = {**kwargs, "dask_worker": self.worker}
        except BaseException as exc:
            self._send_error(message.request_id, exc)
            return
        if inspect.iscoroutinefunction(function):
            self._await(message.request_id, function(*args, **kwargs))
            return
        thread = threading.Thread(
            target=self._answer,
            args=(message.request_id, function, *args),
            kwargs=kwargs,
            name="apportion-run",
            daemon=True,
        )
        thread.start()

    def _await(self, request_id: int, awaitable: Any) -> None:
        """Run ``awaitable`` on the loop and answer with its outcome."""
        task = asyncio.get_running_loop().create_task(self._settle(request_id, awaitable))
        self._coroutines.add(task)
        task.add_done_callback(self._coroutines.discard)

    async def _settle(self, request_id: int, awaitable: Any) -> None:
        try:
            value = await awaitable
        except asyncio.CancelledError:
            raise  # the worker is closing: nobody is there to answer
        except BaseException as exc:
            self._send_error(request_id, exc)
            return
        self._send_value(request_id, value)

    # --- answers ---------------------------------------------------------------------

    def _answer(self, request_id: int, function: Any, *args: Any, **kwargs: Any) -> None:
        """Call ``function`` here and send how it went (on any thread)."""
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:  # SystemExit from user code is an answer too
            self._send_error(request_id, exc)
            return
        self._send_value(request_id, value)

    def _answer_soon(self, request_id: int, function: Any, *args: Any) -> None:
        """Like ``_answer``; when ``function`` returns an awaitable (an ``async def``
        plugin hook), the answer waits for it on the loop, as Dask awaits it."""
        try:
            value = function(*args)
        except BaseException as exc:
            self._send_error(request_id, exc)
            return
        if inspect.isawaitable(value):
            self._await(request_id, value)
        else:
            self._send_value(request_id, value)

    def _send_value(self, request_id: int, value: Any) -> None:
        if request_id == NO_REPLY:
            return
        try:
            blob = dumps(value)
        except Exception as exc:
            self._send_error(request_id, exc)
            return
        self.worker.send_threadsafe(CallAnswered(request_id, "ok", blob, b""))

    def _send_error(self, request_id: int, exc: BaseException) -> None:
        if request_id == NO_REPLY:
            # Nobody waits (a replay to a joining worker, run(wait=False)): say it here.
            logger.error("worker %s: %s: %s", self.worker.name, type(exc).__name__, exc)
            return
        if exc.__traceback__ is not None and exc.__traceback__.tb_next is not None:
            exc = exc.with_traceback(exc.__traceback__.tb_next)  # the user's frames only
        blob, traceback = pack_exception(exc)
        self.worker.send_threadsafe(CallAnswered(request_id, "error", blob, traceback))

    # --- uploads and plugins ---------------------------------------------------------

    def _install(self, message: Install) -> Any:
        if message.kind == "upload":
            return self._upload(message.name, message.blob, bool(message.load))
        known = self.plugins.get(message.name)
        if known is not None and known[0] == message.blob:
            return _OK  # replayed after a reconnection: already set up
        plugin = loads(message.blob)
        if known is not None:
            self._teardown(message.name)  # replaced, as Dask replaces a plugin by name
        self.plugins[message.name] = (message.blob, plugin)
        setup = getattr(plugin, "setup", None)
        result = setup(worker=self.worker) if setup is not None else None
        return _then_ok(result) if inspect.isawaitable(result) else _OK

    def _uninstall(self, name: str) -> Any:
        result = self._teardown(name) if name in self.plugins else None
        return _then_ok(result) if inspect.isawaitable(result) else _OK

    def _teardown(self, name: str) -> Any:
        """Forget the plugin and call its ``teardown``; return what that returned."""
        _, plugin = self.plugins.pop(name)
        teardown = getattr(plugin, "teardown", None)
        return teardown(worker=self.worker) if teardown is not None else None

    def upload_directory(self) -> Path:
        """Where uploads go (the worker's ``local_directory``): made on first use, first
        on ``sys.path`` from then on, removed when the worker closes."""
        if self.directory is None:
            self.directory = LocalDirectory(self.worker.memory_manager.config.local_directory)
            sys.path.insert(0, str(self.directory.path))
        return self.directory.path

    def _upload(self, filename: str, data: bytes, load: bool) -> dict[str, Any]:
        if os.path.basename(filename) != filename or filename in ("", ".", ".."):
            raise ValueError(f"an upload is named by a plain file name, not {filename!r}")
        path = os.path.join(self.upload_directory(), filename)
        unchanged = self.uploads.get(filename) == data
        if not unchanged:
            with open(path, "wb") as f:
                f.write(data)
            self.uploads[filename] = data
            importlib.invalidate_caches()  # a new file in a directory already listed
        if load and not unchanged:
            import_file(path)
        return {"status": "OK", "nbytes": len(data)}


def import_file(path: str) -> list[Any]:
    """Import (or reload) what a ``.py``, ``.zip``, ``.egg`` or ``.pyz`` file holds."""
    name, ext = os.path.splitext(os.path.basename(path))
    names: list[str] = []
    if ext == ".py":
        with contextlib.suppress(OSError):
            os.remove(importlib.util.cache_from_source(path))
        names.append(name)
    elif ext in (".zip", ".egg", ".pyz"):
        if path not in sys.path:
            sys.path.insert(0, path)
        names.extend(info.name for info in pkgutil.iter_modules([path]))
    if not names:
        logger.warning("nothing to import from %s", os.path.basename(path))
        return []
    importlib.invalidate_caches()
    # A module imported before runs again (a changed upload); a new one runs once.
    return [
        importlib.reload(sys.modules[n]) if n in sys.modules else importlib.import_module(n)
        for n in names
    ]


def parameter_names(function: Any) -> set[str]:
    """The names of ``function``'s parameters (none for builtins without a signature):
    Dask passes ``dask_worker``/``dask_scheduler`` to functions that ask for them."""
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # builtins without a signature
        return set()


#: What a successful install or uninstall answers, as Dask's plugin calls do.
_OK = {"status": "OK"}


async def _then_ok(awaitable: Any) -> dict[str, str]:
    await awaitable
    return _OK
