"""Clusters whose workers have a memory limit, for the benchmarks that spill.

Both systems get the same shape, started as command-line processes on loopback TCP:
a scheduler and ``workers`` worker processes of ``nthreads`` threads, each with the
same ``--memory-limit`` and Dask's default thresholds (target 0.6, spill 0.7, pause
0.8, terminate 0.95), spilling under a ``--local-directory`` in the benchmark's
temporary directory.

- apportion: ``apportion scheduler`` and ``apportion worker --memory-limit L
  --local-directory D`` (``queue_throughput._cluster``); a memory limit gives each
  worker process a supervisor, which kills and restarts it above ``terminate``.
- Dask: ``dask scheduler`` and ``dask worker --nanny --memory-limit L
  --local-directory D``; the nanny plays the supervisor's part (and sets the same
  ``MALLOC_TRIM_THRESHOLD_``).

``LimitedSession`` reads, for either system: each worker's pid (a worker killed and
restarted comes back with another), the files and bytes written to spill
directories so far (apportion's ``SpillStore`` totals, Dask's ``disk-write`` metrics
of its spill buffer), and the lines of the workers' logs that say a worker was
killed or restarted.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import tasks
from data_transfer import _dask_cluster
from harness import settle_apportion, settle_dask
from queue_throughput import START_TIMEOUT, _cluster

#: Log lines of a supervisor or nanny that killed or restarted a worker process.
_RESTART = re.compile(
    r"killed by its supervisor|restarting it|replaced by a fresh process"  # apportion
    r"|Restarting worker|exceeded \d+% memory budget|Worker process \d+ was killed",  # Dask
    re.IGNORECASE,
)


@dataclass
class LimitedSession:
    """A connected client of either system on a cluster with a memory limit."""

    client: Any
    wait: Callable[..., Any]
    #: Returns once the scheduler holds no task.
    settle: Callable[[], None]
    #: Worker address -> pid, of the workers connected now.
    pids: Callable[[], dict[str, int]]
    #: (files, bytes) written to spill directories so far, over the workers alive.
    spilled: Callable[[], tuple[int, int]]
    #: The workers' log lines so far that say a worker was killed or restarted.
    restarts: Callable[[], list[str]]


def _apportion_pids(client: Any) -> dict[str, int]:
    workers = client.scheduler_info()["workers"]
    return {address: int(info["pid"]) for address, info in workers.items()}


def _summed(totals: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return sum(files for files, _ in totals.values()), sum(n for _, n in totals.values())


def _restart_lines(base: Path) -> list[str]:
    lines = []
    for log in sorted(base.glob("w*.log")):
        text = log.read_text(errors="replace")
        lines += [f"{log.name}: {line}" for line in text.splitlines() if _RESTART.search(line)]
    return lines


@contextlib.contextmanager
def apportion_limited(workers: int, nthreads: int, limit: str) -> Iterator[LimitedSession]:
    """An apportion cluster of ``workers`` processes limited to ``limit`` each."""
    from apportion import Client, wait

    with tempfile.TemporaryDirectory(prefix="apportion-mem-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        args = ["--memory-limit", limit, "--local-directory", str(base / "spill")]
        with _cluster(base, workers, nthreads, worker_args=[args] * workers) as address:
            client = Client(address)
            try:
                yield LimitedSession(
                    client,
                    wait,
                    partial(settle_apportion, client),
                    partial(_apportion_pids, client),
                    lambda: _summed(client.run(tasks.spill_totals_apportion) or {}),
                    partial(_restart_lines, base),
                )
            finally:
                client.close()


@contextlib.contextmanager
def dask_limited(workers: int, nthreads: int, limit: str) -> Iterator[LimitedSession]:
    """A Dask cluster of ``workers`` nanny-supervised processes limited to ``limit`` each."""
    import distributed

    # The nanny says at WARNING that it restarts a worker; the benchmarks quiet Dask
    # to ERROR otherwise (``tasks.share_with_workers``).
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "warning"
    with tempfile.TemporaryDirectory(prefix="dask-mem-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        args = ["--nthreads", str(nthreads), "--nanny", "--memory-limit", limit]
        args += ["--local-directory", str(base / "spill")]
        with _dask_cluster(base, [args] * workers) as scheduler_file:
            client = distributed.Client(scheduler_file=str(scheduler_file))
            try:
                client.wait_for_workers(workers, timeout=START_TIMEOUT)
                yield LimitedSession(
                    client,
                    distributed.wait,
                    partial(settle_dask, client),
                    lambda: client.run(os.getpid),
                    lambda: _summed(client.run(tasks.spill_totals_dask) or {}),
                    partial(_restart_lines, base),
                )
            finally:
                client.close()


#: How each system's session is opened: (workers, nthreads, limit) -> session.
SESSIONS: dict[str, Callable[[int, int, str], contextlib.AbstractContextManager[LimitedSession]]]
SESSIONS = {"apportion": apportion_limited, "dask": dask_limited}


def describe_bytes(n: float) -> str:
    """``1.5 GiB``: bytes as the benchmarks print them."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


_SIZE = re.compile(r"^\s*([0-9.]+)\s*([a-z]*)\s*$", re.IGNORECASE)
#: Units of a size: decimal (``GB``) and binary (``GiB``) multiples of a byte.
_PREFIXES = ["", "k", "m", "g", "t"]
_UNITS = {
    "": 1,
    **{prefix + "b": 1000**power for power, prefix in enumerate(_PREFIXES)},
    **{prefix + "ib": 1024**power for power, prefix in enumerate(_PREFIXES) if prefix},
}


def parse_size(text: str) -> int:
    """``64MiB``, ``10GiB``, ``2GB``, ``4096``: bytes."""
    match = _SIZE.match(text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size such as 64MiB or 10GiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass(frozen=True)
class Round:
    """One run of a workload on one system."""

    seconds: float
    #: What the workload computed: equal across rounds and systems, or something is wrong.
    answer: Hashable
    #: Files and bytes written to the spill directories during the round.
    files_spilled: int
    bytes_spilled: int
    #: What said a worker was killed or restarted during the round (empty: none).
    restarts: list[str]


def measure(session: LimitedSession, workload: Callable[[], Hashable]) -> Round:
    """Time ``workload`` (it submits, waits and returns its answer) on a settled
    scheduler, with what it spilled and any worker killed or restarted meanwhile."""
    session.settle()
    pids, (files, written), said = session.pids(), session.spilled(), len(session.restarts())
    start = time.perf_counter()
    answer = workload()
    seconds = time.perf_counter() - start
    restarts = session.restarts()[said:]
    after = session.pids()
    if after != pids:
        restarts.append(f"worker pids were {sorted(pids.values())}, now {sorted(after.values())}")
    files_after, written_after = session.spilled()
    return Round(seconds, answer, files_after - files, written_after - written, restarts)


def run_systems(
    systems: list[str],
    repeat: int,
    shape: tuple[int, int, str],
    one_round: Callable[[LimitedSession], Round],
) -> dict[str, list[Round]]:
    """``repeat`` rounds of ``one_round`` on each system's cluster of ``shape``
    (workers, threads, memory limit), each round printed as it ends."""
    results: dict[str, list[Round]] = {}
    for system in systems:
        print(f"{system}:", flush=True)
        with SESSIONS[system](*shape) as session:
            results[system] = []
            for i in range(repeat):
                result = one_round(session)
                print(f"  round {i + 1}: {describe(result)}", flush=True)
                results[system].append(result)
    return results


def describe(result: Round) -> str:
    killed = "; ".join(result.restarts) if result.restarts else "none"
    return (
        f"{result.seconds:.1f} s, spilled {describe_bytes(result.bytes_spilled)} in "
        f"{result.files_spilled:,} files, workers killed or restarted: {killed}"
    )


def report(results: dict[str, list[Round]]) -> int:
    """Print each system's median and the ratio; 1 if anything went wrong."""
    print()
    medians = {s: statistics.median(r.seconds for r in rounds) for s, rounds in results.items()}
    for system, rounds in results.items():
        spilled = statistics.median(r.bytes_spilled for r in rounds)
        print(
            f"{system:<10}: {medians[system]:.1f} s (median of {len(rounds)}), "
            f"spilled {describe_bytes(spilled)} per round"
        )
    if "apportion" in medians and "dask" in medians:
        ratio = medians["apportion"] / medians["dask"]
        print(f"ratio     : {ratio:.2f}x (apportion's seconds / Dask's)")
    failed = [line for rounds in results.values() for r in rounds for line in r.restarts]
    answers = {r.answer for rounds in results.values() for r in rounds}
    if len(answers) != 1:
        print("ANSWERS DIFFER between rounds or systems")
    else:
        print(f"answers   : the same in every round of {' and '.join(results)}")
    print(f"killed    : {'; '.join(failed) if failed else 'no worker of either system'}")
    return 1 if failed or len(answers) != 1 else 0
