"""``apportion worker``: option checking in-process, and one real supervised run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import psutil
import pytest
from click.testing import CliRunner

from apportion.cli.main import main
from apportion.cli.worker import WorkerSettings, check_resources
from apportion.cli.worker import worker as worker_command
from apportion.core.resources import SCALE, parse_supply
from apportion.loop_thread import LoopThread
from apportion.protocol.worker import WorkerClosing
from apportion.worker.detect import parse_memory_limit
from apportion.worker.memory_policy import THRESHOLD_NAMES, MemoryThresholds
from fake_scheduler import FakeScheduler


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "spec", ["GPU", "GPU=-1", "GPU=abc", "=2", "gpu=[0,1", "gpu=[]", "gpu=[3-1]", "gpu=[0,0]"]
)
def test_malformed_resources_exit_with_status_2_and_one_line(spec: str) -> None:
    result = CliRunner().invoke(main, ["worker", "tcp://127.0.0.1:8786", "--resources", spec])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--resources" in errors[0]
    assert len(result.output.splitlines()) == 1


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "spec", ["gpu=[0,1,2,3]", "gpu=[0-7]", "gpu=[0-1,6] MEMORY=16GiB", "GPU=2,gpu=[0, 1]"]
)
def test_indexed_pools_are_accepted_and_passed_on_as_written(spec: str) -> None:
    ctx = click.Context(worker_command)
    param = next(p for p in worker_command.params if p.name == "resources")
    assert check_resources(ctx, param, spec) == spec


@pytest.mark.timeout(10)
def test_help_lists_the_worker_options() -> None:
    result = CliRunner().invoke(main, ["worker", "--help"])
    assert result.exit_code == 0
    for option in ("--nthreads", "--nworkers", "--nprocs", "--resources", "--name", "--port"):
        assert option in result.output
    for option in ("--split-units", "--config", "APPORTION_RESOURCES", "auto"):
        assert option in result.output
    for option in ("--heartbeat-interval", "--reconnect-timeout"):
        assert option in result.output


@pytest.mark.timeout(10)
def test_liveness_options_reach_the_worker_and_every_child(launched: Launched) -> None:
    assert invoke()[0] == 0
    assert launched.liveness == (1.0, 120.0)
    assert invoke("--heartbeat-interval", "0.25", "--reconnect-timeout", "0")[0] == 0
    assert launched.liveness == (0.25, 0.0)
    assert invoke("--nworkers", "2", "--reconnect-timeout", "7")[0] == 0
    for argv in launched.commands:
        assert argv[argv.index("--reconnect-timeout") + 1] == "7.0"
        assert argv[argv.index("--heartbeat-interval") + 1] == "1.0"
    code, output = invoke("--heartbeat-interval", "0")
    assert code == 2 and "--heartbeat-interval" in output


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


#: Each start method, and the processes under the supervisor: with forkserver the
#: workers are children of the fork server, itself the supervisor's child.
UNDER_SUPERVISOR = [("forkserver", 3), ("spawn", 2)]


@pytest.mark.process
@pytest.mark.timeout(45)
@pytest.mark.parametrize(("method", "under"), UNDER_SUPERVISOR)
def test_nworkers_runs_supervised_workers_that_stop_on_sigterm(
    loop_thread: LoopThread, method: str, under: int
) -> None:
    scheduler = loop_thread.run(FakeScheduler("127.0.0.1").start())
    argv = [sys.executable, "-m", "apportion.cli.main", "worker", scheduler.address]
    argv += ["--nworkers", "2", "--nthreads", "1", "--name", "box", "--start-method", method]
    argv += ["--resources", "GPU=1 gpu=[0-1,5]", "--drain-timeout", "0.5"]
    supervisor = subprocess.Popen(argv, stderr=subprocess.PIPE)
    family = [psutil.Process(supervisor.pid)]
    try:
        hellos = [loop_thread.run(scheduler.next_worker(), 20)[1] for _ in range(2)]
        assert sorted(h.name for h in hellos) == ["box-0", "box-1"]
        assert all(h.resources == {"GPU": 10_000, "gpu": 30_000} for h in hellos)
        assert all(h.units == {"gpu": ["0", "1", "5"]} and h.nthreads == 1 for h in hellos)
        family += family[0].children(recursive=True)
        assert len(family) == 1 + under
        supervisor.send_signal(signal.SIGTERM)
        _, stderr = supervisor.communicate(timeout=20)
        assert supervisor.returncode == 0, stderr.decode()
        # This fake scheduler never answers the drain: each worker leaves after 0.5 s.
        assert stderr.decode().count("SIGTERM received; draining") == 2
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
    finally:
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        supervisor.wait(5)
        loop_thread.run(scheduler.close(), 5)


@pytest.mark.process
@pytest.mark.timeout(45)
@pytest.mark.parametrize(("method", "under"), UNDER_SUPERVISOR)
def test_workers_stop_when_their_supervisor_is_killed(
    loop_thread: LoopThread, method: str, under: int
) -> None:
    """SIGKILL leaves the supervisor no chance to stop its children; they notice alone
    (with forkserver: the server sees the supervisor go and exits, then they notice)."""
    scheduler = loop_thread.run(FakeScheduler("127.0.0.1").start())
    argv = [sys.executable, "-m", "apportion.cli.main", "worker", scheduler.address]
    argv += ["--nworkers", "2", "--nthreads", "1", "--name", "orphan", "--start-method", method]
    # Own session, so that the test runner's process group is not involved.
    supervisor = subprocess.Popen(argv, stderr=subprocess.PIPE, start_new_session=True)
    family = [psutil.Process(supervisor.pid)]
    try:
        conns = [loop_thread.run(scheduler.next_worker(), 20)[0] for _ in range(2)]
        children = family[0].children(recursive=True)
        family += children
        assert len(children) == under
        # The workers' parent: the fork server (the one other parent), else us.
        parents = {c.ppid() for c in children} - {supervisor.pid}
        workers_parent = parents.pop() if parents else supervisor.pid
        supervisor.kill()
        assert supervisor.wait(10) == -signal.SIGKILL
        # Both leave deliberately: the scheduler hears WorkerClosing, not a lost connection.
        for conn in conns:
            loop_thread.run(scheduler.expect(conn, WorkerClosing), 10)
        deadline = time.monotonic() + 10
        while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
            assert time.monotonic() < deadline, "orphaned workers still running"
            time.sleep(0.05)  # polling for the exit, not waiting for it to happen
        _, stderr = supervisor.communicate(timeout=10)  # EOF: every writer has exited
        assert stderr.decode().count(f"supervisor {workers_parent} is gone; stopping") == 2, stderr
    finally:
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        supervisor.communicate(timeout=5)  # reaps it and closes the pipe
        loop_thread.run(scheduler.close(), 5)


# --- auto, split units, APPORTION_RESOURCES and --config ---------------------------
# The command runs in-process with its two exits replaced: ``run_one`` (one worker)
# and ``Supervisor`` (several) record what they were given instead of starting anything.


class Launched:
    """What the worker command would have started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.one: list[dict[str, object]] = []
        self.commands: list[list[str]] = []
        self.liveness: tuple[float, float] | None = None
        self.settings: WorkerSettings | None = None
        self.supervisor_options: dict[str, object] = {}
        launched = self

        def run_one(address: str, settings: WorkerSettings) -> int:
            launched.one.append(
                {
                    "nthreads": settings.nthreads,
                    "resources": settings.resources,
                    "name": settings.name,
                }
            )
            launched.liveness = (settings.heartbeat_interval, settings.reconnect_timeout)
            launched.settings = settings
            return 0

        class Supervisor:
            def __init__(self, commands: list[list[str]], **kwargs: object) -> None:
                launched.commands = commands
                launched.supervisor_options = kwargs

            def run(self, stop_timeout: float = 10.0) -> int:
                return 0

        monkeypatch.setattr("apportion.cli.worker.run_one", run_one)
        monkeypatch.setattr("apportion.worker.supervisor.Supervisor", Supervisor)
        monkeypatch.delenv("APPORTION_RESOURCES", raising=False)

    def child_resources(self) -> list[str]:
        return [argv[argv.index("--resources") + 1] for argv in self.commands]


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> Launched:
    return Launched(monkeypatch)


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["worker", "tcp://127.0.0.1:8786", *args], env=env)
    return result.exit_code, result.output


@pytest.mark.timeout(10)
def test_the_start_method_chooses_the_supervisors_spawner(launched: Launched) -> None:
    from apportion.worker.fork_spawn import ForkSpawner
    from apportion.worker.supervisor import popen_spawn

    assert invoke("--nworkers", "2")[0] == 0
    assert isinstance(launched.supervisor_options["spawn"], ForkSpawner)
    assert invoke("--nworkers", "2", "--start-method", "spawn")[0] == 0
    assert launched.supervisor_options["spawn"] is popen_spawn
    code, output = invoke("--nworkers", "2", "--start-method", "fork")
    assert code == 2 and "'fork' is not one of 'forkserver', 'spawn'" in output


@pytest.mark.timeout(10)
def test_split_units_gives_each_process_its_own_share(launched: Launched) -> None:
    code, _ = invoke("--nworkers", "2", "--split-units", "--resources", "gpu=[0-3] licence=1")
    assert code == 0
    assert launched.child_resources() == ["gpu=[0,1] licence=1", "gpu=[2,3] licence=1"]
    invoke("--nworkers", "2", "--split-units", "--resources", "gpu=[0-4]")
    assert launched.child_resources() == ["gpu=[0,1,2]", "gpu=[3,4]"]


@pytest.mark.timeout(10)
def test_without_split_units_every_process_gets_the_whole_spec(launched: Launched) -> None:
    assert invoke("--nworkers", "3", "--resources", "gpu=[0-3] process=1")[0] == 0
    assert launched.child_resources() == ["gpu=[0-3] process=1"] * 3


@pytest.mark.timeout(10)
def test_fewer_units_than_processes_exits_2_with_one_line(launched: Launched) -> None:
    code, output = invoke("--nworkers", "4", "--split-units", "--resources", "gpu=[0-2]")
    assert code == 2 and not launched.commands
    assert output.splitlines() == [
        "Error: --split-units: pool 'gpu' has 3 units, fewer than the 4 worker processes"
    ]


@pytest.fixture
def fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake ``nvidia-smi`` listing four GPUs, first on PATH."""
    script = tmp_path / "nvidia-smi"
    lines = "".join(f"echo '{i}, GPU-{i}{i}{i}{i}-aaaa'\n" for i in range(4))
    script.write_text("#!/bin/sh\n" + lines)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.process
@pytest.mark.timeout(10)
@pytest.mark.usefixtures("fake_gpus")
def test_auto_under_a_mask_offers_exactly_the_masked_gpus(
    launched: Launched, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert invoke("--resources", "auto licence=2")[0] == 0
    amounts, units = parse_supply(str(launched.one[0]["resources"]))
    assert units == {"gpu": ["2", "3"]}
    assert amounts["licence"] == 2 * SCALE and amounts["cpus"] >= SCALE
    assert amounts["memory"] == psutil.virtual_memory().total * SCALE


@pytest.mark.process
@pytest.mark.timeout(10)
@pytest.mark.usefixtures("fake_gpus")
def test_auto_is_detected_once_then_split(launched: Launched) -> None:
    assert invoke("--nworkers", "2", "--split-units", "--resources", "auto")[0] == 0
    shares = [parse_supply(spec)[1] for spec in launched.child_resources()]
    assert shares == [{"gpu": ["0", "1"]}, {"gpu": ["2", "3"]}]


@pytest.mark.timeout(10)
def test_auto_without_nvidia_smi_offers_no_gpus_and_no_error(
    launched: Launched, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no nvidia-smi anywhere
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert invoke("--resources", "auto")[0] == 0
    amounts, units = parse_supply(str(launched.one[0]["resources"]))
    assert units == {} and sorted(amounts) == ["cpus", "memory"]


@pytest.mark.timeout(10)
def test_a_malformed_mask_with_auto_exits_2_with_one_line(
    launched: Launched, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,0")
    code, output = invoke("--resources", "auto")
    assert code == 2 and not launched.one
    assert output.splitlines() == [
        "Error: --resources: auto: CUDA_VISIBLE_DEVICES='0,0': '0' is listed twice"
    ]


@pytest.mark.timeout(10)
def test_resources_come_from_the_environment_unless_given(launched: Launched) -> None:
    env = {"APPORTION_RESOURCES": "gpu=[0,1] licence=1"}
    assert invoke(env=env)[0] == 0
    assert invoke("--resources", "GPU=2", env=env)[0] == 0
    assert [r["resources"] for r in launched.one] == ["gpu=[0,1] licence=1", "GPU=2"]


@pytest.mark.timeout(10)
def test_a_malformed_environment_spec_names_the_variable(launched: Launched) -> None:
    code, output = invoke(env={"APPORTION_RESOURCES": "GPU=abc"})
    assert code == 2 and len(output.splitlines()) == 1
    assert output.startswith("Error: APPORTION_RESOURCES: resource 'GPU': amount 'abc'")


@pytest.mark.timeout(10)
def test_config_file_gives_defaults_that_options_override(
    launched: Launched, tmp_path: Path
) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(
        'nthreads = 2\nnworkers = 2\nsplit_units = true\nresources = "gpu=[0-3]"\nname = "box"\n'
    )
    assert invoke("--config", str(config))[0] == 0
    assert launched.child_resources() == ["gpu=[0,1]", "gpu=[2,3]"]
    argv = launched.commands[1]
    assert argv[argv.index("--nthreads") + 1] == "2" and argv[-1] == "box-1"
    assert "--config" not in argv  # children get every value explicitly
    assert invoke("--config", str(config), "--nworkers", "1", "--resources", "GPU=1")[0] == 0
    assert launched.one == [{"nthreads": 2, "resources": "GPU=1", "name": "box"}]


@pytest.mark.timeout(10)
def test_environment_overrides_config_file(launched: Launched, tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text('resources = "GPU=1"\n')
    assert invoke("--config", str(config), env={"APPORTION_RESOURCES": "GPU=3"})[0] == 0
    assert launched.one[0]["resources"] == "GPU=3"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "resource = 'gpu=[0-3]'\n",
            "unknown key 'resource' (known: allow_plaintext, connect_timeout, "
            "death_timeout, drain_timeout,",
        ),
        ("nprocs = 2\n", "unknown key 'nprocs'"),
        ("nthreads = 0\n", "nthreads: 0 is not in the range x>=1."),
        ("nthreads = [1]\n", "nthreads must be a single value"),
        ("nthreads = \n", "is not valid TOML"),
    ],
)
def test_config_file_errors_exit_2_with_one_line(
    launched: Launched, tmp_path: Path, text: str, message: str
) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(text)
    code, output = invoke("--config", str(config))
    assert code == 2 and not launched.one
    assert len(output.splitlines()) == 1, output
    assert output.startswith(f"Error: --config: {config}") and message in output


@pytest.mark.timeout(10)
def test_bad_resources_in_config_file_name_the_file(launched: Launched, tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text('resources = "GPU"\n')
    code, output = invoke("--config", str(config))
    assert code == 2
    assert output.splitlines() == [
        f"Error: resources in {config}: invalid resource spec 'GPU': parts must be NAME=AMOUNT"
    ]


@pytest.mark.timeout(10)
def test_missing_config_file_exits_2_with_one_line(launched: Launched, tmp_path: Path) -> None:
    code, output = invoke("--config", str(tmp_path / "absent.toml"))
    assert code == 2 and len(output.splitlines()) == 1
    assert "cannot read" in output and "No such file" in output


# --- memory limits and supervision ---------------------------------------------------


@pytest.mark.timeout(5)
def test_memory_limit_forms() -> None:
    gib = 2**30
    assert parse_memory_limit("4GiB", 1, total=16 * gib) == 4 * gib
    assert parse_memory_limit("4e9", 2, total=16 * gib) == 4_000_000_000
    assert parse_memory_limit("0.25", 2, total=16 * gib) == 4 * gib
    assert parse_memory_limit("auto", 4, total=16 * gib) == 4 * gib
    assert parse_memory_limit("none", 4, total=16 * gib) == 0
    assert parse_memory_limit("0", 4, total=16 * gib) == 0
    for bad in ("lots", "-1GiB", "12 apples", "100"):
        with pytest.raises(ValueError, match="memory-limit"):
            parse_memory_limit(bad, 1, total=16 * gib)


@pytest.mark.timeout(10)
def test_a_memory_limit_puts_even_one_worker_under_a_supervisor(launched: Launched) -> None:
    assert invoke("--memory-limit", "1GiB")[0] == 0
    assert not launched.one and len(launched.commands) == 1
    assert launched.supervisor_options["memory_limit"] == 2**30
    argv = launched.commands[0]
    assert argv[argv.index("--memory-limit") + 1] == str(2**30)  # reported by the child
    assert "--no-supervisor" in argv


@pytest.mark.timeout(10)
def test_one_worker_without_a_limit_runs_bare(launched: Launched) -> None:
    assert invoke("--drain-timeout", "7")[0] == 0
    assert launched.settings is not None and launched.settings.drain_timeout == 7.0
    assert not launched.commands


@pytest.mark.timeout(10)
def test_memory_thresholds_reach_the_supervisor_and_every_child(launched: Launched) -> None:
    args = ("--memory-limit", "1GiB", "--nworkers", "2", "--local-directory", "/scratch")
    assert invoke(*args, "--memory-target", "0.5", "--memory-pause", "off")[0] == 0
    assert launched.supervisor_options["memory_terminate"] == 0.95
    for argv in launched.commands:
        given = {name: argv[argv.index(f"--memory-{name}") + 1] for name in THRESHOLD_NAMES}
        assert given == {"target": "0.5", "spill": "0.7", "pause": "off", "terminate": "0.95"}
        assert argv[argv.index("--local-directory") + 1] == "/scratch"
    assert invoke("--memory-limit", "1GiB", "--memory-terminate", "OFF")[0] == 0
    assert launched.supervisor_options["memory_terminate"] is False
    assert invoke("--memory-spill", "0.75", "--memory-target", "false")[0] == 0
    assert launched.settings is not None
    assert launched.settings.memory == MemoryThresholds(target=False, spill=0.75)
    assert launched.settings.local_directory is None


@pytest.mark.timeout(10)
def test_a_bad_memory_threshold_exits_2_naming_the_option(launched: Launched) -> None:
    for bad in ("1.5", "0", "lots"):
        code, output = invoke("--memory-pause", bad)
        assert code == 2 and "--memory-pause" in output and len(output.splitlines()) == 1


@pytest.mark.timeout(10)
def test_no_supervisor_with_a_memory_limit_is_refused(
    launched: Launched, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("APPORTION_SUPERVISOR_PID", raising=False)
    code, output = invoke("--memory-limit", "1GiB", "--no-supervisor")
    assert code == 2 and "enforced by a supervisor" in output
    assert "--memory-terminate off" in output
    # Nothing to enforce from outside: the worker spills and pauses by itself.
    args = ("--memory-limit", "1GiB", "--no-supervisor", "--memory-terminate", "off")
    assert invoke(*args)[0] == 0 and launched.one
    code, output = invoke("--nworkers", "2", "--no-supervisor")
    assert code == 2 and "needs a supervisor" in output


@pytest.mark.timeout(10)
def test_a_lifetime_reaches_every_child(launched: Launched) -> None:
    assert invoke("--nworkers", "2", "--lifetime", "3600")[0] == 0
    for argv in launched.commands:
        assert argv[argv.index("--lifetime") + 1] == "3600.0"


@pytest.mark.process
@pytest.mark.timeout(30)
def test_a_worker_drains_and_leaves_at_the_end_of_its_lifetime(loop_thread: LoopThread) -> None:
    scheduler = loop_thread.run(FakeScheduler("127.0.0.1").start())
    argv = [sys.executable, "-m", "apportion.cli.main", "worker", scheduler.address]
    argv += ["--nthreads", "1", "--lifetime", "1", "--drain-timeout", "0.5"]
    worker = subprocess.Popen(argv, stderr=subprocess.PIPE)
    try:
        loop_thread.run(scheduler.next_worker(), 20)
        _, stderr = worker.communicate(timeout=20)
        # A departure of its own accord: status 0, so a supervisor does not restart it.
        assert worker.returncode == 0, stderr.decode()
        assert "lifetime of 1s reached; draining" in stderr.decode()
    finally:
        worker.kill()
        worker.wait(5)
        loop_thread.run(scheduler.close(), 5)


# --- slurm: what the allocation granted --------------------------------------------

SLURM_JOB = {
    "SLURM_JOB_ID": "42",
    "SLURM_CPUS_ON_NODE": "4",
    "SLURM_MEM_PER_NODE": "2048",
    "CUDA_VISIBLE_DEVICES": "1,3",
}


@pytest.mark.timeout(10)
def test_slurm_offers_the_grant_and_threads_for_its_cpus(launched: Launched) -> None:
    assert invoke("--resources", "slurm licence=2", env=SLURM_JOB)[0] == 0
    assert launched.one == [
        {
            "nthreads": 4,
            "resources": "cpus=4 gpu=[1,3] licence=2 memory=2147483648",
            "name": None,
        }
    ]
    assert invoke("--nworkers", "2", "--split-units", "--resources", "slurm", env=SLURM_JOB)[0] == 0
    assert [parse_supply(spec)[1] for spec in launched.child_resources()] == [
        {"gpu": ["1"]},
        {"gpu": ["3"]},
    ]
    assert all(argv[argv.index("--nthreads") + 1] == "2" for argv in launched.commands)
    assert invoke("--nthreads", "3", "--resources", "slurm", env=SLURM_JOB)[0] == 0
    assert launched.one[-1]["nthreads"] == 3


@pytest.mark.timeout(10)
def test_slurm_outside_an_allocation_exits_2_with_one_line(
    launched: Launched, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    code, output = invoke("--resources", "slurm")
    assert code == 2 and not launched.one
    assert len(output.splitlines()) == 1
    assert output.startswith("Error: --resources: slurm: 'slurm' describes a Slurm allocation")


@pytest.mark.timeout(10)
def test_sge_outside_a_grid_engine_job_exits_2_with_one_line(
    launched: Launched, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOB_ID", raising=False)
    code, output = invoke("--resources", "sge")
    assert code == 2 and not launched.one
    assert len(output.splitlines()) == 1
    assert output.startswith("Error: --resources: sge: not inside a Grid Engine job")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("auto slurm", "has both auto and slurm"),
        ("slurm slurm", "'slurm' is given twice"),
        ("slurm sge", "has both slurm and sge"),
    ],
)
def test_slurm_spec_mistakes_exit_2(launched: Launched, spec: str, message: str) -> None:
    code, output = invoke("--resources", spec, env=SLURM_JOB)
    assert code == 2 and message in output and len(output.splitlines()) == 1


@pytest.mark.timeout(10)
def test_death_timeout_sets_both_waits_for_the_scheduler(launched: Launched) -> None:
    assert invoke("--no-supervisor", "--death-timeout", "1.5m")[0] == 0
    assert launched.settings is not None
    assert launched.settings.connect_timeout == launched.settings.reconnect_timeout == 90.0
    assert invoke("--nworkers", "2", "--death-timeout", "7")[0] == 0
    for argv in launched.commands:  # each supervised process is told both
        assert argv[argv.index("--connect-timeout") + 1] == "7.0"
        assert argv[argv.index("--reconnect-timeout") + 1] == "7.0"
    code, output = invoke("--death-timeout", "soon")
    assert code == 2 and "--death-timeout='soon' is not a duration" in output
