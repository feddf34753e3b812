"""Where the CPU of a tiny task goes, per process and per stage (``throughput.py --profile``).

Two runs of the same workload on fresh clusters:

1. **CPU**: no profiler. The CPU time (user + system, ``psutil``) of this process
   (the client and the scheduler, which a ``LocalCluster`` runs here) and of each
   worker process over the timed run, divided by the number of tasks.
2. **Stages**: every thread of every process under ``cProfile`` with a per-thread CPU
   clock (``time.thread_time``: time blocked in ``epoll`` or a lock costs nothing).
   Worker processes start it from ``profiling/sitecustomize.py`` (this run puts that
   folder on their ``PYTHONPATH``); each thread gets its own profiler. Each function's
   own time is given to a stage by its module (the table ``STAGES``); a built-in
   (``pickle.dumps``, ``socket.send``) or a helper from the standard library takes the
   stage of whoever called it, in proportion to the time each caller spent in it.

The profiler slows Python code more than C code, so its absolute times are not
used: each process's stage shares from run 2 are multiplied by that process's CPU
per task from run 1. The shares are an estimate (a few per cent); the totals are
measured.
"""

from __future__ import annotations

import cProfile
import marshal
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Set in the environment of processes that should profile every thread.
ENVIRONMENT_VARIABLE = "APPORTION_BENCH_PROFILE"
#: The folder whose ``sitecustomize.py`` starts the profilers in a new process.
HOOK_DIR = Path(__file__).resolve().parent / "profiling"

#: Stage of a function by where it is defined: the first prefix of its file's path
#: (relative to the apportion package, or the standard library's module name) that
#: matches. Order matters: the first match wins.
STAGES: list[tuple[str, str]] = [
    ("apportion/client/future.py", "client: futures and keys"),
    ("apportion/client/state.py", "client: futures and keys"),
    ("apportion/client/waiting.py", "client: futures and keys"),
    ("apportion/client/results.py", "client: gather"),
    ("apportion/client/transfers.py", "client: gather"),
    ("apportion/client/data_calls.py", "client: gather"),
    ("apportion/client/", "client: submit"),
    ("apportion/core/payload.py", "pickling (arguments, results)"),
    ("apportion/core/groups.py", "scheduler: handling"),
    ("apportion/protocol/", "encoding (msgpack, framing)"),
    ("msgpack", "encoding (msgpack, framing)"),
    ("apportion/scheduler/service.py", "scheduler: service"),
    ("apportion/scheduler/wire.py", "scheduler: service"),
    ("apportion/scheduler/", "scheduler: handling"),
    ("apportion/worker/execution.py", "worker: run"),
    ("apportion/worker/context.py", "worker: run"),
    ("apportion/worker/outbox.py", "worker: report"),
    ("apportion/worker/", "worker: receive and state"),
    ("apportion/net/", "network (connections, framing I/O)"),
    ("asyncio/streams", "network (connections, framing I/O)"),
    ("asyncio/selector_events", "network (connections, framing I/O)"),
    ("asyncio/", "event loop and threads"),
    ("selectors", "event loop and threads"),
    ("threading", "event loop and threads"),
    ("concurrent/", "event loop and threads"),
    ("queue", "event loop and threads"),
    ("tasks.py", "worker: run"),
    # Dask's lowering, ordering and task nodes (``collections_compute.py --profile``):
    # the same work on Dask's own client, scheduler and workers.
    ("dask/", "Dask's own code"),
    ("toolz/", "Dask's own code"),
    ("tlz/", "Dask's own code"),
    ("apportion/", "other apportion"),
    ("pickle", "pickling (arguments, results)"),
    ("cloudpickle", "pickling (arguments, results)"),
]

_profiles: list[tuple[str, cProfile.Profile]] = []
_lock = threading.Lock()


def _profile_this_thread() -> None:
    profile = cProfile.Profile(time.thread_time)
    with _lock:
        _profiles.append((threading.current_thread().name, profile))
    profile.enable()


def _bootstrap(*_: Any) -> None:
    # ``threading.setprofile`` hook: runs first in every new thread, and replaces
    # itself with a profiler of that thread.
    import sys

    sys.setprofile(None)
    _profile_this_thread()


def start() -> None:
    """Profile this thread and every thread started from now on."""
    threading.setprofile(_bootstrap)
    _profile_this_thread()


def start_from_environment() -> None:
    """``start()`` when this process was asked to (``sitecustomize``)."""
    if os.environ.get(ENVIRONMENT_VARIABLE):
        start()


def clear() -> None:
    """Forget what was profiled so far (the warm-up): every thread starts again at 0."""
    with _lock:
        for _, profile in _profiles:
            profile.clear()


def collect() -> bytes:
    """Every thread's profile so far, marshalled: {thread name: pstats-style dict}."""
    out: dict[str, Any] = {}
    with _lock:
        for name, profile in _profiles:
            profile.snapshot_stats()
            stats: dict[Any, Any] = profile.stats  # type: ignore[attr-defined]
            key = name
            while key in out:
                key += "'"
            out[key] = stats
    return marshal.dumps(out)


# --- analysis ------------------------------------------------------------------------


def _where(func: tuple[str, int, str]) -> str:
    """A function's file as STAGES matches it."""
    filename, _, name = func
    if filename == "~":  # a built-in: "<method 'send' of '_socket.socket' objects>"
        return name
    path = filename.replace(os.sep, "/")
    marker = "/apportion/"
    if marker in path:
        return "apportion/" + path.rsplit(marker, 1)[1]
    for anchor in ("/site-packages/", "/lib/python3"):
        if anchor in path:
            tail = path.rsplit(anchor, 1)[1]
            return tail.split("/", 1)[1] if anchor == "/lib/python3" and "/" in tail else tail
    return path.rsplit("/", 1)[-1]


def _direct_stage(func: tuple[str, int, str]) -> str | None:
    where = _where(func)
    if func[0] == "~":
        for needle, stage in (
            ("msgpack", "encoding (msgpack, framing)"),
            ("_pickle", "pickling (arguments, results)"),
            ("pickle", "pickling (arguments, results)"),
            ("socket", "network (connections, framing I/O)"),
            ("select", "event loop and threads"),
            ("epoll", "event loop and threads"),
            ("lock", "event loop and threads"),
        ):
            if needle in where:
                return stage
        return None
    for prefix, stage in STAGES:
        if where.startswith(prefix):
            return stage
    return None


def stage_times(stats: dict[Any, Any]) -> dict[str, float]:
    """Seconds of own time per stage, helpers' time given to their callers' stages."""
    memo: dict[Any, dict[str, float]] = {}

    def shares(func: Any, depth: int = 0) -> dict[str, float]:
        """How ``func``'s own time divides among stages (fractions summing to 1)."""
        if func in memo:
            return memo[func]
        direct = _direct_stage(func)
        if direct is not None:
            memo[func] = {direct: 1.0}
            return memo[func]
        memo[func] = {"other": 1.0}  # while computing: a cycle lands here
        callers = stats[func][4] if func in stats else {}
        total = sum(v[2] for v in callers.values())
        if depth > 30 or not callers or total <= 0:
            return memo[func]
        out: dict[str, float] = defaultdict(float)
        for caller, value in callers.items():
            for stage, part in shares(caller, depth + 1).items():
                out[stage] += part * value[2] / total
        memo[func] = dict(out)
        return memo[func]

    times: dict[str, float] = defaultdict(float)
    for func, (_, _, tottime, _, _) in stats.items():
        for stage, part in shares(func).items():
            times[stage] += tottime * part
    return dict(times)


def merge(threads: Iterable[dict[Any, Any]]) -> dict[Any, Any]:
    """One pstats-style dict for several threads of a process."""
    out: dict[Any, Any] = {}
    for stats in threads:
        for func, (cc, nc, tt, ct, callers) in stats.items():
            if func not in out:
                out[func] = [0, 0, 0.0, 0.0, {}]
            row = out[func]
            row[0] += cc
            row[1] += nc
            row[2] += tt
            row[3] += ct
            for caller, value in callers.items():
                old = row[4].get(caller)
                row[4][caller] = (
                    value if old is None else tuple(a + b for a, b in zip(old, value, strict=True))
                )
    return out


def top_functions(stats: dict[Any, Any], n: int) -> list[tuple[str, float]]:
    """The ``n`` functions with the most own time: (where, seconds)."""
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:n]
    return [(f"{_where(func)}:{func[1]} {func[2]}"[:70], row[2]) for func, row in rows]


def report(
    cpu_per_task: dict[str, float], profiles: dict[str, dict[str, Any]], n_top: int = 8
) -> None:
    """Print each process's CPU per task split by stage, then its busiest functions."""
    print()
    print("CPU per task by process and stage (us; stage shares from cProfile, scaled to")
    print("each process's CPU per task measured without the profiler)")
    stages: dict[str, dict[str, float]] = {}
    merged: dict[str, dict[Any, Any]] = {}
    for process, threads in profiles.items():
        merged[process] = merge(threads.values())
        stages[process] = stage_times(merged[process])
    names = sorted({s for per in stages.values() for s in per}, key=lambda s: (s == "other", s))
    processes = list(profiles)
    header = f"{'stage':<38}" + "".join(f"{p:>16}" for p in processes) + f"{'all':>10}"
    print(header)
    print("-" * len(header))
    totals = defaultdict(float)
    for name in names:
        cells, row_total = [], 0.0
        for process in processes:
            seconds = sum(stages[process].values()) or 1.0
            us = cpu_per_task[process] * 1e6 * stages[process].get(name, 0.0) / seconds
            totals[process] += us
            row_total += us
            cells.append(f"{us:>16.1f}")
        print(f"{name:<38}" + "".join(cells) + f"{row_total:>10.1f}")
    print("-" * len(header))
    print(
        f"{'total (measured CPU per task)':<38}"
        + "".join(f"{totals[p]:>16.1f}" for p in processes)
        + f"{sum(totals.values()):>10.1f}"
    )
    for process in processes:
        seconds = sum(stages[process].values()) or 1.0
        scale = cpu_per_task[process] * 1e6 / seconds
        print(f"\n{process}: busiest functions (own time, us per task)")
        for where, own in top_functions(merged[process], n_top):
            print(f"  {own * scale:>7.1f}  {where}")
