"""Runs per second of our job queue beside HyperQueue: 1,000 runs of ``true`` on 2 workers.

apportion gets the shape of ``queue_hyperqueue.py``: a scheduler serving a journal and
2 worker processes, all started as ``apportion`` commands (``python -m
apportion.cli.main``) over loopback TCP. HyperQueue's workers each use every CPU of
the machine with 1 CPU per task, so each of ours gets ``--nthreads`` = the CPU count
(a run occupies one thread while its command runs). The journal, and with it the
runs' logs, and HyperQueue's server directory go under the same temporary directory
base (``TMPDIR``), so both systems write to the same file system. One difference
remains: a run's log (``<journal>-logs/N.log``) is created on its first output, so
``true`` leaves none, where HyperQueue creates a stdout and a stderr file per task.

For apportion, elapsed time runs from ``remote.submit`` (one request with all n specs,
built beforehand) until the journal has every run in a finished state, read every
20 ms from this process (SQLite WAL lets it read while the scheduler writes); then
every run must have completed. Starting the processes is not timed, nor is a warm-up
of a few runs once both workers have registered.

The systems take turns (apportion, hyperqueue, apportion, ...), ``--repeat`` rounds
of each; each round is printed, then the median of each system and the median of
the rounds' ratios. Without hyperqueue the reason is printed with our figures alone.

Usage: ``python benchmarks/queue_throughput.py [--runs N] [--repeat K]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

from apportion import Client
from apportion.runs import remote
from apportion.runs.journal import COMPLETED, FINISHED, Journal
from apportion.runs.spec import RunSpec, new_spec
from harness import wait_until
from queue_hyperqueue import hyperqueue_available, hyperqueue_runs_per_second

N_RUNS = 1_000
N_WORKERS = 2
REPEAT = 3
#: Seconds between two looks at the journal while waiting for the runs.
POLL_INTERVAL = 0.02
#: Seconds a process gets between SIGTERM and SIGKILL when the benchmark stops it.
STOP_GRACE = 10.0
#: Seconds without any run finishing after which a round is given up.
STALL = 30.0
#: How long to wait for the scheduler to listen and the workers to register.
START_TIMEOUT = 60.0

_ADDRESS = re.compile(r"apportion scheduler at (\S+)")
#: Lines of a log worth quoting when runs do not finish.
_COMPLAINT = re.compile(r" (WARNING|ERROR) |^\w+(Error|Exception): ")


def apportion_seconds(n: int, workers: int, nthreads: int, timeout: float = 300.0) -> float:
    """Seconds for ``n`` runs of ``true`` through a fresh scheduler and ``workers`` workers.

    Everything started is stopped and the temporary directory removed, even on failure.
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    with tempfile.TemporaryDirectory(prefix="apportion-q-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        work = base / "work"
        work.mkdir()
        with _cluster(base, workers, nthreads) as address:
            journal = Journal(base / "runs.db")
            try:
                # A few runs per thread first: worker code paths and caches warm up.
                warm_up = [new_spec(["true"], cwd=str(work))] * (workers * nthreads)
                _run_all(address, journal, warm_up, timeout)
                specs = [new_spec(["true"], cwd=str(work)) for _ in range(n)]
                return _run_all(address, journal, specs, timeout)
            finally:
                journal.close()


def _run_all(address: str, journal: Journal, specs: list[RunSpec], timeout: float) -> float:
    """Submit ``specs`` in one request, wait until all finished, check them; the seconds.

    Gives up after ``timeout`` seconds, or ``STALL`` seconds without a run finishing,
    quoting the scheduler's complaints.
    """
    start = time.perf_counter()
    ids = remote.submit(address, specs).ids
    deadline = start + timeout
    finished, progress_at = 0, time.perf_counter()
    while finished < len(ids):
        time.sleep(POLL_INTERVAL)
        counts = journal.counts(ids)
        now = time.perf_counter()
        if sum(counts[state] for state in FINISHED) > finished:
            finished, progress_at = sum(counts[state] for state in FINISHED), now
        elif now > deadline or now - progress_at > STALL:
            how = f"within {timeout:g}s" if now > deadline else f"(none for {STALL:g}s)"
            raise TimeoutError(
                f"apportion: runs not all finished {how}: {_nonzero(counts)}"
                + _complaints(journal.path.with_name("scheduler.log"))
            )
    elapsed = time.perf_counter() - start
    if counts[COMPLETED] != len(ids):
        bad = next(r for r in journal.runs(ids=ids) if r.state != COMPLETED)
        raise AssertionError(
            f"apportion: {counts[COMPLETED]} of {len(ids)} runs completed; "
            f"first other: run {bad.id} {bad.state}: {bad.reason}"
        )
    return elapsed


def _nonzero(counts: dict[str, int]) -> str:
    return ", ".join(f"{count} {state}" for state, count in counts.items() if count)


def _complaints(log: Path, most: int = 3) -> str:
    """The first few warnings, errors and exception lines of a log, as text to append."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    found = [line for line in lines if _COMPLAINT.search(line)][:most]
    return "".join(f"\n  {log.name}: {line}" for line in found)


@contextlib.contextmanager
def _cluster(
    base: Path, workers: int, nthreads: int, worker_args: Sequence[Sequence[str]] = ()
) -> Iterator[str]:
    """A scheduler serving ``base/runs.db`` and ``workers`` workers, as processes.

    ``worker_args``, if given, holds one list of extra options per worker (such as
    ``["--resources", "produce=2"]``), appended to that worker's command.

    Yields the scheduler's address once every worker has registered. Their stderr goes
    to ``*.log`` files in ``base``. On exit all are stopped (SIGTERM, then SIGKILL after
    ``STOP_GRACE`` seconds), with anything they started.
    """
    if worker_args and len(worker_args) != workers:
        raise ValueError(f"worker_args has {len(worker_args)} entries for {workers} workers")
    env = {**os.environ, "APPORTION_HOME": str(base / "home")}
    command = [sys.executable, "-m", "apportion.cli.main"]
    procs: list[subprocess.Popen[bytes]] = []
    # This process's clients need the secret the scheduler makes in that home.
    before = os.environ.get("APPORTION_HOME")
    os.environ["APPORTION_HOME"] = env["APPORTION_HOME"]
    try:
        log = base / "scheduler.log"
        argv = [*command, "scheduler", "--port", "0", "--journal", str(base / "runs.db")]
        procs.append(_start(argv, log, env))
        address = _address(log, procs[0])
        for i in range(workers):
            argv = [*command, "worker", address, "--nthreads", str(nthreads), "--name", f"w{i}"]
            argv += worker_args[i] if worker_args else []
            procs.append(_start(argv, base / f"w{i}.log", env))
        client = Client(address)
        try:
            client.wait_for_workers(workers, timeout=START_TIMEOUT)
        finally:
            client.close()
        yield address
    finally:
        _stop(procs)
        if before is None:
            os.environ.pop("APPORTION_HOME", None)
        else:
            os.environ["APPORTION_HOME"] = before


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as stderr:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, env=env
        )


def _address(log: Path, proc: subprocess.Popen[bytes]) -> str:
    """The address the scheduler writing ``log`` announces; raises if it dies first."""
    found: list[str] = []

    def announced() -> bool:
        match = _ADDRESS.search(log.read_text(errors="replace"))
        if match:
            found.append(match.group(1))
            return True
        if proc.poll() is not None:
            raise RuntimeError(f"the scheduler exited ({proc.returncode}): {log.read_text()}")
        return False

    wait_until(announced, "the scheduler did not announce its address", START_TIMEOUT)
    return found[0]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM ``procs`` (workers first), SIGKILL what is left after ``STOP_GRACE``, and
    kill any process they started that outlived them."""
    descendants: list[psutil.Process] = []
    for proc in reversed(procs):
        with contextlib.suppress(psutil.NoSuchProcess):
            descendants += psutil.Process(proc.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for child in descendants:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(descendants, timeout=5.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=N_RUNS, help="runs of true per round")
    parser.add_argument("--repeat", type=int, default=REPEAT, help="rounds of each system")
    args = parser.parse_args()
    if args.runs < 1 or args.repeat < 1:
        parser.error("--runs and --repeat must be at least 1")
    n, nthreads = args.runs, os.cpu_count() or 1
    print(f"job queue: {n} runs of true on {N_WORKERS} workers x {nthreads} threads", flush=True)
    reason = hyperqueue_available()
    if reason is not None:
        print(f"hyperqueue not compared: {reason}", flush=True)

    ours: list[float] = []
    theirs: list[float] = []
    for i in range(1, args.repeat + 1):
        seconds = apportion_seconds(n, N_WORKERS, nthreads)
        ours.append(seconds)
        line = f"round {i}: apportion {n / seconds:,.1f} runs/s ({seconds:.2f} s)"
        if reason is None:
            rate = hyperqueue_runs_per_second(n, N_WORKERS)
            theirs.append(n / rate)
            line += f", hyperqueue {rate:,.1f} runs/s ({n / rate:.2f} s)"
            line += f", ratio {(n / seconds) / rate:.2f}x"
        print(line, flush=True)

    median = f"median of {args.repeat}"
    print()
    ours_s = statistics.median(ours)
    print(f"apportion   : {n / ours_s:,.1f} runs/s ({ours_s:.2f} s, {median})")
    if theirs:
        theirs_s = statistics.median(theirs)
        print(f"hyperqueue  : {n / theirs_s:,.1f} runs/s ({theirs_s:.2f} s, {median})")
        ratio = statistics.median([t / o for o, t in zip(ours, theirs, strict=True)])
        print(f"ratio       : {ratio:.2f}x (apportion/hyperqueue, {median} rounds)")


if __name__ == "__main__":
    main()
