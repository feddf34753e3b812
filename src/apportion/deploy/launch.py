"""A cluster for the length of one command, inside a batch job: the part every system shares.

``apportion slurm`` and ``apportion sge`` start the processes, wait for them and stop
them in the same order on every way out (COMMAND ends, COMMAND cannot start, SIGTERM
or SIGINT, workers that fail):

1. the scheduler (``apportion scheduler``, TLS with credentials made for this job,
   so that nothing crosses the network in plaintext) writes the scheduler file;
2. the workers start (``start_workers``: one ``srun`` step, or a ``qrsh -inherit``
   per host), each started process in ``workers``;
3. once every node's workers have registered (``nodes``), COMMAND runs with
   ``APPORTION_SCHEDULER_FILE`` and the client credentials in its environment;
4. teardown: COMMAND is stopped if it still runs, the workers get SIGTERM and drain
   (``drain_workers``), then the scheduler stops, which removes its file. Each stage
   is bounded, then killed.

A subclass says how its batch system places the workers; decisions stay in the
``*_plan`` modules.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from apportion.deploy.slurm_plan import (
    SCHEDULER_FILE_VARIABLE,
    LaunchOptions,
    missing_text,
    missing_workers,
)
from apportion.net.scheduler_file import SchedulerFileError, read_scheduler_file
from apportion.net.security import Security

logger = logging.getLogger("apportion.deploy")

#: Seconds the scheduler gets to write its file.
SCHEDULER_START_TIMEOUT = 60.0
#: Seconds the scheduler gets to close once its workers are gone.
SCHEDULER_STOP_TIMEOUT = 10.0
#: Seconds COMMAND gets between SIGTERM and SIGKILL when we stop it.
COMMAND_KILL_GRACE = 5.0


class SchedulerView(Protocol):
    """What the launch asks of a client of its scheduler: the workers registered."""

    def scheduler_info(self) -> Any: ...


#: Opens a client of the scheduler the file names, with these credentials: given by
#: the command line (a ``Client``), since deployment does not import the client.
Connect = Callable[[Path, Security], AbstractContextManager[SchedulerView]]


class LaunchError(RuntimeError):
    """The cluster could not be started; the message says what is missing."""


class Stopped(Exception):
    """SIGTERM or SIGINT arrived: stop everything and exit with 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class ClusterLaunch:
    """Runs COMMAND with a cluster around it; ``run`` returns the exit status. A
    subclass gives ``label``, ``listen_host``, ``start_workers``, ``nodes`` and
    ``drain_workers``."""

    #: The command's name in log lines (``apportion slurm``).
    label = "apportion"
    #: Signals that stop the cluster (Grid Engine adds its ``-notify`` warning).
    stop_signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
    #: Whether the scheduler runs in a session of its own (so that a Ctrl-C in an
    #: salloc shell reaches only us), or in the job's process group, so that a batch
    #: system that ends a job by killing its group ends it too.
    own_session = True

    def __init__(
        self,
        options: LaunchOptions,
        scheduler_file: Path,
        command: Sequence[str],
        connect: Connect,
    ) -> None:
        self.connect = connect
        self.options = options
        self.scheduler_file = scheduler_file
        self.command = list(command)
        #: Credentials made for this job: every process of the cluster gets them.
        self.security = Security.temporary()
        self.scheduler: subprocess.Popen[bytes] | None = None
        #: The processes that started the workers (srun, qrsh, a supervisor): if one
        #: ends before they registered, the start failed.
        self.workers: list[subprocess.Popen[bytes]] = []
        self.child: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        """Start, run COMMAND, tear down (see the module docstring)."""
        previous = {sig: signal.getsignal(sig) for sig in self.stop_signals}
        for sig in previous:
            signal.signal(sig, _raise_stopped)
        try:
            return self._run()
        except Stopped as stop:
            logger.warning("%s: %s received; stopping", self.label, stop)
            return 128 + stop.signum
        finally:
            # A second signal must not cut the teardown short: the job would leave
            # processes running until the batch system's SIGKILL.
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)
            self.teardown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> int:
        self.start_scheduler()
        self.start_workers()
        self.wait_registered()
        env = {
            **os.environ,
            **self.security.environment("client"),
            SCHEDULER_FILE_VARIABLE: str(self.scheduler_file),
        }
        logger.info("%s: running %s", self.label, " ".join(self.command))
        try:
            self.child = subprocess.Popen(self.command, env=env)
        except OSError as exc:
            raise LaunchError(f"cannot run {self.command[0]}: {exc}") from None
        status = self.child.wait()
        return 128 - status if status < 0 else status  # killed by a signal: as a shell says

    # --- starting --------------------------------------------------------------------

    def start_scheduler(self) -> None:
        host = self.listen_host()
        argv = [sys.executable, "-m", "apportion.cli.main", "scheduler"]
        argv += ["--host", host, "--port", "0", "--scheduler-file", str(self.scheduler_file)]
        env = {**os.environ, **self.security.environment("scheduler")}
        # Its own session: a Ctrl-C in an salloc shell reaches us, and we stop it in order.
        self.scheduler = subprocess.Popen(
            self.wrap(argv), env=env, stdin=subprocess.DEVNULL, start_new_session=self.own_session
        )
        if not _wait(self._scheduler_file_written, SCHEDULER_START_TIMEOUT):
            raise LaunchError(
                f"the scheduler did not write {self.scheduler_file} within "
                f"{SCHEDULER_START_TIMEOUT:g}s"
            )

    def _scheduler_file_written(self) -> bool:
        assert self.scheduler is not None
        if self.scheduler.poll() is not None:
            raise LaunchError(f"the scheduler exited with status {self.scheduler.returncode}")
        try:
            return read_scheduler_file(self.scheduler_file).pid == self.scheduler.pid
        except SchedulerFileError:
            return False

    def wrap(self, argv: list[str]) -> list[str]:
        """How a process of the cluster is started (as is, unless a subclass says)."""
        return argv

    def listen_host(self) -> str:
        """The interface the scheduler listens on."""
        raise NotImplementedError

    def start_workers(self) -> None:
        """Start the workers of every node; ``self.workers`` are the processes to watch."""
        raise NotImplementedError

    def nodes(self) -> list[str]:
        """The names the workers register under, one per node."""
        raise NotImplementedError

    def wait_registered(self) -> None:
        nodes = self.nodes()
        per_node = self.options.nworkers_per_node
        missing = dict.fromkeys(nodes, 0)
        with self.connect(self.scheduler_file, self.security) as client:

            def all_here() -> bool:
                nonlocal missing
                for index, proc in enumerate(self.workers):
                    if proc.poll() is not None:
                        raise LaunchError(self.exit_text(index, proc.returncode))
                workers = client.scheduler_info()["workers"].values()
                missing = missing_workers(nodes, per_node, (w["name"] for w in workers))
                return not missing

            if not _wait(all_here, self.options.register_timeout):
                raise LaunchError(missing_text(missing, per_node, self.options.register_timeout))
        logger.info("%s: %d worker(s) on %d node(s)", self.label, per_node * len(nodes), len(nodes))

    def exit_text(self, index: int, status: int) -> str:
        """Why the start failed when ``self.workers[index]`` ended with ``status``."""
        return f"the workers exited with status {status} before every node's workers registered"

    # --- stopping --------------------------------------------------------------------

    def teardown(self) -> None:
        """Stop COMMAND, the workers and the scheduler, in that order, each bounded."""
        _stop(self.child, COMMAND_KILL_GRACE, group=False)
        self.drain_workers()
        for proc in self.workers:
            _stop(proc, 5.0, group=False)
        _stop(self.scheduler, SCHEDULER_STOP_TIMEOUT, group=self.own_session)
        with contextlib.suppress(FileNotFoundError):
            if self.scheduler is not None and _names_pid(self.scheduler_file, self.scheduler.pid):
                self.scheduler_file.unlink()

    def drain_workers(self) -> None:
        """SIGTERM to every worker supervisor (they drain), then wait for them."""
        raise NotImplementedError


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` (it asks other processes) until true or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


def node_address() -> str:
    """This node's address as its name resolves: what the other nodes connect to."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        raise LaunchError(
            f"cannot resolve this node's name {socket.gethostname()}: {exc}"
        ) from None


def _names_pid(path: Path, pid: int) -> bool:
    try:
        return read_scheduler_file(path).pid == pid
    except SchedulerFileError:
        return False


def _stop(proc: subprocess.Popen[bytes] | None, grace: float, *, group: bool) -> None:
    """SIGTERM, ``grace`` seconds, then SIGKILL (the whole group if it has its own)."""
    if proc is None or proc.poll() is not None:
        return
    send: Callable[[int], None] = (
        (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    )
    with contextlib.suppress(ProcessLookupError):
        send(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        logger.warning("%s did not stop within %gs; killing it", proc.args, grace)
        with contextlib.suppress(ProcessLookupError):
            send(signal.SIGKILL)
        proc.wait()
