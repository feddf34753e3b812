"""A cluster across "hosts" that share nothing but a network: network namespaces on a
bridge, each with its own 10.x address. The scheduler in one, workers in others, TLS
and a secret on every connection, data crossing from one host to another; then the
same through ``apportion ssh`` against an sshd inside a namespace. Needs root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest

from apportion import Client, Security, get_worker
from cli_processes import APPORTION, Processes, announced_address, poll
from namespaces import Namespaces
from namespaces import skip_reason as namespace_skip
from sshd_server import SSHServer, kill_marked, marked_processes, remote_python
from sshd_server import skip_reason as sshd_skip

pytestmark = [
    pytest.mark.process,
    pytest.mark.tcp,
    pytest.mark.skipif(namespace_skip() is not None, reason=namespace_skip() or ""),
]

# Workers in other namespaces cannot import this module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def produce(n: int) -> tuple[list[int], str]:
    return list(range(n)), get_worker().address


def consume(made: tuple[list[int], str]) -> tuple[int, str, str]:
    values, made_at = made
    return sum(values), made_at, get_worker().address


@pytest.fixture
def net() -> Iterator[Namespaces]:
    namespaces = Namespaces(3)
    try:
        yield namespaces.create()
    finally:
        namespaces.remove()


def child_env(security: Security, role: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPORTION_TLS")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return {**env, **security.environment(role)}


@pytest.mark.timeout(120)
def test_data_crosses_namespaces_over_tls(net: Namespaces, procs: Processes) -> None:
    security = Security.temporary()
    a, b, c = net.addresses
    scheduler = [*APPORTION, "scheduler", "--host", a, "--port", "0", "--no-journal"]
    started, log = procs.launch(net.exec_argv(0, scheduler), child_env(security, "scheduler"))
    address = announced_address(started, log, timeout=30)
    assert address.startswith(f"tls://{a}:")
    for index, (host, resource) in enumerate([(b, "onB=1"), (c, "onC=1")], start=1):
        worker = [*APPORTION, "worker", address, "--host", host, "--nthreads", "1"]
        worker += ["--resources", resource, "--name", f"ns-{index}"]
        procs.launch(net.exec_argv(index, worker), child_env(security, "worker"))
    with Client(address, security=security, timeout=30) as client:
        client.wait_for_workers(2, timeout=60)
        made = client.submit(produce, 100, resources={"onB": 1})
        total, made_at, used_at = client.submit(consume, made, resources={"onC": 1}).result(60)
    assert total == sum(range(100))
    assert made_at.startswith(f"tls://{b}:") and used_at.startswith(f"tls://{c}:")

    # Without TLS nothing listens on a non-loopback address, unless told to.
    plain = {**child_env(Security(token=security.token), "scheduler")}
    refused = subprocess.run(
        net.exec_argv(0, [*APPORTION, "scheduler", "--host", a, "--port", "0", "--no-journal"]),
        env=plain,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0
    assert f"refusing to listen on {a} without TLS" in refused.stderr
    # And a client speaking plaintext to the TLS scheduler gets nowhere.
    plaintext = Security(token=security.token)
    with pytest.raises((OSError, TimeoutError)):
        Client(address.replace("tls://", "tcp://"), security=plaintext, timeout=3)


@pytest.fixture
def mark() -> Iterator[str]:
    mark = uuid.uuid4().hex
    try:
        yield mark
    finally:
        kill_marked(mark)


@pytest.mark.skipif(sshd_skip() is not None, reason=sshd_skip() or "")
@pytest.mark.timeout(150)
def test_apportion_ssh_to_an_sshd_in_a_namespace(
    tmp_path: Path, net: Namespaces, procs: Processes, mark: str
) -> None:
    """Scheduler and a worker on "host" A through its sshd; a worker on B joins with the
    scheduler file alone; data made on B is used on A."""
    a, b, _ = net.addresses
    sshd = SSHServer(tmp_path / "sshd", address=a, port=2222)
    try:
        sshd.start(prefix=net.prefix_of(0))
        python = remote_python(tmp_path, mark)
        scheduler_file = tmp_path / "cluster.json"
        argv = [*APPORTION, "ssh", a, a, "--remote-python", str(python)]
        argv += ["--scheduler-port", "0", "--scheduler-file", str(scheduler_file)]
        argv += ["--resources", "onA=1", "--nthreads", "1"]
        for option in sshd.ssh_options():
            argv += ["--ssh-option", option]
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPORTION_TLS")}
        command, log = procs.launch(argv, {**env, "PYTHONPATH": os.pathsep.join(sys.path)})
        poll(lambda: "connect with Client" in log.read_text(), 60, "apportion ssh to start")
        # Worker B: credentials (secret and TLS) from the scheduler file alone.
        worker = [*APPORTION, "worker", "--scheduler-file", str(scheduler_file)]
        worker += ["--host", b, "--resources", "onB=1", "--nthreads", "1", "--name", "ns-b"]
        procs.launch(net.exec_argv(1, worker), {**env, "PYTHONPATH": os.pathsep.join(sys.path)})
        with Client(scheduler_file=scheduler_file, timeout=30) as client:
            assert client.scheduler_address.startswith(f"tls://{a}:")
            client.wait_for_workers(2, timeout=60)
            made = client.submit(produce, 10, resources={"onB": 1})
            total, made_at, used_at = client.submit(consume, made, resources={"onA": 1}).result(60)
        assert total == 45
        assert made_at.startswith(f"tls://{b}:") and used_at.startswith(f"tls://{a}:")
        os.killpg(command.pid, signal.SIGINT)
        assert command.wait(60) == 0, log.read_text()
        poll(lambda: not marked_processes(mark), 20, "the remote processes to end")
    finally:
        sshd.stop()
