"""The worker's end of its guard server, which forks a guard for each run.

Starting a Python interpreter for each run's guard costs ~10 ms of CPU, more than
a short command itself; forking a small process that has already started costs a
fraction of a millisecond. So the worker starts, on its first run, one
``python -I -S guard.py --serve FD`` process (the *server*, ``runs/guard.py``) and
asks it for each guard over a Unix socket pair (``SOCK_SEQPACKET``: one message per
request, and end of file when the worker's end closes). A request is one byte with
three descriptors (``SCM_RIGHTS``): the read end of the run's life line, the write
end of its report pipe and of its output pipe. Everything else the guard needs
(argv, directory, environment) comes on the life line, which has no size limit.

The server dies with the worker: when the worker's end of the socket closes (the
kernel closes it, however the worker dies) and, for a process the worker forked
without exec that still holds that end, by its parent-death signal. The guards it
forked then see their parent change and kill their runs. A server that died
(killed by hand) is noticed on the next request, which starts a new one.

The server runs in its own session, in ``/`` (it must pin no directory), and its
stderr is kept for the one line that says why it failed.
"""

from __future__ import annotations

import atexit
import contextlib
import socket
import subprocess
import threading
from array import array

__all__ = ["GuardServer", "GuardServerGone", "server_for"]

#: Seconds to wait for a server that stopped answering to exit and say why.
EXIT_WAIT = 5.0


class GuardServerGone(Exception):
    """The server is not there any more (it died, or was never able to start)."""


class GuardServer:
    """One running server; ``request`` asks it for a guard."""

    def __init__(self, executable: str, script: str) -> None:
        """Start the server; ``OSError`` if the executable cannot be run."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._popen = subprocess.Popen(
                [executable, "-I", "-S", script, "--serve", str(theirs.fileno())],
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._channel = ours
        #: The server's pid (tests look at it).
        self.pid = self._popen.pid

    def request(self, life: int, report: int, output: int) -> None:
        """Ask for a guard holding these three descriptors (the server gets copies);
        ``GuardServerGone`` if the server is not there to be asked."""
        fds = array("i", [life, report, output])
        try:
            self._channel.sendmsg([b"g"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except OSError as exc:  # EPIPE, ECONNREFUSED: the other end is closed
            raise GuardServerGone(str(exc)) from exc

    def gone(self) -> bool:
        """Whether the server has exited, after a short wait: called when a request
        got no answer, so either it has died or a guard failed."""
        try:
            self._popen.wait(0.5)
        except subprocess.TimeoutExpired:
            return False
        return True

    def failure(self) -> str:
        """Why the server exited: the last line it wrote, else how it ended."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(EXIT_WAIT)
        said = ""
        if self._popen.stderr is not None and self._popen.returncode is not None:
            said = self._popen.stderr.read().decode(errors="replace").strip()
        if said:
            return said.splitlines()[-1]
        returncode = self._popen.returncode
        if returncode is None:
            return "it stopped answering"
        if returncode < 0:
            return f"it was killed by signal {-returncode}"
        return f"it exited with code {returncode}"

    def close(self) -> None:
        """Let the server go (its guards, and so their runs, go with it)."""
        self._channel.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(EXIT_WAIT)
        if self._popen.stderr is not None:
            self._popen.stderr.close()


_servers: dict[tuple[str, str], GuardServer] = {}
_servers_lock = threading.Lock()


def server_for(
    executable: str, script: str, *, replacing: GuardServer | None = None
) -> tuple[GuardServer, bool]:
    """This process's server running ``script`` with ``executable``, started if there
    is none or if it is ``replacing`` (found gone); whether it was started now."""
    key = (executable, script)
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server is not replacing:
            return server, False
        if server is not None:
            server.close()
        server = GuardServer(executable, script)
        _servers[key] = server
        return server, True


@atexit.register
def _close_all() -> None:
    """Let every server go as this process ends, rather than leave their pipes and
    processes to the garbage collector: a worker has stopped its runs by then, and a
    run left now would die with the process all the same."""
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()
