"""Runs one run's command on a worker, and stops all of it when asked.

Theory of operation. The command starts under a guard (``runs/guard.py``), a
small process that leads a session and process group of its own and starts the
command as its child in that group, so one ``killpg`` of the guard's pid reaches
every process that stayed in the group. Guards are forked by this worker's guard
server (``runs/guard_server.py``), started on the first run: a fork costs a
fraction of a millisecond where starting an interpreter per run cost ~10 ms. The
guard holds one end of a pipe whose other end only this process holds: when the
worker dies, by any signal, the kernel closes it and the guard SIGKILLs the whole
run at once, before the scheduler can start the run elsewhere. No file is written
for this, so nothing depends on who owns a shared directory. The guard ignores
every other signal, so stopping the run is unchanged: it is the command that feels
TERM. Once every process of the run is gone, closing the pipe lets the guard go.

A process that left the group (``setsid``; a daemonised helper still holding a GPU)
is found by ancestry instead: every scan records the live descendants of the guard,
the group and what was recorded before. The guard is a child subreaper (Linux), so
a process of the run whose parent exits is re-parented to it rather than to init
and stays traceable to the run. ``run_command`` scans now and then while the run
goes on (at growing gaps, so a long run costs almost nothing); stops scan before
and after signalling.

Stopping is SIGTERM (then SIGCONT, so a stopped process wakes up to act on it), a
grace period, then SIGKILL until nothing is left. Zombies count as gone: they hold
nothing, and their parent (the guard, init or a subreaper) reaps them. The guard
reports the command's wait status on a second pipe the moment it reaps it; a waiter
thread reads it, and that is the run's exit, noticed at once rather than by polling.
End of the reports means the guard is gone (the server, not this process, reaps
it); if that comes first, the run was killed with its group (SIGKILL), or with its
server.

stdout and stderr share one pipe so the log keeps their order, and a reader thread
hands every read to ``on_output`` as soon as it returns. Leftover processes keep the
pipe open, so output is only known to end once they are gone; a holder that no scan
found is given up on with a warning rather than waited for forever.

Limit: where the guard cannot be a subreaper (not Linux), a helper that leaves
the group *and* loses its parent between two scans escapes (a double-forking daemon
does both within milliseconds).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from io import FileIO
from signal import SIGCONT, SIGKILL, SIGTERM
from typing import BinaryIO, Literal

import psutil

from apportion.runs.exit_status import NEVER_STARTED, ExitStatus
from apportion.runs.guard_start import RunStartError, command_started, guard_spec, start_guard

__all__ = ["ExitStatus", "RunOutcome", "RunProcess", "RunStartError", "run_command"]

logger = logging.getLogger("apportion.runs")

#: Largest single read of output: Linux's default pipe capacity, so one read
#: usually empties a full pipe.
READ_SIZE = 64 * 1024
#: Once output comes, the reader lets more gather for this long (or up to this many
#: bytes) and delivers it as one chunk: each delivery costs the worker and the
#: scheduler a message, so thousands of small writes must not become thousands of
#: messages, nor thousands of wake-ups of the reader.
GATHER_SECONDS = 0.005
GATHER_BYTES = 1 << 20
#: Pipe capacity asked for (Linux; the default is 64 KiB), so that a command writing
#: fast is not held up while output gathers.
PIPE_SIZE = 1 << 20
#: Reads made for a reader that is given up on: what the pipe holds then (the reads
#: are bounded because the unknown writer may keep writing).
_LAST_READS = 16
#: Seconds between looks at the cancel event; an exit is noticed at once regardless.
CANCEL_POLL = 0.05
#: Seconds to the first descendant scan of a running command, and the longest gap
#: between scans (each reads every process's /proc entry: ~60 µs per process).
SCAN_FIRST = 0.1
SCAN_MAX = 5.0
#: Seconds to wait for end of output once every process we know of is gone, before
#: deciding that some process we never found holds the pipe.
OUTPUT_CLOSE_WAIT = 1.0
#: Longest gap while polling for processes to vanish: they are not our children,
#: so no event says when they do.
GONE_POLL_MAX = 0.1
#: A process in uninterruptible sleep outlives SIGKILL until its I/O ends; say so
#: this often (seconds) instead of waiting without a word.
STUCK_WARNING_EVERY = 10.0


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The run's live processes at one moment."""

    #: By pid: the process group's members and every descendant found or recorded.
    processes: dict[int, psutil.Process]
    #: Those in the run's process group, which one ``killpg`` reaches.
    in_group: frozenset[int]

    def outside_group(self) -> list[psutil.Process]:
        """Those that must be signalled one by one."""
        return [p for pid, p in self.processes.items() if pid not in self.in_group]


class RunProcess:
    """One run's command under its guard, in their own session and process group.

    Made by ``start``. Two daemon threads serve it: one delivers output, one hears
    the guard's reports. ``stop`` and ``reap_leftovers`` leave no process of the run
    behind, then let the guard go.
    """

    def __init__(
        self,
        guard_pid: int,
        output: FileIO,
        on_output: Callable[[bytes], None],
        *,
        life: int,
        reports: BinaryIO,
        command_pid: int,
    ) -> None:
        """Use ``start``: this takes over a just-started guard (``guard_pid``), the
        read end of the run's output, the worker's end of its life line and the pipe
        of its reports."""
        #: The guard's pid, which is also the run's process-group (and session) id.
        self.pid: int = guard_pid
        #: The command's pid (the guard's child): the one users know the run by.
        self.command_pid = command_pid
        #: The worker's end of the life line: closing it lets the guard kill the group.
        self._life: int | None = life
        self._reports = reports
        #: The command's ``returncode`` once the guard reported it (or the guard's own,
        #: if it died first: killed with the group).
        self._returncode: int | None = None
        #: Whether processes of the run may be left after the command exited (the
        #: guard said so, or cannot tell).
        self._others_left = True
        #: True once a stop had to escalate to SIGKILL.
        self.sigkill_sent = False
        #: Set by the first ``stop`` if the command had already exited by itself then,
        #: before anything was signalled: its end is its own, not the stop's.
        self.exited_first = False
        self._stop_asked = False
        self._output = output
        self._on_output = on_output
        #: Set once ``on_output`` raised: the rest of the output is read and dropped,
        #: since a reader that stopped reading would block the command on a full pipe.
        self._output_failed = False
        #: Serialises scans and stops, so that concurrent ``stop`` calls stop once.
        self._lock = threading.RLock()
        #: Live processes of the run other than the command, by pid, kept from scan to
        #: scan so that one which left the group and lost its parent is still found.
        self._recorded: dict[int, psutil.Process] = {}
        #: Processes we may not signal (another user's); left alone, not waited for.
        self._unkillable: set[psutil.Process] = set()
        #: Set once the command has exited, so ``_returncode`` is known.
        self._exited = threading.Event()
        #: Set once the reader has finished: end of output, or given up on.
        self._drained = threading.Event()
        #: A byte here wakes the reader to give up; written only while open, under
        #: the lock, since the reader closes it and the fd number may be reused.
        self._wake_read, self._wake_write = os.pipe()
        self._wake_lock = threading.Lock()
        self._wake_open = True
        os.set_blocking(self._output.fileno(), False)
        with contextlib.suppress(OSError, AttributeError):  # not Linux, or over the limit
            fcntl.fcntl(self._output.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self._waiter = threading.Thread(target=self._hear_guard, name=f"run-{self.pid}-guard")
        self._reader = threading.Thread(target=self._read_output, name=f"run-{self.pid}-output")
        self._waiter.daemon = self._reader.daemon = True

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        on_output: Callable[[bytes], None],
    ) -> RunProcess:
        """Start ``argv`` in ``cwd`` with exactly ``env``; ``RunStartError`` if it cannot.

        stdin is /dev/null (nobody will type into it); stdout and stderr share one
        pipe. ``on_output`` is called from the reader thread, one call at a time.
        """
        if isinstance(argv, str):
            raise TypeError(f"argv must be a list of arguments, not the string {argv!r}")
        if not argv:
            raise RunStartError("cannot start an empty command")
        if not sys.executable:
            raise RunStartError(f"cannot start {argv[0]!r}: no Python to run its guard with")
        try:
            spec = guard_spec(argv, cwd, env)
        except ValueError as exc:
            raise RunStartError(f"cannot start {argv[0]!r}: {exc}") from exc
        guard_pid, life, reports, output = start_guard(argv[0], spec)
        command_pid = command_started(reports, life, output, argv[0], cwd)
        process = cls(
            guard_pid, output, on_output, life=life, reports=reports, command_pid=command_pid
        )
        try:
            process._waiter.start()
            process._reader.start()
        except BaseException:
            process._abort()
            raise
        return process

    def release(self) -> None:
        """Let the guard go (it kills what is left of its group, itself included).

        Called once every process of the run is gone; calling it again does nothing.
        """
        with self._lock:
            life, self._life = self._life, None
        if life is not None:
            os.close(life)

    # --- state -----------------------------------------------------------------------

    def poll(self) -> ExitStatus | None:
        """The command's status once it has exited (its output may still be flowing)."""
        return self._status() if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> ExitStatus | None:
        """The command's status once it exited and all output was delivered; None on timeout.

        Leftover processes hold the output open, so this waits for them too.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._exited.wait(timeout):
            return None
        if not self._drained.wait(None if deadline is None else deadline - time.monotonic()):
            return None
        return self._status()

    def members(self) -> list[int]:
        """Pids still alive in the group (the guard aside) or among the run's descendants."""
        with self._lock:
            return sorted(self._scan().processes)

    # --- stopping --------------------------------------------------------------------

    def stop(self, grace: float) -> ExitStatus:
        """Stop every process of the run: SIGTERM, up to ``grace`` seconds, then SIGKILL.

        Returns once none of them exists, with the command's status (which is its own
        exit status if it had already exited). Calling it again does no harm.
        """
        with self._lock:
            if not self._stop_asked:
                self._stop_asked = True
                self.exited_first = self._exited.is_set()
            self._terminate(grace)
        self._exited.wait()  # the command is dead by now; the guard is saying so
        self.release()
        return self._status()

    def reap_leftovers(self, grace: float) -> int:
        """Stop what the command left running when it exited; how many were found.

        Helpers daemonised by the command (a server holding a GPU) would otherwise
        hold the worker's resources after the run is reported done.
        """
        if not self._exited.is_set():
            raise RuntimeError(f"run {self.pid} is still running; stop it instead")
        if not self._recorded and not self._others_left:
            # The common case, and cheap: the guard, to which every orphan of the run
            # is re-parented, had no child left, and no process was seen leaving;
            # the scan of the whole process table is skipped.
            self.release()
            return 0
        with self._lock:
            found = self._terminate(grace)
        self.release()
        return found

    def _terminate(self, grace: float) -> int:
        """TERM, grace, KILL; returns how many processes there were."""
        first = self._scan()
        if not first.processes:
            return 0
        self._signal(first, SIGTERM)
        # Scanning again catches children forked while we signalled; those outside
        # the group were not reached by killpg. Nothing gets TERM twice: a second
        # TERM turns some programs' orderly shutdown into an abrupt one.
        after = self._scan()
        late = {pid: p for pid, p in after.processes.items() if pid not in first.processes}
        self._signal(_Snapshot(late, after.in_group), SIGTERM, group=False)
        self._signal(after, SIGCONT)
        if not self._wait_gone(grace):
            self._kill_until_gone()
        return len(first.processes)

    def _wait_gone(self, timeout: float) -> bool:
        """Whether every process of the run vanished within ``timeout``."""
        deadline = time.monotonic() + timeout
        gap = 0.005
        while self._scan().processes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._pause(min(gap, remaining))
            gap = min(2 * gap, GONE_POLL_MAX)
        return True

    def _kill_until_gone(self) -> None:
        self.sigkill_sent = True
        warn_at = time.monotonic() + STUCK_WARNING_EVERY
        gap = 0.005
        while True:
            snapshot = self._scan()
            if not snapshot.processes:
                return
            # Every process one by one as well as the group: KILL cannot be taken
            # twice, and one we may not signal is found this way and left alone.
            self._signal(snapshot, SIGKILL)
            for process in snapshot.processes.values():
                self._send(process, SIGKILL)
            if time.monotonic() >= warn_at:
                warn_at += STUCK_WARNING_EVERY
                logger.warning(
                    "run %d: pids %s outlive SIGKILL (uninterruptible sleep?); still waiting",
                    self.pid,
                    sorted(snapshot.processes),
                )
            self._pause(gap)
            gap = min(2 * gap, GONE_POLL_MAX)

    def _signal(self, snapshot: _Snapshot, sig: int, *, group: bool = True) -> None:
        """Send ``sig`` to the group (if ``group``) and to those outside it."""
        if group:
            # ESRCH: nobody left in the group. EPERM: only members we may not signal,
            # which the one-by-one KILL finds and reports.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
        for process in snapshot.outside_group():
            self._send(process, sig)

    def _send(self, process: psutil.Process, sig: int) -> None:
        try:
            # psutil refuses a pid that was reused by another process since the scan.
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied:
            logger.error(
                "run %d: may not signal pid %d (another user's?); leaving it running",
                self.pid,
                process.pid,
            )
            self._unkillable.add(process)

    def _pause(self, seconds: float) -> None:
        # The command's exit is an event; wake for it rather than sleep through it.
        if self._exited.is_set():
            time.sleep(seconds)
        else:
            self._exited.wait(seconds)

    # --- finding the run's processes ---------------------------------------------------

    def _scan(self) -> _Snapshot:
        """The run's live processes now (the guard aside, which ``release`` ends);
        they become the recorded descendants."""
        live: dict[int, psutil.Process] = {}
        children: dict[int, list[int]] = {}
        group: set[int] = set()
        for pid in psutil.pids():
            found_live = _live_process(pid)
            if found_live is None or found_live[0] in self._unkillable:
                continue
            live[pid] = found_live[0]
            children.setdefault(found_live[1], []).append(pid)
            if _pgid(pid) == self.pid:
                group.add(pid)
        group.discard(self.pid)
        stack = [
            *group,
            *children.get(self.pid, ()),
            *(pid for pid, p in self._recorded.items() if live.get(pid) == p),
        ]
        found: dict[int, psutil.Process] = {}
        while stack:
            pid = stack.pop()
            if pid not in found and pid != self.pid:
                found[pid] = live[pid]
                stack.extend(children.get(pid, ()))
        self._recorded = found
        return _Snapshot(found, frozenset(group))

    # --- threads and output ----------------------------------------------------------

    def _hear_guard(self) -> None:
        """Hear the guard until it is gone: the command's exit, then end of reports."""
        try:
            for line in self._reports:
                words = line.split()
                if len(words) == 3 and words[0] == b"exited" and not self._exited.is_set():
                    self._returncode = os.waitstatus_to_exitcode(int(words[1]))
                    self._others_left = words[2] != b"0"
                    self._exited.set()
        finally:
            # End of reports: the guard is dead (only it holds their write end).
            self._reports.close()
            if self._returncode is None:
                # It died before the command's end reached it: SIGKILL to the group,
                # or its server died. The run was killed, and anything may be left.
                self._returncode = -SIGKILL
            self._exited.set()

    def _wait_exit(self, timeout: float) -> bool:
        """Whether the command has exited, waiting up to ``timeout`` for it."""
        return self._exited.wait(timeout)

    def _status(self) -> ExitStatus:
        returncode = self._returncode
        assert returncode is not None, "only called once the command has exited"
        return ExitStatus.from_returncode(returncode)

    def _read_output(self) -> None:
        fd = self._output.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)
        woken = select.poll()  # while output gathers, only a give-up cuts it short
        woken.register(self._wake_read, select.POLLIN)
        try:
            while True:
                ready = {ready_fd for ready_fd, _ in poller.poll()}
                if self._wake_read in ready:
                    # Given up on: deliver what is there now, not what comes later.
                    for _ in range(_LAST_READS):
                        chunk = _read(fd)
                        if not chunk:
                            return
                        self._deliver(chunk)
                    return
                chunk = _read(fd)
                if chunk == b"":
                    return
                if chunk is not None:
                    chunk, ended = self._gather(fd, woken, chunk)
                    self._deliver(chunk)
                    if ended:
                        return
        finally:
            self._close_pipes()
            self._drained.set()

    def _gather(self, fd: int, woken: select.poll, first: bytes) -> tuple[bytes, bool]:
        """``first`` and what else came within ``GATHER_SECONDS`` (up to ``GATHER_BYTES``);
        whether the output ended meanwhile. A give-up (``woken``) ends it at once."""
        if woken.poll(GATHER_SECONDS * 1000):
            return first, False
        parts, size = [first], len(first)
        while size < GATHER_BYTES:
            more = _read(fd)
            if more is None:
                break
            if more == b"":
                return b"".join(parts), True
            parts.append(more)
            size += len(more)
        return b"".join(parts), False

    def _deliver(self, chunk: bytes) -> None:
        if self._output_failed:
            return
        try:
            self._on_output(chunk)
        except Exception:
            self._output_failed = True
            logger.exception(
                "run %d: on_output failed; the rest of its output is dropped", self.pid
            )

    def _finish_output(self) -> None:
        """Wait for end of output; give up on it if a process we never found holds it."""
        if not self._drained.wait(OUTPUT_CLOSE_WAIT):
            logger.warning(
                "run %d: a process outside the run holds its output open; "
                "output written from now on is dropped",
                self.pid,
            )
            with self._wake_lock:
                if self._wake_open:
                    os.write(self._wake_write, b"x")
        self._reader.join()

    def _close_pipes(self) -> None:
        with self._wake_lock:
            self._wake_open = False
            os.close(self._wake_write)
        os.close(self._wake_read)
        self._output.close()

    def _abort(self) -> None:
        """Kill and reap the run after its threads failed to start."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, SIGKILL)
        self.release()
        if not self._waiter.is_alive():
            self._reports.close()
        if not self._reader.is_alive():
            self._close_pipes()


def _live_process(pid: int) -> tuple[psutil.Process, int] | None:
    """``pid``'s process and parent pid, or None if it is gone or a zombie."""
    try:
        process = psutil.Process(pid)  # records the start time: a reused pid is told apart
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            return process, int(process.ppid())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _pgid(pid: int) -> int | None:
    if pid == 0:  # getpgid(0) would be our own group
        return None
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _read(fd: int) -> bytes | None:
    """Up to ``READ_SIZE`` bytes as they are; b"" at end of output; None if none yet."""
    try:
        return os.read(fd, READ_SIZE)
    except BlockingIOError:
        return None


# --- the worker's one call ---------------------------------------------------------------


#: Why a run ended, in the words shown to users.
Reason = Literal["completed", "failed", "timed out", "cancelled", "preempted", "could not start"]


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How a run ended, once all of its processes are gone."""

    #: The command's status; both fields None if it never started.
    status: ExitStatus
    #: ``"completed"``, ``"failed"``, ``"timed out"``, ``"cancelled"``, ``"preempted"`` (a
    #: cancel that was an interruption, ``runs.live``) or ``"could not start"``.
    reason: Reason
    #: One line for users: ``"exit code 3"``, ``"cancelled; stopped with SIGTERM"``.
    detail: str
    #: Processes still running after the command exited by itself, which were stopped.
    leftovers: int


def run_command(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    on_output: Callable[[bytes], None],
    cancel: threading.Event,
    time_limit: float | None = None,
    grace: float = 10.0,
    on_start: Callable[[int], None] | None = None,
) -> RunOutcome:
    """Run ``argv`` until it exits, ``cancel`` is set or ``time_limit`` passes.

    Blocks (call it in a thread) and returns only when every process of the run is
    gone and all its output was delivered. A cancelled or timed-out run is stopped
    with ``RunProcess.stop(grace)``; after a normal exit, leftovers get the same
    treatment. ``on_start(pid)`` is called once the command runs; if it raises, the
    run is stopped and the exception propagates.
    """
    if cancel.is_set():
        return RunOutcome(NEVER_STARTED, "cancelled", "cancelled before it started", 0)
    try:
        process = RunProcess.start(argv, cwd=cwd, env=env, on_output=on_output)
    except RunStartError as exc:
        return RunOutcome(NEVER_STARTED, "could not start", str(exc), 0)
    try:
        if on_start is not None:
            on_start(process.command_pid)
        ending = _watch(process, cancel, time_limit)
        if ending == "exited":
            return _after_exit(process, grace)
        status = process.stop(grace)
        how = f"SIGKILL after a {grace:g}s grace" if process.sigkill_sent else "SIGTERM"
        if ending == "cancelled" and process.exited_first:
            # It exited by itself in the moment the cancel came, before any signal:
            # its own status says how it ended (a failure is not the stop's doing).
            return RunOutcome(status, "completed" if status.ok else "failed", status.describe(), 0)
        if ending == "cancelled":
            return RunOutcome(status, "cancelled", f"cancelled; stopped with {how}", 0)
        detail = f"killed after its time limit of {time_limit:g}s"
        if process.sigkill_sent:
            detail += f" ({how})"
        return RunOutcome(status, "timed out", detail, 0)
    except BaseException:
        process.stop(grace)
        raise
    finally:
        process.release()
        process._finish_output()


def _watch(
    process: RunProcess, cancel: threading.Event, time_limit: float | None
) -> Literal["exited", "cancelled", "timed out"]:
    """Wait for the first of: exit, cancel, time limit; record descendants meanwhile."""
    now = time.monotonic()
    deadline = None if time_limit is None else now + time_limit
    scan_gap = SCAN_FIRST
    scan_at = now + scan_gap
    while True:
        timeout = CANCEL_POLL if deadline is None else min(CANCEL_POLL, deadline - now)
        if process._wait_exit(max(0.0, timeout)):
            return "exited"
        if cancel.is_set():
            return "cancelled"
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return "timed out"
        if now >= scan_at:
            process.members()  # records descendants that may lose their parent later
            scan_gap = min(2 * scan_gap, SCAN_MAX)
            scan_at = now + scan_gap


def _after_exit(process: RunProcess, grace: float) -> RunOutcome:
    leftovers = process.reap_leftovers(grace)
    status = process.poll()
    assert status is not None, "the command has exited"
    detail = status.describe()
    if leftovers:
        detail += f"; stopped {leftovers} leftover process{'es' if leftovers > 1 else ''}"
    return RunOutcome(status, "completed" if status.ok else "failed", detail, leftovers)
