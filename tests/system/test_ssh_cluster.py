"""``apportion ssh`` and ``SSHCluster`` against a real sshd on loopback: a cluster comes
up over ssh, runs tasks (one needing a resource given by ``--resources``), takes its
credentials from the scheduler file alone, and leaves no process behind when stopped
by Ctrl-C or when ``apportion ssh`` is killed outright."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest

from apportion import Client, SSHCluster
from cli_processes import APPORTION, poll
from sshd_server import SSHServer, kill_marked, marked_processes, remote_python, skip_reason

pytestmark = [
    pytest.mark.process,
    pytest.mark.tcp,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]

# The remote workers cannot import this module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def plus(x: int) -> int:
    return x + 1


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SSHServer]:
    server = SSHServer(tmp_path / "sshd")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def mark() -> Iterator[str]:
    """Marks the remote processes of one test; kills any it leaves, even on failure."""
    mark = uuid.uuid4().hex
    try:
        yield mark
    finally:
        kill_marked(mark)


def start_ssh_command(
    tmp_path: Path, sshd: SSHServer, mark: str, *extra: str
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    python = remote_python(tmp_path, mark)
    scheduler_file = tmp_path / "cluster.json"
    log = tmp_path / "apportion-ssh.log"
    options = [arg for option in sshd.ssh_options() for arg in ("--ssh-option", option)]
    argv = [*APPORTION, "ssh", sshd.address, sshd.address, "--remote-python", str(python)]
    argv += ["--scheduler-port", "0", "--scheduler-file", str(scheduler_file), *options, *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc, scheduler_file, log


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(120)
def test_apportion_ssh_runs_tasks_and_ctrl_c_leaves_no_process(
    tmp_path: Path, sshd: SSHServer, mark: str
) -> None:
    proc, scheduler_file, log = start_ssh_command(
        tmp_path, sshd, mark, "--nworkers", "2", "--nthreads", "1", "--resources", "licence=2"
    )
    try:
        poll(lambda: "connect with Client" in log.read_text(), 60, "apportion ssh to start")
        assert scheduler_file.stat().st_mode & 0o777 == 0o600
        address = re.search(r"scheduler at (tls://\S+)", log.read_text())
        assert address, log.read_text()
        # The scheduler file alone: address, secret and TLS credentials.
        with Client(scheduler_file=scheduler_file, timeout=30) as client:
            assert client.scheduler_address == address.group(1)
            client.wait_for_workers(2, timeout=60)
            assert client.submit(plus, 1, resources={"licence": 2}).result(30) == 2
            assert sum(client.gather(client.map(plus, range(10)))) == 55
        assert marked_processes(mark)
        # No credential on any remote command line (``ps`` shows them to everyone).
        secret = json.loads(scheduler_file.read_text())["token"]
        for pid in marked_processes(mark):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            assert secret not in cmdline and "PRIVATE KEY" not in cmdline
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
        assert "drained" in log.read_text()
        poll(lambda: not marked_processes(mark), 20, "the remote processes to end")
    finally:
        stop(proc)


@pytest.mark.timeout(120)
def test_a_killed_apportion_ssh_leaves_nothing_on_the_remote_host(
    tmp_path: Path, sshd: SSHServer, mark: str
) -> None:
    proc, _, log = start_ssh_command(tmp_path, sshd, mark)
    try:
        poll(lambda: "worker ssh-0" in log.read_text(), 60, "a worker to start")
        assert marked_processes(mark)
        os.kill(proc.pid, signal.SIGKILL)  # the command alone: its ssh children live on
        proc.wait()
        poll(lambda: not marked_processes(mark), 40, "the remote processes to end")
    finally:
        stop(proc)


@pytest.mark.timeout(120)
def test_ssh_cluster_in_python(tmp_path: Path, sshd: SSHServer, mark: str) -> None:
    python = remote_python(tmp_path, mark)
    with SSHCluster(
        [sshd.address, sshd.address, sshd.address],
        connect_options={"options": sshd.ssh_options()},
        worker_options={"nthreads": 1, "resources": {"gpu": [0, 1]}},
        scheduler_options={"port": 0},
        remote_python=str(python),
    ) as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            futures = client.map(plus, range(4), resources={"gpu": 2})
            assert client.gather(futures) == [1, 2, 3, 4]
    poll(lambda: not marked_processes(mark), 20, "the remote processes to end")
    with pytest.raises(ValueError, match="not understood here: password"):
        SSHCluster(["a", "b"], connect_options={"password": "x"})
