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
import statistics
import sys
import time
from dataclasses import dataclass

import tasks
from limited import SESSIONS, LimitedSession, describe_bytes, parse_size

tasks.share_with_workers()

N_WORKERS = 2
N_THREADS = 2
#: Bytes of data produced, in memory limits of one worker.
FACTOR = 3
SEED = 20260502
REPEAT = 1
#: Longest wait for one round's tasks, so that a stuck system cannot hang the suite.
ROUND_TIMEOUT = 900.0


@dataclass(frozen=True)
class Round:
    """One run of the workload on one system."""

    seconds: float
    #: (values, sum modulo 2**64) of every block.
    total: tuple[int, int]
    #: Files and bytes written to the spill directories during the round.
    files_spilled: int
    bytes_spilled: int
    #: What said a worker was killed or restarted during the round (empty: none).
    restarts: list[str]


def one_round(session: LimitedSession, count: int, block: int) -> Round:
    """Produce ``count`` blocks, hold them all, reduce them; check the count of values."""
    session.settle()
    pids, (files, written), said = session.pids(), session.spilled(), len(session.restarts())
    client = session.client
    start = time.perf_counter()
    blocks = client.map(tasks.random_block, [SEED] * count, range(count), [block] * count)
    session.wait(blocks, timeout=ROUND_TIMEOUT)
    checksums = client.map(tasks.block_checksum, blocks)
    total = client.submit(tasks.add_checksums, *checksums).result(timeout=ROUND_TIMEOUT)
    seconds = time.perf_counter() - start
    del blocks, checksums
    restarts = session.restarts()[said:]
    after = session.pids()
    if after != pids:
        restarts.append(f"worker pids were {sorted(pids.values())}, now {sorted(after.values())}")
    files_after, written_after = session.spilled()
    if total[0] != count * (block // 8):
        raise AssertionError(f"the total counts {total[0]:,} values, not {count * block // 8:,}")
    return Round(seconds, tuple(total), files_after - files, written_after - written, restarts)


def describe(result: Round) -> str:
    killed = "; ".join(result.restarts) if result.restarts else "none"
    return (
        f"{result.seconds:.1f} s, spilled {describe_bytes(result.bytes_spilled)} in "
        f"{result.files_spilled:,} files, workers killed or restarted: {killed}"
    )


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
    results: dict[str, list[Round]] = {}
    for system in systems:
        print(f"{system}:", flush=True)
        with SESSIONS[system](N_WORKERS, N_THREADS, args.limit) as session:
            results[system] = []
            for i in range(args.repeat):
                result = one_round(session, count, block)
                print(f"  round {i + 1}: {describe(result)}", flush=True)
                results[system].append(result)
    return report(results, args.repeat)


def report(results: dict[str, list[Round]], repeat: int) -> int:
    """Print each system's median and the ratio; 1 if anything went wrong."""
    print()
    medians = {s: statistics.median(r.seconds for r in rounds) for s, rounds in results.items()}
    for system, rounds in results.items():
        spilled = statistics.median(r.bytes_spilled for r in rounds)
        print(
            f"{system:<10}: {medians[system]:.1f} s (median of {repeat}), "
            f"spilled {describe_bytes(spilled)} per round"
        )
    if "apportion" in medians and "dask" in medians:
        ratio = medians["apportion"] / medians["dask"]
        print(f"ratio     : {ratio:.2f}x (apportion's seconds / Dask's)")
    failed = [line for rounds in results.values() for r in rounds for line in r.restarts]
    totals = {r.total for rounds in results.values() for r in rounds}
    if len(totals) != 1:
        print(f"TOTALS DIFFER between rounds or systems: {sorted(totals)}")
    else:
        print(f"totals    : the same in every round of {' and '.join(results)}")
    print(f"killed    : {'; '.join(failed) if failed else 'no worker of either system'}")
    return 1 if failed or len(totals) != 1 else 0


if __name__ == "__main__":
    sys.exit(main())
