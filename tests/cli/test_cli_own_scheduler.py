"""Schedulers started with no options, as real processes with a home of their own: a
taken default port falls back and says so once, a second scheduler of the same user
keeps a file of its own, and every command given no address reaches the first.

Ports 8786 and 8787 are held by the test while it runs (unless something else holds
them already): either way they are taken, as on a machine where another user's
scheduler runs.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from apportion import Client
from apportion.cli.main import main
from apportion.net.address import parse_address
from apportion.net.handshake import HandshakeError
from apportion.net.scheduler_claim import lock_path
from apportion.net.scheduler_file import read_scheduler_file
from cli_processes import APPORTION, Processes, poll

pytestmark = [pytest.mark.process, pytest.mark.tcp, pytest.mark.timeout(90)]

#: Variables that would choose a scheduler or a secret other than the home's.
CHOOSERS = [
    "APPORTION_SCHEDULER",
    "APPORTION_SCHEDULER_FILE",
    "APPORTION_TOKEN",
    "APPORTION_TOKEN_FILE",
]


@pytest.fixture
def defaults_taken() -> Iterator[None]:
    """Ports 8786 and 8787 taken on loopback for the test's length."""
    with contextlib.ExitStack() as stack:
        for port in (8786, 8787):
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen(1)
            except OSError as exc:
                assert exc.errno == errno.EADDRINUSE, exc  # someone else's: taken all the same
        yield


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's APPORTION_HOME, for the processes and for the commands run here."""
    where = tmp_path / "home"
    monkeypatch.setenv("APPORTION_HOME", str(where))
    for name in CHOOSERS:
        monkeypatch.setenv(name, "")  # recorded, so that teardown puts it back
        monkeypatch.delenv(name)
    return where


def _env() -> dict[str, str]:
    return dict(os.environ)


def _command(*args: str) -> str:
    """``apportion ARGS`` run here (the home's variables apply); its output."""
    result = CliRunner().invoke(main, list(args), env=dict.fromkeys(CHOOSERS))
    assert result.exit_code == 0, result.output
    return result.output


def _port(address: str) -> int:
    return parse_address(address)[1]


def _wait_for_line(log: Path, pattern: str) -> re.Match[str]:
    found: re.Match[str] = poll(lambda: re.search(pattern, log.read_text()), 20, pattern)
    return found


def _fell_back_once(log: Path, address: str) -> None:
    """The log says once that 8786 was taken, naming the port listened on; and the
    dashboard's fallen-back port is announced once, as the port it serves on."""
    text = log.read_text()
    taken = re.findall(r"port 8786 is taken .*; listening on port (\d+) instead", text)
    assert taken == [str(_port(address))], text
    dashboard = re.findall(
        r"dashboard port 8787 is taken; serving the dashboard on port (\d+)", text
    )
    served = re.findall(r"dashboard at http://127\.0\.0\.1:(\d+)/", text)
    assert len(dashboard) == 1 and served == dashboard, text


def test_two_schedulers_side_by_side_each_keep_their_file_and_commands_reach_the_first(
    procs: Processes, home: Path, defaults_taken: None
) -> None:
    _, first, first_log = procs.start_scheduler(env=_env())
    _wait_for_line(first_log, r"scheduler file \(address and secret\)")
    second_proc, second, second_log = procs.start_scheduler(env=_env())
    spare = home / f"scheduler-{_port(second)}.json"
    notice = _wait_for_line(second_log, r"the default scheduler file .* belongs to .*")
    assert notice.group(0) == (
        f"the default scheduler file {home / 'scheduler.json'} belongs to the running "
        f"scheduler at {first} (pid {procs.procs[0][0].pid}): reach this one with "
        f"--scheduler-file {spare}"
    )
    _fell_back_once(first_log, first)
    _fell_back_once(second_log, second)  # the second also found the journal busy
    assert read_scheduler_file(spare).address == second

    # Every command given no address reaches the first.
    assert _command("info").startswith(f"scheduler {first}: 0 workers")
    status = json.loads(_command("status", "--json"))
    # Neither this status command nor the job queue is one of the clients.
    assert status["scheduler"]["address"] == first and status["clients"] == 0
    assert "no task is waiting" in _command("why")
    submitted = _command("submit", "--", "true").splitlines()
    assert submitted[0] == f"submitted run 1 to {first}"  # then: no worker yet, it waits
    procs.start("worker", "--name", "found-it", "--nthreads", "1", env=_env())
    poll(lambda: "found-it" in _command("info"), 20, "the worker to join the first")
    assert "found-it" not in _command("info", "--scheduler-file", str(spare))

    # The second's exit takes its own file, and leaves the default one alone.
    second_proc.send_signal(signal.SIGTERM)
    assert second_proc.wait(20) == 0
    assert not spare.exists() and not lock_path(spare).exists()
    assert read_scheduler_file(home / "scheduler.json").address == first
    assert _command("info").startswith(f"scheduler {first}: 1 workers")


def test_a_taken_file_or_port_asked_for_is_refused_in_one_line(
    procs: Processes, home: Path
) -> None:
    _, first, log = procs.start_scheduler("--port", "0", "--no-journal", env=_env())
    _wait_for_line(log, r"scheduler file \(address and secret\)")
    default = home / "scheduler.json"
    refusals = [
        (
            ["--scheduler-file", str(default)],
            f"Error: scheduler file {default} belongs to the running scheduler at {first} "
            f"(pid {procs.procs[0][0].pid}): give another --scheduler-file, or leave it out "
            "to have a file of this scheduler's own",
        ),
        (
            ["--port", str(_port(first))],
            f"Error: cannot listen on 127.0.0.1:{_port(first)}: the port is taken; your "
            f"scheduler at {first} is running (scheduler file {default}); --port 0 takes "
            "any free port",
        ),
    ]
    for args, line in refusals:
        done = subprocess.run(
            [*APPORTION, "scheduler", "--no-journal", "--no-dashboard", *args],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=30,
        )
        assert (done.returncode, done.stderr.strip()) == (1, line), done.stderr
    assert read_scheduler_file(default).address == first


def test_a_client_at_the_dashboards_port_is_told_where_the_scheduler_is(
    procs: Processes, home: Path
) -> None:
    _, first, log = procs.start_scheduler(
        "--port", "0", "--no-journal", "--dashboard-address", ":0", env=_env()
    )
    dashboard = _wait_for_line(log, r"dashboard at http://(127\.0\.0\.1:\d+)/").group(1)
    _wait_for_line(log, r"scheduler file \(address and secret\)")
    with pytest.raises(HandshakeError) as info:
        Client(dashboard, timeout=5)
    assert str(info.value) == (
        f"{dashboard} is apportion's dashboard (HTTP), not a scheduler; the scheduler is at {first}"
    )


def test_the_file_of_a_killed_scheduler_is_said_stale_then_taken_over(
    procs: Processes, home: Path
) -> None:
    killed, first, log = procs.start_scheduler("--port", "0", "--no-journal", env=_env())
    _wait_for_line(log, r"scheduler file \(address and secret\)")
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    default = home / "scheduler.json"
    stale = CliRunner().invoke(main, ["info"], env=dict.fromkeys(CHOOSERS))
    assert stale.exit_code == 1
    assert stale.output == (
        f"Error: no scheduler of yours is running ({default} is left by one that stopped "
        f"({first})): start one with `apportion scheduler`, or give a scheduler's address "
        "or --scheduler-file\n"
    )
    _, second, log = procs.start_scheduler("--port", "0", "--no-journal", env=_env())
    _wait_for_line(log, rf"scheduler file \(address and secret\): {re.escape(str(default))}\n")
    assert read_scheduler_file(default).address == second
    assert _command("info").startswith(f"scheduler {second}: 0 workers")
