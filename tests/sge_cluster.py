"""A real one-node Son of Grid Engine (Debian's gridengine-* packages), for tests.

Debian's packages put the cell at ``SGE_ROOT=/var/lib/gridengine``, ``default``,
with its spool initialised and no host configured. ``start`` makes this host the
master (``act_qmaster``, ``host_aliases``), starts ``sge_qmaster``, adds what the
tests need from files (``qconf -A*``/``-M*``, idempotent: what exists is modified,
not added twice), starts ``sge_execd`` and returns once the queue takes jobs:

- a ``gpu`` INT consumable, per job (``consumable JOB``), two on this host;
- a parallel environment ``smp`` (``$pe_slots``, ``control_slaves FALSE``: the
  job's processes are its own), another, ``tight``, whose tasks Grid Engine starts
  (``control_slaves TRUE``, ``job_is_first_task TRUE``: ``qrsh -inherit`` works in
  its jobs, for a slot the job script does not hold), and a queue ``apportion.q`` of 2
  slots whose ``starter_method`` plays a site's GPU assignment: it sets
  ``CUDA_VISIBLE_DEVICES`` to as many devices as the job's ``-l gpu=N`` (from 1, so
  that a label from it cannot be mistaken for a default 0), as sites do in a prolog
  or starter. Its ``notify`` is 10 s: ``qdel`` of a ``-notify`` job kills it 10 s
  after the warning;
- a scheduler that runs every second.

Jobs must come from a uid of 1000 or more (Grid Engine's ``min_uid``): tests submit
as an ordinary user made for them (``unix_users``). ``stop`` deletes every job and
stops the daemons it started; one already running when ``start`` came (another
session's) is used and left running. The configuration stays in the cell's spool
(the next ``start`` finds it): this is for a machine whose cell is the tests' own,
since it rewrites this host's ``complex_values`` and the scheduler's interval.
``missing()`` says why none can run here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

SGE_ROOT = Path("/var/lib/gridengine")
CELL = "default"
DAEMONS = Path("/usr/lib/gridengine")
BINARIES = ("qconf", "qsub", "qstat", "qdel", "qhost")
QUEUE = "apportion.q"
#: The GPU consumable, granted once per job whatever its slots.
GPU_COMPLEX = "gpu                 gpu        INT       <=    YES         JOB        0        0"
PE = "smp"
#: The parallel environment of tight integration: qrsh -inherit starts its tasks.
TIGHT_PE = "tight"
SLOTS = 2
GPUS = 2

_PE = f"""pe_name {PE}
slots 999
user_lists NONE
xuser_lists NONE
start_proc_args NONE
stop_proc_args NONE
allocation_rule $pe_slots
control_slaves FALSE
job_is_first_task TRUE
urgency_slots min
accounting_summary FALSE
qsort_args NONE
"""

_TIGHT_PE = _PE.replace(f"pe_name {PE}", f"pe_name {TIGHT_PE}").replace(
    "control_slaves FALSE", "control_slaves TRUE"
)

_STARTER = """#!/bin/sh
# A site's GPU assignment: CUDA_VISIBLE_DEVICES for the job's -l gpu=N, from device 1.
n=$(qstat -j "$JOB_ID" | sed -n 's/^hard resource_list:.*gpu=\\([0-9]*\\).*/\\1/p')
if [ -n "$n" ] && [ "$n" -gt 0 ]; then
    CUDA_VISIBLE_DEVICES=$(seq -s, 1 "$n")
    export CUDA_VISIBLE_DEVICES
fi
exec "$@"
"""

_LIMITS = " ".join(
    f"{kind}_{name} INFINITY"
    for name in ("rt", "cpu", "fsize", "data", "stack", "core", "rss", "vmem")
    for kind in ("s", "h")
)


def missing() -> str | None:
    """Why Grid Engine cannot be started here, or None if it can."""
    if os.geteuid() != 0:
        return "starting sge_qmaster and sge_execd needs root"
    absent = [name for name in BINARIES if shutil.which(name) is None]
    absent += [d for d in ("sge_qmaster", "sge_execd") if not (DAEMONS / d).exists()]
    if absent or not (SGE_ROOT / CELL / "common" / "bootstrap").exists():
        return (
            f"Grid Engine is not installed (missing: {', '.join(absent) or 'its cell'}): "
            "apt-get install gridengine-master gridengine-exec gridengine-client"
        )
    return None


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What Grid Engine's commands need in their environment."""
    return {**os.environ, "SGE_ROOT": str(SGE_ROOT), "SGE_CELL": CELL, **(extra or {})}


def daemon_environment() -> dict[str, str]:
    """The daemons' environment: a clean one, since ``sge_execd`` hands its own
    environment on to every job (this process's ``APPORTION_HOME`` would reach them)."""
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "SGE_ROOT": str(SGE_ROOT),
        "SGE_CELL": CELL,
    }


class GridEngine:
    """The one-node cell (see the module docstring)."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self.root = Path(tempfile.mkdtemp(prefix="sge-test-"))
        self.root.chmod(0o755)
        self.started: list[str] = []

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=environment(),
            check=check,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )

    def _file(self, name: str, text: str) -> str:
        path = self.root / name
        path.write_text(text)
        path.chmod(0o755)
        return str(path)

    def _up(self) -> bool:
        return self.run("qconf", "-sh", check=False).returncode == 0

    def _apply(self, show: str, add: str, modify: str, name: str, text: str) -> None:
        exists = self.run("qconf", show, name, check=False).returncode == 0
        self.run("qconf", modify if exists else add, self._file(f"{name}.conf", text))

    def start(self, timeout: float = 30.0) -> None:
        if not self._up():  # else a master answers already: its files stay as they are
            common = SGE_ROOT / CELL / "common"
            (common / "act_qmaster").write_text(f"{self.host}\n")
            (common / "host_aliases").write_text(f"{self.host} localhost\n")
            subprocess.run(
                [str(DAEMONS / "sge_qmaster")], env=daemon_environment(), check=True, timeout=30
            )
            self.started.append("qmaster")
            self._wait(self._up, timeout, "sge_qmaster")
        self._configure()
        if not self._execd_pid():
            subprocess.run(
                [str(DAEMONS / "sge_execd")], env=daemon_environment(), check=True, timeout=30
            )
            self.started.append("execd")
        self._wait(self._queue_open, timeout, f"queue {QUEUE} open on {self.host}")

    def _configure(self) -> None:
        complexes = self.run("qconf", "-sc").stdout.splitlines()
        kept = [line for line in complexes if line.split()[:1] != ["gpu"]]
        if len(kept) + 1 != len(complexes) or GPU_COMPLEX not in complexes:
            text = "\n".join([*kept, GPU_COMPLEX]) + "\n"
            self.run("qconf", "-Mc", self._file("complexes", text))
        self.run("qconf", "-as", self.host)
        host = (
            f"hostname {self.host}\nload_scaling NONE\ncomplex_values gpu={GPUS}\n"
            "user_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\n"
            "usage_scaling NONE\nreport_variables NONE\n"
        )
        self._apply("-se", "-Ae", "-Me", self.host, host)
        self._apply("-sp", "-Ap", "-Mp", PE, _PE)
        self._apply("-sp", "-Ap", "-Mp", TIGHT_PE, _TIGHT_PE)
        starter = self._file("starter.sh", _STARTER)
        queue = "\n".join(
            [
                f"qname {QUEUE}",
                f"hostlist {self.host}",
                "seq_no 0",
                "load_thresholds NONE",
                "suspend_thresholds NONE",
                "nsuspend 1",
                "suspend_interval 00:05:00",
                "priority 0",
                "min_cpu_interval 00:05:00",
                "processors UNDEFINED",
                "qtype BATCH INTERACTIVE",
                "ckpt_list NONE",
                f"pe_list {PE} {TIGHT_PE}",
                "rerun FALSE",
                f"slots {SLOTS}",
                "tmpdir /tmp",
                "shell /bin/sh",
                "prolog NONE",
                "epilog NONE",
                "shell_start_mode unix_behavior",
                f"starter_method {starter}",
                "suspend_method NONE",
                "resume_method NONE",
                "terminate_method NONE",
                "notify 00:00:10",
                "owner_list NONE",
                "user_lists NONE",
                "xuser_lists NONE",
                "subordinate_list NONE",
                "complex_values NONE",
                "projects NONE",
                "xprojects NONE",
                "calendar NONE",
                "initial_state default",
                *(
                    f"{k} {v}"
                    for k, v in zip(_LIMITS.split()[::2], _LIMITS.split()[1::2], strict=True)
                ),
                "",
            ]
        )
        self._apply("-sq", "-Aq", "-Mq", QUEUE, queue)
        sconf = self.run("qconf", "-ssconf").stdout.splitlines()
        wanted = {"schedule_interval": "0:0:1", "flush_submit_sec": "1", "flush_finish_sec": "1"}
        lines = [
            f"{line.split()[0]} {wanted[line.split()[0]]}"
            if line.split()[:1] and line.split()[0] in wanted
            else line
            for line in sconf
        ]
        self.run("qconf", "-Msconf", self._file("sconf", "\n".join(lines) + "\n"))

    def _execd_pid(self) -> int | None:
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] == "sge_execd":
                return proc.pid
        return None

    def _queue_open(self) -> bool:
        out = self.run("qstat", "-f", "-q", QUEUE, check=False).stdout
        for line in out.splitlines():
            fields = line.split()
            if fields and fields[0] == f"{QUEUE}@{self.host}":
                return len(fields) == 5  # no sixth column: no state such as "au"
        return False

    def _wait(self, condition: object, timeout: float, what: str) -> None:
        assert callable(condition)
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        parts = []
        for path in Path("/var/spool/gridengine").glob("*/messages"):
            parts.append(f"--- {path}\n{path.read_text(errors='replace')[-3000:]}")
        for path in Path("/var/spool/gridengine/execd").glob("*/messages"):
            parts.append(f"--- {path}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    # --- jobs ----------------------------------------------------------------------

    def state(self, job: str) -> str:
        """The job's state letters (``qw``, ``r``...); "" once it is no longer listed."""
        out = self.run("qstat", "-u", "*", check=False).stdout
        for line in out.splitlines():
            fields = line.split()
            if len(fields) >= 5 and fields[0] == job:
                return fields[4]
        return ""

    def wait_gone(self, job: str, timeout: float) -> None:
        self._wait(lambda: not self.state(job), timeout, f"job {job} to end")

    # --- teardown ------------------------------------------------------------------

    def stop(self) -> None:
        """Delete every job; stop the daemons this object started; raise if they stay."""
        self.run("qdel", "-f", "-u", "*", check=False)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.run("qstat", "-u", "*", check=False).stdout:
            time.sleep(0.2)
        if "execd" in self.started:
            self.run("qconf", "-ke", self.host, check=False)
        if "qmaster" in self.started:
            self.run("qconf", "-km", check=False)
        deadline = time.monotonic() + 15
        names = {"sge_execd"} if "execd" in self.started else set()
        names |= {"sge_qmaster"} if "qmaster" in self.started else set()
        while time.monotonic() < deadline and self._alive(names):
            time.sleep(0.2)
        left = self._alive(names | {"sge_shepherd"})
        for proc in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(left, timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)
        if left:
            raise RuntimeError(f"Grid Engine processes left behind: {left}")

    def _alive(self, names: set[str]) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] in names and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        return found
