"""Real processes through ``apportion.runs.process``: output, exit, stopping trees.

Scripts print the pids of the processes they start, so a test can name each one and
check on the process table that it is gone; the ``watch`` fixture kills whatever a
test recorded, so a failing test leaves nothing running either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from apportion.runs.process import (
    ExitStatus,
    RunOutcome,
    RunProcess,
    RunStartError,
    run_command,
)

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]


class Watch:
    """Collects a run's output and remembers every process it started."""

    def __init__(self) -> None:
        self.started = time.time()
        #: The pids ``on_start`` was given: the commands'.
        self.leaders: list[int] = []
        #: Their process groups (their guards' pids).
        self.groups: list[int] = []
        self.processes: list[psutil.Process] = []
        self.cancels: list[threading.Event] = []
        self._chunks: list[bytes] = []
        self._changed = threading.Condition()

    def on_output(self, chunk: bytes) -> None:
        with self._changed:
            self._chunks.append(chunk)
            self._changed.notify_all()

    def on_start(self, pid: int) -> None:
        self.leaders.append(pid)
        # The command's group is its guard's: that is what clean-up looks for.
        with contextlib.suppress(OSError):
            self.groups.append(os.getpgid(pid))
        self._track(pid)

    @property
    def output(self) -> bytes:
        with self._changed:
            return b"".join(self._chunks)

    def printed_pids(self, count: int) -> list[int]:
        """The first ``count`` output lines, taken as pids of processes to track."""
        with self._changed:
            done = self._changed.wait_for(lambda: self.output.count(b"\n") >= count, timeout=10)
        assert done, f"expected {count} lines, got {self.output!r}"
        pids = [int(line) for line in self.output.splitlines()[:count]]
        for pid in pids:
            self._track(pid)
        return pids

    def _track(self, pid: int) -> None:
        # As a psutil.Process taken while it runs, so a reused pid is never killed.
        with contextlib.suppress(psutil.NoSuchProcess):
            self.processes.append(psutil.Process(pid))

    def all_gone(self) -> bool:
        """Whether every process recorded so far is gone."""
        return all(gone(p) for p in self.processes)

    def kill_all(self) -> None:
        for cancel in self.cancels:
            cancel.set()
        victims = list(self.processes)
        # Members of the runs' groups we never heard of, but only ones younger than
        # the test: a group id can outlive its run and be taken by another.
        for pid in psutil.pids():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(pid) in self.groups:
                    process = psutil.Process(pid)
                    if process.create_time() >= self.started - 1:
                        victims.append(process)
        for process in victims:
            with contextlib.suppress(psutil.Error):
                process.kill()
        # Not psutil.wait_procs: it waits for zombies too, which only init reaps.
        deadline = time.monotonic() + 5
        while not all(gone(p) for p in victims) and time.monotonic() < deadline:
            time.sleep(0.01)


@pytest.fixture
def watch() -> Iterator[Watch]:
    """A ``Watch`` whose processes are all killed when the test ends, whatever happened."""
    recorder = Watch()
    try:
        yield recorder
    finally:
        recorder.kill_all()


def gone(process: psutil.Process | int) -> bool:
    """Not in the process table, or a zombie (which holds nothing).

    A ``psutil.Process`` also counts as gone once its pid belongs to another process.
    """
    try:
        if isinstance(process, int):
            process = psutil.Process(process)
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def run(watch: Watch, script: str, **options: Any) -> RunOutcome:
    """``script`` under ``sh -c`` to its end, in the test's environment."""
    options.setdefault("cwd", os.getcwd())
    options.setdefault("env", dict(os.environ))
    options.setdefault("cancel", threading.Event())
    return run_command(
        ["sh", "-c", script], on_output=watch.on_output, on_start=watch.on_start, **options
    )


class Background:
    """``run`` in a thread, for tests that cancel it from here."""

    def __init__(self, watch: Watch, script: str, **options: Any) -> None:
        self.cancel = threading.Event()
        watch.cancels.append(self.cancel)
        self._outcome: RunOutcome | None = None

        def target() -> None:
            self._outcome = run(watch, script, cancel=self.cancel, **options)

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def outcome(self) -> RunOutcome:
        self._thread.join(timeout=10)
        assert self._outcome is not None, "run_command did not return"
        return self._outcome


# --- statuses ------------------------------------------------------------------------


def test_exit_status_describes_itself() -> None:
    assert ExitStatus.from_returncode(0).describe() == "exit code 0"
    assert ExitStatus.from_returncode(0).ok
    assert not ExitStatus.from_returncode(3).ok
    assert ExitStatus.from_returncode(-9).describe() == "killed by SIGKILL"
    assert ExitStatus(code=None, signal=None).describe() == "never started"


def test_exit_code_is_reported(watch: Watch) -> None:
    outcome = run(watch, "exit 3")
    assert outcome == RunOutcome(ExitStatus(3, None), "failed", "exit code 3", 0)


def test_killed_by_a_signal_is_described(watch: Watch) -> None:
    outcome = run(watch, "kill -KILL $$")
    assert outcome.status == ExitStatus(None, signal.SIGKILL)
    assert (outcome.reason, outcome.detail) == ("failed", "killed by SIGKILL")


# --- output, environment, starting ---------------------------------------------------


def test_stdout_and_stderr_keep_their_order(watch: Watch) -> None:
    outcome = run(watch, "echo 1; echo 2 >&2; echo 3; echo 4 >&2")
    assert (outcome.reason, outcome.detail) == ("completed", "exit code 0")
    assert watch.output == b"1\n2\n3\n4\n"


def test_large_output_is_all_delivered(watch: Watch) -> None:
    size = 5_000_000
    outcome = run(watch, f"head -c {size} /dev/zero; echo end")
    assert outcome.status.ok
    assert len(watch.output) == size + 4
    assert watch.output.endswith(b"\0end\n")


def test_env_and_cwd_are_applied(watch: Watch, tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "GREETING": "hello there"}
    outcome = run(
        watch, 'echo "$GREETING"; pwd -P; echo "${HOME-unset}"', cwd=str(tmp_path), env=env
    )
    assert outcome.status.ok
    assert watch.output.decode().splitlines() == ["hello there", str(tmp_path.resolve()), "unset"]


def test_on_start_gets_the_commands_pid_in_its_guards_group(watch: Watch) -> None:
    # It lingers so that on_start, which runs once it has started, finds it alive.
    run(watch, "echo $$ $(ps -o pgid= -p $$); sleep 0.5")
    command, group = (int(word) for word in watch.output.split())
    assert watch.leaders == [command]
    assert group != command and watch.groups == [group]


def test_missing_command_raises_a_clear_error() -> None:
    with pytest.raises(RunStartError) as caught:
        RunProcess.start(["nosuchcmd"], cwd=os.getcwd(), env=dict(os.environ), on_output=print)
    assert str(caught.value) == "cannot start 'nosuchcmd': No such file or directory"


def test_missing_command_could_not_start(watch: Watch) -> None:
    outcome = run_command(
        ["nosuchcmd"],
        cwd=os.getcwd(),
        env=dict(os.environ),
        on_output=watch.on_output,
        cancel=threading.Event(),
        on_start=watch.on_start,
    )
    assert outcome == RunOutcome(
        ExitStatus(None, None),
        "could not start",
        "cannot start 'nosuchcmd': No such file or directory",
        0,
    )
    assert watch.leaders == []


def test_missing_cwd_is_named(tmp_path: Path) -> None:
    cwd = str(tmp_path / "gone")
    with pytest.raises(RunStartError, match=f"cannot start 'true' in '{cwd}': No such file"):
        RunProcess.start(["true"], cwd=cwd, env=dict(os.environ), on_output=print)


def test_a_string_is_not_taken_for_an_argv() -> None:
    with pytest.raises(TypeError, match="list of arguments"):
        RunProcess.start("echo hi", cwd=os.getcwd(), env={}, on_output=print)


# --- stopping ------------------------------------------------------------------------


def test_cancel_stops_grandchildren_including_one_that_left_the_group(watch: Watch) -> None:
    script = "sleep 100 & echo $!; setsid sleep 100 & echo $!; sleep 100 & echo $!; wait"
    background = Background(watch, script, grace=5)
    pids = watch.printed_pids(3)
    background.cancel.set()
    outcome = background.outcome()
    assert outcome.reason == "cancelled"
    assert outcome.detail == "cancelled; stopped with SIGTERM"
    assert outcome.status == ExitStatus(None, signal.SIGTERM)
    assert len(watch.processes) == 4, "the leader and three sleeps, each seen running"
    assert watch.all_gone()
    assert all(gone(pid) for pid in pids)  # checked by pid in the process table too


def test_a_command_that_exits_by_itself_as_the_cancel_comes_ends_as_it_exited(
    watch: Watch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cancel is seen in the same instant as the command's own exit (here: the
    # watch says "cancelled" once it has exited): no signal was sent, so its own
    # status says how it ended, and a failure is not taken for the stop's doing.
    from apportion.runs import process as process_module

    def cancelled_once_exited(process: RunProcess, *_: object) -> str:
        assert process.wait(timeout=5) is not None
        return "cancelled"

    monkeypatch.setattr(process_module, "_watch", cancelled_once_exited)
    outcome = run(watch, "exit 3", grace=5)
    assert (outcome.reason, outcome.detail) == ("failed", "exit code 3")
    assert outcome.status == ExitStatus(3, None)
    outcome = run(watch, "exit 0", grace=5)
    assert (outcome.reason, outcome.detail) == ("completed", "exit code 0")


def test_a_stop_says_whether_the_command_had_exited_before_it(watch: Watch) -> None:
    running = RunProcess.start(
        ["sleep", "100"], cwd=os.getcwd(), env=dict(os.environ), on_output=watch.on_output
    )
    watch.on_start(running.command_pid)
    assert running.stop(grace=5) == ExitStatus(None, signal.SIGTERM)
    assert not running.exited_first
    exited = RunProcess.start(
        ["sh", "-c", "exit 3"], cwd=os.getcwd(), env=dict(os.environ), on_output=watch.on_output
    )
    watch.on_start(exited.command_pid)
    assert exited.wait(timeout=5) == ExitStatus(3, None)
    assert exited.stop(grace=5) == ExitStatus(3, None)
    assert exited.exited_first


def test_a_process_ignoring_sigterm_is_killed_after_the_grace(watch: Watch) -> None:
    # An ignored TERM is inherited, so the sleep ignores it too.
    background = Background(watch, "trap '' TERM; sleep 100 & echo $!; wait", grace=0.3)
    watch.printed_pids(1)
    background.cancel.set()
    outcome = background.outcome()
    assert outcome.status == ExitStatus(None, signal.SIGKILL)
    assert outcome.detail == "cancelled; stopped with SIGKILL after a 0.3s grace"
    assert watch.all_gone()


def test_time_limit_stops_the_run(watch: Watch) -> None:
    outcome = run(watch, "exec sleep 10", time_limit=0.3, grace=5)
    assert outcome.reason == "timed out"
    assert outcome.detail == "killed after its time limit of 0.3s"
    assert outcome.status == ExitStatus(None, signal.SIGTERM)
    assert watch.all_gone()


def test_leftovers_are_stopped_after_the_leader_exits(watch: Watch) -> None:
    outcome = run(watch, "sleep 100 & echo $!; exit 0", grace=5)
    assert outcome.reason == "completed"
    assert outcome.leftovers == 1
    assert outcome.detail == "exit code 0; stopped 1 leftover process"
    [sleeper] = watch.printed_pids(1)
    assert gone(sleeper)  # by pid: it was stopped before the test read its pid


def test_helper_that_left_the_group_is_found_by_a_scan_during_the_run(watch: Watch) -> None:
    # Once the command exits, the setsid'ed helper is out of the group and has the
    # guard (a subreaper) for parent, or init where there is none: the guard's
    # tree, or the record of an earlier scan (the first at 0.1 s), ties it to the run.
    outcome = run(watch, "setsid sleep 100 & echo $!; sleep 0.4", grace=5)
    [helper] = watch.printed_pids(1)
    assert outcome.leftovers == 1
    assert gone(helper)


def test_stop_is_idempotent_and_leaves_no_member(watch: Watch) -> None:
    process = RunProcess.start(
        ["sh", "-c", "sleep 100 & echo $!; wait"],
        cwd=os.getcwd(),
        env=dict(os.environ),
        on_output=watch.on_output,
    )
    watch.on_start(process.command_pid)
    [sleeper] = watch.printed_pids(1)
    assert process.poll() is None
    assert process.members() == sorted([process.command_pid, sleeper])
    assert process.stop(grace=5) == ExitStatus(None, signal.SIGTERM)
    assert process.stop(grace=5) == ExitStatus(None, signal.SIGTERM)
    assert process.members() == []
    assert process.wait(timeout=5) == ExitStatus(None, signal.SIGTERM)
    assert not process.sigkill_sent


def test_on_start_failing_stops_the_run(watch: Watch) -> None:
    def fail(pid: int) -> None:
        watch.on_start(pid)
        raise RuntimeError("bookkeeping failed")

    with pytest.raises(RuntimeError, match="bookkeeping failed"):
        run_command(
            ["sleep", "100"],
            cwd=os.getcwd(),
            env=dict(os.environ),
            on_output=watch.on_output,
            cancel=threading.Event(),
            on_start=fail,
            grace=5,
        )
    assert watch.all_gone()


def test_a_failing_on_output_is_logged_and_the_run_still_ends(
    watch: Watch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(chunk: bytes) -> None:
        raise OSError("disk full")

    # More than a pipe holds: had the reader stopped reading, the command would block.
    outcome = run_command(
        ["head", "-c", "1000000", "/dev/zero"],
        cwd=os.getcwd(),
        env=dict(os.environ),
        on_output=broken,
        cancel=threading.Event(),
        on_start=watch.on_start,
    )
    assert outcome.reason == "completed"
    assert "on_output failed; the rest of its output is dropped" in caplog.text
