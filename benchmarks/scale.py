"""Many worker processes on one machine: start-up, throughput and leaving, beside Dask.

A scheduler in a process of its own and ``--workers`` (200) worker processes of 1
thread each, started as a deployment starts them: ``apportion scheduler`` and
``apportion worker --nworkers N --nthreads 1`` (one supervisor per node, as a node is
deployed; ``--supervisors S`` splits the N among S of them, as S nodes would), and
the same with ``dask scheduler`` and ``dask worker --nworkers N --nthreads 1``
(``--no-dashboard``; ``--memory-limit 0``, as apportion's default has none), all on
loopback. For each system in turn, timed from this process, which is a client:

1. start-up: from launching the workers until the scheduler counts all N, and the
   CPU seconds the supervisors and every process under them had spent by then;
2. ``--rounds`` (3) rounds of ``--tasks`` (20,000) no-op tasks, ``map`` then
   ``gather``: tasks/s (best, and the range), and the scheduler's CPU seconds per
   task (user + system, psutil on its process, over the rounds);
3. leaving: SIGTERM to each worker supervisor (as a service manager stops one) until
   the scheduler counts no worker, and until the supervisors have exited;

and the scheduler's peak resident memory (``VmHWM``). Each phase has a budget of
``--dask-timeout`` seconds (400) for either system: a phase that does not finish in
it is reported as such ("did not finish within 400 s", with how far it got), and
the system's later phases are skipped. A phase also stops when the machine's
available memory falls under ``--min-free`` (2 GiB): 200 processes are a lot of a
shared machine.

Every process this starts is in a session (so a process group) of its own, and
every group is killed when its system is done, on an error, on Ctrl-C or SIGTERM
alike; the report ends by checking that none is left.

Usage: ``python benchmarks/scale.py [--workers N] [--tasks N] [--rounds N]
[--supervisors S] [--dask-timeout S] [--systems apportion,dask]
[--worker-options OPTIONS] [--json FILE]``
(``make bench-scale``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

import tasks
from harness import settle_apportion, settle_dask

tasks.share_with_workers()

N_WORKERS = 200
N_TASKS = 20_000
ROUNDS = 3
BUDGET = 400.0
MIN_FREE_GIB = 2.0
#: Seconds between two counts of the registered workers.
POLL = 0.25


class PhaseFailed(Exception):
    """A phase did not finish: over its budget, or the machine short of memory."""


# --- processes ---------------------------------------------------------------------------


class ProcessGroups:
    """Every process started here, each the leader of a session of its own, so that one
    ``killpg`` reaches it and all it started (workers, Dask's spawned processes)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(self.logs / log, "ab") as out:
            child = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        self.started.append(child)
        return child

    def kill_all(self) -> list[int]:
        """SIGKILL every group; the process ids still alive in them a while after."""
        for child in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        for child in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)
        deadline = time.monotonic() + 10
        while True:
            left = members([child.pid for child in self.started])
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)


def members(groups: list[int]) -> list[int]:
    """Live (not zombie) processes whose process group is one of ``groups``."""
    found = []
    for process in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(process.info["pid"]) in groups:
                found.append(process.info["pid"])
    return found


def family_cpu(pids: list[int]) -> float:
    """CPU seconds of ``pids`` and everything under them, reaped children included."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(pid)
            for process in [top, *top.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = process.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
    return total


def wait_for_file(path: Path, child: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.stat().st_size:
        if child.poll() is not None:
            raise PhaseFailed(f"the scheduler exited with status {child.returncode}")
        if time.monotonic() > deadline:
            raise PhaseFailed(f"no scheduler file within {timeout:.0f} s")
        time.sleep(0.1)
    time.sleep(0.2)  # written in one go, but let the writer finish


def peak_rss(pid: int) -> int:
    """The peak resident memory of process ``pid`` so far, in bytes (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc: peak memory needs Linux")


def check_memory(min_free: float) -> None:
    available = psutil.virtual_memory().available / 2**30
    if available < min_free:
        raise PhaseFailed(f"stopped: the machine's available memory fell to {available:.1f} GiB")


# --- the two systems ---------------------------------------------------------------------


class System:
    """What differs between apportion and Dask here: commands, client, counting."""

    name = ""

    def scheduler(self, file: Path) -> list[str]:
        raise NotImplementedError

    def workers(self, file: Path, n: int) -> list[str]:
        raise NotImplementedError

    def client(self, file: Path) -> Any:
        raise NotImplementedError

    def settle(self, client: Any) -> None:
        raise NotImplementedError

    def wait(self, futures: Any, timeout: float) -> None:
        """Return once ``futures`` are done; ``TimeoutError`` after ``timeout``."""
        raise NotImplementedError

    def count(self, client: Any) -> int:
        return len(client.nthreads())


class Apportion(System):
    name = "apportion"

    def scheduler(self, file: Path) -> list[str]:
        command = [sys.executable, "-m", "apportion.cli.main", "scheduler", "--host", "127.0.0.1"]
        return [*command, "--port", "0", "--no-journal", "--scheduler-file", str(file)]

    def __init__(self, extra: list[str] | None = None) -> None:
        #: More options for ``apportion worker`` (``--worker-options``).
        self.extra = extra or []

    def workers(self, file: Path, n: int) -> list[str]:
        command = [sys.executable, "-m", "apportion.cli.main", "worker"]
        command += ["--scheduler-file", str(file), "--nworkers", str(n), "--nthreads", "1"]
        return [*command, *self.extra]

    def client(self, file: Path) -> Any:
        from apportion import Client

        return Client(scheduler_file=str(file))

    def settle(self, client: Any) -> None:
        settle_apportion(client)

    def wait(self, futures: Any, timeout: float) -> None:
        import apportion

        apportion.wait(futures, timeout=timeout)


class Dask(System):
    name = "dask"
    dask = str(Path(sys.executable).with_name("dask"))

    def scheduler(self, file: Path) -> list[str]:
        command = [self.dask, "scheduler", "--host", "127.0.0.1", "--port", "0"]
        return [*command, "--no-dashboard", "--scheduler-file", str(file)]

    def workers(self, file: Path, n: int) -> list[str]:
        command = [self.dask, "worker", "--scheduler-file", str(file), "--host", "127.0.0.1"]
        command += ["--nworkers", str(n), "--nthreads", "1"]
        return [*command, "--no-dashboard", "--memory-limit", "0"]

    def client(self, file: Path) -> Any:
        import distributed

        return distributed.Client(scheduler_file=str(file))

    def settle(self, client: Any) -> None:
        settle_dask(client)

    def wait(self, futures: Any, timeout: float) -> None:
        import distributed

        distributed.wait(futures, timeout=timeout)


# --- one system's run -----------------------------------------------------------------------


@dataclass
class Outcome:
    system: str
    workers: int
    supervisors: int
    #: Seconds from launching the workers until the scheduler counted all of them.
    startup: float | None = None
    #: CPU seconds (user + system) the supervisors and every process under them had
    #: spent when the scheduler counted all the workers.
    startup_cpu: float | None = None
    #: Workers counted when start-up stopped (all of them unless it failed).
    registered: int = 0
    #: Tasks per second of each round finished.
    rates: list[float] = field(default_factory=list)
    #: The scheduler's CPU seconds (user + system) per task over the rounds finished.
    cpu_per_task: float | None = None
    #: Seconds from SIGTERM to the supervisors until the scheduler counted no worker.
    leave: float | None = None
    #: ... and until every supervisor process had exited.
    exited: float | None = None
    peak_rss: int | None = None
    #: Why the run stopped early ("" if it did not).
    failure: str = ""
    #: The phase it stopped in.
    failed_phase: str = ""
    #: Processes of this run still alive after the final SIGKILL (none, we hope).
    left_behind: list[int] = field(default_factory=list)


def deadline_after(budget: float) -> Callable[[], float]:
    end = time.monotonic() + budget

    def left() -> float:
        return end - time.monotonic()

    return left


def start_up(
    system: System, groups: ProcessGroups, file: Path, args: argparse.Namespace, out: Outcome
) -> tuple[Any, list[subprocess.Popen[bytes]]]:
    client = system.client(file)
    shares = [args.workers // args.supervisors] * args.supervisors
    for i in range(args.workers % args.supervisors):
        shares[i] += 1
    left = deadline_after(args.dask_timeout)
    start = time.perf_counter()
    supervisors = [
        groups.start(system.workers(file, n), f"{system.name}-workers-{i}.log")
        for i, n in enumerate(shares)
    ]
    while True:
        out.registered = system.count(client)
        if out.registered >= args.workers:
            out.startup = time.perf_counter() - start
            out.startup_cpu = family_cpu([s.pid for s in supervisors])
            return client, supervisors
        if left() < 0:
            raise PhaseFailed(
                f"did not finish within {args.dask_timeout:.0f} s "
                f"({out.registered} of {args.workers} workers registered)"
            )
        check_memory(args.min_free)
        time.sleep(POLL)


def rounds(
    system: System, client: Any, scheduler: psutil.Process, args: argparse.Namespace, out: Outcome
) -> None:
    left = deadline_after(args.dask_timeout)
    cpu = 0.0
    for i in range(args.rounds):
        system.settle(client)
        before = scheduler.cpu_times()
        start = time.perf_counter()
        futures = client.map(tasks.noop, range(args.tasks), pure=False)
        while True:
            check_memory(args.min_free)
            try:
                system.wait(futures, timeout=max(0.1, min(5.0, left())))
                break
            except TimeoutError:
                if left() < 0:
                    done = sum(f.done() for f in futures)
                    client.cancel(futures)
                    raise PhaseFailed(
                        f"did not finish within {args.dask_timeout:.0f} s ({i} rounds "
                        f"and {done:,} tasks of round {i + 1} done)"
                    ) from None
        client.gather(futures)
        out.rates.append(args.tasks / (time.perf_counter() - start))
        after = scheduler.cpu_times()
        cpu += (after.user + after.system) - (before.user + before.system)
        out.cpu_per_task = cpu / (args.tasks * len(out.rates))
        print(f"  {system.name} round {i + 1}: {out.rates[-1]:,.0f} tasks/s", flush=True)
        del futures


def leave(
    system: System,
    client: Any,
    supervisors: list[subprocess.Popen[bytes]],
    args: argparse.Namespace,
    out: Outcome,
) -> None:
    left = deadline_after(args.dask_timeout)
    start = time.perf_counter()
    for supervisor in supervisors:
        supervisor.send_signal(signal.SIGTERM)
    while out.leave is None or out.exited is None:
        if out.leave is None and system.count(client) == 0:
            out.leave = time.perf_counter() - start
        if out.exited is None and all(s.poll() is not None for s in supervisors):
            out.exited = time.perf_counter() - start
        if left() < 0:
            counted = system.count(client)
            raise PhaseFailed(
                f"did not finish within {args.dask_timeout:.0f} s ({counted} workers still counted)"
            )
        time.sleep(POLL / 5)


def run(system: System, args: argparse.Namespace) -> Outcome:
    """One system's scheduler, workers and phases; every process killed after."""
    out = Outcome(system.name, args.workers, args.supervisors)
    print(f"\n{system.name}: {args.workers} workers", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"scale-{system.name}-") as scratch:
        where = Path(scratch)
        os.environ["APPORTION_HOME"] = str(where / "home")  # a secret of its own
        groups = ProcessGroups(where)
        client = None
        phase = "scheduler"
        try:
            file = where / "scheduler.json"
            scheduler = groups.start(system.scheduler(file), f"{system.name}-scheduler.log")
            wait_for_file(file, scheduler, 60)
            phase = "start-up"
            client, supervisors = start_up(system, groups, file, args, out)
            print(f"  {system.name} start-up: {out.startup:.1f} s", flush=True)
            process = psutil.Process(scheduler.pid)
            phase = "rounds"
            rounds(system, client, process, args, out)
            phase = "leaving"
            leave(system, client, supervisors, args, out)
            out.peak_rss = peak_rss(scheduler.pid)
        except PhaseFailed as exc:
            out.failure, out.failed_phase = str(exc), phase
            print(f"  {system.name} {phase}: {exc}", flush=True)
            with contextlib.suppress(Exception):
                out.peak_rss = peak_rss(scheduler.pid)
        finally:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
            out.left_behind = groups.kill_all()
            for log in sorted(where.glob("*.log")):
                (args.logs / log.name).write_bytes(log.read_bytes())
    return out


# --- the report ----------------------------------------------------------------------------


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def rows(out: Outcome) -> dict[str, str]:
    """The table's cells for one system; a failed phase's cell says why."""
    rates = out.rates
    cells = {
        "start-up (all workers registered)": seconds(out.startup),
        "start-up CPU (supervisors and workers)": seconds(out.startup_cpu),
        "tasks/s, best of rounds": f"{max(rates):,.0f}" if rates else "-",
        "tasks/s, range": f"{min(rates):,.0f}-{max(rates):,.0f}" if rates else "-",
        "scheduler CPU per task": (
            "-" if out.cpu_per_task is None else f"{out.cpu_per_task * 1e6:,.0f} us"
        ),
        "all workers left (scheduler's count)": seconds(out.leave),
        "supervisors exited": seconds(out.exited),
        "peak scheduler RSS": "-" if out.peak_rss is None else f"{out.peak_rss / 2**20:,.0f} MiB",
    }
    if out.failure:
        first = {"start-up": 0, "rounds": 2, "leaving": 5}.get(out.failed_phase, 0)
        label = list(cells)[first]
        if cells[label] == "-":
            cells[label] = "DNF"
    return cells


def ratio(label: str, apportion: Outcome, dask: Outcome) -> str:
    """How many times better apportion did: Dask's time over apportion's, apportion's
    rate or cost over Dask's (CPU and memory: Dask's over apportion's)."""
    pairs: dict[str, tuple[float | None, float | None]] = {
        "start-up (all workers registered)": (dask.startup, apportion.startup),
        "start-up CPU (supervisors and workers)": (dask.startup_cpu, apportion.startup_cpu),
        "tasks/s, best of rounds": (
            max(apportion.rates, default=None),
            max(dask.rates, default=None),
        ),
        "scheduler CPU per task": (dask.cpu_per_task, apportion.cpu_per_task),
        "all workers left (scheduler's count)": (dask.leave, apportion.leave),
        "supervisors exited": (dask.exited, apportion.exited),
        "peak scheduler RSS": (
            None if dask.peak_rss is None else float(dask.peak_rss),
            None if apportion.peak_rss is None else float(apportion.peak_rss),
        ),
    }
    top, bottom = pairs.get(label, (None, None))
    return "-" if top is None or bottom is None or not bottom else f"{top / bottom:.1f}x"


def report(outcomes: dict[str, Outcome], args: argparse.Namespace) -> None:
    cores = psutil.cpu_count(logical=True)
    memory = psutil.virtual_memory().total / 2**30
    print()
    print(
        f"{args.workers} worker processes x 1 thread ({args.supervisors} supervisor(s)), "
        f"{args.tasks:,} no-op tasks x {args.rounds} rounds, one scheduler; "
        f"{cores} cores, {memory:.0f} GiB; budget {args.dask_timeout:.0f} s per phase"
    )
    cells = {name: rows(out) for name, out in outcomes.items()}
    both = "apportion" in outcomes and "dask" in outcomes
    header = f"{'':<38}" + "".join(f"{name:>16}" for name in cells)
    header += f"{'apportion better':>18}" if both else ""
    print(header)
    print("-" * len(header))
    for label in next(iter(cells.values())):
        line = f"{label:<38}" + "".join(f"{c[label]:>16}" for c in cells.values())
        if both:
            line += f"{ratio(label, outcomes['apportion'], outcomes['dask']):>18}"
        print(line)
    for out in outcomes.values():
        if out.failure:
            print(f"{out.system}: {out.failed_phase}: {out.failure}")
        left = ", ".join(map(str, out.left_behind)) or "none"
        print(f"{out.system}: processes left behind after the run: {left}")
    print(f"(logs in {args.logs})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=N_WORKERS, help="worker processes")
    parser.add_argument("--tasks", type=int, default=N_TASKS, help="no-op tasks per round")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of --tasks")
    parser.add_argument(
        "--supervisors", type=int, default=1, help="worker supervisors sharing --workers"
    )
    parser.add_argument(
        "--dask-timeout",
        type=float,
        default=BUDGET,
        help="seconds each phase may take, for either system",
    )
    parser.add_argument(
        "--min-free", type=float, default=MIN_FREE_GIB, help="GiB of available memory to keep"
    )
    parser.add_argument("--systems", default="apportion,dask", help="comma-separated")
    parser.add_argument(
        "--worker-options",
        default="",
        help="more options for apportion worker, e.g. '--start-method spawn'",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--logs", type=Path, help="keep the processes' logs here (default: a new temp dir)"
    )
    args = parser.parse_args()
    args.logs = args.logs or Path(tempfile.mkdtemp(prefix="scale-logs-"))
    args.logs.mkdir(parents=True, exist_ok=True)
    # SIGTERM and SIGHUP unwind like Ctrl-C, so that every process group is killed (and
    # Ctrl-C itself even where a shell started this with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    systems: dict[str, System] = {
        "apportion": Apportion(shlex.split(args.worker_options)),
        "dask": Dask(),
    }
    outcomes = {}
    for name in args.systems.split(","):
        outcomes[name] = run(systems[name], args)
    report(outcomes, args)
    if args.json:
        figures = {"args": {k: str(v) for k, v in vars(args).items()}}
        figures |= {name: asdict(out) for name, out in outcomes.items()}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if any(out.left_behind for out in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
