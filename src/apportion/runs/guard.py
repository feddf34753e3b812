"""The guard of one run: leads the run's process group and kills it if the worker dies;
and the server that forks a guard for each run.

A run's command must not outlive its worker, however the worker ends: a worker
killed with SIGKILL (by its supervisor for its memory, by the kernel, by hand)
cannot stop anything, and the scheduler starts the run again elsewhere at once,
so a command left running would run twice and hold what its next attempt is given
(a GPU). No file can carry this duty safely (another user may own or plant it),
so the kernel does: each run has a guard, the leader of a new session and process
group, which starts the command as its child, in that group. The guard holds the
read end of a pipe (the *life line*) whose write end only the worker holds,
close-on-exec. When the worker dies, the kernel closes it, the guard's ``poll``
wakes within microseconds, and the guard SIGKILLs the whole group at once (itself
too) and, first, every descendant of its own that left the group.

The guard is also a *child subreaper* (Linux): a process of the run whose parent
exits is re-parented to the guard, not to init, so no process of the run ever
leaves the guard's tree, and the worker's scans find it.

Everything else about the run is the worker's: it signals the group to stop it
(the guard catches every signal and ignores it, so only the command feels them;
SIGKILL takes the guard too), and it closes the life line once every process of
the run is gone, which makes the guard kill the group (only itself by then).

The server. Starting an interpreter per run costs more than a short command, so
the worker starts one ``python -I -S guard.py --serve CHANNEL_FD`` (the *server*,
see ``guard_server``) and each guard is a fork of it: a fraction of a millisecond.
The server is single-threaded, so a fork holds nothing of another run. CHANNEL_FD
is a ``SOCK_SEQPACKET`` socket to the worker; each message brings, with
``SCM_RIGHTS``, the read end of a run's life line and the write ends of its report
pipe and of its output. The server forks; the child makes a new session, puts
/dev/null on stdin and the output on stdout and stderr, and is that run's guard.
The server exits at end of file on the socket (the worker died, however, or let
it go), or when its parent changes (``PR_SET_PDEATHSIG``: a process the worker
forked without exec may hold the socket); each guard has the same alarm on the
server, so its run dies with it. The server reaps the guards.

Protocol of a guard. The worker writes on the life line: ``ARGC SIZE`` and a
newline, then SIZE bytes of NUL-separated argv, directory and ``NAME=VALUE``
environment entries. (Not the guard's own environment: Python changes its own,
``LC_CTYPE`` under the C locale, which the command must not inherit.) On the report
pipe the guard writes ``guard PID`` (its own, the run's process group), then
``started PID``, or ``failed ERRNO`` (and exits 127) if the command could not be
executed, or ``nocwd ERRNO`` if the directory could not be entered; then
``exited STATUS LEFT`` once the command ends: its raw wait status, and 1 if
processes of the run are still its children then (0: none of the run's processes
is left anywhere). End of file on the report pipe means the guard is gone.

This file is run by path with ``-I -S`` and imports the standard library only:
importing apportion would cost a large fraction of a second of CPU. It imports as
little as it can (``_signal`` rather than ``signal``, which imports ``enum``; no
``contextlib``), for the server's start delays a worker's first run.
"""

import os
import select
import sys

# mypy knows ``signal`` only; ``_signal`` is its C core, the same functions with
# plain ints for signals and handlers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import Any
else:
    import _signal as signal

#: Linux ``prctl`` options (``<linux/prctl.h>``).
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

#: Signals the guard cannot catch, and those it leaves as they are.
UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})


def _prctl(option: int, value: int) -> bool:
    """Call Linux's ``prctl``; False where there is none (another system) or it fails.

    ``ctypes`` is loaded once, by the server, before it forks any guard; neither
    the parent-death signal nor being a subreaper is inherited by a fork."""
    global _libc
    try:
        if _libc is None:
            import ctypes

            _libc = ctypes.CDLL(None, use_errno=True)
        return bool(_libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


_libc: "Any" = None


def take_signals(wake_fd: int) -> set[int]:
    """Catch every catchable signal with a handler that only wakes the loop; returns
    the signals the command must get with their default action.

    Signals the guard was started with ignored stay ignored (the command inherits
    that, as it would have without a guard); Python ignores SIGPIPE and SIGXFSZ
    itself, which the command must not inherit.
    """
    restore: set[int] = {signal.SIGPIPE}
    if hasattr(signal, "SIGXFSZ"):
        restore.add(signal.SIGXFSZ)
    for sig in signal.valid_signals():
        if sig in UNCATCHABLE or sig in restore:
            continue
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue
            signal.signal(sig, _wake)
        except (OSError, ValueError):  # real-time signals some libcs reserve
            continue
        restore.add(sig)
    signal.set_wakeup_fd(wake_fd, warn_on_full_buffer=False)
    return restore


def _wake(signum: int, frame: object) -> None:
    """Nothing to do: ``set_wakeup_fd`` has already woken the loop."""


def descendants(root: int, proc: str = "/proc") -> dict[int, int]:
    """The live descendants of ``root``, as pid -> process group, read from ``proc``."""
    parents: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        names = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as file:
                text = file.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        fields = text[text.rfind(b")") + 2 :].split()
        if len(fields) < 3 or fields[0] == b"Z":
            continue
        pid = int(name)
        parents.setdefault(int(fields[1]), []).append(pid)
        groups[pid] = int(fields[2])
    found: dict[int, int] = {}
    stack = list(parents.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found[pid] = groups[pid]
            stack.extend(parents.get(pid, ()))
    return found


def kill_all() -> None:
    """SIGKILL every process of the run: the descendants that left the group one by
    one, then the whole group at once, the guard with it."""
    me = os.getpid()
    if has_children():  # else no descendant at all: the usual release, no scan
        for pid, group in descendants(me).items():
            if group != me:
                try:  # noqa: SIM105 (contextlib costs the guard 3 ms of start)
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    os.killpg(0, signal.SIGKILL)
    os._exit(137)  # not reached: the signal above is ours too


def has_children() -> bool:
    """Whether any process is our child (none is reaped here)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def report(fd: int, line: str) -> None:
    """Tell the worker; a worker that cannot hear any more is dead."""
    try:
        os.write(fd, line.encode() + b"\n")
    except OSError:
        kill_all()


def reap(child: int) -> tuple[int | None, bool]:
    """Reap every child that exited: ``(child's wait status or None, children left)``."""
    status = None
    while True:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status, False
        if pid == 0:
            return status, True
        if pid == child:
            status = raw


def read_spec(life: int) -> tuple[list[bytes], bytes, dict[bytes, bytes]] | None:
    """The run's ``(argv, cwd, environment)``, as the worker writes them first on the
    life line; None if the line closed before they were all there (the worker died)."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(life, 65536)
        if not chunk:
            return None
        data += chunk
    header, _, payload = data.partition(b"\n")
    argc, size = (int(word) for word in header.split())
    while len(payload) < size:
        chunk = os.read(life, 1 << 20)
        if not chunk:
            return None
        payload += chunk
    items = payload.split(b"\0")
    entries = (entry.partition(b"=") for entry in items[argc + 1 :] if entry)
    return items[:argc], items[argc], {name: value for name, _, value in entries}


def spawn(
    command: list[bytes], env: dict[bytes, bytes], restore: set[int], ignore: set[int]
) -> tuple[int, int | None]:
    """Start ``command`` with ``env`` (searched on its ``PATH``) as our child, with
    ``restore`` back to their default actions and ``ignore`` ignored; ``(pid, None)``,
    or ``(0, errno)`` if it cannot be executed.

    A plain fork and exec, as ``subprocess`` does: ``posix_spawn`` would leave glibc's
    internal signals ignored in the command.
    """
    errors, errors_write = os.pipe()  # close-on-exec: end of file means it runs
    child = os.fork()
    if child == 0:
        try:
            os.close(errors)
            for sig in restore:
                signal.signal(sig, signal.SIG_DFL)
            for sig in ignore:
                signal.signal(sig, signal.SIG_IGN)
            os.execvpe(command[0], command, env)
        except OSError as exc:
            os.write(errors_write, str(exc.errno or 0).encode())
        finally:
            os._exit(127)
    os.close(errors_write)
    with os.fdopen(errors, "rb") as said:
        failure = said.read()
    if failure:
        os.waitpid(child, 0)
        return 0, int(failure)
    return child, None


def guard(life: int, report_fd: int, parent: int) -> int:
    """Run one run under this process, a child of ``parent`` (the server) that leads a
    session of its own; returns only if the command could not start."""
    # The command must hold neither end: a report pipe kept open by the command
    # would hide the guard's death from the worker.
    os.set_inheritable(life, False)
    os.set_inheritable(report_fd, False)
    spec = read_spec(life)
    if spec is None:
        return 0  # the worker died before the run began: nothing to stop
    command, cwd, env = spec
    try:
        os.chdir(cwd)
    except OSError as exc:
        report(report_fd, f"nocwd {exc.errno or 0}")
        return 127
    wake_read, wake_write = _wake_pipe()
    restore = take_signals(wake_write)
    # The parent-death signal must wake us even where the worker ignores it (nohup):
    # we catch it all the same, and the command still ignores it.
    ignore: set[int] = set()
    if signal.SIGHUP not in restore:
        signal.signal(signal.SIGHUP, _wake)
        ignore.add(signal.SIGHUP)
    # Without a subreaper (not Linux), an orphan of the run goes to init: the guard
    # cannot then say that nothing is left.
    adopts_orphans = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGHUP)
    if os.getppid() != parent:  # the server died before the alarm was set
        kill_all()
    child, error = spawn(command, env, restore, ignore)
    if error is not None:
        report(report_fd, f"failed {error}")
        return 127
    report(report_fd, f"started {child}")
    # The output is the command's: it ends when the command's processes close it.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    poller = select.poll()
    poller.register(life, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    running = True
    while True:
        if running:
            status, left = reap(child)
            if status is not None:
                report(report_fd, f"exited {status} {int(left or not adopts_orphans)}")
                running = False
        else:
            reap(child)  # orphans of the run, re-parented to us
        if os.getppid() != parent:
            kill_all()
        for fd, _ in poller.poll():
            if fd == life:
                # EOF (the worker died, or let go of a finished run); the worker
                # writes nothing after the spec, and anything is no reason to stay.
                kill_all()
            else:
                _drain(wake_read)


def _wake_pipe() -> tuple[int, int]:
    """A pipe for ``set_wakeup_fd``: neither end may block."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    os.set_blocking(wake_read, False)
    return wake_read, wake_write


def _drain(fd: int) -> None:
    try:  # noqa: SIM105 (contextlib costs the guard 3 ms of start)
        os.read(fd, 4096)
    except BlockingIOError:
        pass


# --- the server ------------------------------------------------------------------------


#: Room for the three descriptors of a request (``int`` is 4 bytes on Linux).
_FDS_PER_REQUEST = 3


def serve(channel_fd: int) -> int:
    """Fork a guard for each request on ``channel_fd`` until the worker is gone."""
    import socket  # once per worker: its enum costs nothing per run

    worker = os.getppid()
    channel = socket.socket(fileno=channel_fd)
    channel.setblocking(False)
    # What the worker gave us, which each guard takes back before it looks at what
    # the command must inherit.
    saved: dict[int, Any] = {sig: signal.getsignal(sig) for sig in (signal.SIGCHLD, signal.SIGHUP)}
    wake_read, wake_write = _wake_pipe()
    for sig in saved:
        signal.signal(sig, _wake)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    # SIGHUP when the thread that started us ends: only a changed parent counts.
    _prctl(PR_SET_PDEATHSIG, signal.SIGHUP)  # also loads ctypes for every guard
    me = os.getpid()
    poller = select.poll()
    poller.register(channel_fd, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    space = socket.CMSG_SPACE(_FDS_PER_REQUEST * 4)
    while True:
        _reap_all()
        if os.getppid() != worker:
            return 0  # our guards see us go: their parent changes too
        while True:
            try:
                data, ancillary, _, _ = channel.recvmsg(16, space, socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                break
            fds = [
                int.from_bytes(cmsg[i : i + 4], sys.byteorder, signed=True)
                for level, kind, cmsg in ancillary
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                for i in range(0, len(cmsg) - len(cmsg) % 4, 4)
            ]
            if not data:
                return 0  # end of file: the worker closed its end, or died
            if len(fds) == _FDS_PER_REQUEST and os.fork() == 0:
                code = 1
                try:
                    os.close(channel_fd)
                    os.close(wake_read)
                    os.close(wake_write)
                    code = _start_guard(fds, saved, me)
                except BaseException:
                    sys.excepthook(*sys.exc_info())  # on the run's output, if it got there
                finally:
                    os._exit(code)
            for fd in fds:
                os.close(fd)
        for fd, _ in poller.poll():
            if fd == wake_read:
                _drain(wake_read)


def _start_guard(fds: list[int], saved: "dict[int, Any]", server: int) -> int:
    """In a child just forked by the server: become a run's guard."""
    life, report_fd, output = fds
    signal.set_wakeup_fd(-1)
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(devnull)
    os.close(output)
    report(report_fd, f"guard {os.getpid()}")
    return guard(life, report_fd, server)


def _reap_all() -> None:
    """Reap every guard that ended (none is anyone else's to wait for)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "--serve" or not argv[2].isdigit():
        print("usage: python -I -S guard.py --serve CHANNEL_FD", file=sys.stderr)
        return 2
    return serve(int(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
