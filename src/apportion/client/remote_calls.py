"""What runs code on workers outside tasks: run, uploads, plugins.

Also the facts about processes that Dask serves next to them: versions and recent
log records of the scheduler and the workers.

The scheduler runs no user code (DESIGN.md), so ``run_on_scheduler`` is supported
differently: the function runs here, in the client's process, against a read-only
snapshot of the scheduler's state (``SchedulerView``); it can read the workers and
tasks the scheduler knows, it cannot change them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from types import MappingProxyType, SimpleNamespace
from typing import Any

from apportion.client.future import rebuild_exception
from apportion.client.link import SchedulerLink
from apportion.core import payload
from apportion.protocol.cluster import DumpRequest, LogsReply, LogsRequest, VersionsRequest
from apportion.protocol.remote_calls import (
    NO_REPLY,
    CallOnWorkers,
    InstallOnWorkers,
    UninstallFromWorkers,
    WorkersAnswered,
)
from apportion.scheduler.remote_calls import MAX_INSTALL_BYTES
from apportion.versions import mismatches, versions
from apportion.worker.remote_calls import parameter_names

logger = logging.getLogger("apportion.client")

#: Files ``upload_file`` accepts: what Python can import from a directory on its path.
UPLOAD_SUFFIXES = (".py", ".zip", ".egg", ".pyz")

ON_ERROR = ("raise", "return", "ignore")


class WorkerLostError(RuntimeError):
    """A worker left (or was lost) before it answered a ``run`` or a plugin call."""


class SchedulerView:
    """A read-only picture of the scheduler, given to ``run_on_scheduler`` functions
    as ``dask_scheduler``.

    ``workers`` maps each worker's address to its facts (``name``, ``nthreads``,
    ``resources``, ``free_resources``, ``processing``, ...), ``tasks`` each key to
    its state (``state``, ``worker``, ``deps``, ``resources``, ...), both as
    attribute namespaces like Dask's ``WorkerState`` and ``TaskState``. Taken once,
    when the call starts: later changes are not seen, and changes made here are not
    the scheduler's.
    """

    def __init__(self, dump: Mapping[str, Any]) -> None:
        self.id: str = dump.get("id", "")
        self.address: str = dump.get("address", "")
        self.workers: Mapping[str, SimpleNamespace] = MappingProxyType(
            {
                address: SimpleNamespace(address=address, **facts)
                for address, facts in dump.get("workers", {}).items()
            }
        )
        self.tasks: Mapping[str, SimpleNamespace] = MappingProxyType(
            {key: SimpleNamespace(key=key, **facts) for key, facts in dump["task_states"].items()}
        )
        #: The rest of the dump (config, clients, recent transitions), as plain data.
        self.dump: Mapping[str, Any] = MappingProxyType(dict(dump))

    def __repr__(self) -> str:
        counts = f"{len(self.workers)} workers, {len(self.tasks)} tasks"
        return f"<SchedulerView {self.address}: {counts}>"


# --- run ---------------------------------------------------------------------------


def run(
    link: SchedulerLink,
    /,
    function: Callable[..., Any],
    *args: Any,
    workers: str | Iterable[str] | None = None,
    wait: bool = True,
    nanny: bool = False,
    on_error: str = "raise",
    **kwargs: Any,
) -> Any:
    """Run ``function(*args, **kwargs)`` on every worker (or those named in
    ``workers``, by address or name), outside the task threads; return
    ``{worker address: result}``.

    As in Dask: a parameter named ``dask_worker`` receives the worker object; an
    ``async def`` function runs on the worker's event loop, any other on a thread
    of its own, so it runs even while every task thread is busy. ``on_error``:
    "raise" the first error (with the worker's traceback), "return" exceptions as
    results, or "ignore" workers that failed. ``wait=False`` returns None at once.
    An asynchronous client returns an awaitable of the answers.
    """
    if nanny:
        raise ValueError("apportion workers have no nanny process: run with nanny=False")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    link.check_open()
    names = [workers] if isinstance(workers, str) else list(workers or ())
    if workers is not None and not names:
        return link.ready({} if wait else None)  # asked for no worker at all
    # By value, as task functions travel: a script's own functions run on workers.
    call = payload.dumps_function((function, args, kwargs))
    if not wait:
        link.post(CallOnWorkers(NO_REPLY, call, names))
        return link.ready(None)
    return link.ask(
        lambda rid: CallOnWorkers(rid, call, names), partial(_answers, on_error=on_error)
    )


def run_on_scheduler(
    link: SchedulerLink, /, function: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """Run ``function`` against the scheduler's state, here in this process.

    The scheduler runs no user code, so unlike Dask the function runs in the
    client's process; a ``dask_scheduler`` parameter receives a read-only
    ``SchedulerView`` snapshot (``.workers``, ``.tasks``, ``.address``, ``.id``).
    An ``async def`` function is run to completion (an asynchronous client gives an
    awaitable, and the function runs in the caller's loop). A function that changes
    the scheduler (adds plugins, edits tasks) cannot work here.
    """
    link.check_open()
    if link.asynchronous:
        return _run_on_scheduler_async(link, function, args, kwargs)
    if "dask_scheduler" in parameter_names(function):
        state = link.ask(lambda rid: DumpRequest(rid)).state
        kwargs = {**kwargs, "dask_scheduler": SchedulerView(state)}
    if inspect.iscoroutinefunction(function):
        return asyncio.run(function(*args, **kwargs))
    return function(*args, **kwargs)


async def _run_on_scheduler_async(
    link: SchedulerLink, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``run_on_scheduler`` in the caller's running loop."""
    if "dask_scheduler" in parameter_names(function):
        reply = await link.ask(lambda rid: DumpRequest(rid))
        kwargs = {**kwargs, "dask_scheduler": SchedulerView(reply.state)}
    outcome = function(*args, **kwargs)
    if inspect.isawaitable(outcome):
        outcome = await outcome
    return outcome


# --- uploads and plugins -------------------------------------------------------------


def upload_file(link: SchedulerLink, filename: str | os.PathLike[str], load: bool = True) -> Any:
    """Make a ``.py``, ``.zip`` or ``.egg`` importable on every worker, now and later.

    The scheduler keeps the file and sends it to workers that join later. A
    ``.py`` file is imported on each worker when ``load`` is true, and reloaded
    when uploaded again, so a changed file takes effect. Returns
    ``{worker address: {"status": "OK", "nbytes": size}}``; an error while
    importing on a worker is raised here.
    """
    path = os.fspath(filename)
    name = os.path.basename(path)
    if not name.endswith(UPLOAD_SUFFIXES):
        raise ValueError(f"upload_file takes {', '.join(UPLOAD_SUFFIXES)} files, not {name!r}")
    with open(path, "rb") as f:
        data = f.read()
    if len(data) > MAX_INSTALL_BYTES:
        raise ValueError(
            f"{name} is {len(data):,} bytes; uploads are limited to {MAX_INSTALL_BYTES:,}"
        )
    return _install(link, "upload", name, data, load=load)


def register_plugin(
    link: SchedulerLink, plugin: Any, name: str | None = None, idempotent: bool | None = None
) -> Any:
    """Install a worker plugin on every worker, now and on those that join later.

    Any object with ``setup(worker)`` and/or ``teardown(worker)`` works (Dask's
    ``WorkerPlugin`` subclasses too, by duck typing): ``setup`` runs on each
    worker as it is registered or joins, ``teardown`` when the plugin is
    unregistered or the worker closes; either may be ``async def``.
    ``transition`` hooks are not called by apportion's workers. Scheduler and
    nanny plugins are refused: the scheduler runs no user code. A plugin of the
    same name is replaced, unless ``idempotent``. Returns
    ``{worker address: {"status": "OK"}}``; an error in ``setup`` is raised here.
    """
    _refuse_scheduler_plugin(plugin)
    if not (hasattr(plugin, "setup") or hasattr(plugin, "teardown")):
        raise TypeError(
            f"{type(plugin).__name__} is not a worker plugin: it has neither "
            "setup(worker) nor teardown(worker)"
        )
    if _has_own_transition(plugin):
        logger.warning(
            "plugin %s has a transition() hook; apportion's workers do not call it",
            type(plugin).__name__,
        )
    blob = payload.dumps_function(plugin)
    # Dask names an unnamed plugin by its class and a token of its pickle.
    name = name or getattr(plugin, "name", None)
    name = name or f"{type(plugin).__name__}-{payload.function_id(blob)[:12]}"
    return _install(link, "plugin", name, blob, replace=not idempotent)


def register_worker_plugin(
    link: SchedulerLink, /, plugin: Any, name: str | None = None, **kwargs: Any
) -> Any:
    """Dask's older name for ``register_plugin``."""
    if kwargs.pop("nanny", False):
        raise ValueError("apportion workers have no nanny process: nanny plugins are refused")
    return register_plugin(link, plugin, name, **kwargs)


def unregister_worker_plugin(link: SchedulerLink, name: str, nanny: bool | None = None) -> Any:
    """Remove the worker plugin ``name`` everywhere; each worker runs its ``teardown``."""
    if nanny:
        raise ValueError("apportion workers have no nanny process")
    link.check_open()
    return link.ask(lambda rid: UninstallFromWorkers(rid, name), _answers)


def _install(
    link: SchedulerLink,
    kind: str,
    name: str,
    blob: bytes,
    *,
    load: bool = True,
    replace: bool = True,
) -> Any:
    link.check_open()
    return link.ask(
        lambda rid: InstallOnWorkers(rid, kind, name, blob, int(load), int(replace)),
        _answers,
    )


# --- versions and logs ---------------------------------------------------------------


def get_versions(
    link: SchedulerLink, check: bool = False, packages: Iterable[str] | None = None
) -> Any:
    """Python and package versions of this client, the scheduler and every worker.

    ``{"scheduler": {...}, "workers": {address: {...}}, "client": {...}}``, each
    ``{"host": {...}, "packages": {name: version}}`` as Dask returns them.
    ``check=True`` raises ``ValueError`` naming each required package
    (python, apportion, msgpack, cloudpickle) whose versions differ.
    ``packages``: more package names to report for the client and the workers
    (the scheduler reports its fixed list: it runs no code sent to it).
    """
    link.check_open()
    extra = list(packages or ())
    return link.run(_get_versions, link, check, extra)


async def _get_versions(link: SchedulerLink, check: bool, extra: list[str]) -> dict[str, Any]:
    """On the session's loop: ask the scheduler and the workers."""
    scheduler = (await link.request(lambda rid: VersionsRequest(rid))).versions
    call = payload.dumps_function((_versions_here, (extra,), {}))
    workers = _answers(await link.request(lambda rid: CallOnWorkers(rid, call, [])))
    result = {"scheduler": scheduler, "workers": workers, "client": _versions_here(extra)}
    if check:
        problems = mismatches({"client": result["client"], "scheduler": scheduler, **workers})
        if problems:
            raise ValueError("version mismatch: " + "; ".join(problems))
    return result


def get_worker_logs(
    link: SchedulerLink,
    n: int | None = None,
    workers: str | Iterable[str] | None = None,
    nanny: bool = False,
) -> Any:
    """Each worker's recent log records, ``{address: [(level, message), ...]}``,
    oldest first; the last ``n`` of them when given. Workers keep the records
    their logging configuration lets through, up to ``log_ring.LOG_LENGTH``."""
    if nanny:
        raise ValueError("apportion workers have no nanny process")
    return run(link, _worker_logs, n, workers=workers)


def get_scheduler_logs(link: SchedulerLink, n: int | None = None) -> Any:
    """The scheduler's recent log records, ``[(level, message), ...]``, oldest first."""
    link.check_open()
    return link.ask(lambda rid: LogsRequest(rid, n or 0), _log_records)


# --- helpers ---------------------------------------------------------------------------


def _log_records(reply: LogsReply) -> list[tuple[str, str]]:
    return [(level, text) for level, text in reply.records]


def _answers(reply: WorkersAnswered, on_error: str = "raise") -> dict[str, Any]:
    """The workers' answers as values, exceptions raised, returned or left out."""
    if reply.error:
        raise ValueError(reply.error)
    out: dict[str, Any] = {}
    for address, (status, value, traceback) in reply.results.items():
        if status == "ok":
            out[address] = payload.loads(value)
            continue
        if status == "error":
            exc = rebuild_exception(value, traceback)
        else:
            exc = WorkerLostError(value.decode(errors="replace"))
        if on_error == "raise":
            raise exc
        if on_error == "return":
            out[address] = exc
    return out


def _versions_here(extra: list[str]) -> dict[str, Any]:
    """Versions in the process this runs in (shipped to workers by reference)."""
    from apportion.versions import package_version

    found = versions()
    found["packages"].update({name: package_version(name) for name in extra})
    return found


def _worker_logs(n: int | None, dask_worker: Any) -> list[tuple[str, str]]:
    """Runs on a worker: its recent log records."""
    records: list[tuple[str, str]] = dask_worker.remote_calls.logs.recent(n)
    return records


def _refuse_scheduler_plugin(plugin: Any) -> None:
    """Dask's scheduler and nanny plugins would run user code where apportion runs none."""
    dask_plugins = sys.modules.get("distributed.diagnostics.plugin")
    kinds = [
        (getattr(dask_plugins, "SchedulerPlugin", None), "scheduler"),
        (getattr(dask_plugins, "NannyPlugin", None), "nanny"),
    ]
    for cls, where in kinds:
        if isinstance(cls, type) and isinstance(plugin, cls):
            raise TypeError(
                f"{type(plugin).__name__} is a {where} plugin: apportion's scheduler runs no "
                "user code (for security) and its workers have no nanny; use a worker "
                "plugin (setup/teardown on each worker) instead"
            )


def _has_own_transition(plugin: Any) -> bool:
    """A ``transition`` hook other than the no-op Dask's ``WorkerPlugin`` inherits."""
    hook = getattr(type(plugin), "transition", None)
    if hook is None:
        return False
    dask_plugins = sys.modules.get("distributed.diagnostics.plugin")
    base = getattr(getattr(dask_plugins, "WorkerPlugin", None), "transition", None)
    return hook is not base
