"""The task ``qrsh -inherit`` runs on each host of an ``apportion sge`` job: the worker
supervisor, drained when its standard input (qrsh's, from ``apportion sge``) ends.

Real processes, no Grid Engine: a stand-in for the supervisor reports what it got.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]

#: The supervisor's stand-in: says it started (its argv, whether SIGUSR2 is ignored),
#: and on SIGTERM says so and exits 3, as a drained supervisor exits by itself.
SUPERVISOR = """\
import json, signal, sys, time
def drained(signum, frame):
    print("drained", flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, drained)
ignored = signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
print(json.dumps({"argv": sys.argv[1:], "usr2_ignored": ignored}), flush=True)
while True:
    time.sleep(0.05)
"""


def start(*options: str) -> subprocess.Popen[str]:
    supervisor = [sys.executable, "-c", SUPERVISOR, "worker"]
    return subprocess.Popen(
        [sys.executable, "-m", "apportion.deploy.sge_task", *options, "--", *supervisor],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def stop(task: subprocess.Popen[str]) -> None:
    """Kill what is left, and close the pipes (however the test went)."""
    if task.poll() is None:
        task.kill()
    with task:
        pass


def test_the_end_of_its_input_drains_the_supervisor_and_its_status_is_the_tasks() -> None:
    task = start()
    try:
        assert task.stdout is not None and task.stdin is not None
        started = json.loads(task.stdout.readline())
        # -notify's SIGUSR2 reaches every task of the job: the supervisor ignores it.
        assert started == {"argv": ["worker"], "usr2_ignored": True}
        task.stdin.close()  # what apportion sge does to drain it, through qrsh
        assert task.stdout.readline() == "drained\n"
        assert task.wait(10) == 3
    finally:
        stop(task)


def test_on_several_hosts_the_worker_serves_on_its_hosts_address() -> None:
    task = start("--own-address")
    try:
        assert task.stdout is not None and task.stdin is not None
        argv = json.loads(task.stdout.readline())["argv"]
        assert argv[:2] == ["worker", "--host"] and len(argv) == 3
        task.send_signal(15)  # a SIGTERM sent here is passed on the same way
        assert task.stdout.readline() == "drained\n"
        assert task.wait(10) == 3
    finally:
        stop(task)
