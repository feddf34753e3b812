"""What ``apportion ssh`` runs where, built without running anything; and the bootstrap
run here, without ssh, as the remote end runs it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from apportion.deploy.ssh_commands import (
    BOOTSTRAP,
    ConnectOptions,
    SchedulerOptions,
    WorkerOptions,
    announced_address,
    bootstrap_input,
    host_name,
    plan_cluster,
    relayed_line,
    scheduler_args,
    split_ssh_options,
    ssh_argv,
    worker_args,
)
from apportion.deploy.ssh_options import connect_options, scheduler_options, worker_options
from apportion.net.scheduler_file import read_scheduler_file, write_scheduler_file
from apportion.net.security import Security

SECRET = "s3cr3t-" + "x" * 40


def test_the_first_host_schedules_and_the_others_work() -> None:
    plan = plan_cluster(["alice@head", "n1", "n1"], "/opt/py/bin/python")
    assert plan.scheduler_host == "alice@head"
    assert plan.worker_hosts == ("n1", "n1")
    assert scheduler_args(plan) == ["scheduler", "--host", "head", "--port", "8786", "--no-journal"]


def test_one_host_is_refused_with_how_to_have_both_on_it() -> None:
    with pytest.raises(ValueError, match="name one host twice"):
        plan_cluster(["head"], "python")
    with pytest.raises(ValueError, match="'-oProxyCommand=x' is not a host"):
        plan_cluster(["head", "-oProxyCommand=x"], "python")


def test_worker_arguments_carry_the_options_and_a_name_per_entry() -> None:
    options = WorkerOptions(nworkers=2, nthreads=4, resources="gpu=[0,1] licence=2")
    plan = plan_cluster(["head", "n1", "n1"], "python", worker=options)
    assert worker_args(plan, 1, "tls://head:8786") == [
        *("worker", "tls://head:8786", "--nworkers", "2", "--host", "n1"),
        *("--name", "ssh-1-n1", "--nthreads", "4", "--resources", "gpu=[0,1] licence=2"),
    ]


def test_the_ssh_command_line_holds_no_credential_and_quotes_every_word() -> None:
    connect = ConnectOptions(options=("-p", "2222"))
    plan = plan_cluster(["head", "n1"], "/opt/my python/bin/python", connect)
    argv = ssh_argv(plan, "n1", worker_args(plan, 0, "tls://head:8786"))
    assert argv[:7] == ["ssh", "-T", "-o", "BatchMode=yes", "-p", "2222", "--"]
    assert argv[7] == "n1"
    remote = shlex.split(argv[8])  # as the remote POSIX shell reads it
    assert remote[:3] == ["/opt/my python/bin/python", "-c", BOOTSTRAP]
    assert remote[3:6] == ["worker", "tls://head:8786", "--nworkers"]
    security = Security.temporary()
    line = bootstrap_input(security.environment("worker"), 5.0)
    assert security.token is not None and security.token not in " ".join(argv)
    spec = json.loads(line)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert spec == {"env": security.environment("worker"), "grace": 5.0}


def test_ssh_options_split_as_a_shell_would() -> None:
    texts = ["-p 2222", "-o 'ProxyJump=gw host'"]
    assert split_ssh_options(texts) == ("-p", "2222", "-o", "ProxyJump=gw host")
    with pytest.raises(ValueError, match='cannot read ssh option "-o \'x"'):
        split_ssh_options(["-o 'x"])


def test_host_names_of_destinations() -> None:
    assert host_name("alice@node1") == "node1"
    assert host_name("[fe80::1]") == "fe80::1"
    assert host_name("10.0.0.1") == "10.0.0.1"


def test_the_announcement_gives_the_address() -> None:
    assert announced_address("apportion scheduler at tls://10.0.0.1:8786") == "tls://10.0.0.1:8786"
    assert announced_address("scheduler listening") is None


def test_dask_style_connect_options_become_ssh_arguments() -> None:
    given = {"port": 2222, "username": "me", "known_hosts": None, "client_keys": ["k1"]}
    assert connect_options(given).options == (
        *("-p", "2222", "-l", "me"),
        *("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"),
        *("-i", "k1", "-o", "IdentitiesOnly=yes"),
    )
    with pytest.raises(ValueError, match="connect_options: not understood here: password"):
        connect_options({"password": "x"})


def test_worker_and_scheduler_options_in_dask_names() -> None:
    options = worker_options({"n_workers": 3, "resources": {"gpu": [0, 1]}})
    assert options == WorkerOptions(nworkers=3, resources="gpu=[0,1]")
    with pytest.raises(ValueError, match="not understood here: memory_limit"):
        worker_options({"memory_limit": "4GB"})
    with pytest.raises(ValueError, match="gpu"):
        worker_options({"resources": "gpu=[0,0]"})
    assert scheduler_options({"port": 0}) == SchedulerOptions(port=0)
    with pytest.raises(ValueError, match="not a TCP port"):
        scheduler_options({"port": 70000})


def test_a_scheduler_file_carries_a_clients_tls_credentials(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_scheduler_file(path, "tls://h:1", SECRET, "id", tls_ca="CA", tls_cert="C", tls_key="K")
    found = read_scheduler_file(path)
    assert (found.tls_ca, found.tls_cert, found.tls_key) == ("CA", "C", "K")
    assert os.stat(path).st_mode & 0o777 == 0o600
    write_scheduler_file(path, "tls://h:1", SECRET, "id")
    assert "tls" not in json.loads(path.read_text())
    assert read_scheduler_file(path).tls_cert is None


@pytest.mark.process
@pytest.mark.tcp
def test_the_bootstrap_runs_apportion_with_its_stdin_and_stops_it_at_end_of_file(
    tmp_path: Path,
) -> None:
    """The remote end without ssh: credentials in on stdin, the scheduler announces
    itself, and closing stdin (a dropped connection) leaves no process behind."""
    argv = [sys.executable, "-c", BOOTSTRAP, "scheduler", "--port", "0", "--no-journal"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(bootstrap_input({"APPORTION_TOKEN": SECRET}, 10.0))
        proc.stdin.flush()
        lines = []
        for raw in proc.stderr:
            lines.append(raw.decode())
            if announced_address(lines[-1]):
                break
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "".join(lines)
        assert all(SECRET not in " ".join(c.cmdline()) for c in children)
        proc.stdin.close()
        assert proc.wait(20) == 0, "".join(lines)
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        for stream in (proc.stdin, proc.stderr):
            if stream is not None:
                stream.close()


def test_relayed_json_records_gain_their_host_and_other_lines_a_prefix() -> None:
    record = {"time": "2026-11-24T10:00:00.000Z", "level": "INFO", "message": "héllo"}
    relayed = json.loads(relayed_line("node01", json.dumps(record)))
    assert relayed == {**record, "host": "node01"}
    assert relayed_line("node01", "plain text") == "[node01] plain text"
    assert relayed_line("node01", "{not json") == "[node01] {not json"
    assert relayed_line("node01", "[1, 2]") == "[node01] [1, 2]"
    assert relayed_line("node01", '{"a": 1} trailing') == '[node01] {"a": 1} trailing'


def test_remote_processes_are_given_the_log_format(monkeypatch: pytest.MonkeyPatch) -> None:
    from apportion.deploy.ssh import _remote_environment

    security = Security.temporary()
    monkeypatch.delenv("APPORTION_LOG_FORMAT", raising=False)
    assert "APPORTION_LOG_FORMAT" not in _remote_environment(security, "worker")
    monkeypatch.setenv("APPORTION_LOG_FORMAT", "json")
    env = _remote_environment(security, "worker")
    assert env["APPORTION_LOG_FORMAT"] == "json"
    assert env.items() >= security.environment("worker").items()
