"""A real OpenSSH server for one test: its own host key, one client key in its own
authorized_keys, root login by key only, on a free port of one address, all under a
temporary directory. ``ssh_options`` are the client arguments that reach it and
nothing else (no user config, the test's known_hosts, strict host key checking).

Needs root (sshd logs in as the user running it only when root) and
``/usr/sbin/sshd``; ``skip_reason()`` says which is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def skip_reason() -> str | None:
    """Why a real sshd cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root: sshd only logs in as root when it runs as root"
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        return "needs OpenSSH (/usr/sbin/sshd and ssh)"
    if shutil.which("ssh-keygen") is None:
        return "needs ssh-keygen"
    return None


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


class SSHServer:
    """One ``sshd -D -e`` on ``address``; ``prefix`` runs it elsewhere (``ip netns exec``)."""

    def __init__(self, directory: Path, address: str = "127.0.0.1", port: int = 0) -> None:
        self.directory = directory
        self.address = address
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / "sshd.log"

    def start(self, prefix: Sequence[str] = ()) -> SSHServer:
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
                check=True,
                stdin=subprocess.DEVNULL,
            )
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        if not self.port:
            self.port = _free_port(self.address)
        kind, key = (d / "host_key.pub").read_text().split()[:2]
        (d / "known_hosts").write_text(f"[{self.address}]:{self.port} {kind} {key}\n")
        (d / "sshd_config").write_text(
            f"ListenAddress {self.address}\n"
            f"Port {self.port}\n"
            f"HostKey {d / 'host_key'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\n"
            "PidFile none\n"
            "UsePAM no\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "StrictModes no\n"
            "LogLevel ERROR\n"
        )
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [*prefix, SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_ready(prefix)
        return self

    def _wait_ready(self, prefix: Sequence[str]) -> None:
        """Until a real login works (sshd listening is not enough to say it accepts)."""
        deadline = time.monotonic() + 20
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"sshd ended:\n{self.log.read_text()}")
            done = subprocess.run(
                [*prefix, "ssh", *self.ssh_options(), self.address, "true"],
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=20,
            )
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                said = done.stderr.decode()
                raise AssertionError(f"cannot log in: {said}\n{self.log.read_text()}")
            time.sleep(0.1)

    def ssh_options(self) -> list[str]:
        """Client arguments that reach this server with this test's key only."""
        d = self.directory
        return [
            "-F",
            "/dev/null",
            "-p",
            str(self.port),
            "-i",
            str(d / "client_key"),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={d / 'known_hosts'}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "User=root",
        ]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()


#: The variable the remote Python wrapper sets: every remote process of a test has it.
MARK_VARIABLE = "APPORTION_SSH_TEST_MARK"


def remote_python(directory: Path, mark: str) -> Path:
    """A script standing for the remote hosts' Python: this interpreter, with this
    checkout of apportion on its path, and ``mark`` in the environment of every process
    started through it (so that the test can find them, and no one else's)."""
    import sys

    import apportion

    source = Path(apportion.__file__).resolve().parents[1]
    script = directory / "remote-python"
    script.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={source} {MARK_VARIABLE}={mark}\n"
        f'exec {sys.executable} "$@"\n'
    )
    script.chmod(0o755)
    return script


def marked_processes(mark: str) -> list[int]:
    """The pids of live processes started through ``remote_python(..., mark)``."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK_VARIABLE) == mark and proc.status() != "zombie":
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_marked(mark: str) -> None:
    """Kill whatever a failed test left behind."""
    for pid in marked_processes(mark):
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
