"""Fair shares of a GPU box between two people, apportion beside Dask in the same run.

One worker process offering ``GPU=4`` (4 threads). Person A queues 2,000 trials of
50 ms asking ``GPU=1``, then person B queues 200. Two clients stand in for the two
people (each client is its own share until people are admitted). Printed for each
system:

- B's first start delay: from B's submission to its first trial's start (target:
  at most one trial, 50 ms), and from the first GPU freed after B's submission to
  that start (what the scheduler adds to waiting for a unit: A's four trials run in
  step, so the next unit may free a whole trial after B submits);
- each share's GPU-seconds in every whole 2 s window while both wait (from B's
  submission to its last end, or A's if sooner), as B's percentage (target: 50 % +- 10, and 25 %
  +- 10 with A weighing 3 and B 1);
- Jain's fairness index over that period, of each share's GPU-seconds over its
  weight (1.0: exactly fair);
- tiny-task throughput (10,000 no-op tasks, ``map`` then ``gather``, 2 workers of
  1 thread) with one share, and with two clients submitting 5,000 each at once
  (the fair path's cost when it is taken).

Dask has no weights: it runs the 1:1 case only. Weights are set on apportion's
scheduler directly (``ShareBook.set``), as a registry of people will set them.
After B's last trial, A's remaining trials are cancelled: the figures are about the
time both wait.

``--before SRC`` also measures one-share tiny-task throughput with the apportion
source tree at ``SRC`` (a checkout of an earlier revision: its ``src`` goes first on
``PYTHONPATH``), alternating runs with this tree's, to show the cost of shares on
one user's throughput (target: within 5 %).

Usage: ``python benchmarks/fairness.py [--systems apportion,dask] [--before SRC
[--rounds N]]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tasks
from harness import wait_until

tasks.share_with_workers()

GPUS = 4
N_A = 2_000
N_B = 200
SECONDS = 0.05
WINDOW = 2.0
N_TINY = 10_000
TINY_RUNS = 3


@dataclass
class Outcome:
    delay: float  #: B's first start after its submission, seconds
    after_free: float  #: ... after the first GPU freed once B had submitted
    windows: list[float]  #: B's fraction of the GPU-seconds in each whole window
    b_fraction: float  #: ... over the whole time both waited
    jain: float  #: Jain's index of GPU-seconds over weight, over that time


def gpu_seconds(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in spans)


def analyse(
    a_spans: list[tuple[float, float]],
    b_spans: list[tuple[float, float]],
    submitted: float,
    weights: tuple[float, float],
) -> Outcome:
    """Both wait from B's submission until B's last trial ends, or A's if sooner
    (on a first-come-first-served system, A's queue empties first)."""
    first = min(start for start, _ in b_spans)
    last = min(max(end for _, end in b_spans), max(end for _, end in a_spans))
    windows = []
    lo = submitted
    while lo + WINDOW <= last:
        a, b = gpu_seconds(a_spans, lo, lo + WINDOW), gpu_seconds(b_spans, lo, lo + WINDOW)
        windows.append(b / (a + b) if a + b else 0.0)
        lo += WINDOW
    a, b = gpu_seconds(a_spans, submitted, last), gpu_seconds(b_spans, submitted, last)
    x = (a / weights[0], b / weights[1])
    jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x)) if any(x) else 0.0
    freed = min((end for _, end in a_spans if end >= submitted), default=submitted)
    return Outcome(first - submitted, first - freed, windows, b / (a + b) if a + b else 0.0, jain)


def two_people(a: Any, b: Any, weights: tuple[float, float]) -> Outcome:
    """The workload on clients ``a`` and ``b`` of one cluster (either system)."""
    gpu = {"GPU": 1}
    a.gather(a.map(tasks.trial_a, [0.0] * GPUS, range(GPUS), resources=gpu, pure=False))
    b.gather(b.map(tasks.trial_b, [0.0] * GPUS, range(GPUS), resources=gpu, pure=False))
    trials_a = a.map(tasks.trial_a, [SECONDS] * N_A, range(N_A), resources=gpu, pure=False)
    time.sleep(0.5)  # A's trials are running, the rest of its 25 s of work queued
    submitted = time.time()
    trials_b = b.map(tasks.trial_b, [SECONDS] * N_B, range(N_B), resources=gpu, pure=False)
    b_spans = b.gather(trials_b)
    time.sleep(2 * SECONDS)  # A's trials running at B's last end finish
    done = [f for f in trials_a if f.status == "finished"]
    a_spans = a.gather(done)
    a.cancel(trials_a)
    return analyse(a_spans, b_spans, submitted, weights)


def run_apportion(weights: tuple[float, float]) -> Outcome:
    from apportion import Client, LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=GPUS, resources={"GPU": GPUS}, dashboard_address=None
    ) as cluster:
        state = cluster.scheduler.state

        async def clients() -> set[str]:
            return set(state.clients)

        async def weigh(share: str, weight: float) -> None:
            state.shares.set(share, weight)

        loop = cluster._loop  # the scheduler's own thread: its state is changed there
        before = loop.run(clients())
        with Client(cluster) as a:
            wait_until(lambda: len(loop.run(clients()) - before) == 1, "A's client joining")
            (share_a,) = loop.run(clients()) - before
            loop.run(weigh(share_a, weights[0] / weights[1]))
            with Client(cluster) as b:
                return two_people(a, b, weights)


def run_dask() -> Outcome:
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=GPUS,
            resources={"GPU": GPUS},
            processes=True,
            dashboard_address=None,
        ) as cluster,
        distributed.Client(cluster) as a,
        distributed.Client(cluster) as b,
    ):
        return two_people(a, b, (1, 1))


# --- tiny tasks --------------------------------------------------------------------------


def tiny_rate(clients: list[Any]) -> float:
    """Best tasks/s of 10,000 no-ops, split between ``clients`` submitting at once."""
    import threading

    best = 0.0
    per = N_TINY // len(clients)
    for _ in range(TINY_RUNS):
        time.sleep(0.2)
        start = time.perf_counter()

        def one(client: Any) -> None:
            client.gather(client.map(tasks.noop, range(per), pure=False))

        threads = [threading.Thread(target=one, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        best = max(best, per * len(clients) / (time.perf_counter() - start))
    return best


def tiny_apportion(shares: int) -> float:
    from apportion import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        clients = [Client(cluster) for _ in range(shares)]
        try:
            for c in clients:
                c.gather(c.map(tasks.noop, range(200), pure=False))
            return tiny_rate(clients)
        finally:
            for c in clients:
                c.close()


def tiny_dask(shares: int) -> float:
    import distributed

    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        clients = [distributed.Client(cluster) for _ in range(shares)]
        try:
            for c in clients:
                c.gather(c.map(tasks.noop, range(200), pure=False))
            return tiny_rate(clients)
        finally:
            for c in clients:
                c.close()


def tiny_in(src: str | None) -> float:
    """One-share tiny-task throughput in a fresh interpreter, with ``src`` first on
    ``PYTHONPATH`` (another revision of apportion) or this tree's."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src) / "src"), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, __file__, "--tiny-only"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


# --- report ------------------------------------------------------------------------------


def _row(name: str, cells: list[str]) -> None:
    print(f"{name:<34}" + "".join(f"{c:>18}" for c in cells))


def report(results: dict[str, Outcome]) -> None:
    names = list(results)
    print()
    print(
        f"Fair shares: 1 worker, GPU={GPUS} ({GPUS} threads); A queues {N_A:,} trials of "
        f"{SECONDS * 1000:.0f} ms, then B {N_B}"
    )
    _row("", names)
    delays = [f"{r.delay * 1000:,.0f} ms" for r in results.values()]
    _row("B's first start delay (<= 50 ms)", delays)
    _row("  after the next GPU freed", [f"{r.after_free * 1000:,.1f} ms" for r in results.values()])
    for name, r in results.items():
        cells = " ".join(f"{w * 100:.0f}%" for w in r.windows) or "(no whole window)"
        print(f"  B's share per {WINDOW:g} s window, {name}: {cells}")
    targets = {n: ("25% +-10" if "3:1" in n else "50% +-10") for n in names}
    _row("B's share while both wait", [f"{r.b_fraction * 100:.0f}%" for r in results.values()])
    _row("  target", [targets[n] for n in names])
    met = [
        "yes" if abs(r.b_fraction - (0.25 if "3:1" in n else 0.5)) <= 0.10 else "NO"
        for n, r in results.items()
    ]
    _row("  met", met)
    _row("Jain's index (by weight)", [f"{r.jain:.3f}" for r in results.values()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    parser.add_argument("--before", help="an earlier apportion checkout, for its throughput")
    parser.add_argument("--rounds", type=int, default=3, help="alternations with --before")
    parser.add_argument("--tiny-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tiny_only:
        print(tiny_apportion(1))
        return
    systems = args.systems.split(",")
    results: dict[str, Outcome] = {}
    runs: list[tuple[str, Callable[[], Outcome]]] = []
    if "apportion" in systems:
        runs += [
            ("apportion 1:1", lambda: run_apportion((1, 1))),
            ("apportion 3:1", lambda: run_apportion((3, 1))),
        ]
    if "dask" in systems:
        runs.append(("dask 1:1", run_dask))
    for name, run in runs:
        began = time.perf_counter()
        results[name] = run()
        print(f"  {name}: {time.perf_counter() - began:.1f} s", flush=True)
    if results:
        report(results)
    print()
    print(f"Tiny-task throughput: {N_TINY:,} no-ops, 2 workers x 1 thread (best of {TINY_RUNS})")
    if "apportion" in systems:
        print(f"  apportion, one share:   {tiny_apportion(1):>10,.0f} tasks/s", flush=True)
        print(f"  apportion, two shares:  {tiny_apportion(2):>10,.0f} tasks/s", flush=True)
    if "dask" in systems:
        print(f"  dask, one client:       {tiny_dask(1):>10,.0f} tasks/s", flush=True)
        print(f"  dask, two clients:      {tiny_dask(2):>10,.0f} tasks/s", flush=True)
    if args.before:
        before, after = [], []
        for _ in range(args.rounds):  # alternated, so that a busy moment hits both alike
            before.append(tiny_in(args.before))
            after.append(tiny_in(None))
        b, a = max(before), max(after)
        print(
            f"  one share, before: {b:,.0f} tasks/s; this tree: {a:,.0f} tasks/s "
            f"({(a / b - 1) * 100:+.1f} %; target within 5 %)"
        )


if __name__ == "__main__":
    main()
