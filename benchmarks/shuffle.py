"""A shuffle under a memory limit: apportion beside Dask in the same run.

Both systems get the same cluster (``limited.py``): a scheduler and 2 worker
processes of 2 threads, each with ``--memory-limit`` (2 GiB by default) and Dask's
thresholds, apportion's under its supervisor and Dask's under its nanny, all started
as command-line processes on loopback TCP.

The workload, ``--size`` bytes in all (10 GiB by default) in P = size / ``--partition``
input partitions (64 MiB each by default: P = 160):

1. input i: ``partition`` bytes of int64 from a generator seeded by (seed, i);
2. split i: input i cut into P pieces by value modulo P (a stable radix sort of the
   bucket numbers, then views of the sorted copy): about 3.3 times a partition's
   memory at the peak of a task, well under the limit with 2 threads;
3. pick (i, j): piece j of split i as an array of its own (P x P tasks of about
   ``partition`` / P bytes);
4. output j: the j-th piece of every input concatenated, checked to hold only values
   v with v % P == j, and reduced to (values, sum modulo 2**64, XOR);
5. the P outputs gathered to the client: the answer, which must be the same on both
   systems (and covers every value: the counts add up to size / 8).

Each input's tasks are submitted together, input by input, so both systems (whose
futures run in submission order) work through the inputs one after the other instead
of producing every input first. The client holds only the outputs' futures: every
intermediate result is released by the scheduler once its dependents are done. The
data still outgrows memory: the picks of every input, ``size`` bytes in all, must be
held until the outputs run, so both systems spill most of them.

For each system: seconds from the first submit until the answer is in the client,
bytes written to the spill directories (apportion's ``SpillStore`` totals; Dask's
``disk-write`` metrics of its spill buffer), and whether any worker was killed or
restarted: the workers' pids before and after each round must be the same, and no
worker log may say so. The ratio is apportion's seconds over Dask's (below 1:
apportion faster). Nothing here asserts a time; a wrong answer, a different answer
between the systems or a worker killed is an error (exit status 1).

``make bench`` (``run_all.py``) runs it at full size, 10 GiB: under two minutes per
system on the project's 2-core, 24 GiB machine; docs/memory.md has the figures.

Usage: ``python benchmarks/shuffle.py [--size 10GiB] [--partition 64MiB]
[--limit 2GiB] [--repeat N] [--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any, cast

import tasks
from limited import (
    SESSIONS,
    LimitedSession,
    Round,
    describe_bytes,
    measure,
    parse_size,
    report,
    run_systems,
)

tasks.share_with_workers()

GiB = 2**30
MiB = 2**20
N_WORKERS = 2
N_THREADS = 2
SEED = 20260501
#: Longest wait for one round's answer, so that a stuck system cannot hang the suite.
ROUND_TIMEOUT = 1800.0

#: One output partition: (values, their sum modulo 2**64, their XOR).
Output = tuple[int, int, int]


def submit_shuffle(client: Any, size: int, partition: int, seed: int) -> list[Any]:
    """Submit the workload (module docstring); the futures of the P outputs."""
    parts = size // partition
    picks: list[list[Any]] = []
    for i in range(parts):
        block = client.submit(tasks.random_block, seed, i, partition, pure=False)
        split = client.submit(tasks.shuffle_split, block, parts, pure=False)
        picks.append(client.map(tasks.shuffle_pick, [split] * parts, range(parts), pure=False))
    return [
        client.submit(tasks.shuffle_combine, j, parts, *(row[j] for row in picks), pure=False)
        for j in range(parts)
    ]


def one_round(session: LimitedSession, size: int, partition: int, seed: int) -> Round:
    """Run the workload once; checks the answer covers every value."""

    def workload() -> tuple[Output, ...]:
        outputs = submit_shuffle(session.client, size, partition, seed)
        session.wait(outputs, timeout=ROUND_TIMEOUT)
        return tuple(tuple(output) for output in session.client.gather(outputs))

    result = measure(session, workload)
    answer = cast(tuple[Output, ...], result.answer)
    count = sum(output[0] for output in answer)
    if count != (size // partition) * (partition // 8):
        raise AssertionError(f"the outputs hold {count:,} values, not {size // 8:,}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="10GiB", help="bytes of input in all")
    parser.add_argument("--partition", default="64MiB", help="bytes per input partition")
    parser.add_argument("--limit", default="2GiB", help="memory limit of each worker")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of each system")
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    args = parser.parse_args()
    size, partition = parse_size(args.size), parse_size(args.partition)
    systems = args.systems.split(",")
    if unknown := [s for s in systems if s not in SESSIONS]:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    if args.repeat < 1 or not 0 < partition <= size or partition % 8:
        parser.error("--repeat must be at least 1, --partition a multiple of 8 up to --size")
    parts = size // partition
    print(
        f"shuffle: {describe_bytes(parts * partition)} in {parts} partitions of "
        f"{describe_bytes(partition)} ({parts * (parts + 2):,} tasks); {N_WORKERS} workers x "
        f"{N_THREADS} threads, memory limit {args.limit} each",
        flush=True,
    )
    shape = (N_WORKERS, N_THREADS, args.limit)
    play = partial(one_round, size=size, partition=partition, seed=SEED)
    return report(run_systems(systems, args.repeat, shape, play))


if __name__ == "__main__":
    sys.exit(main())
