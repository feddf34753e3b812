"""A real one-node Slurm (munged, slurmctld, slurmd) in a temporary directory, for tests.

Everything the daemons read or write lives under one directory: the configuration,
the munge key and socket, state, spool, logs and pid files, and four fake GPUs
(character devices with NVIDIA's major number, which Slurm only ``stat``s) so that
``--gres=gpu:N`` jobs get a ``CUDA_VISIBLE_DEVICES`` from Slurm itself. The ports
are picked free, so it does not clash with another Slurm on the machine. The client
commands find this cluster through ``SLURM_CONF``, which is only ever put in the
environment of the subprocesses (``SlurmCluster.env``), never in this process's.

``missing()`` says why such a cluster cannot run here (not root, a binary not on
PATH); the fixture skips with that reason rather than passing silently.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

#: What must be on PATH for the cluster and its tests.
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo")

#: The fake GPUs' count: enough for a job to get a strict subset.
GPUS = 4

#: Character-device major of /dev/nvidia0..N.
NVIDIA_MAJOR = 195

#: Daemon names whose leftovers teardown looks for (and kills) under our directory.
_DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")


def missing() -> str | None:
    """Why a Slurm cluster cannot be started here, or None if it can."""
    if os.geteuid() != 0:
        return "starting slurmctld, slurmd and munged needs root"
    absent = [name for name in BINARIES if shutil.which(name) is None]
    if absent:
        return f"not on PATH: {', '.join(absent)}"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _memory_mib() -> int:
    # slurmd refuses a node whose RealMemory is above what it measures; stay under it.
    return int(psutil.virtual_memory().total // 2**20 * 0.9)


class SlurmCluster:
    """One node (named after this host) with ``CPUS`` CPUs and ``GPUS`` GPU GRES."""

    CPUS = 2

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="slurm-"))
        self.node = socket.gethostname()
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"
        self.daemons: list[subprocess.Popen[bytes]] = []

    # --- configuration -------------------------------------------------------------

    def write_config(self) -> None:
        for sub in ("munge", "state", "spool", "log", "dev"):
            (self.root / sub).mkdir(mode=0o700)
        devices = []
        for i in range(GPUS):
            device = self.root / "dev" / f"nvidia{i}"
            os.mknod(device, 0o600 | 0o020000, os.makedev(NVIDIA_MAJOR, i))
            devices.append(str(device))
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        log = self.root / "log"
        memory = _memory_mib()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=apportion-test",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={self.root / 'state'}",
                    f"SlurmdSpoolDir={self.root / 'spool'}",
                    f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.root / 'slurmd.pid'}",
                    f"SlurmctldLogFile={log / 'slurmctld.log'}",
                    f"SlurmdLogFile={log / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core_Memory",
                    "GresTypes=gpu",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SchedulerType=sched/builtin",
                    "SchedulerParameters=sched_interval=1",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    "KillWait=5",
                    "MinJobAge=10",
                    "InactiveLimit=0",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=30",
                    f"PlugStackConfig={self.root / 'plugstack.conf'}",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.CPUS} "
                    f"RealMemory={memory} Gres=gpu:{GPUS} State=UNKNOWN",
                    f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        (self.root / "plugstack.conf").write_text("")
        (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")
        (self.root / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu File={self.root / 'dev'}/nvidia[0-{GPUS - 1}]\n"
        )

    # --- processes -----------------------------------------------------------------

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` naming this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **(extra or {})}

    def _daemon(self, *argv: str) -> None:
        log = self.root / "log" / f"{Path(argv[0]).name}.out"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                start_new_session=True,
            )
        self.daemons.append(proc)

    def start(self, timeout: float = 30.0) -> None:
        """Write the configuration, start the daemons, return once the node is idle."""
        self.write_config()
        munge = self.root / "munge"
        self._daemon(
            "munged",
            "--foreground",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )
        self._wait(self.munge_socket.exists, timeout, "munged's socket")
        self._daemon("slurmctld", "-D", "-f", str(self.conf))
        self._daemon("slurmd", "-D", "-N", self.node, "-f", str(self.conf))
        self._wait(self._idle, timeout, f"node {self.node} idle in sinfo")

    def _idle(self) -> bool:
        for proc in self.daemons:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}):\n{self.logs()}")
        done = self.run("sinfo", "--noheader", "--nodes", self.node, "-o", "%t", check=False)
        return done.stdout.strip() == "idle"

    def _wait(self, condition: object, timeout: float, what: str) -> None:
        assert callable(condition)
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")
            time.sleep(0.1)

    def run(
        self, *argv: str, check: bool = True, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (bounded)."""
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=self.env(env),
            check=check,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )

    def logs(self) -> str:
        """Every daemon log, for a failure message."""
        parts = []
        for path in [*sorted((self.root / "log").glob("*")), self.root / "munge" / "munged.log"]:
            if path.exists():
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    # --- jobs ----------------------------------------------------------------------

    def sbatch(self, script: Path, *, cwd: Path, env: Mapping[str, str] | None = None) -> str:
        """Submit ``script`` from ``cwd``; the job id."""
        done = subprocess.run(
            ["sbatch", "--parsable", "--chdir", str(cwd), str(script)],
            capture_output=True,
            text=True,
            env=self.env(env),
            check=True,
            timeout=30,
            cwd=cwd,
        )
        return done.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """The job's state (``PENDING``, ``RUNNING``, ``COMPLETED``...); "" once forgotten."""
        done = self.run("squeue", "--noheader", "-j", job, "-o", "%T", "--states=all", check=False)
        return done.stdout.strip()

    def wait_finished(self, job: str, timeout: float) -> str:
        """Wait until ``job`` leaves the queue's live states; its last state seen."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            state = self.state(job)
            if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return state
            if not state and last:
                return last
            last = state or last
            time.sleep(0.2)
        raise AssertionError(f"job {job} still {last} after {timeout}s:\n{self.logs()}")

    def wait_running(self, job: str, timeout: float) -> None:
        """Wait until ``job`` runs."""
        self._wait(lambda: self.state(job) == "RUNNING", timeout, f"job {job} running")

    # --- teardown ------------------------------------------------------------------

    def leftovers(self) -> list[psutil.Process]:
        """Slurm processes of this cluster still alive (its daemons and step daemons)."""
        found = []
        for proc in psutil.process_iter(["name", "cmdline", "environ"]):
            try:
                if proc.info["name"] not in _DAEMONS:
                    continue
                text = " ".join(proc.info["cmdline"] or [])
                conf = (proc.info["environ"] or {}).get("SLURM_CONF", "")
                if str(self.root) in text or conf == str(self.conf):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill what is left; raise if any survives."""
        self.run("scancel", "--full", "--user", "root", check=False)
        # slurmstepd ends its job's processes on cancel; give it a moment before the
        # daemons go, so that nothing is orphaned outside the node's control.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.run("squeue", "--noheader", check=False).stdout:
            time.sleep(0.2)
        for proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.daemons:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stragglers = self.leftovers()
        for proc in stragglers:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(stragglers, timeout=5)
        survivors = self.leftovers()
        shutil.rmtree(self.root, ignore_errors=True)
        if stragglers or survivors:
            raise RuntimeError(f"Slurm processes left behind: {stragglers}")
