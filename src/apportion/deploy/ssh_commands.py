"""What ``apportion ssh`` runs on each host, as data: the ``ssh`` command lines, the
bootstrap that runs at the other end, and the line that tells the scheduler's address.

Through the system's ``ssh`` binary, so the user's ``~/.ssh/config``, agent, keys,
jump hosts and known hosts all apply as they do for their own ``ssh`` (no Python SSH
library, no paramiko). ``BatchMode=yes``: a host that would ask for a password or to
accept an unknown host key fails with ssh's own message instead of waiting for an
answer nobody can type.

The cluster's credentials never go on a command line (which every user of the remote
host can read in ``ps``): the remote command is ``PYTHON -c BOOTSTRAP apportion-args``,
and the bootstrap reads one JSON line from the ssh channel's stdin — the environment
carrying the secret and the TLS material — then runs ``apportion`` with it. It keeps
reading stdin: at end of file (``apportion ssh`` closed it to stop the cluster, or
died, or the connection dropped) it sends SIGTERM (a worker drains, a scheduler
stops), then after a grace period SIGKILL to the whole process group. So nothing
outlives the connection. The remote processes get a fresh private ``APPORTION_HOME``
(removed at the end): they never touch the remote user's secret, journal or
scheduler file.

The remote login shell must be POSIX-like (sh, bash, zsh...): arguments are quoted
with ``shlex.quote``.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from apportion.net.address import DEFAULT_PORT

#: Runs at the other end of every ssh connection (module docstring). Kept to the
#: standard library of any Python 3 the remote host may have.
BOOTSTRAP = """\
import json, os, shutil, signal, subprocess, sys, tempfile, threading
spec = json.loads(sys.stdin.buffer.readline() or b"{}")
home = tempfile.mkdtemp(prefix="apportion-ssh-")
env = dict(os.environ, APPORTION_HOME=home, **spec.get("env", {}))
child = subprocess.Popen(
    [sys.executable, "-m", "apportion.cli.main", *sys.argv[1:]],
    env=env, stdin=subprocess.DEVNULL, start_new_session=True)
ended = threading.Event()
def hang_up():
    while sys.stdin.buffer.read1(65536):
        pass
    ended.set()
def exited():
    child.wait()
    ended.set()
for target in (hang_up, exited):
    threading.Thread(target=target, daemon=True).start()
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, lambda *_: ended.set())
ended.wait()
if child.poll() is None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(spec.get("grace", 30))
    except subprocess.TimeoutExpired:
        pass
try:
    os.killpg(child.pid, signal.SIGKILL)
except OSError:
    pass
child.wait()
shutil.rmtree(home, ignore_errors=True)
sys.exit(child.returncode if child.returncode >= 0 else 128 - child.returncode)
"""

#: How ``apportion scheduler`` announces itself on stderr: a plain line, or the
#: message of a JSON record, where the address ends at the closing quote.
_ANNOUNCED = re.compile(r"apportion scheduler at ((?:tcp|tls)://[^\s\"]+)")


@dataclass(frozen=True)
class ConnectOptions:
    """How to reach every host: the ``ssh`` binary and the arguments to give it."""

    ssh: str = "ssh"
    #: Extra ``ssh`` arguments, each a word (``("-p", "2222", "-o", "User=me")``).
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class SchedulerOptions:
    """Where the scheduler listens."""

    port: int = DEFAULT_PORT
    #: The interface to listen on; None: the scheduler host's name as given to ssh.
    host: str | None = None


@dataclass(frozen=True)
class WorkerOptions:
    """What each worker host runs: ``apportion worker --nworkers ...``."""

    nworkers: int = 1
    nthreads: int | None = None
    resources: str | None = None
    #: The data port's interface; None: each host's name as given to ssh.
    host: str | None = None


@dataclass(frozen=True)
class ClusterPlan:
    """Which host runs what, and how to reach them."""

    scheduler_host: str
    worker_hosts: tuple[str, ...]
    remote_python: str
    connect: ConnectOptions = ConnectOptions()
    scheduler: SchedulerOptions = SchedulerOptions()
    worker: WorkerOptions = WorkerOptions()
    #: Seconds a remote process gets between SIGTERM and SIGKILL.
    grace: float = 30.0


def plan_cluster(
    hosts: Sequence[str],
    remote_python: str,
    connect: ConnectOptions = ConnectOptions(),
    scheduler: SchedulerOptions = SchedulerOptions(),
    worker: WorkerOptions = WorkerOptions(),
) -> ClusterPlan:
    """The scheduler on the first host, workers on the others (a host named twice is
    both); ``ValueError`` if that leaves no worker."""
    if len(hosts) < 2:
        raise ValueError(
            f"give at least two hosts, the scheduler's then the workers' (got {list(hosts)}); "
            "name one host twice for a scheduler and a worker on it"
        )
    for host in hosts:
        if not host or host.startswith("-") or any(c.isspace() for c in host):
            raise ValueError(f"{host!r} is not a host to ssh to")
    return ClusterPlan(hosts[0], tuple(hosts[1:]), remote_python, connect, scheduler, worker)


def split_ssh_options(texts: Sequence[str]) -> tuple[str, ...]:
    """``--ssh-option`` values (``"-p 2222"``, ``"-o StrictHostKeyChecking=no"``) as
    words, split as a shell would."""
    words: list[str] = []
    for text in texts:
        try:
            words.extend(shlex.split(text))
        except ValueError as exc:
            raise ValueError(f"cannot read ssh option {text!r}: {exc}") from None
    return tuple(words)


def host_name(destination: str) -> str:
    """The host part of an ssh destination: ``alice@node1`` -> ``node1``,
    ``[fe80::1]`` -> ``fe80::1``."""
    host = destination.rsplit("@", 1)[-1]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def scheduler_args(plan: ClusterPlan) -> list[str]:
    """``apportion`` arguments of the scheduler. No journal: an ssh cluster runs the
    tasks of its clients, not the remote user's staged runs."""
    host = plan.scheduler.host or host_name(plan.scheduler_host)
    return ["scheduler", "--host", host, "--port", str(plan.scheduler.port), "--no-journal"]


def worker_args(plan: ClusterPlan, index: int, address: str) -> list[str]:
    """``apportion`` arguments of the workers on ``plan.worker_hosts[index]``."""
    destination = plan.worker_hosts[index]
    options = plan.worker
    args = ["worker", address, "--nworkers", str(options.nworkers)]
    args += ["--host", options.host or host_name(destination)]
    args += ["--name", f"ssh-{index}-{host_name(destination)}"]
    if options.nthreads is not None:
        args += ["--nthreads", str(options.nthreads)]
    if options.resources is not None:
        args += ["--resources", options.resources]
    return args


def ssh_argv(plan: ClusterPlan, destination: str, apportion: Sequence[str]) -> list[str]:
    """The local command that runs ``apportion APPORTION...`` on ``destination`` through
    the bootstrap. ``-T``: no terminal, so the remote end sees a plain pipe close."""
    remote = [plan.remote_python, "-c", BOOTSTRAP, *apportion]
    command = " ".join(shlex.quote(word) for word in remote)
    connect = plan.connect
    return [connect.ssh, "-T", "-o", "BatchMode=yes", *connect.options, "--", destination, command]


def bootstrap_input(env: Mapping[str, str], grace: float) -> bytes:
    """The one line the bootstrap reads first: the credentials, off the command line."""
    return json.dumps({"env": dict(env), "grace": grace}).encode() + b"\n"


def announced_address(line: str) -> str | None:
    """The scheduler's address if ``line`` is its announcement."""
    found = _ANNOUNCED.search(line)
    return found.group(1) if found else None


def relayed_line(label: str, line: str) -> str:
    """A remote process's output line as ``apportion ssh`` prints it: a JSON log
    record (``--log-format json``) gains ``"host": label`` and stays one JSON
    object, so the whole output can be read as JSON lines; any other line is
    prefixed ``[label]``."""
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            return json.dumps({**record, "host": label}, ensure_ascii=False)
    return f"[{label}] {line}"
