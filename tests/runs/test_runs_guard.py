"""A run's guard: the command's whole process group dies with the worker, by any signal.

The pure part (reading the process tree) is tested on a fake ``/proc``; the rest
with a stand-in worker process (``WORKER`` below: it starts a run through
``RunProcess`` and prints the pids the command prints), killed as a worker would be.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from apportion.runs import guard, guard_server
from apportion.runs import guard_start as process_module
from apportion.runs.process import ExitStatus, RunProcess, RunStartError, run_command
from cli_processes import poll

#: Starts the command given as arguments through ``RunProcess`` and prints its output;
#: with ``--fork`` first, a child forked without exec keeps the worker's end of the
#: life line open (as a function task calling ``os.fork`` would) and prints its pid.
WORKER = """\
import os, sys, time
from apportion.runs import guard_server
from apportion.runs.process import RunProcess
fork = sys.argv[1] == "--fork"
argv = sys.argv[2:] if fork else sys.argv[1:]
def out(chunk):
    sys.stdout.buffer.write(chunk)
    sys.stdout.flush()
process = RunProcess.start(argv, cwd=os.getcwd(), env=dict(os.environ), on_output=out)
[server] = guard_server._servers.values()
print("guard", process.pid, "server", server.pid, flush=True)
if fork:
    child = os.fork()
    if child == 0:
        time.sleep(300)
        os._exit(0)
    print("forked", child, flush=True)
time.sleep(300)
"""


def _stat_line(pid: int, name: str, state: str, ppid: int, pgrp: int) -> str:
    return f"{pid} ({name}) {state} {ppid} {pgrp} {pgrp} 0 -1 0\n"


def test_descendants_are_read_from_proc_whatever_the_command_names(tmp_path: Path) -> None:
    tree = {
        10: ("guard", "S", 1, 10),
        11: ("sh", "S", 10, 10),
        12: ("a) (b c", "S", 11, 10),  # a name that looks like more fields
        13: ("daemon", "S", 10, 13),  # left the group, re-parented to the guard
        14: ("dead", "Z", 11, 10),  # a zombie holds nothing
        15: ("grandchild", "R", 13, 13),
        20: ("elsewhere", "S", 1, 20),
    }
    for pid, (name, state, ppid, pgrp) in tree.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat_line(pid, name, state, ppid, pgrp))
    (tmp_path / "self").mkdir()
    (tmp_path / "99").mkdir()  # vanished between the listing and the read
    assert guard.descendants(10, str(tmp_path)) == {11: 10, 12: 10, 13: 13, 15: 13}
    assert guard.descendants(20, str(tmp_path)) == {}
    assert guard.descendants(10, str(tmp_path / "missing")) == {}


@pytest.mark.process
@pytest.mark.timeout(60)
def test_the_guard_catches_every_signal_but_those_it_cannot_or_was_told_to_ignore() -> None:
    """The command must get what it would have got without a guard: default actions
    (SIGPIPE too, which Python ignores), and an inherited ignore kept."""
    script = (
        "import os, signal, sys; sys.path.insert(0, sys.argv[1]); import guard; "
        "r, w = os.pipe(); os.set_blocking(w, False); "
        "print(*sorted(int(s) for s in guard.take_signals(w))); "
        "print(signal.getsignal(signal.SIGTERM) is guard._wake, "
        "signal.getsignal(signal.SIGHUP) == signal.SIG_IGN)"
    )
    python = [sys.executable, "-I", "-S", "-c", script, str(Path(guard.__file__).parent)]
    found = subprocess.run(  # started with SIGHUP ignored, as under nohup
        ["sh", "-c", 'trap "" HUP; exec "$@"', "sh", *python],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert found.returncode == 0, found.stderr
    restored_text, handlers = found.stdout.splitlines()
    restored = {int(word) for word in restored_text.split()}
    assert {signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGCHLD} <= restored
    assert signal.SIGHUP not in restored  # ignored before: stays ignored for the command
    assert not restored & {signal.SIGKILL, signal.SIGSTOP}
    assert handlers == "True True"


# --- real processes ----------------------------------------------------------------------


class Family:
    """Every process a test's stand-in workers and their runs started, killed at the end."""

    def __init__(self) -> None:
        self.workers: list[subprocess.Popen[bytes]] = []
        self.processes: list[psutil.Process] = []

    def start_worker(self, *argv: str) -> subprocess.Popen[bytes]:
        worker = subprocess.Popen(
            [sys.executable, "-c", WORKER, *argv],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.workers.append(worker)
        return worker

    def line(self, worker: subprocess.Popen[bytes], timeout: float = 20) -> list[str]:
        """The worker's next line of output, as words; each number is tracked as a pid."""
        assert worker.stdout is not None
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(worker.stdout.readline()))  # type: ignore[union-attr]
        reader.daemon = True
        reader.start()
        reader.join(timeout)
        assert got and got[0], "the stand-in worker said nothing"
        words = got[0].decode().split()
        for word in words:
            if word.isdigit():
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.processes.append(psutil.Process(int(word)))
        return words

    def kill_all(self) -> None:
        for process in [*self.processes]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        for worker in self.workers:
            with contextlib.suppress(OSError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
            if worker.stdout is not None:
                worker.stdout.close()


@pytest.fixture
def family() -> Iterator[Family]:
    found = Family()
    try:
        yield found
    finally:
        found.kill_all()


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(processes: list[psutil.Process], timeout: float = 10) -> float:
    """Seconds until every one of ``processes`` is gone; fails after ``timeout``."""
    start = time.monotonic()
    while not all(gone(p) for p in processes):
        left = [p.pid for p in processes if not gone(p)]
        assert time.monotonic() - start < timeout, f"still running: {left}"
        time.sleep(0.005)
    return time.monotonic() - start


#: A command whose process group holds two grandchildren, and which says their pids.
FAMILY = "sleep 300 & echo $!; sleep 300 & echo $!; echo $$; wait"


@pytest.mark.process
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_the_run_dies_with_its_worker_whatever_signal_kills_it(
    family: Family, how: signal.Signals
) -> None:
    worker = family.start_worker("sh", "-c", FAMILY)
    [word, guard_pid, _, server_pid] = family.line(worker)
    assert word == "guard"
    run = [family.line(worker) for _ in range(3)]
    processes = [p for p in family.processes if p.pid != worker.pid]
    assert len(processes) == 5 and not any(gone(p) for p in processes), run
    assert {os.getpgid(p.pid) for p in processes if p.pid != int(server_pid)} == {int(guard_pid)}
    os.kill(worker.pid, how)
    worker.wait(10)
    wait_gone(processes)


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_forked_child_holding_the_life_line_does_not_keep_the_run_alive(
    family: Family,
) -> None:
    """The parent-death signal catches what the pipe cannot: a process forked from
    the worker (no exec) that keeps its end of the life line open."""
    worker = family.start_worker("--fork", "sh", "-c", FAMILY)
    family.line(worker)  # guard
    lines = [family.line(worker) for _ in range(4)]  # the run's three, and the fork's
    [forked] = [words[1] for words in lines if words[0] == "forked"]
    processes = [p for p in family.processes if p.pid not in (worker.pid, int(forked))]
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    wait_gone(processes)
    assert psutil.pid_exists(int(forked))  # it held the pipe all along


@pytest.mark.process
@pytest.mark.timeout(60)
def test_signals_to_the_group_reach_the_command_and_leave_the_guard(tmp_path: Path) -> None:
    seen: list[bytes] = []
    script = "trap 'echo got INT' INT; echo ready; while :; do sleep 0.05; done"
    process = RunProcess.start(
        ["sh", "-c", script], cwd=str(tmp_path), env=dict(os.environ), on_output=seen.append
    )
    try:
        poll(lambda: b"ready" in b"".join(seen), 20, "the command to start")
        os.killpg(process.pid, signal.SIGINT)
        poll(lambda: b"got INT" in b"".join(seen), 20, "the command to get SIGINT")
        assert process.poll() is None  # the command goes on; so does the guard
        assert psutil.Process(process.pid).status() != psutil.STATUS_ZOMBIE
    finally:
        status = process.stop(5)
    assert status.signal == signal.SIGTERM
    with contextlib.suppress(psutil.NoSuchProcess):  # gone already, and reaped by its server
        wait_gone([psutil.Process(process.pid)])


@pytest.mark.process
@pytest.mark.timeout(60)
def test_the_command_starts_with_the_signal_dispositions_it_would_have_had(
    tmp_path: Path,
) -> None:
    seen: list[bytes] = []
    process = RunProcess.start(
        ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"],
        cwd=str(tmp_path),
        env=dict(os.environ),
        on_output=seen.append,
    )
    status = process.wait(20)
    process.release()
    assert status is not None and status.ok
    fields = dict(line.split(":") for line in b"".join(seen).decode().splitlines())
    # Ours, less what Python ignores for itself (subprocess gives those back too).
    with open("/proc/self/status") as mine:
        ours = dict(line.split(":", 1) for line in mine if line.startswith("SigIgn"))
    python_own = (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))
    assert int(fields["SigIgn"], 16) == int(ours["SigIgn"], 16) & ~python_own
    assert int(fields["SigBlk"], 16) == 0


@pytest.mark.process
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "env",
    [
        {},  # the C locale: Python, which the guard is, sets LC_CTYPE for itself
        {"PATH": "/usr/bin:/bin", "LANG": "C", "ODD": "a=b\nc d", "EMPTY": ""},
    ],
)
def test_the_command_gets_exactly_the_runs_environment(tmp_path: Path, env: dict[str, str]) -> None:
    seen: list[bytes] = []
    process = RunProcess.start(["env", "-0"], cwd=str(tmp_path), env=env, on_output=seen.append)
    status = process.wait(20)
    process.release()
    assert status is not None and status.ok
    printed = b"".join(seen).decode().split("\0")
    assert dict(entry.split("=", 1) for entry in printed if entry) == env


def test_no_python_to_run_the_guard_with_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "")
    with pytest.raises(RunStartError, match="cannot start 'true': no Python to run its guard"):
        RunProcess.start(["true"], cwd=os.getcwd(), env={}, on_output=print)


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_guard_that_fails_before_starting_the_command_is_said_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "guard.py"
    broken.write_text("import sys\nprint('no prctl here', file=sys.stderr)\nsys.exit(3)\n")
    monkeypatch.setattr(process_module, "GUARD", str(broken))
    with pytest.raises(RunStartError) as caught:
        RunProcess.start(["true"], cwd=str(tmp_path), env={}, on_output=print)
    assert str(caught.value) == (
        f"cannot start 'true': its guard ({sys.executable}) failed: no prctl here"
    )


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_process_that_left_the_group_dies_with_the_worker_too(family: Family) -> None:
    worker = family.start_worker("sh", "-c", "setsid sleep 300 & echo $!; " + FAMILY)
    [_, guard_pid, _, server_pid] = family.line(worker)
    [family.line(worker) for _ in range(4)]
    processes = [p for p in family.processes if p.pid not in (worker.pid, int(guard_pid))]
    groups = {os.getpgid(p.pid) for p in processes if p.pid != int(server_pid)}
    assert len(processes) == 5 and len(groups) == 2  # one setsid'ed out of the group
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    wait_gone(processes)


# --- the guard server --------------------------------------------------------------------


def _server() -> guard_server.GuardServer:
    return guard_server._servers[(sys.executable, process_module.GUARD)]


def _run(argv: list[str], cwd: Path) -> tuple[ExitStatus, bytes]:
    seen: list[bytes] = []
    outcome = run_command(
        argv, cwd=str(cwd), env=dict(os.environ), on_output=seen.append, cancel=threading.Event()
    )
    return outcome.status, b"".join(seen)


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_server_killed_meanwhile_takes_its_runs_and_is_replaced(tmp_path: Path) -> None:
    seen: list[bytes] = []
    process = RunProcess.start(
        ["sh", "-c", "echo $$; exec sleep 300"],
        cwd=str(tmp_path),
        env=dict(os.environ),
        on_output=seen.append,
    )
    try:
        server = psutil.Process(_server().pid)
        poll(lambda: b"".join(seen).endswith(b"\n"), 20, "the command's first line")
        command = psutil.Process(int(b"".join(seen)))
        server.kill()
        # The run's guard sees its parent go, and kills the run.
        status = process.wait(20)
        assert status is not None and status.signal == signal.SIGKILL
        wait_gone([command, server])
    finally:
        process.stop(5)
    status, output = _run(["echo", "again"], tmp_path)
    assert status.ok and output == b"again\n"
    assert _server().pid != server.pid


@pytest.mark.process
@pytest.mark.timeout(120)
def test_many_runs_at_once_each_get_only_their_own_descriptors(tmp_path: Path) -> None:
    """Every command holds stdin, stdout and stderr and nothing else, while the server
    forks other runs' guards holding their pipes."""
    results: list[tuple[ExitStatus, bytes]] = []
    script = "sleep 0.2; echo $$; ls /proc/$$/fd"
    threads = [
        threading.Thread(target=lambda: results.append(_run(["sh", "-c", script], tmp_path)))
        for _ in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 16
    pids = set()
    for status, output in results:
        assert status.ok, output
        pid, *fds = output.decode().split()
        pids.add(pid)
        assert sorted(fds) == ["0", "1", "2"]
    assert len(pids) == 16


@pytest.mark.process
@pytest.mark.timeout(60)
def test_the_server_dies_with_its_worker_even_if_a_fork_holds_its_socket(
    family: Family,
) -> None:
    worker = family.start_worker("--fork", "true")
    [_, _, _, server_pid] = family.line(worker)
    family.line(worker)  # forked
    server = psutil.Process(int(server_pid))
    assert not gone(server)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    wait_gone([server])


@pytest.mark.process
@pytest.mark.timeout(60)
def test_runs_die_with_their_server_under_a_worker_that_ignores_sighup(family: Family) -> None:
    """The guard's parent-death signal is SIGHUP, which a worker under ``nohup``
    ignores: the guard hears it all the same, and the command still ignores it."""
    nohup = ["sh", "-c", 'trap "" HUP; exec "$@"', "sh"]
    script = "awk '/SigIgn/ {print \"ignored=\" $2}' /proc/$$/status; echo $$; exec sleep 300"
    worker = subprocess.Popen(
        [*nohup, sys.executable, "-c", WORKER, "sh", "-c", script],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    family.workers.append(worker)  # killed at the end, with all it printed
    [_, _, _, server_pid] = family.line(worker)
    [ignored] = family.line(worker)
    assert int(ignored.removeprefix("ignored="), 16) & (1 << (signal.SIGHUP - 1))
    family.line(worker)  # the command's pid
    processes = [p for p in family.processes if p.pid != int(server_pid)]
    os.kill(int(server_pid), signal.SIGKILL)
    wait_gone(processes)
    assert worker.poll() is None  # only its runs went
