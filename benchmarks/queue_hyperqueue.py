"""Runs per second of a job queue in HyperQueue: 1,000 runs of ``true`` on 2 workers.

The reference figure for our own job queue: the same shape as
``hq submit --array 1-1000 true`` on a server with 2 local workers. HyperQueue's Python
package (``pip install hyperqueue``, 0.27) ships no ``hq`` binary; its server and
workers live in ``hyperqueue.abi3.so`` and run as threads of this process
(``LocalCluster``), while every task is a child process of this one. The API has no
task arrays, so the job is n ``job.program(["true"])`` tasks without dependencies
(an array job would send one task description for all n ids; here it is repeated).

Settings, all HyperQueue's defaults unless said:

- each worker gets every CPU of the machine (``WorkerConfig(cores=None)``) and each
  task asks for 1 CPU, so up to 2 x cpus runs at once;
- stdout and stderr of each task go to files (``%{CWD}/%{TASK_ID}.stdout`` and
  ``.stderr``), as our queue keeps a log per run. ``%{CWD}`` would be the directory
  the script is started from, so the job's working directory is set to a
  directory inside the temporary directory that also holds the server's files;
- ``max_fails=1``: the first failed task cancels the rest of the job.

The temporary directory follows ``TMPDIR``. Creating the 2n log files is a large
part of the cost, so compare with our queue writing its logs to the same file
system (on a 2-CPU VM: about 300 runs/s on ext4, 400-500 on tmpfs).

Elapsed time runs from ``client.submit(job)`` (serialising the job included) until
the server reports the job terminated; starting the server and workers is not timed.
``Client.wait_for_jobs`` polls the server only once a second (and draws a progress
bar), which would round a run of about a second up by as much as a second, so this
script asks for the same job status every 10 ms instead, through the same FFI call
(``client.connection.wait_for_jobs``) with a callback that stops it after one poll.

Usage: ``python benchmarks/queue_hyperqueue.py [-n RUNS] [--workers N]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

N_RUNS = 1_000
N_WORKERS = 2
#: Seconds between two job-status requests to the server while waiting.
POLL_INTERVAL = 0.01


class _StillRunning(Exception):
    """Raised from the wait callback to end a ``wait_for_jobs`` call after one poll."""


def hyperqueue_available() -> str | None:
    """None if hyperqueue can be imported and started here, else a one-line reason why it
    was not compared.

    "Started" means: a server and one worker start, and a job of one ``true`` runs.
    """
    try:
        import hyperqueue
    except Exception as exc:  # ImportError, or a broken native library
        return _one_line(f"hyperqueue cannot be imported ({type(exc).__name__}: {exc})")
    try:
        with _cluster(workers=1) as (client, work_dir):
            _run_job(client, work_dir, n=1, timeout=30.0)
    except Exception as exc:
        version = getattr(hyperqueue, "get_version", lambda: "?")()
        return _one_line(
            f"hyperqueue {version} cannot run a job here ({type(exc).__name__}: {exc})"
        )
    return None


def hyperqueue_runs_per_second(n: int = 1000, workers: int = 2, timeout: float = 300.0) -> float:
    """Start a HyperQueue server with `workers` local workers (each with the machine's
    cpus, default), submit ONE job of n program tasks running `true` (the closest to
    `hq submit --array 1-n true`), wait for all to finish, check every task succeeded,
    stop everything, and return n / elapsed (elapsed = from submit to all done;
    server/worker start-up excluded). Clean up all processes and temp dirs even on
    failure.

    Task logs keep HyperQueue's default: one stdout and one stderr file per task,
    written to the job's working directory inside the temporary directory.
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    with _cluster(workers) as (client, work_dir):
        elapsed = _run_job(client, work_dir, n, timeout)
    return n / elapsed


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _run_job(client: Any, work_dir: Path, n: int, timeout: float) -> float:
    """Submit one job of ``n`` ``true`` tasks, wait for it, check it; return the seconds."""
    from hyperqueue import Job

    job = Job(default_workdir=work_dir)
    for _ in range(n):
        job.program(["true"])
    start = time.perf_counter()
    submitted = client.submit(job)
    status = _wait(client, submitted.id, deadline=start + timeout)
    elapsed = time.perf_counter() - start

    # The job has terminated; this call returns at once, with the ids of the jobs
    # that have a failed or cancelled task.
    unsuccessful = client.connection.wait_for_jobs([submitted.id], lambda _: None)
    if unsuccessful or status["failed"] or status["finished"] != n or status["total"] != n:
        failed = client.connection.get_failed_tasks([submitted.id]).get(submitted.id, {})
        example = next(iter(failed.values()), None)
        raise AssertionError(
            f"hyperqueue job {submitted.id}: {status['finished']} of {n} tasks finished, "
            f"{status['failed']} failed"
            + (f" (first error: {_one_line(example.error)})" if example is not None else "")
        )
    client.forget(submitted.id)
    return elapsed


def _wait(client: Any, job_id: int, deadline: float) -> dict[str, Any]:
    """Poll job ``job_id`` every ``POLL_INTERVAL`` until it terminates; its last status.

    A status is ``{"finished": int, "failed": int, "total": int, "completed": bool}``,
    where ``completed`` means the job has terminated (finished, failed or cancelled).
    """
    last: dict[str, Any] = {}

    def check(statuses: dict[int, dict[str, Any]]) -> None:
        last.clear()
        last.update(statuses[job_id])
        if not last["completed"]:
            raise _StillRunning

    while True:
        try:
            client.connection.wait_for_jobs([job_id], check)
        except _StillRunning:
            if time.perf_counter() > deadline:
                raise TimeoutError(
                    f"hyperqueue job {job_id}: {last['finished']} of {last['total']} tasks "
                    "finished before the timeout"
                ) from None
            time.sleep(POLL_INTERVAL)
        else:
            return last


@contextlib.contextmanager
def _cluster(workers: int) -> Iterator[tuple[Any, Path]]:
    """A HyperQueue server with ``workers`` workers in this process, in a temporary directory.

    Yields a connected client and the directory to run tasks in. On exit, even after an
    error: stops the server (its workers stop when they lose it), waits for their
    threads to end, ends any task process still running, and removes the directory.
    """
    from hyperqueue import LocalCluster

    me = psutil.Process()
    threads_before = me.num_threads()
    children_before = {child.pid for child in me.children(recursive=True)}
    with tempfile.TemporaryDirectory(prefix="apportion-hq-", ignore_cleanup_errors=True) as tmp:
        with _stdout_silenced():  # the server prints a table of its settings to fd 1
            cluster = LocalCluster(server_dir=str(Path(tmp) / "server"))
        try:
            for _ in range(workers):
                cluster.start_worker()
            yield cluster.client(), Path(tmp) / "work"
        finally:
            cluster.stop()
            # The first client call leaves one runtime thread behind for the process.
            _settle(lambda: me.num_threads() <= threads_before + 1, timeout=5.0)
            _end_new_children(me, children_before)


def _settle(done: Callable[[], bool], timeout: float) -> None:
    """Poll ``done`` for up to ``timeout`` seconds (best effort: clean-up must go on)."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def _end_new_children(me: psutil.Process, before: set[int]) -> None:
    """Kill task processes started since ``before`` that outlived their worker."""
    leftover = [child for child in me.children(recursive=True) if child.pid not in before]
    for child in leftover:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(leftover, timeout=5.0)


@contextlib.contextmanager
def _stdout_silenced() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null meanwhile (native code writes there directly)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=N_RUNS, help="runs of true")
    parser.add_argument("--workers", type=int, default=N_WORKERS, help="local workers")
    args = parser.parse_args()
    shape = f"{args.runs} runs of true on {args.workers} workers"
    reason = hyperqueue_available()
    if reason is not None:
        print(f"hyperqueue: {shape}: not compared: {reason}")
        return
    rate = hyperqueue_runs_per_second(args.runs, args.workers)
    print(f"hyperqueue: {shape}: {rate:,.1f} runs/s", flush=True)


if __name__ == "__main__":
    main()
