"""Dask collections larger than memory, in the order each scheduler runs them: apportion
beside Dask.distributed in the same run.

Both systems get the same cluster (``limited.py``): a scheduler and 2 worker
processes of 1 thread each, with ``--limit`` of memory (2 GiB by default) and Dask's
thresholds, apportion's under its supervisor and Dask's under its nanny, all started
as command-line processes on loopback TCP. Each system computes the same collections
with its own client's ``compute`` (Dask lowers and optimises the graph on the client
either way), one after the other on one cluster per system, after a small warm-up:

a. ``x.sum()``;
b. ``(x + x.T).sum()``, then the same at a larger size;
c. ``(x - x.mean(axis=0)).std()``;

where ``x`` is an ``n`` x ``n`` array of float64 from Dask's seeded ``RandomState``
in 2,000 x 2,000 chunks, ``n`` the multiple of 2,000 nearest to the size asked in GiB;

d. a join and a group-by: two frames of generated partitions (``dd.from_map``; the
   left one ``key`` and ``value``, the right one ``weight`` and ``amount``, both
   indexed by a sorted ``id`` with the same known divisions) joined on ``id``
   partition by partition, a column ``value * weight`` added, then
   ``groupby("key").agg`` of a sum, a mean and a count. Every input partition is a
   root task and the two of a pair meet only in the join, so a scheduler that starts
   the roots in submission order holds many of them at once.

The full sizes (``--full``, ``make bench-memory``): a. 12 GiB, b. 7.6 and 18.6 GiB,
c. 7.6 GiB, d. twice the cluster's memory (8 GiB of input with 2 workers of 2 GiB).
The default sizes, for ``make bench``, are half those (a. 6 GiB, b. 3.8 and 9.3 GiB,
c. 3.8 GiB, d. the cluster's memory): about two minutes for both systems on the
project's 2-core machine.

For each workload and system: seconds from ``compute`` to the value in the client,
the peak resident memory of any worker process (each worker's RSS sampled every
50 ms by a thread of this process, from the pids each system reports), and bytes
written to the spill directories (apportion's ``SpillStore`` totals; Dask's
``disk-write`` metrics of its spill buffer); then apportion's figures over Dask's,
and the targets apportion is measured against: its time at most Dask's, its peak
worker memory at most 1.25 times Dask's, and no spilling where Dask spills nothing.
The targets are printed as yes or NO, never asserted. An answer that differs
between the systems, or a worker killed or restarted, is an error (exit status 1).

Usage: ``python benchmarks/memory_order.py [--full] [--limit 2GiB]
[--workloads a,b1,b2,c,d] [--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import psutil

import tasks
from limited import SESSIONS, LimitedSession, Round, describe_bytes, measure, parse_size

tasks.share_with_workers()

N_WORKERS = 2
N_THREADS = 1
CHUNK = 2_000
SEED = 20261127
#: Rows of each generated partition of a frame: 2,000,000 rows of three int64 or
#: float64 columns (the index one of them) are 46 MiB a frame, 92 MiB a pair.
ROWS = 2_000_000
#: Bytes per row of a left and a right partition together (index, two columns each).
PAIR_ROW_BYTES = 2 * 3 * 8
KEYS = 1_000
#: How often the sampler reads each worker's resident memory.
SAMPLE_SECONDS = 0.05
#: Longest wait for one workload, so that a stuck system cannot hang the suite.
ROUND_TIMEOUT = 1_800.0
#: The targets: apportion's peak worker memory over Dask's, at most.
MEMORY_TARGET = 1.25


def side(gib: float) -> int:
    """The side of a square float64 array of about ``gib`` GiB, a multiple of CHUNK."""
    return max(1, round(math.sqrt(gib * 2**30 / 8) / CHUNK)) * CHUNK


def random_array(gib: float) -> Any:
    n = side(gib)
    return da.random.RandomState(SEED).random_sample((n, n), chunks=(CHUNK, CHUNK))


def array_sum(gib: float) -> Any:
    return random_array(gib).sum()


def transpose_sum(gib: float) -> Any:
    x = random_array(gib)
    return (x + x.T).sum()


def centred_std(gib: float) -> Any:
    x = random_array(gib)
    return (x - x.mean(axis=0)).std()


def left_partition(i: int) -> pd.DataFrame:
    """Partition ``i`` of the left frame: ids i*ROWS.., a key and a value per id."""
    rng = np.random.default_rng((SEED, 0, i))
    index = pd.Index(np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64), name="id")
    return pd.DataFrame(
        {"key": rng.integers(0, KEYS, ROWS, dtype=np.int64), "value": rng.random(ROWS)},
        index=index,
    )


def right_partition(i: int) -> pd.DataFrame:
    """Partition ``i`` of the right frame: the same ids, a weight and an amount per id."""
    rng = np.random.default_rng((SEED, 1, i))
    index = pd.Index(np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64), name="id")
    return pd.DataFrame({"weight": rng.random(ROWS), "amount": rng.random(ROWS)}, index=index)


def partitions(gib: float) -> int:
    return max(2, round(gib * 2**30 / (ROWS * PAIR_ROW_BYTES)))


def join_groupby(gib: float) -> Any:
    count = partitions(gib)
    divisions = [i * ROWS for i in range(count)] + [count * ROWS - 1]
    left = dd.from_map(left_partition, range(count), divisions=divisions)
    right = dd.from_map(right_partition, range(count), divisions=divisions)
    joined = left.join(right)
    joined = joined.assign(product=joined.value * joined.weight)
    return joined.groupby("key").agg({"product": "sum", "amount": "mean", "value": "count"})


@dataclass(frozen=True)
class Workload:
    label: str
    expression: str
    build: Callable[[float], Any]
    #: None: the cluster's memory (small), twice the cluster's memory (full).
    small_gib: float | None
    full_gib: float | None

    def data(self, gib: float) -> str:
        if self.build is join_groupby:
            count = partitions(gib)
            size = count * ROWS * PAIR_ROW_BYTES
            return f"{describe_bytes(size)} in {count} partition pairs"
        n = side(gib)
        return f"{describe_bytes(n * n * 8)}, n = {n:,}"


WORKLOADS = [
    Workload("a", "x.sum()", array_sum, 6.0, 12.0),
    Workload("b1", "(x + x.T).sum()", transpose_sum, 3.8, 7.6),
    Workload("b2", "(x + x.T).sum()", transpose_sum, 9.3, 18.6),
    Workload("c", "(x - x.mean(axis=0)).std()", centred_std, 3.8, 7.6),
    Workload("d", "join on id, then groupby(key).agg", join_groupby, None, None),
]


def answer_of(value: Any) -> tuple[float, ...]:
    """A result as numbers that both systems must agree on (to rounding)."""
    if isinstance(value, pd.DataFrame):
        value = value.sort_index()
        return (
            float(value["product"].sum()),
            float(value["amount"].sum()),
            float(value["value"].sum()),
            float(len(value)),
        )
    return (float(value),)


class RssSampler:
    """Samples the resident memory of some processes in a thread; keeps the peak of each."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._processes = {address: psutil.Process(pid) for address, pid in pids.items()}
        self.first = {address: 0 for address in pids}
        self.peak = {address: 0 for address in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        for address, process in self._processes.items():
            try:
                rss = process.memory_info().rss
            except psutil.Error:  # killed: measure() reports it from the pids
                continue
            self.first[address] = self.first[address] or rss
            self.peak[address] = max(self.peak[address], rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_SECONDS)

    def __enter__(self) -> RssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


@dataclass(frozen=True)
class Figures:
    round: Round
    #: The highest RSS of any one worker during the round, and of every worker at its start.
    peak_rss: int
    start_rss: int


def one_workload(session: LimitedSession, workload: Workload, gib: float) -> Figures:
    collection = workload.build(gib)
    sampler: RssSampler | None = None

    def run() -> tuple[float, ...]:
        nonlocal sampler
        with RssSampler(session.pids()) as sampler:
            future = session.client.compute(collection)
            return answer_of(future.result(timeout=ROUND_TIMEOUT))

    result = measure(session, run)
    assert sampler is not None
    return Figures(result, max(sampler.peak.values()), max(sampler.first.values()))


def warm_up(session: LimitedSession) -> None:
    """Load NumPy, pandas and Dask on the workers before timing."""
    session.client.compute(array_sum(0.01)).result(timeout=ROUND_TIMEOUT)
    session.client.compute(join_groupby(0.0)).result(timeout=ROUND_TIMEOUT)


def describe(figures: Figures) -> str:
    r = figures.round
    killed = "; ".join(r.restarts) if r.restarts else "none"
    return (
        f"{r.seconds:6.1f} s, peak worker RSS {describe_bytes(figures.peak_rss)} "
        f"(at start {describe_bytes(figures.start_rss)}), spilled "
        f"{describe_bytes(r.bytes_spilled)} in {r.files_spilled:,} files, "
        f"workers killed or restarted: {killed}"
    )


def yes(condition: bool) -> str:
    return "yes" if condition else "NO"


def compare(workload: Workload, apportion: Figures, dask: Figures) -> list[str]:
    a, d = apportion.round, dask.round
    time_ratio = a.seconds / d.seconds
    memory_ratio = apportion.peak_rss / dask.peak_rss
    spill = (
        f"no spilling where Dask spills none: {yes(a.bytes_spilled == 0)}"
        if d.bytes_spilled == 0
        else "Dask spills too (no spilling target)"
    )
    return [
        f"{workload.label}. apportion / Dask: time {time_ratio:.2f}x, peak worker RSS "
        f"{memory_ratio:.2f}x, spilled {describe_bytes(a.bytes_spilled)} / "
        f"{describe_bytes(d.bytes_spilled)}",
        f"    time <= Dask's: {yes(time_ratio <= 1)}; peak memory <= {MEMORY_TARGET}x "
        f"Dask's: {yes(memory_ratio <= MEMORY_TARGET)}; {spill}",
    ]


def same(answers: list[Any]) -> bool:
    """Whether every system's answer equals the first's, to rounding."""
    first = answers[0]
    return all(
        all(math.isclose(p, q, rel_tol=1e-9) for p, q in zip(first, other, strict=True))
        for other in answers[1:]
    )


def summarise(
    chosen: list[Workload], systems: list[str], results: dict[str, dict[str, Figures]]
) -> bool:
    """Print the ratios and targets of each workload; whether anything went wrong."""
    failed = False
    for w in chosen:
        answers = [results[s][w.label].round.answer for s in systems]
        if not same(answers):
            print(f"{w.label}. ANSWERS DIFFER: {answers}")
            failed = True
        failed = failed or any(results[s][w.label].round.restarts for s in systems)
        if "apportion" in results and "dask" in results:
            for line in compare(w, results["apportion"][w.label], results["dask"][w.label]):
                print(line)
    if not failed:
        print(f"answers   : the same on {' and '.join(systems)}; no worker killed")
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full sizes (make bench-memory)")
    parser.add_argument("--limit", default="2GiB", help="memory limit of each worker")
    parser.add_argument("--workloads", default=",".join(w.label for w in WORKLOADS))
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    args = parser.parse_args()
    systems = args.systems.split(",")
    if unknown := [s for s in systems if s not in SESSIONS]:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    labels = args.workloads.split(",")
    if unknown := [label for label in labels if label not in {w.label for w in WORKLOADS}]:
        parser.error(f"unknown workloads: {', '.join(unknown)}")
    try:
        limit = parse_size(args.limit)
    except ValueError as error:
        parser.error(str(error))
    chosen = [w for w in WORKLOADS if w.label in labels]
    cluster_gib = N_WORKERS * limit / 2**30
    sizes = {
        w.label: (w.full_gib or 2 * cluster_gib) if args.full else (w.small_gib or cluster_gib)
        for w in chosen
    }

    print(
        f"memory_order: {N_WORKERS} workers x {N_THREADS} thread, memory limit "
        f"{describe_bytes(limit)} each; {'full' if args.full else 'small'} sizes",
        flush=True,
    )
    for w in chosen:
        print(f"  {w.label}. {w.expression}: {w.data(sizes[w.label])}")

    results: dict[str, dict[str, Figures]] = {}
    for system in systems:
        print(f"\n{system}:", flush=True)
        began = time.perf_counter()
        with SESSIONS[system](N_WORKERS, N_THREADS, args.limit) as session:
            warm_up(session)
            results[system] = {}
            for w in chosen:
                figures = one_workload(session, w, sizes[w.label])
                print(f"  {w.label:<3}{describe(figures)}", flush=True)
                results[system][w.label] = figures
        print(f"  ({time.perf_counter() - began:.0f} s with the cluster's start)", flush=True)

    print()
    return 1 if summarise(chosen, systems, results) else 0


if __name__ == "__main__":
    sys.exit(main())
