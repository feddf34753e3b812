"""``apportion status`` against a real scheduler and worker over TCP: the JSON, the
runs of a journal only when it is this scheduler's, the errors, and ``--watch``
redrawing in a real terminal (tmux)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from apportion.cli.main import main
from apportion.cli.run_options import RunOptions, specs_from_options
from apportion.client.client import Client
from apportion.loop_thread import LoopThread
from apportion.net.security import Security
from apportion.runs.journal import Journal
from apportion.scheduler.service import Scheduler
from apportion.worker.service import Worker
from cli_processes import APPORTION, free_port, poll

SRC = Path(__file__).resolve().parents[2] / "src"


@dataclass
class Cluster:
    loop: LoopThread
    scheduler: Scheduler

    @property
    def address(self) -> str:
        return self.scheduler.address

    def add_worker(self, name: str) -> None:
        """A worker with one thread and gpu=[0,1] (closed with the scheduler)."""
        self.loop.run(Worker(self.address, nthreads=1, resources="gpu=[0,1]", name=name).start())


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A scheduler that leaves unsatisfiable tasks waiting, one worker with gpu=[0,1],
    and a task asking for 8 GPUs."""
    loop = LoopThread("status-test")
    scheduler = loop.run(Scheduler("127.0.0.1", 0, security=Security.in_memory()).start())
    try:
        cluster = Cluster(loop, scheduler)
        cluster.add_worker("gpubox")
        with Client(scheduler.address, timeout=10) as client:
            held = client.submit(sum, [1, 2], key="too-big", resources={"gpu": 8})
            yield cluster
            assert not held.done()
    finally:
        loop.run(scheduler.close(), 10)
        loop.stop()


def _status(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["status", *args], env=env)
    return result.exit_code, result.output


def _pending(address: str) -> dict[str, object]:
    code, output = _status(address, "--json")
    assert code == 0, output
    found = json.loads(output)
    return found if found["pending"] else {}


@pytest.mark.tcp
def test_json_shows_the_unsatisfiable_request_with_its_reason(cluster: Cluster) -> None:
    found = poll(lambda: _pending(cluster.address), 10, "the task to be queued")
    (kind,) = found["pending"]
    assert kind["unsatisfiable"] is True and kind["oldest"] == "too-big"
    assert "no connected worker can ever provide" in kind["why"]
    assert found["runs"] is None and found["scheduler"]["address"] == cluster.address
    code, text = _status("--scheduler", cluster.address)
    assert code == 0 and "UNSATISFIABLE: 1 task needs gpu=8" in text
    assert "gpu [□□] 0/2  0:free 1:free" in text and "\x1b[" not in text


@pytest.mark.tcp
def test_runs_are_shown_from_the_journal_this_scheduler_serves(
    cluster: Cluster, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    with Journal(home / "runs.db") as journal:
        journal.stage(specs_from_options(RunOptions(("true",), array="1-3")), time.time())
        env = {"APPORTION_HOME": str(home)}
        assert json.loads(_status(cluster.address, "--json", env=env)[1])["runs"] is None
        journal.claim(cluster.address)
        runs = json.loads(_status(cluster.address, "--json", env=env)[1])["runs"]
        assert runs["counts"]["staged"] == 3 and runs["journal"] == str(home / "runs.db")
        (array,) = runs["arrays"]
        assert array["counts"]["staged"] == 3
        journal.claim("tcp://127.0.0.1:1")  # another scheduler's: shown only when named
        assert json.loads(_status(cluster.address, "--json", env=env)[1])["runs"] is None
        named = _status(cluster.address, "--journal", str(home / "runs.db"), env=env)[1]
        assert "[□□□□□□□□□□] 0/3 done  3 staged" in named


@pytest.mark.tcp
def test_errors_are_one_line(cluster: Cluster, tmp_path: Path) -> None:
    code, output = _status(cluster.address, "--link")
    assert (code, output) == (1, f"Error: the scheduler at {cluster.address} serves no dashboard\n")
    token = {"APPORTION_TOKEN": "0" * 64}
    code, output = _status(f"127.0.0.1:{free_port()}", env=token)
    assert code == 1 and output.startswith("Error: ") and output.count("\n") == 1
    code, output = _status(cluster.address, "--journal", str(tmp_path / "nope.db"))
    assert code == 2 and output == f"Error: no journal at {tmp_path / 'nope.db'}\n"


def _tmux(socket: str, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["tmux", "-L", socket, "-f", "/dev/null", *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=10,
    )
    return done.stdout


@pytest.mark.tcp
@pytest.mark.process
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_watch_redraws_in_a_terminal_and_ctrl_c_exits_0(cluster: Cluster) -> None:
    socket = f"apportion-status-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, **cluster.scheduler.security.environment("client")}
    env["PYTHONPATH"] = str(SRC)
    env.pop("NO_COLOR", None)
    watch = [*APPORTION, "status", cluster.address, "--watch", "--interval", "0.3"]
    # The shell stays after the watch ends, to show its exit status.
    command = f"{shlex.join(watch)}; echo EXIT=$?; sleep 60"
    try:
        _tmux(socket, "new-session", "-d", "-s", "s", "-x", "120", "-y", "40", command, env=env)

        def screen() -> str:
            return _tmux(socket, "capture-pane", "-p", "-t", "s")

        first = poll(lambda: "1 worker," in screen() and screen(), 20, "the first frame")
        assert "UNSATISFIABLE: 1 task needs gpu=8" in first
        assert first.splitlines()[0].startswith(f"scheduler {cluster.address}")
        cluster.add_worker("second")
        later = poll(lambda: "2 workers," in screen() and screen(), 10, "a redraw")
        assert "second" in later
        _tmux(socket, "send-keys", "-t", "s", "C-c")
        poll(lambda: "EXIT=0" in screen(), 10, "the watch to exit with status 0")
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=10)
