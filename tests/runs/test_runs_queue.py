"""The job queue through the CLI, as a user runs it: Guild's spec, durability, cancel.

Every scenario of Guild's Dask-scheduler spec (seed 003) in our own format, plus
what its notes and users asked for: ddd beside aaa in both orders, runs that can
never start reported and left staged, a scheduler SIGKILLed with runs queued and
running, and a cancel that leaves no process of the run behind. Each run records
its start and end times in its log; concurrency is asserted from those.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from apportion.runs.journal import COMPLETED, FINISHED, QUEUED, Journal
from cli_processes import APPORTION, Processes, free_port, poll

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

OP = """\
import os, sys, time
cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
print("start", time.time(), os.environ["RUN_ID"], cuda or "-", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.5)
print("stop", time.time(), flush=True)
"""


class Queue:
    """The CLI against one journal in a test's own APPORTION_HOME."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "APPORTION_HOME": str(home), "APPORTION_LOG_LEVEL": "INFO"}
        self.op = home / "op.py"
        home.mkdir(parents=True, exist_ok=True)
        self.op.write_text(OP)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*APPORTION, *args],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stage(self, *resources: str, seconds: float = 0.5, name: str = "") -> int:
        args = [a for r in resources for a in ("--resources", r)]
        args += ["--name", name] if name else []
        result = self.cli("stage", *args, "--", sys.executable, str(self.op), str(seconds))
        assert result.returncode == 0, result.stderr
        found = re.search(r"staged run (\d+)", result.stdout)
        assert found, result.stdout
        return int(found.group(1))

    def run_once(self, *resources: str) -> subprocess.CompletedProcess[str]:
        args = ["--resources", " ".join(resources)] if resources else []
        return self.cli("scheduler", "--run-once", *args)

    def journal(self) -> Journal:
        return Journal(self.home / "runs.db")

    def interval(self, run_id: int) -> tuple[float, float, str]:
        """(start, stop, CUDA_VISIBLE_DEVICES) from the run's log."""
        log = (self.home / "runs-logs" / f"{run_id}.log").read_text()
        start = re.search(r"start (\S+) \S+ (\S+)", log)
        stop = re.search(r"stop (\S+)", log)
        assert start and stop, log
        return float(start.group(1)), float(stop.group(1)), start.group(2)

    def states(self) -> dict[int, str]:
        with self.journal() as journal:
            return {r.id: r.state for r in journal.runs()}


@pytest.fixture
def queue(tmp_path: Path) -> Queue:
    return Queue(tmp_path / "home")


def overlap(a: tuple[float, float, str], b: tuple[float, float, str]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_two_runs_that_do_not_fit_together_run_one_after_the_other(queue: Queue) -> None:
    first, second = queue.stage("foo=5"), queue.stage("foo=5")
    result = queue.run_once("foo=7")
    assert result.returncode == 0, result.stderr
    assert not overlap(queue.interval(first), queue.interval(second))
    assert queue.states() == {first: COMPLETED, second: COMPLETED}
    log = result.stderr
    assert "cluster resources: foo=7" in log
    for run_id in (first, second):
        assert f"scheduling run {run_id} (requires foo=5)" in log
        assert re.search(rf"run {run_id} started on run-once \(pid \d+, holding foo=5\)", log)
        assert f"run {run_id} completed" in log
    assert result.stdout.count("start ") == 2  # run output is echoed, as Guild does


def test_two_runs_that_fit_together_run_side_by_side(queue: Queue) -> None:
    first, second = queue.stage("foo=5"), queue.stage("foo=5")
    assert queue.run_once("foo=12").returncode == 0
    assert overlap(queue.interval(first), queue.interval(second))


def test_a_run_needing_an_undefined_resource_is_reported_once_and_stays_staged(
    queue: Queue,
) -> None:
    needs_foo = queue.stage("foo=5")
    plain = queue.stage()
    result = queue.run_once()
    # Left staged is not done: the exit says so, and names the run and why.
    assert result.returncode == 1, result.stderr
    message = (
        f"ignoring staged run {needs_foo} (requires resources not defined for the cluster: foo)"
    )
    assert result.stderr.count(message) == 1, result.stderr
    assert (
        f"left staged: run {needs_foo}: the --run-once cluster (no resources) cannot run it: "
        "requires resources not defined for the cluster: foo"
    ) in result.stderr
    assert (
        f"1 staged run could not start on this cluster and stays staged; "
        f"cancel with apportion cancel {needs_foo}"
    ) in result.stderr
    assert queue.states() == {needs_foo: "staged", plain: COMPLETED}
    why = queue.cli("why", str(needs_foo))
    assert "staged" in why.stdout


def test_run_once_names_a_misspelt_resource_and_exits_1(queue: Queue) -> None:
    typo = queue.stage("gpu=1")
    result = queue.run_once("GPU=1")
    assert result.returncode == 1, result.stderr
    assert (
        f"left staged: run {typo}: the --run-once cluster (GPU=1) cannot run it: requires "
        "resources not defined for the cluster: gpu (did you mean GPU (not gpu)?)"
    ) in result.stderr
    assert queue.states() == {typo: "staged"}


def test_several_resource_options_all_count(queue: Queue) -> None:
    run_id = queue.stage("foo=1", "bar=1 baz=1")
    result = queue.run_once("foo=1 bar=1 baz=2")
    assert result.returncode == 0, result.stderr
    assert f"scheduling run {run_id} (requires bar=1 baz=1 foo=1)" in result.stderr
    assert queue.states() == {run_id: COMPLETED}

    again = queue.stage("foo=1", "bar=1 baz=1")
    result = queue.run_once("foo=1")
    assert result.returncode == 1, result.stderr
    assert "requires resources not defined for the cluster: bar, baz" in result.stderr
    assert queue.states()[again] == "staged"


def test_misspecified_resources_are_refused_at_once(queue: Queue) -> None:
    bad = queue.cli("stage", "--resources", "bar", "--", "true")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "Error: --resources: invalid resource spec 'bar': parts must be NAME=AMOUNT"
    ]
    assert not (queue.home / "runs.db").exists() or not queue.states()
    scheduler = queue.cli("scheduler", "--run-once", "--resources", "foo")
    assert scheduler.returncode == 2 and "parts must be NAME=AMOUNT" in scheduler.stderr


GUILD_GPU = {"aaa": "gpu0=1", "bbb": "gpu0=1", "ccc": "gpu0=1 gpu1=1", "ddd": "gpu1=1"}


@pytest.mark.parametrize("order", [["aaa", "bbb", "ccc", "ddd"], ["aaa", "ddd", "bbb", "ccc"]])
def test_guild_gpu_example_starts_aaa_and_ddd_together_in_either_order(
    queue: Queue, order: list[str]
) -> None:
    ids = {name: queue.stage(GUILD_GPU[name], name=name) for name in order}
    result = queue.run_once("gpu0=1 gpu1=1")
    assert result.returncode == 0, result.stderr
    aaa, bbb, ccc, ddd = (queue.interval(ids[k]) for k in ("aaa", "bbb", "ccc", "ddd"))
    assert overlap(aaa, ddd), "ddd must run beside aaa"
    assert not overlap(aaa, bbb) and not overlap(ccc, aaa) and not overlap(ccc, bbb)
    assert not overlap(ccc, ddd)


def test_gpu_runs_see_the_devices_they_hold(queue: Queue) -> None:
    singles = [queue.stage("gpu=1", name=f"one-{i}") for i in range(3)]
    both = queue.stage("gpu=2", name="both")
    result = queue.run_once("gpu=[0,1]")
    assert result.returncode == 0, result.stderr
    seen = {run_id: queue.interval(run_id) for run_id in (*singles, both)}
    assert seen[both][2] == "0,1"
    for a in singles:
        assert seen[a][2] in ("0", "1")
        for b in singles:
            if a != b and overlap(seen[a], seen[b]):
                assert seen[a][2] != seen[b][2], "two runs on one GPU at once"


# --- a long-lived scheduler: submit, durability, cancel, time limits ------------------


def start_scheduler(procs: Processes, port: int) -> str:
    return procs.start_scheduler("--port", str(port), "--adopt-grace", "20")[1]


@pytest.fixture
def cluster(
    procs: Processes, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> tuple[Processes, Queue, str]:
    monkeypatch.setenv("APPORTION_HOME", str(queue.home))  # for the processes procs starts
    port = free_port()
    address = start_scheduler(procs, port)
    procs.start("worker", address, "--nthreads", "2", "--name", "w", "--resources", "slot=2")
    return procs, queue, address


def test_submit_an_array_and_wait_for_it(cluster: tuple[Processes, Queue, str]) -> None:
    _, queue, address = cluster
    result = queue.cli(
        "submit", address, "--name", "sweep", "--array", "1-6", "--wait", "--",
        sys.executable, "-c", "import sys; print('seed', sys.argv[1])", "{}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "submitted 6 runs 1-6 (sweep)" in result.stdout
    assert "6 runs: 6 completed" in result.stdout
    logs = sorted((queue.home / "runs-logs").glob("*.log"))
    assert sorted(p.read_text() for p in logs) == [f"seed {i}\n" for i in range(1, 7)]
    table = queue.cli("runs").stdout
    assert "sweep[3]" in table and "completed" in table


def test_a_killed_scheduler_loses_no_run_and_runs_none_twice(
    cluster: tuple[Processes, Queue, str],
) -> None:
    procs, queue, address = cluster
    marks = queue.home / "executions.txt"
    script = f"echo $RUN_ID >> {marks}; sleep 0.4"
    result = queue.cli("submit", address, "--resources", "slot=1", "--array", "1-22", "--",
                       "sh", "-c", script + " # {}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    poll(lambda: list(queue.states().values()).count("running") == 2, 20, "two running")
    scheduler = procs.procs[0][0]
    os.killpg(scheduler.pid, signal.SIGKILL)
    scheduler.wait(10)
    start_scheduler(procs, int(address.rsplit(":", 1)[1]))

    def all_finished() -> bool:
        return all(state in FINISHED for state in queue.states().values())

    poll(all_finished, 60, "every run to finish after the restart")
    with queue.journal() as journal:
        records = journal.runs()
        histories = {r.id: journal.history(r.id) for r in records}
    assert len(records) == 22 and all(r.state == COMPLETED for r in records)
    executions = marks.read_text().split()
    for record in records:
        ran = executions.count(str(record.id))
        interrupted = any("interrupted" in text for _, text in histories[record.id])
        assert ran == 1 or (interrupted and ran == 2), (record.id, ran, histories[record.id])
    adopted = [i for i, h in histories.items() if any("adopted" in t for _, t in h)]
    assert len(adopted) == 2, histories  # the two running ones kept running


def test_cancel_leaves_no_process_of_the_run_behind(
    cluster: tuple[Processes, Queue, str],
) -> None:
    _, queue, address = cluster
    pids = queue.home / "pids"
    script = (
        f"sleep 300 & echo $! >> {pids}; sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"
    )
    result = queue.cli("submit", address, "--resources", "slot=2", "--", "sh", "-c", script)
    run_id = int(re.findall(r"submitted run (\d+)", result.stdout)[0])
    poll(lambda: pids.exists() and len(pids.read_text().split()) == 3, 20, "the run's processes")
    family = [int(p) for p in pids.read_text().split()]
    assert all(psutil.pid_exists(p) for p in family)
    cancelled = queue.cli("cancel", str(run_id))
    assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout
    poll(lambda: queue.states()[run_id] == "cancelled", 30, "the run to be cancelled")
    gone = [p for p in family if not psutil.pid_exists(p) or _zombie(p)]
    assert gone == family, "processes of the cancelled run are still running"
    # Its slots are free again: a run needing both starts.
    after = queue.cli("submit", address, "--resources", "slot=2", "--wait", "--", "true")
    assert after.returncode == 0, after.stderr + after.stdout


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_time_limit_stops_the_run_and_fails_it(cluster: tuple[Processes, Queue, str]) -> None:
    _, queue, address = cluster
    result = queue.cli("submit", address, "--time-limit", "1s", "--wait", "--", "sleep", "60")
    assert result.returncode == 1
    assert "run 1: failed: timed out: killed after its time limit of 1s" in result.stdout
    assert "timed out" in queue.cli("runs").stdout


def test_higher_priority_runs_start_first_and_failed_runs_retry(queue: Queue) -> None:
    low = queue.stage("slot=1", name="low")
    high_args = ["--resources", "slot=1", "--priority", "5", "--name", "high", "--"]
    high = queue.cli("stage", *high_args, sys.executable, str(queue.op), "0.5")
    high_id = int(re.findall(r"staged run (\d+)", high.stdout)[0])
    marker = queue.home / "tried"
    flaky = (
        f"import os, sys; p = {str(marker)!r}\n"
        "if not os.path.exists(p): open(p, 'w').close(); print('first try'); sys.exit(3)\n"
        "print('second time lucky')"
    )
    retried = queue.cli("stage", "--retries", "1", "--", sys.executable, "-c", flaky)
    retried_id = int(re.findall(r"staged run (\d+)", retried.stdout)[0])
    result = queue.run_once("slot=1")
    assert result.returncode == 0, result.stderr
    assert queue.interval(high_id)[1] <= queue.interval(low)[0], "priority 5 goes first"
    with queue.journal() as journal:
        record = journal.get(retried_id)
        assert record is not None and record.state == COMPLETED and record.attempts == 2
    log = (queue.home / "runs-logs" / f"{retried_id}.log").read_text()
    assert log == "first try\n\n[apportion: attempt 2]\nsecond time lucky\n", log


def test_a_run_that_fails_for_good_makes_run_once_exit_1(queue: Queue) -> None:
    failing = queue.cli("stage", "--", sys.executable, "-c", "import sys; sys.exit(4)")
    run_id = int(re.findall(r"staged run (\d+)", failing.stdout)[0])
    result = queue.run_once()
    assert result.returncode == 1
    assert f"run {run_id} failed: exit code 4" in result.stderr
    assert "exit 4" in queue.cli("runs").stdout


def test_a_run_whose_worker_is_killed_runs_again_elsewhere(
    cluster: tuple[Processes, Queue, str],
) -> None:
    procs, queue, address = cluster
    victim, _ = procs.start("worker", address, "--nthreads", "1", "--name", "victim",
                            "--resources", "only=1")  # fmt: skip
    marks = queue.home / "attempts"
    script = f"echo $RUN_ID >> {marks}; sleep 1"
    result = queue.cli("submit", address, "--resources", "only=1", "--", "sh", "-c", script)
    run_id = int(re.findall(r"submitted run (\d+)", result.stdout)[0])
    poll(lambda: queue.states().get(run_id) == "running", 20, "the run to start")
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    procs.start("worker", address, "--nthreads", "1", "--name", "rescue", "--resources", "only=1")
    poll(lambda: queue.states()[run_id] == COMPLETED, 30, "the run to complete on the rescue")
    with queue.journal() as journal:
        record = journal.get(run_id)
        history = [text for _, text in journal.history(run_id)]
    assert record is not None and record.worker == "rescue" and record.attempts == 2
    assert any("its worker victim left" in text for text in history), history


def test_hundreds_of_instant_runs_all_complete(queue: Queue) -> None:
    """A run's start and end reach the scheduler before its task's result, however
    many finish in the same instant (they once raced, leaving a run queued forever)."""
    staged = queue.cli("stage", "--array", "1-300", "--", "true")
    assert staged.returncode == 0, staged.stderr
    result = queue.run_once()
    assert result.returncode == 0, result.stderr
    assert set(queue.states().values()) == {COMPLETED}
    assert "Traceback" not in result.stderr


def test_a_worker_cut_off_and_back_keeps_its_run_which_runs_once(
    procs: Processes, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPORTION_HOME", str(queue.home))
    _, address, _ = procs.start_scheduler("--port", "0", "--worker-timeout", "1.5")
    worker, _ = procs.start(
        "worker", address, "--nthreads", "1", "--name", "w", "--heartbeat-interval", "0.2"
    )
    marks = queue.home / "starts"
    script = f"echo x >> {marks}; echo begun; sleep 4; echo done"
    result = queue.cli("submit", address, "--", "sh", "-c", script)
    run_id = int(re.findall(r"submitted run (\d+)", result.stdout)[0])
    poll(lambda: queue.states().get(run_id) == "running", 20, "the run to start")
    # Output still in the worker when it freezes goes with its old session (the log
    # then marks the gap): freeze it once "begun" is in, to test the adoption alone.
    log_path = queue.home / "runs-logs" / f"{run_id}.log"
    poll(lambda: log_path.exists() and log_path.read_text() == "begun\n", 20, "the output")
    os.kill(worker.pid, signal.SIGSTOP)  # silent: declared lost, its run requeued
    try:
        poll(lambda: queue.states()[run_id] == QUEUED, 20, "the run to be requeued")
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    poll(lambda: queue.states()[run_id] == COMPLETED, 30, "the run to complete")
    assert marks.read_text() == "x\n"  # its command ran once: adopted, not restarted
    log = log_path.read_text()
    assert log == "begun\ndone\n", log
    with queue.journal() as journal:
        history = [text for _, text in journal.history(run_id)]
    assert any("adopted: still running on w" in text for text in history), history


class Copies:
    """The copies of one run's command alive on this machine, told apart by a marker.

    The command ``sh -c 'sleep M & sleep M; wait'`` with a unique ``M`` of seconds:
    each copy is two sleeps whose command line holds ``M``, in the run's group with
    a grandchild among them. ``kill_all`` (the fixture calls it, even on failure)
    ends any that are left.
    """

    def __init__(self) -> None:
        self.marker = f"3000.{os.getpid()}{time.monotonic_ns() % 10**6}"
        self.command = ["sh", "-c", f"sleep {self.marker} & sleep {self.marker}; wait"]

    def sleeps(self) -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline", "status"]):
            cmdline = process.info["cmdline"] or []
            alive = process.info["status"] != psutil.STATUS_ZOMBIE
            if alive and cmdline[:1] == ["sleep"] and self.marker in cmdline:
                found.append(process)
        return found

    def count(self) -> float:
        """How many copies run now (two sleeps each)."""
        return len(self.sleeps()) / 2

    def kill_all(self) -> None:
        for process in self.sleeps():
            with contextlib.suppress(psutil.Error):
                process.kill()


@pytest.fixture
def copies() -> Iterator[Copies]:
    found = Copies()
    try:
        yield found
    finally:
        found.kill_all()


def _started_on(queue: Queue, run_id: int) -> str:
    # The journal's writer commits in batches: the start may land a moment later.
    with queue.journal() as journal:
        record = journal.get(run_id)
    return record.worker if record is not None and record.state == "running" else ""


def worker_running(command: psutil.Process) -> psutil.Process:
    """The worker process a run's ``command`` descends from: the first ancestor that is
    apportion's (the guards between are not). A worker forked by its supervisor's fork
    server shows the server's command line, not its own, so its name cannot tell."""
    for parent in command.parents():
        if any(m in " ".join(parent.cmdline()) for m in ("apportion.cli.main", "fork_server")):
            return parent
    raise AssertionError(f"{command} descends from no worker")


def _killed_worker_runs_once_elsewhere(
    procs: Processes, queue: Queue, address: str, copies: Copies, victim: str, rescue: str
) -> None:
    """Run ``copies.command`` on ``victim`` (a worker's name), SIGKILL that worker
    process once a ``rescue`` worker is ready beside it, and watch the run start again
    there: never two copies at once, none of the first copy's processes left."""
    result = queue.cli("submit", address, "--resources", "only=1", "--", *copies.command)
    run_id = int(re.findall(r"submitted run (\d+)", result.stdout)[0])
    assert poll(lambda: _started_on(queue, run_id), 30, "the run to start") == victim
    first = poll(lambda: len(copies.sleeps()) == 2 and copies.sleeps(), 20, "the run's sleeps")
    procs.start("worker", address, "--nthreads", "1", "--name", rescue, "--resources", "only=1")
    poll(lambda: rescue in queue.cli("status", address).stdout, 30, "the rescue worker")
    worker = worker_running(first[0])
    worker.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:  # no sleep between samples: a second copy must not slip through
        now = copies.sleeps()
        assert len(now) <= 2, [p.cmdline() for p in now]
        if len(now) == 2 and not {p.pid for p in now} & {p.pid for p in first}:
            break
        assert time.monotonic() < deadline, "the run did not start again"
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in first)
    assert poll(lambda: _started_on(queue, run_id), 30, "the second start") == rescue
    assert copies.count() == 1


def test_a_worker_killed_with_sigkill_leaves_no_run_behind_and_it_runs_once_elsewhere(
    cluster: tuple[Processes, Queue, str], copies: Copies
) -> None:
    """With no supervisor, nobody but the run's guard can stop it: it does."""
    procs, queue, address = cluster
    procs.start("worker", address, "--nthreads", "1", "--name", "victim",
                "--resources", "only=1")  # fmt: skip
    _killed_worker_runs_once_elsewhere(procs, queue, address, copies, "victim", "rescue")


def test_a_supervised_worker_killed_with_sigkill_leaves_no_run_behind(
    cluster: tuple[Processes, Queue, str], copies: Copies
) -> None:
    """Its supervisor starts a fresh worker at once: the run's old copy is gone first."""
    procs, queue, address = cluster
    procs.start("worker", address, "--nworkers", "1", "--supervisor", "--name", "sup",
                "--resources", "only=1")  # fmt: skip
    _killed_worker_runs_once_elsewhere(procs, queue, address, copies, "sup-0", "rescue")


def test_runs_and_cancel_from_another_machine_go_through_the_scheduler(
    cluster: tuple[Processes, Queue, str], tmp_path: Path
) -> None:
    _, queue, address = cluster
    elsewhere = Queue(tmp_path / "elsewhere")  # no journal of its own, nor secret
    refused = elsewhere.cli("runs", "--scheduler", address)
    assert refused.returncode != 0 and "secret" in refused.stderr
    elsewhere.env["APPORTION_TOKEN"] = (queue.home / "secret").read_text().strip()
    done = queue.cli("submit", address, "--name", "quick", "--wait", "--", "true")
    assert done.returncode == 0, done.stderr
    slow = queue.cli("submit", address, "--name", "slow", "--", "sleep", "60")
    slow_id = int(re.findall(r"submitted run (\d+)", slow.stdout)[0])
    poll(lambda: queue.states()[slow_id] == "running", 20, "the slow run to start")
    table = elsewhere.cli("runs", "--scheduler", address)
    assert table.returncode == 0, table.stderr
    assert re.search(r"quick\s+completed", table.stdout) and re.search(
        r"slow\s+running", table.stdout
    )
    cancelled = elsewhere.cli("cancel", "--scheduler", address, str(slow_id))
    assert cancelled.returncode == 0 and "cancel requested (running)" in cancelled.stdout
    poll(lambda: queue.states()[slow_id] == "cancelled", 30, "the run to be cancelled")
    unknown = elsewhere.cli("cancel", "--scheduler", address, "999")
    assert unknown.returncode == 2 and "no run 999" in unknown.stderr


def test_submit_says_at_once_what_no_connected_worker_can_run(
    cluster: tuple[Processes, Queue, str],
) -> None:
    _, queue, address = cluster
    first = queue.cli("submit", address, "--wait", "--", "true")  # the worker is connected
    assert first.returncode == 0, first.stderr
    typo = queue.cli("submit", address, "--resources", "Slot=1", "--", "true")
    assert typo.returncode == 1 and typo.stdout == ""
    (line,) = typo.stderr.splitlines()
    assert line.startswith(
        "Error: the run asks for Slot=1, but no connected worker offers Slot: "
        "did you mean slot (not Slot)? (the workers offer "
    ), line
    assert "slot=2 on w" in line and line.endswith("); nothing was queued")
    big = queue.cli("submit", address, "--resources", "slot=3", "--", "true")
    assert big.returncode == 0, big.stderr
    big_id = int(re.findall(r"submitted run (\d+)", big.stdout)[0])
    (warning,) = big.stderr.splitlines()
    assert warning.startswith(
        f"warning: run {big_id} asks for slot=3, but no connected worker can ever provide it: "
        "largest slot supply is 2 on w (the workers offer "
    ), warning
    assert warning.endswith("; queued until a worker that can run it joins")
    waited = queue.cli("submit", address, "--resources", "slot=3", "--wait", "--", "true")
    assert waited.returncode == 1
    waited_id = int(re.findall(r"submitted run (\d+)", waited.stdout)[0])
    assert waited.stderr.splitlines()[-1] == (
        f"Error: not waiting: run {waited_id} can never start on the connected workers and "
        f"stays queued; cancel with apportion cancel {waited_id} --scheduler {address}"
    )
    states = queue.states()
    assert (states[big_id], states[waited_id]) == (QUEUED, QUEUED)
    assert len(states) == 3  # the misspelt one was never queued
