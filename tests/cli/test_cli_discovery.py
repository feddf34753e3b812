"""Commands given no address find the user's own scheduler through the user's
scheduler file, in a fixed order of precedence, and never try a fixed port.

In-process (CliRunner) against scheduler files written here, whose claim this test
holds as a running scheduler would; one test against a real scheduler in this process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from apportion.cli.credentials import scheduler_address, scheduler_file_option
from apportion.cli.main import main
from apportion.loop_thread import LoopThread
from apportion.net.scheduler_claim import SchedulerFileClaim, lock_path
from apportion.net.scheduler_file import write_scheduler_file
from apportion.net.security import Security
from apportion.scheduler.service import Scheduler

TOKEN = "t" * 43
#: Variables that choose a scheduler or its secret: cleared for each test, and put
#: back afterwards (a command that reads a scheduler file sets the secret's).
VARIABLES = ["APPORTION_SCHEDULER", "APPORTION_SCHEDULER_FILE", "APPORTION_TOKEN"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("APPORTION_HOME", str(tmp_path / "home"))
    for name in [*VARIABLES, "APPORTION_TOKEN_FILE"]:
        monkeypatch.setenv(name, "")  # recorded, so that teardown puts it back
        monkeypatch.delenv(name)
    return tmp_path / "home"


@pytest.fixture
def running(home: Path) -> Iterator[SchedulerFileClaim]:
    """The default scheduler file, held as its running scheduler holds it."""
    path = home / "scheduler.json"
    with SchedulerFileClaim.take(path) as claim:
        write_scheduler_file(path, "tcp://127.0.0.1:4001", TOKEN, "s1")
        yield claim


@click.command()
@click.argument("given", required=False)
@scheduler_file_option
@click.pass_context
def which(ctx: click.Context, given: str | None) -> None:
    click.echo(scheduler_address(ctx, given))


def _which(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(which, list(args), env=env)
    return result.exit_code, result.output


def test_the_default_file_names_the_users_running_scheduler(running: SchedulerFileClaim) -> None:
    assert _which() == (0, "tcp://127.0.0.1:4001\n")


def test_precedence_is_given_then_file_then_variable_then_default(
    running: SchedulerFileClaim, tmp_path: Path
) -> None:
    named = tmp_path / "named.json"
    write_scheduler_file(named, "tcp://127.0.0.1:4002", TOKEN, "s2")
    variable = {"APPORTION_SCHEDULER": "tcp://127.0.0.1:4003"}
    assert _which(env=variable) == (0, "tcp://127.0.0.1:4003\n")
    assert _which("--scheduler-file", str(named), env=variable) == (0, "tcp://127.0.0.1:4002\n")
    both = {**variable, "APPORTION_SCHEDULER_FILE": str(named)}
    assert _which(env=both) == (0, "tcp://127.0.0.1:4002\n")
    assert _which("tcp://127.0.0.1:4004", env=both) == (0, "tcp://127.0.0.1:4004\n")


def test_no_running_scheduler_is_one_line_naming_the_file(home: Path) -> None:
    code, output = _which()
    assert code == 1
    assert output == (
        f"Error: no scheduler of yours is running (no scheduler file at "
        f"{home / 'scheduler.json'}): start one with `apportion scheduler`, or give a "
        "scheduler's address or --scheduler-file\n"
    )


def test_a_file_left_by_a_scheduler_that_stopped_is_not_used(home: Path) -> None:
    path = home / "scheduler.json"
    with SchedulerFileClaim.take(path) as claim:
        claim.note("tcp://127.0.0.1:4001")
        write_scheduler_file(path, "tcp://127.0.0.1:4001", TOKEN, "s1")
        left = lock_path(path).read_bytes()
    write_scheduler_file(path, "tcp://127.0.0.1:4001", TOKEN, "s1")
    lock_path(path).write_bytes(left)  # what a killed scheduler leaves: nobody holds it
    code, output = _which()
    assert code == 1 and "left by one that stopped (tcp://127.0.0.1:4001)" in output


def test_the_users_other_scheduler_is_named_when_the_default_has_none(home: Path) -> None:
    spare = home / "scheduler-4005.json"
    with SchedulerFileClaim.take(spare):
        write_scheduler_file(spare, "tcp://127.0.0.1:4005", TOKEN, "s5")
        code, output = _which()
    assert code == 1
    assert output.endswith(
        f"yours at tcp://127.0.0.1:4005 is reached with --scheduler-file {spare}\n"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--link"],
        ["info"],
        ["why"],
        ["dump", "state.json"],
        ["submit", "--", "true"],
        ["worker", "--connect-timeout", "0"],
    ],
    ids=" ".join,
)
def test_every_command_given_no_address_says_no_scheduler_of_yours_runs(
    home: Path, args: list[str]
) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: no scheduler of yours is running (")
    assert result.output.count("\n") == 1 and "8786" not in result.output


@pytest.mark.tcp
def test_commands_reach_the_scheduler_the_default_file_names_with_its_secret(
    home: Path,
) -> None:
    loop = LoopThread("discovery-test")
    security = Security.in_memory()  # a secret of its own: only the file can give it
    server = loop.run(Scheduler("127.0.0.1", 0, security=security).start())
    path = home / "scheduler.json"
    try:
        with SchedulerFileClaim.take(path):
            assert security.token is not None
            write_scheduler_file(path, server.address, security.token, server.id)
            info = CliRunner().invoke(main, ["info"])
            assert info.exit_code == 0, info.output
            assert info.output.startswith(f"scheduler {server.address}: 0 workers")
            status = CliRunner().invoke(main, ["status", "--json"])
            assert status.exit_code == 0, status.output
            found = json.loads(status.output)
            # The status command's own client is not one of the clients shown.
            assert found["scheduler"]["address"] == server.address and found["clients"] == 0
    finally:
        loop.run(server.close(), 10)
        loop.stop()
