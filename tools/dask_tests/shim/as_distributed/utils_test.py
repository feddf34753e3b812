"""The helpers Dask's tests import from ``distributed.utils_test``, for apportion.

The task functions (``inc``, ``slowinc``, ``throws``...) do what their names say; a
test's assertions depend on their results (``throws`` raises ``RuntimeError("hello!")``).
``cluster()`` starts what Dask's starts: a scheduler and workers of one thread each,
as separate processes, through apportion's command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from apportion import Client

APPORTION = [sys.executable, "-m", "apportion.cli.main"]

# Dask's tests turn the active memory manager off with this config; apportion has none.
NO_AMM: dict[str, Any] = {}


def inc(x: Any) -> Any:
    return x + 1


def dec(x: Any) -> Any:
    return x - 1


def mul(x: Any, y: Any) -> Any:
    return x * y


def div(x: Any, y: Any) -> Any:
    return x / y


def double(x: Any) -> Any:
    return x * 2


def throws(x: Any) -> Any:
    raise RuntimeError("hello!")


def slowinc(x: Any, delay: float = 0.02) -> Any:
    time.sleep(delay)
    return x + 1


def slowdec(x: Any, delay: float = 0.02) -> Any:
    time.sleep(delay)
    return x - 1


def slowdouble(x: Any, delay: float = 0.02) -> Any:
    time.sleep(delay)
    return x * 2


def slowadd(x: Any, y: Any, delay: float = 0.02) -> Any:
    time.sleep(delay)
    return x + y


def slowsum(seq: Any, delay: float = 0.02) -> Any:
    time.sleep(delay)
    return sum(seq)


def slowidentity(*args: Any, **kwargs: Any) -> Any:
    time.sleep(kwargs.get("delay", 0.02))
    return args[0] if len(args) == 1 else args


def randominc(x: Any, scale: float = 1) -> Any:
    import random

    time.sleep(random.random() * scale)
    return x + 1


async def asyncinc(x: Any, delay: float = 0.02) -> Any:
    await asyncio.sleep(delay)
    return x + 1


def block_on_event(event: Any) -> None:
    event.wait()


class _UnhashableCallable:
    __hash__ = None  # type: ignore[assignment]

    def __call__(self, x: Any) -> Any:
        return x + 1


# Calls made so far of each `varying` function, in the process that runs it.
_calls: dict[int, int] = {}
_keys = itertools.count()


class _Varying:
    """Returns (or raises) the next of its items at each call in one process."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.key = next(_keys) + os.getpid() * 1_000_000

    def __call__(self) -> Any:
        count = _calls.get(self.key, 0)
        _calls[self.key] = count + 1
        item = self.items[count]
        if isinstance(item, BaseException) or (
            isinstance(item, type) and issubclass(item, BaseException)
        ):
            raise item
        return item


def varying(items: list[Any]) -> Callable[[], Any]:
    return _Varying(list(items))


def map_varying(itemslists: list[list[Any]]) -> tuple[Callable[..., Any], list[Any]]:
    def apply(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return apply, [varying(items) for items in itemslists]


def nodebug(func: Callable[..., Any]) -> Callable[..., Any]:
    return func


def poll_for(
    predicate: Callable[[], Any],
    timeout: float = 15,
    fail_func: Callable[[], None] | None = None,
    period: float = 0.05,
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            if fail_func is not None:
                fail_func()
            pytest.fail("condition not reached in time")
        time.sleep(period)


async def async_poll_for(
    predicate: Callable[[], Any], timeout: float = 15, period: float = 0.05, **_: Any
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(period)


@contextlib.contextmanager
def raises_with_cause(
    expected_exception: type[BaseException],
    match: str | None,
    expected_cause: type[BaseException],
    match_cause: str | None,
    *more_causes: Any,
) -> Iterator[None]:
    with pytest.raises(expected_exception, match=match) as info:
        yield
    cause = info.value.__cause__
    assert isinstance(cause, expected_cause), cause
    if match_cause:
        assert re.search(match_cause, str(cause)), str(cause)


# Dask's logger names, by the apportion package that does the same work.
_LOGGERS = {"comm": "net", "nanny": "worker", "deploy": "deploy", "client": "client"}


def _apportion_logger(name: str) -> str:
    if name != "distributed" and not name.startswith("distributed."):
        return name
    part = name.split(".")[1] if "." in name else ""
    if part in ("scheduler", "worker"):
        return f"apportion.{part}"
    return f"apportion.{_LOGGERS[part]}" if part in _LOGGERS else "apportion"


@contextlib.contextmanager
def captured_logger(
    logger: str | logging.Logger, level: int = logging.INFO, propagate: bool | None = None
) -> Iterator[io.StringIO]:
    """What is logged while it is held. Dask's logger names (``distributed.*``) stand for
    apportion's own loggers: a test that wants a quiet close wants apportion quiet."""
    name = _apportion_logger(logger if isinstance(logger, str) else logger.name)
    target = logging.getLogger(name)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    old_level, old_propagate = target.level, target.propagate
    target.setLevel(level)
    target.addHandler(handler)
    if propagate is not None:
        target.propagate = propagate
    try:
        yield buffer
    finally:
        target.removeHandler(handler)
        target.setLevel(old_level)
        target.propagate = old_propagate


def _skip_async(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
    """``gen_cluster``/``gen_test``: Dask's in-process asynchronous tests drive Dask's
    scheduler and worker objects directly; they are not in the harness's selection."""

    def decorate(func: Callable[..., Any]) -> Any:
        return pytest.mark.skip(reason="drives Dask's objects in process")(func)

    return decorate


gen_cluster = gen_test = _skip_async


def _announced(proc: subprocess.Popen[bytes], log: str, what: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        with open(log) as file:
            found = re.search(what, file.read())
        if found:
            return found.group(1)
        time.sleep(0.02)
    with open(log) as file:
        raise RuntimeError(f"{' '.join(proc.args)} did not start:\n{file.read()}")  # type: ignore[arg-type]


def _stop(procs: list[subprocess.Popen[bytes]], timeout: float = 10) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def cluster(
    nworkers: int = 2,
    nanny: bool = False,
    worker_kwargs: dict[str, Any] | None = None,
    active_rpc_timeout: float = 10,
    scheduler_kwargs: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """``apportion scheduler`` and ``nworkers`` ``apportion worker`` processes of one
    thread each (``worker_kwargs`` may say ``nthreads`` and ``memory_limit``); yields
    ``({"address": ...}, [{"address": ..., "name": ...}, ...])`` as Dask's does."""
    worker_kwargs = dict(worker_kwargs or {})
    scheduler_kwargs = dict(scheduler_kwargs or {})
    nthreads = str(worker_kwargs.pop("nthreads", 1))
    memory = worker_kwargs.pop("memory_limit", None)
    dashboard = scheduler_kwargs.pop("dashboard_address", None)
    if worker_kwargs or scheduler_kwargs:
        raise NotImplementedError(
            f"the harness's cluster() has no apportion equivalent of {worker_kwargs}"
            f" {scheduler_kwargs}"
        )
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="cluster-") as logs:

        def start(*args: str) -> tuple[subprocess.Popen[bytes], str]:
            log = os.path.join(logs, f"{len(procs)}.log")
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [*APPORTION, *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            procs.append(proc)
            return proc, log

        try:
            extra = ["--dashboard-address", dashboard] if dashboard else []
            proc, log = start("scheduler", "--port", "0", *extra)
            address = _announced(proc, log, r"apportion scheduler at ((?:tcp|tls)://[^\s\"]+)")
            by_name = {}
            for index in range(nworkers):
                extra = ["--memory-limit", str(memory)] if memory is not None else []
                if not nanny:
                    # Dask's default: no nanny, so no supervisor either; a memory limit
                    # then only spills and pauses, as a Dask worker without a nanny's.
                    extra += ["--no-supervisor"]
                    extra += ["--memory-terminate", "off"] if memory is not None else []
                by_name[str(index)] = start(
                    "worker", address, "--nthreads", nthreads, "--name", str(index), *extra
                )[0]
            with Client(address, set_as_default=False) as client:
                client.wait_for_workers(nworkers, timeout=30)
                workers = client.scheduler_info()["workers"]
            # As Dask's: each worker's address, name, and its process (through a weak
            # reference, called to get it: `a["proc"]().terminate()`).
            described = sorted(
                (
                    {
                        "address": a,
                        "name": str(w["name"]),
                        "proc": weakref.ref(by_name[str(w["name"])]),
                    }
                    for a, w in workers.items()
                ),
                key=lambda worker: str(worker["name"]),
            )
            yield {"address": address}, described
        finally:
            _stop(procs)


def tls_only_security() -> Any:
    """Dask's test certificates stand for TLS between every peer: apportion's own
    throw-away certificates give that."""
    from apportion import Security

    return Security.temporary()


def _apportion_command(args: list[Any]) -> list[str]:
    """Dask's command line pointed at apportion's, as the imports are:
    ``python -m dask scheduler ...`` and ``dask-worker ...`` become ``apportion``'s
    ``scheduler`` and ``worker`` with the same options."""
    words = [str(arg) for arg in args]
    if words[1:3] == ["-m", "dask"] and words[3:4] in (["scheduler"], ["worker"]):
        return [*APPORTION, *words[3:]]
    name = os.path.basename(words[0]) if words else ""
    if name in ("dask-scheduler", "dask-worker"):
        return [*APPORTION, name.removeprefix("dask-"), *words[1:]]
    return words


@contextlib.contextmanager
def popen(
    args: list[Any], capture_output: bool = False, terminate_timeout: float = 10, **kwargs: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """A command run in a process of its own, stopped (then killed) when left."""
    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc = subprocess.Popen(_apportion_command(args), start_new_session=True, **kwargs)
    try:
        yield proc
    finally:
        _stop([proc], terminate_timeout)
