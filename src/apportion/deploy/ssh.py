"""A cluster on machines reached by ssh: the scheduler on the first host, workers on
the others, as ``dask-ssh`` and Dask's ``SSHCluster`` do.

``ssh_commands.py`` says what runs where and why the credentials travel on stdin; this
module only starts those ``ssh`` processes, relays their output (each line prefixed
with its host) and stops them. The cluster's credentials are made fresh for it
(``Security.temporary()``: mutual TLS and a secret), so it is encrypted even across
hosts that share nothing with this one.

Stopping (``close``) ends the workers first — each remote worker drains, handing its
results on — then the scheduler. It closes each ssh channel's stdin, which is what
tells the remote bootstrap to stop; a process that does not end in time is killed,
and the bootstrap then kills what is left of its remote process group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from apportion.core.durations import Duration, seconds
from apportion.deploy.ssh_commands import (
    ClusterPlan,
    ConnectOptions,
    SchedulerOptions,
    WorkerOptions,
    announced_address,
    bootstrap_input,
    plan_cluster,
    relayed_line,
    scheduler_args,
    ssh_argv,
    worker_args,
)
from apportion.deploy.ssh_options import connect_options, scheduler_options, worker_options
from apportion.log_setup import FORMAT_VARIABLE
from apportion.net.scheduler_file import write_scheduler_file
from apportion.net.security import Security

logger = logging.getLogger("apportion.deploy.ssh")

#: Lines of a remote process's output kept to explain its failure.
KEPT_LINES = 20


class RemoteProcess:
    """One ``ssh`` process running ``apportion`` on a host through the bootstrap."""

    def __init__(
        self,
        label: str,
        argv: list[str],
        stdin_line: bytes,
        output: TextIO,
        on_line: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.label = label
        #: The last lines it wrote, for error messages.
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)
        # A session of its own: Ctrl-C in the terminal reaches this process, which
        # stops the cluster in order, not every ssh at once.
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(stdin_line)
            self.process.stdin.flush()
        except OSError:
            pass  # ssh already gone: its output says why, and ``ended`` follows
        #: Set by ``hang_up``: an end after it is the expected one.
        self._hung_up = False
        #: Set once its output has ended (the process has ended or is ending).
        self.ended = threading.Event()
        self._output = output
        self._on_line = on_line
        self._relay = threading.Thread(target=self._read, name=f"ssh-{label}", daemon=True)
        self._relay.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for raw in self.process.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                self.lines.append(line)
                with contextlib.suppress(OSError, ValueError):
                    print(relayed_line(self.label, line), file=self._output, flush=True)
                self._on_line(line)
        if not self._hung_up:
            code = self.process.wait()
            logger.warning("ssh to %s ended with status %s before it was stopped", self.label, code)
        self.ended.set()

    def hang_up(self) -> None:
        """Close its stdin: the remote bootstrap stops its process (module docstring)."""
        assert self.process.stdin is not None
        self._hung_up = True
        with contextlib.suppress(OSError):
            self.process.stdin.close()

    def wait(self, timeout: float) -> None:
        """Wait for it to end, killing the local ``ssh`` after ``timeout`` seconds."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %.0f s: killing its ssh", self.label, timeout)
            self.process.kill()
            self.process.wait()
        self.hang_up()  # its stdin pipe, if not closed yet
        self._relay.join(5)

    def failure(self) -> str:
        code = self.process.poll()
        said = "\n".join(self.lines) or "(no output)"
        return f"ssh to {self.label} ended (status {code}):\n{said}"


class SSHCluster:
    """A scheduler on ``hosts[0]`` and workers on ``hosts[1:]``, started over ssh.

    ``Client(SSHCluster(["head", "node1", "node2"]))``, or as a context manager. The
    arguments are Dask's where they carry over (``ssh_options.py`` reads them; an
    option not understood is an error, never silently dropped):

    - ``connect_options``: ``port``, ``username``, ``known_hosts``, ``client_keys``,
      ``config`` (an ssh config file) and ``options`` (raw ``ssh`` arguments);
    - ``worker_options``: ``n_workers``/``nworkers`` per host, ``nthreads``,
      ``resources`` (``"gpu=[0,1]"`` or a dict), ``host``;
    - ``scheduler_options``: ``port`` (0: any free), ``host``;
    - ``remote_python``: the Python with apportion on the remote hosts (default: this
      one's path).

    ``security`` defaults to fresh temporary credentials (mutual TLS and a secret).
    """

    def __init__(
        self,
        hosts: Sequence[str],
        connect_options: Mapping[str, Any] | None = None,
        worker_options: Mapping[str, Any] | None = None,
        scheduler_options: Mapping[str, Any] | None = None,
        remote_python: str | None = None,
        *,
        security: Security | None = None,
        timeout: Duration = 60.0,
        output: TextIO | None = None,
        on_scheduler_exit: Callable[[], None] | None = None,
    ) -> None:
        plan = plan_cluster(
            list(hosts),
            remote_python or sys.executable,
            _connect(connect_options),
            _scheduler(scheduler_options),
            _worker(worker_options),
        )
        self.plan = plan
        #: What clients and every process of the cluster prove and check.
        self.security = security or Security.temporary()
        #: ``tls://host:port`` once started.
        self.scheduler_address = ""
        self._output = output or sys.stderr
        self._on_scheduler_exit = on_scheduler_exit
        self._workers: list[RemoteProcess] = []
        self._scheduler: RemoteProcess | None = None
        self._closed = False
        try:
            self._start_scheduler(seconds(timeout) or 0.0)
            for index, host in enumerate(plan.worker_hosts):
                argv = ssh_argv(plan, host, worker_args(plan, index, self.scheduler_address))
                line = bootstrap_input(_remote_environment(self.security, "worker"), plan.grace)
                self._workers.append(RemoteProcess(host, argv, line, self._output))
        except BaseException:
            self.close()
            raise

    def _start_scheduler(self, timeout: float) -> None:
        plan = self.plan
        announced = threading.Event()

        def look(line: str) -> None:
            address = announced_address(line)
            if address and not self.scheduler_address:
                self.scheduler_address = address
                announced.set()

        argv = ssh_argv(plan, plan.scheduler_host, scheduler_args(plan))
        line = bootstrap_input(_remote_environment(self.security, "scheduler"), plan.grace)
        remote = RemoteProcess(plan.scheduler_host, argv, line, self._output, look)
        self._scheduler = remote
        watcher = threading.Thread(
            target=self._watch_scheduler, args=(remote, announced), daemon=True
        )
        watcher.start()
        announced.wait(timeout)
        if not self.scheduler_address:
            if remote.ended.is_set():
                remote.wait(5)
                raise RuntimeError(f"the scheduler did not start: {remote.failure()}")
            raise TimeoutError(
                f"the scheduler on {plan.scheduler_host} did not start in {timeout} s"
            )

    def _watch_scheduler(self, remote: RemoteProcess, announced: threading.Event) -> None:
        remote.ended.wait()
        announced.set()  # a scheduler that ended before announcing itself has failed
        if not self._closed and self.scheduler_address:
            logger.error("the scheduler ended: %s", remote.failure())
            if self._on_scheduler_exit is not None:
                self._on_scheduler_exit()

    @property
    def scheduler_id(self) -> str:
        """The id its scheduler file gives it (``write_scheduler_file``)."""
        return f"ssh-{self.plan.scheduler_host}"

    @property
    def hosts(self) -> list[str]:
        return [self.plan.scheduler_host, *self.plan.worker_hosts]

    def write_scheduler_file(self, path: str | os.PathLike[str]) -> None:
        """Write the address, the secret and a client's TLS credentials to ``path``
        (mode 0600): ``Client(scheduler_file=path)`` then needs nothing else."""
        assert self.security.token is not None
        cert, key = self.security.cert_for("client")
        write_scheduler_file(
            Path(path),
            self.scheduler_address,
            self.security.token,
            self.scheduler_id,
            tls_ca=self.security.tls_ca_file,
            tls_cert=cert,
            tls_key=key,
        )

    def close(self, timeout: Duration | None = None) -> None:
        """Stop the workers (they drain), then the scheduler; wait for every ssh to end."""
        if self._closed:
            return
        self._closed = True
        limit = self.plan.grace + 10 if timeout is None else seconds(timeout) or 0.0
        for remote in self._workers:
            remote.hang_up()
        for remote in self._workers:
            remote.wait(limit)
        if self._scheduler is not None:
            self._scheduler.hang_up()
            self._scheduler.wait(limit)

    def __enter__(self) -> SSHCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SSHCluster({self.scheduler_address or 'not started'}, hosts={self.hosts})"


def _connect(given: Mapping[str, Any] | None) -> ConnectOptions:
    return connect_options(dict(given or {}))


def _scheduler(given: Mapping[str, Any] | None) -> SchedulerOptions:
    return scheduler_options(dict(given or {}))


def _worker(given: Mapping[str, Any] | None) -> WorkerOptions:
    return worker_options(dict(given or {}))


__all__ = ["ClusterPlan", "RemoteProcess", "SSHCluster"]


def _remote_environment(security: Security, role: str) -> dict[str, str]:
    """What a remote process is given: its credentials, and this process's log format
    (``--log-format``), so a JSON log stays JSON from every host."""
    env = security.environment(role)
    log_format = os.environ.get(FORMAT_VARIABLE)
    if log_format:
        env[FORMAT_VARIABLE] = log_format
    return env
