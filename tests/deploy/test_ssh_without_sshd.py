"""``SSHCluster`` and ``apportion ssh`` with a stand-in for the ``ssh`` binary that runs
the remote command here (no sshd, no root): how failures read, and the scheduler file
a client needs nothing else than."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import cloudpickle
import pytest
from click.testing import CliRunner

from apportion import Client, SSHCluster
from apportion.cli.main import main
from apportion.client.connect import from_scheduler_file
from apportion.net.scheduler_claim import SchedulerFileClaim
from apportion.net.scheduler_file import read_scheduler_file, write_scheduler_file
from apportion.net.security import Security
from cli_processes import Processes, poll

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def fake_ssh(directory: Path) -> str:
    """A script taking ssh's arguments that runs the remote command with sh, here."""
    script = directory / "fake-ssh"
    script.write_text(
        '#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nshift 2\nexec sh -c "$1"\n'
    )
    script.chmod(0o755)
    return str(script)


def python_here(directory: Path) -> str:
    import apportion

    script = directory / "python"
    source = Path(apportion.__file__).resolve().parents[1]
    script.write_text(f'#!/bin/sh\nPYTHONPATH={source} exec {sys.executable} "$@"\n')
    script.chmod(0o755)
    return str(script)


def double(x: int) -> int:
    return 2 * x


@pytest.mark.process
@pytest.mark.tcp
def test_a_cluster_through_a_stand_in_ssh(tmp_path: Path) -> None:
    with SSHCluster(
        ["localhost", "localhost"],
        connect_options={"ssh": fake_ssh(tmp_path)},
        worker_options={"nthreads": 1},
        scheduler_options={"port": 0},
        remote_python=python_here(tmp_path),
    ) as cluster:
        cluster.write_scheduler_file(tmp_path / "s.json")
        with Client(scheduler_file=tmp_path / "s.json", timeout=30) as client:
            assert client.submit(double, 21).result(30) == 42


@pytest.mark.process
def test_a_scheduler_that_cannot_start_is_reported_with_its_output(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(RuntimeError, match="the scheduler did not start: ssh to h ended"):
        SSHCluster(["h", "h"], connect_options={"ssh": fake_ssh(tmp_path)}, remote_python=missing)


def test_a_scheduler_file_with_tls_is_all_a_client_needs(tmp_path: Path) -> None:
    from apportion.net.scheduler_file import write_scheduler_file

    security = Security.temporary()
    assert security.token is not None
    cert, key = security.cert_for("client")
    path = tmp_path / "s.json"
    write_scheduler_file(
        path,
        "tls://h:1",
        security.token,
        "x",
        tls_ca=security.tls_ca_file,
        tls_cert=cert,
        tls_key=key,
    )
    address, found = from_scheduler_file(path, None, None, 0)
    assert address == "tls://h:1"
    assert isinstance(found, Security) and found.token == security.token
    assert found.cert_for("client") == (cert, key) and found.tls_ca_file == security.tls_ca_file


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["onlyone"], "give at least two hosts"),
        (["n[3-1]"], "range '3-1' in host list 'n[3-1]' runs backwards"),
        ([], "name the hosts"),
        (["a", "b", "--ssh-option", "-o 'x"], "cannot read ssh option"),
        (["a", "b", "--resources", "gpu=[0,0]"], "gpu"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["ssh", *args])
    assert result.exit_code != 0
    assert message in result.output


def test_a_hostfile_error_names_the_line(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("head\nnode1 slots=2\n")
    result = CliRunner().invoke(main, ["ssh", "--hostfile", str(hostfile)])
    assert result.exit_code == 1
    assert f"{hostfile} line 2: 'node1 slots=2'" in result.output


@pytest.mark.process
@pytest.mark.tcp
@pytest.mark.timeout(90)
def test_apportion_ssh_leaves_a_running_schedulers_default_file_alone(
    tmp_path: Path, procs: Processes
) -> None:
    home = tmp_path / "home"
    default = home / "scheduler.json"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").symlink_to(fake_ssh(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPORTION_")}
    env.update(APPORTION_HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    # The user's scheduler, running: it holds the default file.
    with SchedulerFileClaim.take(default) as claim:
        claim.note("tcp://127.0.0.1:4001")
        write_scheduler_file(default, "tcp://127.0.0.1:4001", "t" * 43, "mine")
        python = python_here(tmp_path)
        argv = ["ssh", "localhost", "localhost", "--remote-python", python, "--scheduler-port", "0"]
        proc, log = procs.start(*argv, "--nthreads", "1", env=env)
        found = poll(
            lambda: re.search(r"reach this one with --scheduler-file (\S+)", log.read_text()),
            60,
            "apportion ssh to start",
        )
        spare = Path(found.group(1))
        assert spare.parent == home and spare.name.startswith("scheduler-")
        with Client(scheduler_file=spare, timeout=30) as client:
            assert client.submit(double, 21).result(30) == 42
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
        assert not spare.exists()
        assert read_scheduler_file(default).id == "mine"
