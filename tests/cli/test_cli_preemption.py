"""Preemption with real processes: a scheduler with ``--preempt-after 1s``, one CLI
worker with one GPU, two people. Alice's ``--preemptible`` run holds the GPU; Bob's
run gets it within seconds, Alice's run is stopped (SIGTERM), queued again and runs
as attempt 2 once Bob's is done, with the first attempt's output kept in its log;
also when the scheduler is killed while the run is being stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_processes import APPORTION, Processes, free_port, poll

pytestmark = [pytest.mark.process, pytest.mark.tcp, pytest.mark.timeout(120)]

#: Variables that would choose another scheduler or secret than the test's own.
CHOOSERS = ["APPORTION_SCHEDULER", "APPORTION_SCHEDULER_FILE", "APPORTION_TOKEN"]

#: Alice's run: a job that checkpoints. Its first attempt marks its checkpoint and
#: runs long; the attempt after a preemption finds the checkpoint and finishes.
ALICE = (
    "if [ -e checkpoint ]; then echo resumed from the checkpoint; exit 0; fi; "
    "touch checkpoint; echo first attempt; exec sleep 60"
)


@pytest.fixture
def owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The owner's environment: an APPORTION_HOME of this test's own."""
    monkeypatch.setenv("APPORTION_HOME", str(tmp_path / "owner"))
    for name in [*CHOOSERS, "APPORTION_TOKEN_FILE"]:
        monkeypatch.delenv(name, raising=False)
    yield dict(os.environ)


def _run(env: dict[str, str], *args: str) -> str:
    """``apportion ARGS`` as a process with ``env``; its output, once it succeeded."""
    done = subprocess.run(
        [*APPORTION, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _states(owner: dict[str, str], address: str) -> dict[int, str]:
    """Run id -> state, as the owner sees them."""
    rows = [line.split() for line in _run(owner, "runs", "--scheduler", address).splitlines()[1:]]
    return {int(row[0]): row[1] for row in rows if row}


def _people(owner: dict[str, str], tmp_path: Path) -> dict[str, tuple[dict[str, str], str]]:
    """Alice and Bob admitted: each one's environment and credential file."""
    people = {}
    for name in ("alice", "bob"):
        _run(owner, "user", "add", name, "-o", str(tmp_path / f"{name}.json"))
        home = tmp_path / f"{name}-home"
        home.mkdir(mode=0o700)
        people[name] = ({**owner, "APPORTION_HOME": str(home)}, str(tmp_path / f"{name}.json"))
    return people


def test_a_preemptible_run_makes_way_for_another_person_and_runs_again(
    procs: Processes, owner: dict[str, str], tmp_path: Path
) -> None:
    _, address, log = procs.start_scheduler(
        "--port", "0", "--no-dashboard", "--preempt-after", "1s", env=owner
    )
    procs.start(
        "worker", address, "--nthreads", "2", "--resources", "GPU=1", "--name", "w1", env=owner
    )
    people = _people(owner, tmp_path)
    work = tmp_path / "alice-work"
    work.mkdir()

    alice, alice_file = people["alice"]
    submit = ["submit", "--scheduler-file", alice_file, "--resources", "GPU=1"]
    _run(alice, *submit, "--preemptible", "--cwd", str(work), "--", "sh", "-c", ALICE)
    poll(lambda: _states(owner, address).get(1) == "running", 30, "alice's run to start")
    poll(lambda: (work / "checkpoint").exists(), 10, "alice's first attempt to begin")

    bob, bob_file = people["bob"]
    asked = time.monotonic()
    bob_run = ["submit", "--scheduler-file", bob_file, "--resources", "GPU=1"]
    _run(bob, *bob_run, "--", "sh", "-c", "echo bob; sleep 2")
    poll(lambda: _states(owner, address).get(2) in ("running", "completed"), 20, "bob's run")
    # 1s of waiting, a tick, SIGTERM: seconds, not the 60 alice's first attempt would take.
    assert time.monotonic() - asked < 10
    assert _states(owner, address).get(1) in ("queued", "running")

    states = poll(
        lambda: (s := _states(owner, address)).get(1) == "completed" and s, 30, "alice's run"
    )
    assert states == {1: "completed", 2: "completed"}
    shown = _run(owner, "runs", "show", "1")
    assert "  attempts:    2" in shown
    assert "  preempted:   1 (not failures: no retry used)" in shown
    assert "stopping it on w1: preempted for share 'bob'" in shown
    assert "(preempted; stopped with SIGTERM); queued again" in shown
    assert "(attempt 2)" in shown
    # The first attempt's output is kept, the second's follows it.
    output = _run(owner, "logs", "1")
    assert output.index("first attempt") < output.index("resumed from the checkpoint")
    assert "preempted for share 'bob'" in log.read_text()


#: Alice's run for the restart: on SIGTERM its first attempt takes SAVE seconds to
#: save its work, while the scheduler is killed and started again.
ALICE_SLOW_TO_STOP = (
    "if [ -e checkpoint ]; then echo resumed from the checkpoint; exit 0; fi; "
    "trap 'touch stopping; sleep SAVE; echo saved; exit 143' TERM; "
    "touch checkpoint; echo first attempt; sleep 60 & wait"
)


@pytest.mark.parametrize(
    "save",
    [
        "3",  # still being stopped when its worker is back: adopted, then it ends
        "0.5",  # ended while no scheduler ran: adopted as ended, its end said again
    ],
)
def test_a_run_being_preempted_when_the_scheduler_restarts_is_requeued_not_failed(
    procs: Processes, owner: dict[str, str], tmp_path: Path, save: str
) -> None:
    port = free_port()
    options = ["--port", str(port), "--no-dashboard", "--preempt-after", "1s"]
    scheduler, address, _ = procs.start_scheduler(*options, "--adopt-grace", "30", env=owner)
    procs.start(
        "worker", address, "--nthreads", "2", "--resources", "GPU=1", "--name", "w1", env=owner
    )
    people = _people(owner, tmp_path)
    work = tmp_path / "alice-work"
    work.mkdir()
    alice, alice_file = people["alice"]
    submit = ["submit", "--scheduler-file", alice_file, "--resources", "GPU=1"]
    command = ALICE_SLOW_TO_STOP.replace("SAVE", save)
    _run(alice, *submit, "--preemptible", "--cwd", str(work), "--", "sh", "-c", command)
    poll(lambda: (work / "checkpoint").exists(), 30, "alice's first attempt to begin")
    bob, bob_file = people["bob"]
    _run(bob, "submit", "--scheduler-file", bob_file, "--resources", "GPU=1", "--", "true")

    # The stop has begun (SIGTERM reached the run): the scheduler dies now, and the
    # one started in its place never hears of the stop from anyone but the worker.
    poll(lambda: (work / "stopping").exists(), 20, "alice's run to be stopped")
    os.killpg(scheduler.pid, signal.SIGKILL)
    scheduler.wait(10)
    procs.start_scheduler(*options, "--adopt-grace", "30", env=owner)

    states = poll(
        lambda: (s := _states(owner, address)).get(1) == "completed" and s, 60, "alice's run"
    )
    assert states == {1: "completed", 2: "completed"}
    shown = _run(owner, "runs", "show", "1")
    assert "  attempts:    2" in shown
    assert "  preempted:   1 (not failures: no retry used)" in shown
    assert "preempted (the stop was asked before the scheduler restarted)" in shown, shown
    assert "failed" not in shown
    output = _run(owner, "logs", "1")
    assert output.index("saved") < output.index("resumed from the checkpoint")
