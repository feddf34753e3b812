"""The supervisor's end of the fork server (``worker.fork_server``): a ``Spawner``
that forks each worker process from an interpreter that has already imported the
worker's code, so a worker's start costs its own work, not an interpreter's start
and its imports.

``ForkSpawner`` is what ``Supervisor`` is given instead of ``popen_spawn``; the
supervisor's policy is unchanged. A child it returns behaves as the ``Popen`` of
the same command line would: same options (the command line runs in the fork),
environment (``worker_environment`` plus ``SUPERVISOR_PID_VARIABLE``, naming the
server, the child's parent), default signal handlers, exit status (negative for a
signal), process group (the server is started in ours, and forks stay in it).

The server starts on the first spawn and again on the next one if it died; a
command line that is not ``[python, -m|-c, ...]`` with our interpreter, a system
without ``fork``, or a server that could not start falls back to ``popen_spawn``.
A server that dies under its children leaves them orphans, which stop by
themselves; they are killed here as well, and count as killed by SIGKILL, so that
the supervisor starts their replacements at once with no two workers of one name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from apportion.worker.fork_server import FORMS, MAX_MESSAGE
from apportion.worker.supervisor import (
    SUPERVISOR_PID_VARIABLE,
    ChildProcess,
    popen_spawn,
    worker_environment,
)

logger = logging.getLogger("apportion.supervisor")

#: Seconds the server may take to start and import the worker's code.
READY_TIMEOUT = 60.0

#: Seconds to wait for the server's answer to a spawn (a fork).
SPAWN_TIMEOUT = 30.0


class ForkServerUnavailable(Exception):
    """The server could not start, or is gone."""


class ForkedChild:
    """A worker process forked by the server: the part of ``Popen`` the supervisor uses."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args
        #: As ``Popen.returncode``: None while it runs.
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._server.changed:
            if not self._server.changed.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # as Popen: an ended child is not signalled
            self._server.signal(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One running server and the thread that reads what it says."""

    def __init__(
        self,
        env: dict[str, str],
        executable: str = sys.executable,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        """Start the server in ``env`` and wait until it has imported the worker's
        code; ``ForkServerUnavailable`` if it does not get there."""
        self.executable = executable
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [executable, "-m", "apportion.worker.fork_server", "--serve", str(theirs.fileno())]
        try:
            # Our process group (not a session of its own): a batch system that
            # kills the job's group kills the server and its forks with it.
            self._popen = subprocess.Popen(argv, env=env, pass_fds=(theirs.fileno(),))
        except OSError as exc:
            ours.close()
            raise ForkServerUnavailable(str(exc)) from exc
        finally:
            theirs.close()
        self._channel = ours
        self.pid = self._popen.pid
        self.changed = threading.Condition()
        self._children: dict[int, ForkedChild] = {}
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._spawning = threading.Lock()
        self._closing = False
        #: Set once the server is gone (died, or closed).
        self.gone = False
        ours.settimeout(ready_timeout)
        try:
            ready = self._receive()
        except OSError as exc:  # socket.timeout included
            self._popen.kill()
            self._popen.wait()
            ours.close()
            raise ForkServerUnavailable(f"it did not start: {exc}") from exc
        if ready is None:
            ours.close()
            raise ForkServerUnavailable(f"it exited with status {self._popen.wait()}")
        ours.settimeout(None)
        self._reader = threading.Thread(
            target=self._read, name="apportion-fork-server", daemon=True
        )
        self._reader.start()

    def _receive(self) -> dict[str, Any] | None:
        data = self._channel.recv(MAX_MESSAGE)
        return json.loads(data) if data else None

    def spawn(self, argv: list[str], env: dict[str, str]) -> ForkedChild:
        """Fork a child running ``argv`` in ``env``; ``ForkServerUnavailable`` if
        the server is gone, ``OSError`` if it could not fork."""
        with self._spawning:
            if self.gone:
                raise ForkServerUnavailable("it is gone")
            try:
                self._channel.send(json.dumps({"spawn": argv, "env": env}).encode())
            except OSError as exc:
                raise ForkServerUnavailable(str(exc)) from exc
            try:
                reply = self._replies.get(timeout=SPAWN_TIMEOUT)
            except queue.Empty:
                raise ForkServerUnavailable("it did not answer a spawn") from None
        if "failed" in reply:
            raise OSError(reply["failed"])
        if "gone" in reply:
            raise ForkServerUnavailable("it is gone")
        child: ForkedChild = reply["child"]
        child.args = argv
        return child

    def signal(self, pid: int, sig: int) -> None:
        with contextlib.suppress(OSError):  # gone: its children were killed already
            self._channel.send(json.dumps({"signal": [pid, sig]}).encode())

    def _read(self) -> None:
        while True:
            try:
                message = self._receive()
            except OSError:
                message = None
            if message is None:
                self._lost()
                return
            if "exited" in message:
                pid, code = message["exited"]
                with self.changed:
                    child = self._children.pop(pid, None)
                    if child is not None:
                        child.returncode = code
                    self.changed.notify_all()
            elif "started" in message:
                # Registered here, since its "exited" may come next, before the
                # spawning thread has woken up (handed the child itself, not its pid).
                child = ForkedChild(self, message["started"], [])
                with self.changed:
                    self._children[child.pid] = child
                self._replies.put({"child": child})
            else:
                self._replies.put(message)

    def _lost(self) -> None:
        """The server's end closed: it died, or we closed ours."""
        with self.changed:
            self.gone = True
            if not self._closing and self._children:
                logger.warning(
                    "the fork server (pid %d) died; killing its %d worker processes",
                    self.pid,
                    len(self._children),
                )
            for pid, child in self._children.items():
                if not self._closing:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                    child.returncode = -signal.SIGKILL
            if not self._closing:
                self._children.clear()
            self.changed.notify_all()
        self._replies.put({"gone": True})

    def close(self, timeout: float = 5.0) -> None:
        """Let the server go; children still running (there should be none: the
        supervisor stopped them) see their parent change and stop by themselves."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._channel.shutdown(socket.SHUT_RDWR)
        self._reader.join(timeout)
        self._channel.close()
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()


def forkable(argv: list[str], executable: str = sys.executable) -> bool:
    """Whether a fork of the server can stand in for starting ``argv``."""
    return len(argv) >= 3 and argv[0] == executable and argv[1] in FORMS


#: Whether this system can fork (not Windows).
CAN_FORK = hasattr(os, "fork")


class ForkSpawner:
    """A ``Spawner`` that forks each child from a ``ForkServer``, started on first
    use and again when it is found gone, with ``popen_spawn`` as the fallback."""

    def __init__(self) -> None:
        self._server: ForkServer | None = None
        self._broken = not CAN_FORK
        self._lock = threading.Lock()

    @property
    def server(self) -> ForkServer | None:
        return self._server

    def __call__(self, argv: list[str]) -> ChildProcess:
        if self._broken or not forkable(argv):
            return popen_spawn(argv)
        for _ in range(2):  # a server found gone is replaced once
            server = self._running()
            if server is None:
                return popen_spawn(argv)
            env = {**worker_environment(os.environ), SUPERVISOR_PID_VARIABLE: str(server.pid)}
            try:
                return server.spawn(argv, env)
            except ForkServerUnavailable:
                continue
        return popen_spawn(argv)

    def _running(self) -> ForkServer | None:
        with self._lock:
            if self._server is not None and not self._server.gone:
                return self._server
            if self._server is not None:
                self._server.close()
            try:
                self._server = ForkServer(worker_environment(os.environ))
            except ForkServerUnavailable as exc:
                logger.warning(
                    "the fork server could not start (%s); starting each worker "
                    "process as a fresh interpreter instead",
                    exc,
                )
                self._server = None
                self._broken = True
            return self._server

    def close(self) -> None:
        """Let the server go, if one was started."""
        with self._lock:
            if self._server is not None:
                self._server.close()
                self._server = None
