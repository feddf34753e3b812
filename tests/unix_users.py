"""Ordinary Unix users made for a test, and a Python they may run apportion with.

Only root may make users; ``skip_reason()`` says why a test cannot have them. Every
user is removed at the end, with every process it still has, however the test ends:
a run's command that outlived its worker would otherwise outlive the test too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import apportion


def skip_reason() -> str | None:
    """Why this machine cannot make test users, or None."""
    if os.geteuid() != 0:
        return "making ordinary Unix users needs root"
    for tool in ("useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def interpreter_for(user: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]] | None:
    """A Python that ``user`` may run and that imports apportion, and the environment
    it needs: this one, else the system's of the same version with this one's packages
    on the path (this one may lie in a home only its owner may enter); None if neither
    works."""
    packages = next(p for p in sys.path if p.endswith("site-packages"))
    candidates = [([sys.executable], env)]
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is not None:
        path = f"{env['PYTHONPATH']}:{packages}"
        candidates.append(([system], {**env, "PYTHONPATH": path}))
    for argv, candidate_env in candidates:
        check = [*argv, "-c", "import sys, apportion; print(sys.version_info[:2])"]
        try:
            found = subprocess.run(
                check,
                env=candidate_env,
                user=user,
                group=user,
                extra_groups=[],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except PermissionError:
            continue
        if found.returncode == 0 and found.stdout.strip() == str(sys.version_info[:2]):
            return argv, candidate_env
    return None


def no_python_reason(user: str) -> str:
    return (
        f"{user} can run no Python {sys.version_info.major}.{sys.version_info.minor} that "
        f"imports apportion: {sys.executable} is in a directory they may not enter, and "
        "no system Python fits"
    )


@dataclass
class UnixUser:
    """A user with a home of its own and the environment a login would give it."""

    name: str
    home: Path
    uid: int
    python: list[str]
    env: dict[str, str]
    #: Processes started as this user, for the logs shown when a test fails.
    logs: list[Path] = field(default_factory=list)
    #: Processes started as this user, waited for at the end.
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, *args: str) -> list[str]:
        """``apportion ARGS`` as this user would type it."""
        return [*self.python, "-m", "apportion.cli.main", *args]

    def run(
        self, *args: str, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``apportion ARGS`` run to its end as this user, in its home."""
        return subprocess.run(
            self.command(*args),
            **self._as_user(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``apportion ARGS`` started as this user, in a session of its own, its output
        in a log file."""
        log = Path(tempfile.mkdtemp(prefix="apportion-user-log-")) / "output.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                self.command(*args),
                **self._as_user(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started.append(proc)
        return proc

    def _as_user(self, env: dict[str, str] | None) -> dict[str, Any]:
        """The ``subprocess`` arguments that run a command as this user, in its home."""
        return {
            "env": {**self.env, **(env or {})},
            "user": self.name,
            "group": self.name,
            "extra_groups": [],
            "cwd": self.home,
        }

    def output(self) -> str:
        """Everything its processes printed, for an assertion's message."""
        return "\n".join(f"--- {log}\n{log.read_text(errors='replace')}" for log in self.logs)

    def processes(self) -> list[psutil.Process]:
        """Every process this user has now."""
        found = []
        for proc in psutil.process_iter(["uids"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["uids"] and proc.info["uids"].real == self.uid:
                    found.append(proc)
        return found


@contextlib.contextmanager
def unix_users(count: int) -> Iterator[list[UnixUser]]:
    """``count`` new users, each with a home under one directory all may traverse (as
    ``/home`` is), logged in with a plain environment: no apportion variable, the
    machine's shared ``/tmp``. Removed at the end with all their processes."""
    base = Path(tempfile.mkdtemp(prefix="apportion-users-"))
    base.chmod(0o755)
    users: list[UnixUser] = []
    try:
        for _ in range(count):
            name = f"apt{secrets.token_hex(4)}"
            home = base / name
            subprocess.run(
                ["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/sh", name],
                check=True,
                timeout=30,
                capture_output=True,
            )
            uid = int(
                subprocess.run(
                    ["id", "-u", name], check=True, capture_output=True, text=True, timeout=10
                ).stdout
            )
            users.append(UnixUser(name, home, uid, [], {}))
            env = {
                "HOME": str(home),
                "USER": name,
                "LOGNAME": name,
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "PYTHONPATH": str(Path(apportion.__file__).parents[1]),
            }
            found = interpreter_for(name, env)
            if found is None:
                import pytest

                pytest.skip(no_python_reason(name))
            users[-1].python, users[-1].env = found
        yield users
    finally:
        for user in users:
            _end_processes(user)
            subprocess.run(
                ["userdel", "--remove", user.name], check=False, timeout=30, capture_output=True
            )
        shutil.rmtree(base, ignore_errors=True)
        for user in users:
            for log in user.logs:
                shutil.rmtree(log.parent, ignore_errors=True)


def _end_processes(user: UnixUser) -> None:
    """TERM every process of ``user``, then KILL what is left after a grace."""
    left = user.processes()
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(left, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    deadline = time.monotonic() + 5
    while user.processes() and time.monotonic() < deadline:
        for proc in user.processes():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        time.sleep(0.05)
    for proc in user.started:
        proc.wait(timeout=5)
