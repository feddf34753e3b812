"""The pure tier: events per second through ``SchedulerState.handle`` alone.

No sockets, no threads, no asyncio. 1,000 simulated workers of 2 threads (every
fourth also offers ``GPU=2``) and 100,000 tasks: 80% plain, 10% asking for
``GPU=1``, 10% taking two earlier plain tasks as inputs. All are wanted by one
client, as after ``map``.

The driver plays the service and the workers:

* the client's tasks arrive as ``SubmitTasks`` of 1,000 tasks per frame, each frame
  followed by a ``PlacementDue`` (the service sends one per loop turn);
* then, round after round, every busy worker reports the tasks its threads
  finished (up to ``nthreads``, oldest first) as ``TaskFinished`` messages in one
  frame, as a real worker batches its completions, and one ``PlacementDue`` follows
  all the frames of the round; until every task is in memory.

How events are counted: every message handled is one event, that is each
``SubmitTasks`` and each ``TaskFinished`` inside a frame, plus each
``PlacementDue``, ``WorkerJoined`` and ``ClientJoined``. Calls to ``handle`` (one per
frame) are counted separately. Rates use the time spent inside ``handle`` only;
building messages and routing commands is the driver's cost, reported apart.

Usage: ``python benchmarks/state_machine.py [--workers N] [--tasks N] [--profile]``
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from dataclasses import dataclass, field

from apportion.core.resources import parse_demand, parse_resources
from apportion.gc_thresholds import hold_gc_thresholds
from apportion.protocol.base import Message
from apportion.protocol.tasks import SubmitTasks, TaskSpec
from apportion.protocol.worker import RegisterWorker, TaskFinished
from apportion.scheduler.dispatch import handle
from apportion.scheduler.events import (
    ClientJoined,
    Event,
    FromClient,
    FromWorker,
    PlacementDue,
    SendComputeTask,
    WorkerJoined,
)
from apportion.scheduler.invariants import check_invariants
from apportion.scheduler.records import MEMORY
from apportion.scheduler.state import SchedulerState

CLIENT = "client-1"
FRAME = 1_000
#: Simulated seconds per round; also each task's reported run time.
TICK = 0.001


@dataclass
class Counters:
    handle_seconds: float = 0.0
    calls: int = 0
    events: int = 0
    commands: int = 0
    compute: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


class Driver:
    """Feeds events to one ``SchedulerState`` and routes its commands to fake workers."""

    def __init__(self) -> None:
        self.state = SchedulerState()
        self.counters = Counters()
        self.now = 0.0
        #: worker id -> keys it was told to run, in arrival order.
        self.running: dict[str, deque[str]] = {}
        self.nthreads: dict[str, int] = {}

    def handle(self, event: Event, events: int, kind: str) -> None:
        start = time.perf_counter()
        commands = handle(self.state, event)
        self.counters.handle_seconds += time.perf_counter() - start
        c = self.counters
        c.calls += 1
        c.events += events
        c.by_kind[kind] = c.by_kind.get(kind, 0) + events
        c.commands += len(commands)
        for command in commands:
            if isinstance(command, SendComputeTask):
                self.running[command.worker_id].append(command.key)
                c.compute += 1

    def add_workers(self, count: int, nthreads: int) -> None:
        gpus = parse_resources("GPU=2")
        for i in range(count):
            worker_id = f"worker-{i}"
            resources = gpus if i % 4 == 0 else {}
            reg = RegisterWorker(
                worker_id, f"tcp://10.0.{i // 250}.{i % 250}:40000", nthreads, resources, i, 0, {}
            )
            self.running[worker_id] = deque()
            self.nthreads[worker_id] = nthreads
            self.handle(WorkerJoined(worker_id, reg, self.now), 1, "WorkerJoined")

    def submit(self, frames: list[SubmitTasks]) -> None:
        for msg in frames:
            self.handle(FromClient(CLIENT, [msg], self.now), 1, "SubmitTasks")
            self.handle(PlacementDue(self.now), 1, "PlacementDue")

    def run_to_completion(self, n_tasks: int) -> int:
        """Rounds of completions until ``n_tasks`` have finished; returns the rounds."""
        finished = rounds = 0
        while finished < n_tasks:
            rounds += 1
            self.now += TICK
            progress = 0
            for worker_id, queue in self.running.items():
                if not queue:
                    continue
                done = [queue.popleft() for _ in range(min(self.nthreads[worker_id], len(queue)))]
                report: list[Message] = [TaskFinished(k, 28, TICK, "int") for k in done]
                self.handle(FromWorker(worker_id, report, self.now), len(report), "TaskFinished")
                progress += len(done)
            self.handle(PlacementDue(self.now), 1, "PlacementDue")
            if not progress and not any(self.running.values()):
                raise RuntimeError(f"stalled after {finished} of {n_tasks} tasks")
            finished += progress
        return rounds


def build_frames(n_tasks: int) -> list[SubmitTasks]:
    """The client's submission: 80% plain, 10% GPU=1, 10% with two plain inputs."""
    gpu = parse_demand({"GPU": 1})
    func_id = "0" * 32
    functions = {func_id: b"\x80\x05" + b"f" * 200}
    args = b"\x80\x05\x95\x06\x00\x00\x00\x00\x00\x00\x00K\x01\x85\x94."
    frames = []
    for first in range(0, n_tasks, FRAME):
        specs = []
        for i in range(first, min(first + FRAME, n_tasks)):
            key = f"task-{i:032x}"
            deps: list[str] = []
            resources: dict[str, int] = {}
            if i % 10 == 0:
                resources = gpu
            elif i % 10 == 5:
                deps = [f"task-{i - 1:032x}", f"task-{i - 3:032x}"]
            specs.append(TaskSpec(key, func_id, args, deps, resources, 0, 0))
        frames.append(SubmitTasks(specs, functions, [s.key for s in specs]))
    return frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true", help="cProfile the whole run")
    args = parser.parse_args()

    # The collector as a running scheduler sets it (``apportion.gc_thresholds``).
    hold_gc_thresholds()
    frames = build_frames(args.tasks)
    driver = Driver()
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    wall = time.perf_counter()
    driver.handle(ClientJoined(CLIENT, driver.now), 1, "ClientJoined")
    driver.add_workers(args.workers, args.threads)
    driver.submit(frames)
    rounds = driver.run_to_completion(args.tasks)
    wall = time.perf_counter() - wall
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)

    state = driver.state
    in_memory = sum(1 for t in state.tasks.values() if t.state == MEMORY)
    if in_memory != args.tasks:
        raise AssertionError(f"{in_memory} of {args.tasks} tasks in memory at the end")
    check_invariants(state)

    c = driver.counters
    print(
        f"State machine: {args.workers:,} workers x {args.threads} threads "
        f"({args.workers // 4 + (args.workers % 4 > 0):,} with GPU=2), {args.tasks:,} tasks "
        f"(80% plain, 10% GPU=1, 10% with 2 inputs), {rounds} rounds"
    )
    kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(c.by_kind.items()))
    print(f"events handled:   {c.events:,} ({kinds})")
    print(f"handle() calls:   {c.calls:,}; commands returned: {c.commands:,}")
    print(f"time in handle(): {c.handle_seconds:.2f} s (whole run with driver {wall:.2f} s)")
    print(f"events/s:         {c.events / c.handle_seconds:,.0f}")
    print(f"handle() calls/s: {c.calls / c.handle_seconds:,.0f}")
    print(
        f"tasks/s:          {args.tasks / c.handle_seconds:,.0f} "
        f"({1e6 * c.handle_seconds / args.tasks:.1f} us per task, submit to finish)"
    )


if __name__ == "__main__":
    main()
