"""Three times a worker's memory limit of data, produced and reduced: apportion beside Dask.

Both systems get the same cluster (``limited.py``): a scheduler and 2 worker
processes of 2 threads, each with ``--limit`` of memory (2 GiB by default) and Dask's
thresholds, apportion's under its supervisor and Dask's under its nanny, all started
as command-line processes on loopback TCP.

The workload: N blocks of ``--block`` bytes (32 MiB by default) of random int64 from
a seeded generator, 3 x ``--limit`` in all (N = 192 by default), each held by a
future in the client until every block is in a worker; then one checksum task per
block (values, sum modulo 2**64) and one task adding the checksums. The cluster holds
1.5 times its memory in blocks (3 limits over 2 workers): each worker keeps up to its
target (0.6 of the limit) in memory and must spill the rest, then read every spilled
block back for its checksum. Timed from the first submit until the total is in the
client; the blocks are released after it.

For each system: seconds (the median of ``--repeat`` rounds, each after the scheduler
has forgotten the previous one), bytes written to the spill directories (apportion's
``SpillStore`` totals; Dask's ``disk-write`` metrics of its spill buffer), and whether
a worker was killed or restarted (pids before and after each round, workers' logs).
The ratio is apportion's median over Dask's (below 1: apportion faster). Nothing here
asserts a time; a total that differs between systems or rounds, or a worker killed,
is an error (exit status 1).

Usage: ``python benchmarks/spill.py [--limit 2GiB] [--block 32MiB] [--repeat N]
[--systems apportion,dask]``
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import cast

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

N_WORKERS = 2
N_THREADS = 2
#: Bytes of data produced, in memory limits of one worker.
FACTOR = 3
SEED = 20260502
REPEAT = 1
#: Longest wait for one round's tasks, so that a stuck system cannot hang the suite.
ROUND_TIMEOUT = 900.0


def one_round(session: LimitedSession, count: int, block: int) -> Round:
    """Produce ``count`` blocks, hold them all, reduce them; check the count of values."""
    client = session.client

    def workload() -> tuple[int, int]:
        blocks = client.map(tasks.random_block, [SEED] * count, range(count), [block] * count)
        session.wait(blocks, timeout=ROUND_TIMEOUT)
        checksums = client.map(tasks.block_checksum, blocks)
        total = client.submit(tasks.add_checksums, *checksums).result(timeout=ROUND_TIMEOUT)
        return (int(total[0]), int(total[1]))

    result = measure(session, workload)
    values = cast(tuple[int, int], result.answer)[0]
    if values != count * (block // 8):
        raise AssertionError(f"the total counts {values:,} values, not {count * block // 8:,}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="2GiB", help="memory limit of each worker")
    parser.add_argument("--block", default="32MiB", help="bytes per block")
    parser.add_argument("--repeat", type=int, default=REPEAT, help="rounds of each system")
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    args = parser.parse_args()
    limit, block = parse_size(args.limit), parse_size(args.block)
    systems = args.systems.split(",")
    if unknown := [s for s in systems if s not in SESSIONS]:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    if args.repeat < 1 or not 0 < block <= limit or block % 8:
        parser.error("--repeat must be at least 1, --block a multiple of 8 up to --limit")
    count = FACTOR * limit // block
    print(
        f"spill: {count} blocks of {describe_bytes(block)} = {describe_bytes(count * block)} "
        f"({FACTOR}x a worker's limit) held, then reduced; {N_WORKERS} workers x "
        f"{N_THREADS} threads, memory limit {describe_bytes(limit)} each",
        flush=True,
    )
    shape = (N_WORKERS, N_THREADS, args.limit)
    return report(
        run_systems(systems, args.repeat, shape, partial(one_round, count=count, block=block))
    )


if __name__ == "__main__":
    sys.exit(main())
