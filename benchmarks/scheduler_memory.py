"""Scheduler memory per queued task, with 100,000 tasks queued and no workers.

Two tiers, each read twice (``tracemalloc`` and the process's RSS), every reading in
a fresh process so that neither allocator history nor tracemalloc's own tables
(which cost more than the blocks they trace) leak into another reading:

1. **State machine** (apportion only): ``SchedulerState`` alone, fed ``SubmitTasks``
   frames built the way the client builds them: arguments packed with
   ``payload.pack_call``, a real function blob from ``payload.dumps_function``,
   keys ``<name>-<blake2b of func id and args>`` as ``map`` makes them, no resources,
   10,000 tasks per frame, each frame encoded and decoded by the wire codec so that
   the state holds what it would hold in a server. Messages are dropped after being
   handled: the figure is what the state keeps.
2. **Scheduler process** (apportion and Dask, like for like): the scheduler alone in
   a child process with no workers; a client in this process submits 100,000 no-op
   tasks with ``map(..., pure=False)`` over loopback TCP and holds the futures. The
   child reports its traced memory and RSS before the submit and once it knows all
   100,000 tasks; the difference over 100,000 is the figure.

Target: at most 600 B per queued task (HyperQueue's figure).

Usage: ``python benchmarks/scheduler_memory.py [--tasks N]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import tasks  # noqa: E402

N_TASKS = 100_000
BATCH = 10_000
TARGET = 600


def _reading(traced: bool) -> dict[str, int]:
    import psutil

    gc.collect()
    return {
        "traced": tracemalloc.get_traced_memory()[0] if traced else 0,
        "rss": psutil.Process().memory_info().rss,
    }


# --- tier 1: the state machine alone ------------------------------------------------


def state_machine_reading(n_tasks: int, traced: bool) -> dict[str, Any]:
    """Memory that ``SchedulerState`` keeps for ``n_tasks`` queued tasks."""
    import hashlib

    from apportion.core import payload
    from apportion.protocol.codec import HEADER, decode_body, encode_frame
    from apportion.protocol.tasks import SubmitTasks, TaskSpec
    from apportion.scheduler.dispatch import handle
    from apportion.scheduler.events import ClientJoined, FromClient, PlacementDue
    from apportion.scheduler.records import QUEUED
    from apportion.scheduler.state import SchedulerState

    if traced:
        tracemalloc.start()
    state = SchedulerState()
    handle(state, ClientJoined("client-1", 0.0))
    blob = payload.dumps_function(tasks.inc)
    func_id = payload.function_id(blob)
    before = _reading(traced)
    for first in range(0, n_tasks, BATCH):
        specs = []
        for i in range(first, min(first + BATCH, n_tasks)):
            args, deps = payload.pack_call((i,), {})
            digest = hashlib.blake2b(func_id.encode() + args, digest_size=16).hexdigest()
            specs.append(TaskSpec(f"inc-{digest}", func_id, args, sorted(deps), {}, 0, 0))
        # Small arguments only: the frame is one buffer, its header then its body.
        (frame,) = encode_frame([SubmitTasks(specs, {func_id: blob}, [s.key for s in specs])])
        del specs
        messages = decode_body(bytes(frame)[HEADER.size :])
        del frame
        now = first / n_tasks
        handle(state, FromClient("client-1", messages, now))
        handle(state, PlacementDue(now))
        del messages
    after = _reading(traced)
    queued = sum(1 for t in state.tasks.values() if t.state == QUEUED)
    if queued != n_tasks:
        raise AssertionError(f"{queued} of {n_tasks} tasks queued")
    return {"before": before, "after": after, "tasks": queued, "top": _top_lines(n_tasks)}


def _top_lines(n_tasks: int, limit: int = 8) -> list[tuple[str, float]]:
    """Where the traced bytes were allocated, per task: the largest source lines."""
    if not tracemalloc.is_tracing():
        return []
    stats = tracemalloc.take_snapshot().statistics("lineno")
    src = str(Path(__import__("apportion").__file__).parent.parent)
    import linecache

    out = []
    for stat in stats[:limit]:
        frame = stat.traceback[0]
        where = f"{frame.filename.replace(src + os.sep, '')}:{frame.lineno}"
        text = linecache.getline(frame.filename, frame.lineno).strip()
        out.append((f"{where:<38} {text[:60]}", stat.size / n_tasks))
    return out


# --- tier 2: a scheduler process and a real client ----------------------------------


def host_scheduler(system: str) -> None:
    """Child process: run a scheduler; answer each line on stdin with a reading."""
    traced = tracemalloc.is_tracing()
    count_tasks: Any
    if system == "apportion":
        from apportion import Scheduler

        server = Scheduler(port=0)
        server.__enter__()
        address = server.address
        state = server.state

        def count_tasks() -> int:
            return len(state.tasks)

    else:
        address, count_tasks = _start_dask_scheduler()
    print(json.dumps({"address": address}), flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            break
        print(json.dumps({**_reading(traced), "tasks": count_tasks()}), flush=True)


def _start_dask_scheduler() -> tuple[str, Any]:
    import asyncio

    from distributed import Scheduler

    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        scheduler = Scheduler(port=0, dashboard_address=None, host="127.0.0.1")
        await scheduler
        box["scheduler"] = scheduler
        started.set()
        await asyncio.Event().wait()

    threading.Thread(target=asyncio.run, args=(serve(),), daemon=True).start()
    started.wait(60)
    scheduler = box["scheduler"]
    return scheduler.address, lambda: len(scheduler.tasks)


class SchedulerHost:
    """A child process running one system's scheduler, asked for readings over a pipe."""

    def __init__(self, system: str, traced: bool) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
        env["DASK_LOGGING__DISTRIBUTED"] = "error"
        if traced:
            env["PYTHONTRACEMALLOC"] = "1"
        else:
            env.pop("PYTHONTRACEMALLOC", None)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--host", system],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.address: str = self._line()["address"]

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"scheduler host exited with {self.proc.wait()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def reading(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("read\n")
        self.proc.stdin.flush()
        return self._line()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def process_reading(system: str, n_tasks: int, traced: bool) -> dict[str, Any]:
    """Scheduler-process memory for ``n_tasks`` tasks submitted by a real client."""
    host = SchedulerHost(system, traced)
    try:
        if system == "apportion":
            from apportion import Client
        else:
            from distributed import Client
        client = Client(host.address)
        try:
            client.submit(tasks.inc, 1, pure=False)  # connect, load the module
            time.sleep(0.5)
            before = host.reading()
            futures = client.map(tasks.noop, range(n_tasks), pure=False)
            deadline = time.monotonic() + 300
            while (after := host.reading())["tasks"] < before["tasks"] + n_tasks:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {after['tasks']} tasks reached the scheduler")
                time.sleep(0.2)
            time.sleep(0.5)  # let the last frame's work settle before the final reading
            after = host.reading()
            del futures
        finally:
            client.close()
    finally:
        host.close()
    return {"before": before, "after": after, "tasks": after["tasks"] - before["tasks"]}


# --- orchestration ------------------------------------------------------------------


def _child(args: list[str]) -> dict[str, Any]:
    """Run one reading in a fresh interpreter; return its JSON result."""
    out = subprocess.run(
        [sys.executable, __file__, *args], check=True, stdout=subprocess.PIPE, text=True
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def per_task(result: dict[str, Any], field: str) -> float:
    delta: int = result["after"][field] - result["before"][field]
    return delta / result["tasks"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=N_TASKS)
    parser.add_argument("--host", choices=["apportion", "dask"], help=argparse.SUPPRESS)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # tier:system:traced
    args = parser.parse_args()
    if args.host:
        host_scheduler(args.host)
        return
    if args.one:
        tier, system, traced = args.one.split(":")
        if tier == "state":
            result = state_machine_reading(args.tasks, traced == "1")
        else:
            result = process_reading(system, args.tasks, traced == "1")
        print(json.dumps(result))
        return

    rows: list[tuple[str, str, str]] = []
    top: list[tuple[str, float]] = []
    for tier, system in [("state", "apportion"), ("process", "apportion"), ("process", "dask")]:
        figures = []
        for traced, field in [("1", "traced"), ("0", "rss")]:
            start = time.perf_counter()
            try:
                result = _child(["--tasks", str(args.tasks), "--one", f"{tier}:{system}:{traced}"])
                figures.append(f"{per_task(result, field):,.0f} B")
                top = result.get("top") or top
            except (subprocess.CalledProcessError, ValueError, KeyError) as exc:
                figures.append(f"failed ({exc})")
            elapsed = time.perf_counter() - start
            print(f"  {tier} {system} {field}: {figures[-1]} ({elapsed:.1f} s)", flush=True)
        rows.append((f"{system} ({tier})", figures[0], figures[1]))

    print()
    print(f"Scheduler memory per queued task ({args.tasks:,} queued, no workers)")
    header = f"{'what':<24} {'tracemalloc':>12} {'RSS delta':>12}"
    print(header)
    print("-" * len(header))
    for what, traced_fig, rss_fig in rows:
        print(f"{what:<24} {traced_fig:>12} {rss_fig:>12}")
    print(f"target: at most {TARGET:,} B per queued task (apportion)")
    if top:
        print("largest allocation sites in SchedulerState (bytes per task, tracemalloc):")
        for where, size in top:
            print(f"  {size:>7,.0f} B  {where}")
    print(
        "state = SchedulerState alone; process = the whole scheduler process, "
        "tasks sent by a client over TCP"
    )


if __name__ == "__main__":
    main()
