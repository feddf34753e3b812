"""The fork server: worker processes forked from one interpreter that has already
imported the worker's code, instead of a fresh interpreter for each.

A fresh ``python -m apportion.cli.main worker`` spends most of its start on the
interpreter's own start and on imports; ``apportion worker --nworkers 200`` on a
small node pays that 200 times. The supervisor's end (``worker.fork_spawn``) starts
this server once, as ``python -m apportion.worker.fork_server --serve FD``, in the
environment its workers get, so that what is read only at a process's start
(glibc's ``MALLOC_TRIM_THRESHOLD_``, the interpreter's ``PYTHON*`` variables) is in
effect in every fork. The server imports ``PRELOAD``, freezes what it has allocated
(``gc.freeze``: the collector then leaves those pages shared with the forks), and
forks one child per request.

FD is a ``SOCK_SEQPACKET`` socket to the supervisor, one JSON object per message
(end of file when the supervisor's end closes, however the supervisor ended):

- server: ``{"ready": PID}`` once its imports are done;
- supervisor: ``{"spawn": ARGV, "env": {...}}``, answered ``{"started": PID}`` or
  ``{"failed": REASON}`` (``fork`` refused);
- supervisor: ``{"signal": [PID, SIG]}``, unanswered: the server sends it, as the
  only process that knows PID is still its own (not yet reaped) child, so a pid
  the system has given to another process since is never signalled;
- server: ``{"exited": [PID, CODE]}`` as each child is reaped; CODE follows
  ``subprocess.Popen.returncode`` (negative: killed by that signal).

A child becomes what ARGV (``[python, "-m", MODULE, ARG...]`` or ``[python, "-c",
CODE, ARG...]``) would have started: the server's stack unwinds (``serve`` returns
the request), its descriptors close, its signal handlers are undone, the
environment becomes ENV, and the module or code runs as ``__main__`` and ends as an
interpreter ends (non-daemon threads joined, ``atexit``, exit status). What only a
fresh interpreter would do differs: ``PYTHON*`` variables in ENV are not read again,
and the forks share the server's hash seed (``random`` re-seeds itself at a fork).

The server blocks SIGINT and SIGTERM: Ctrl-C, or a batch system's signal to the
process group, is for the supervisor, which passes it on to the workers and lets
them drain; the server must outlive them, since a worker whose parent goes away
stops at once (its ``SUPERVISOR_PID_VARIABLE`` names the server). It exits at end of
file (or once its parent changes), without touching its children: as workers whose
supervisor was SIGKILLed, they see their parent change and leave by themselves.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any

#: What a worker process imports before it starts serving (``cli.worker.run_one``).
PRELOAD = (
    "apportion.cli.main",
    "apportion.cli.worker",
    "apportion.client.dask_default",
    "apportion.net.security",
    "apportion.runs.launcher",
    "apportion.runs.live",
    "apportion.worker.memory_manager",
    "apportion.worker.service",
)

#: The largest message: a request's argv and environment.
MAX_MESSAGE = 1 << 20

#: The forms of ARGV a fork can stand in for (after the interpreter).
FORMS = ("-m", "-c")


@dataclass(frozen=True)
class Request:
    """What one child is to run, handed from the server's loop to the child."""

    argv: list[str]
    env: dict[str, str]


def send(channel: socket.socket, message: dict[str, Any]) -> None:
    channel.send(json.dumps(message).encode())


def serve(channel_fd: int, preload: tuple[str, ...] = PRELOAD) -> Request | None:
    """Fork a child for each request until the supervisor is gone; in the server
    that returns None, in each child its ``Request``."""
    supervisor = os.getppid()
    channel = socket.socket(fileno=channel_fd)
    taken = _take_signals()
    wake_read = taken.wake_read
    for name in preload:
        importlib.import_module(name)
    gc.freeze()
    children: set[int] = set()
    poller = select.poll()
    poller.register(channel_fd, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    try:
        send(channel, {"ready": os.getpid()})
        while True:
            _reap(children, channel)
            if os.getppid() != supervisor:
                return None
            for fd, _ in poller.poll():
                if fd == wake_read:
                    _drain(wake_read)
                    continue
                data = channel.recv(MAX_MESSAGE)
                if not data:
                    return None  # end of file: the supervisor closed its end, or died
                message = json.loads(data)
                if "signal" in message:
                    pid, sig = message["signal"]
                    if pid in children:  # not reaped: still ours, alive or a zombie
                        os.kill(pid, sig)
                    continue
                pid = _fork(channel)
                if pid == 0:
                    _give_back_signals(taken)
                    return Request(list(message["spawn"]), dict(message["env"]))
                if pid > 0:
                    children.add(pid)
    except OSError:  # EPIPE, ECONNRESET: the supervisor is gone
        return None


#: The signals that are the supervisor's to pass on, not the server's to act on.
HELD = frozenset({signal.SIGINT, signal.SIGTERM})


@dataclass(frozen=True)
class Signals:
    """What the server changed of its signal handling, to undo in each child."""

    sigchld: Any
    mask: set[int | signal.Signals]
    wake_read: int
    wake_write: int


def _take_signals() -> Signals:
    """Block SIGINT and SIGTERM, and have SIGCHLD wake the loop through a pipe.

    Blocked rather than ignored: a child that is sent one before it has undone
    this finds it pending and acts on it as a fresh process would (an ignored
    signal would be lost); pending signals are not inherited, so a SIGTERM the
    server got is not passed on to its later children."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    sigchld = signal.signal(signal.SIGCHLD, _wake)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    return Signals(sigchld, mask, wake_read, wake_write)


def _give_back_signals(taken: Signals) -> None:
    """In a child: the signal handling the server started with, and no wake-up pipe."""
    signal.set_wakeup_fd(-1)
    os.close(taken.wake_read)
    os.close(taken.wake_write)
    signal.signal(signal.SIGCHLD, taken.sigchld)
    signal.pthread_sigmask(signal.SIG_SETMASK, taken.mask)


def _fork(channel: socket.socket) -> int:
    """Fork and say so: 0 in the child (which has let go of ``channel``), the child's
    pid in the server, -1 if the system refused."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        send(channel, {"failed": f"fork: {exc}"})
        return -1
    if pid == 0:
        channel.close()
    else:
        send(channel, {"started": pid})
    return pid


def _reap(children: set[int], channel: socket.socket) -> None:
    """Reap every child that ended and say how."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        send(channel, {"exited": [pid, os.waitstatus_to_exitcode(status)]})


def _wake(signum: int, frame: object) -> None:
    """SIGCHLD's handler: the wake-up descriptor, not this, wakes the loop."""


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.read(fd, 4096)


def run(request: Request) -> None:
    """In a child: become what ``request.argv`` would have started."""
    os.environ.clear()
    os.environ.update(request.env)
    form, what, *args = request.argv[1:]
    if form == "-m":
        import runpy

        # As under ``-m``, the module runs once, as ``__main__``: the copy the preload
        # imported under its own name is dropped (and warned about if left).
        sys.modules.pop(what, None)
        sys.argv = [what, *args]  # run_module puts the module's file first, as -m does
        runpy.run_module(what, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args]
        exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "--serve" or not argv[2].isdigit():
        print("usage: python -m apportion.worker.fork_server --serve CHANNEL_FD", file=sys.stderr)
        return 2
    request = serve(int(argv[2]))
    if request is None:
        return 0
    run(request)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
