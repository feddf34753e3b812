"""Worker resources from Dask's configuration, where apportion's own settings are absent.

The rule (docs/scheduling.md): ``--resources``, then ``APPORTION_RESOURCES``, then
``resources`` in ``--config``; only where none is given, Dask's
``DASK_DISTRIBUTED__WORKER__RESOURCES__<NAME>`` variables over Dask's configuration.
The worker command runs in-process with ``run_one`` replaced, so nothing starts.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
from click.testing import CliRunner

from apportion import LocalCluster
from apportion.cli.main import main
from apportion.cli.worker import WorkerSettings
from apportion.core.resources import SCALE
from apportion.deploy.cluster_options import memory_thresholds
from apportion.worker.dask_config import (
    dask_may_set,
    dask_memory_thresholds,
    dask_worker_resources,
    read_dask_config,
)
from apportion.worker.memory_policy import MemoryThresholds

pytestmark = pytest.mark.timeout(10)

GPU_VARIABLE = "DASK_DISTRIBUTED__WORKER__RESOURCES__GPU"
MEMORY_VARIABLE_PREFIX = "DASK_DISTRIBUTED__WORKER__MEMORY__"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No resources setting from the machine running the tests, apportion's or Dask's."""
    monkeypatch.delenv("APPORTION_RESOURCES", raising=False)
    for name in list(os.environ):
        if name.startswith(("DASK_DISTRIBUTED__WORKER__RESOURCES", MEMORY_VARIABLE_PREFIX)):
            monkeypatch.delenv(name)
    with dask.config.set({"distributed.worker.resources": None}):
        yield


# --- the reader, pure ------------------------------------------------------------


def test_variables_give_resources_with_their_names_as_written() -> None:
    found = dask_worker_resources({GPU_VARIABLE: "2", "HOME": "/root"}, read_config=dict)
    assert found is not None
    assert found.spec == "GPU=2"  # Dask's own reader would say gpu
    assert found.source == "DASK_DISTRIBUTED__WORKER__RESOURCES__* environment variables"


def test_dasks_configuration_gives_resources_when_no_variable_does() -> None:
    found = dask_worker_resources({}, read_config=lambda: {"GPU": 1, "MEMORY": 16e9})
    assert found is not None
    assert found.spec == "GPU=1 MEMORY=16000000000.0"
    assert found.source == "distributed.worker.resources in Dask's configuration"
    assert dask_worker_resources({}, read_config=lambda: None) is None
    assert dask_worker_resources({}, read_config=dict) is None


def test_a_variable_overrides_the_lowercased_copy_dask_keeps_of_it() -> None:
    # Dask's configuration holds the variable too, as "gpu": only the variable counts.
    config = {"gpu": 2, "licence": 1}
    found = dask_worker_resources({GPU_VARIABLE: "4"}, read_config=lambda: config)
    assert found is not None
    assert found.spec == "GPU=4 licence=1"
    assert " and " in found.source


def test_an_amount_apportion_cannot_take_names_where_it_came_from() -> None:
    with pytest.raises(ValueError, match=r"RESOURCES__\* environment variables: .*'GPU'"):
        dask_worker_resources({GPU_VARIABLE: "two"}, read_config=dict)
    with pytest.raises(ValueError, match="in Dask's configuration"):
        dask_worker_resources({}, read_config=lambda: {"GPU": -1})


def test_dasks_configuration_is_read_through_dask_and_without_it_not_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with dask.config.set({"distributed.worker.resources": {"GPU": 2}}):
        assert read_dask_config() == {"GPU": 2}
        monkeypatch.delitem(sys.modules, "dask")  # as if not imported: a LocalCluster's view
        assert read_dask_config(import_dask=False) is None
        monkeypatch.setitem(sys.modules, "dask", None)  # as if Dask were not installed
        assert read_dask_config() is None
        found = dask_worker_resources({GPU_VARIABLE: "1"})
        assert found is not None and found.spec == "GPU=1"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DASK_DISTRIBUTED__WORKER__RESOURCES", '{"GPU": 2}'),
        ("DASK_DISTRIBUTED__WORKER", '{"resources": {"GPU": 2}}'),
        ("DASK_DISTRIBUTED", '{"worker": {"resources": {"GPU": 2}}}'),
        ("DASK_INTERNAL_INHERIT_CONFIG", "e30="),
    ],
)
def test_dask_is_loaded_for_a_variable_that_may_set_the_table(
    tmp_path: Path, variable: str, value: str
) -> None:
    quiet = {"HOME": str(tmp_path), "DASK_ROOT_CONFIG": str(tmp_path / "none")}
    assert not dask_may_set("distributed.worker.resources", quiet)
    assert not dask_may_set("distributed.worker.resources", {**quiet, GPU_VARIABLE: "1"})
    assert dask_may_set("distributed.worker.resources", {**quiet, variable: value})


def test_dask_is_loaded_for_a_settings_file_where_dask_looks(tmp_path: Path) -> None:
    home, root, named = tmp_path / "home", tmp_path / "etc", tmp_path / "named.yaml"
    environ = {"HOME": str(home), "DASK_ROOT_CONFIG": str(root)}
    key = "distributed.worker.memory"
    assert not dask_may_set(key, environ)
    (home / ".config" / "dask").mkdir(parents=True)
    (home / ".config" / "dask" / "notes.txt").write_text("not settings")
    assert not dask_may_set(key, environ)
    (home / ".config" / "dask" / "worker.YAML").write_text("distributed: {}\n")
    assert dask_may_set(key, environ)
    root.mkdir()
    (root / "site.json").write_text("{}")
    assert dask_may_set(key, {**environ, "HOME": str(tmp_path / "elsewhere")})
    named.write_text("distributed: {}\n")
    assert dask_may_set(key, {"HOME": str(tmp_path / "x"), "DASK_CONFIG": str(named)})


@pytest.mark.timeout(60)
def test_a_fresh_program_loads_dask_only_for_a_settings_file(tmp_path: Path) -> None:
    """What ``apportion worker`` does at start: Dask's YAML is read when there is one,
    and Dask is not imported at all when there is none."""
    (tmp_path / ".config" / "dask").mkdir(parents=True)
    program = (
        "import sys\n"
        "from apportion.worker.dask_config import read_dask_config\n"
        "print(read_dask_config(), 'dask' in sys.modules)\n"
    )
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DASK_")},
        "HOME": str(tmp_path),
        "DASK_ROOT_CONFIG": str(tmp_path / "none"),
    }

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", program],
            env=environ,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "None False"
    settings = "distributed:\n  worker:\n    resources:\n      GPU: 3\n"
    (tmp_path / ".config" / "dask" / "gpus.yaml").write_text(settings)
    assert run() == "{'GPU': 3} True"


def test_memory_thresholds_come_from_dasks_configuration_or_its_variables() -> None:
    config = {"target": 0.5, "spill": False, "monitor-interval": "100ms"}
    found = dask_memory_thresholds({}, read_config=lambda: config)
    assert found is not None and dict(found.fractions) == {"target": 0.5, "spill": False}
    assert found.source == "distributed.worker.memory in Dask's configuration"
    assert dask_memory_thresholds({}, read_config=dict) is None
    # Without Dask, its variables, as Dask would parse them.
    variables = {
        MEMORY_VARIABLE_PREFIX + "PAUSE": "False",
        MEMORY_VARIABLE_PREFIX + "TARGET": "0.4",
    }
    found = dask_memory_thresholds(variables, read_config=lambda: None)
    assert found is not None and dict(found.fractions) == {"pause": False, "target": 0.4}
    assert found.source == "DASK_DISTRIBUTED__WORKER__MEMORY__* environment variables"
    with pytest.raises(ValueError, match=r"distributed\.worker\.memory\.pause"):
        dask_memory_thresholds({}, read_config=lambda: {"pause": 1.5})
    with pytest.raises(ValueError, match="MEMORY__SPILL"):
        dask_memory_thresholds({MEMORY_VARIABLE_PREFIX + "SPILL": "lots"}, read_config=lambda: None)


def test_a_local_clusters_memory_fractions_come_before_dasks() -> None:
    options = {"memory_target_fraction": 0.5, "memory_pause_fraction": False, "n": 1}
    with dask.config.set({"distributed.worker.memory.target": 0.3}):
        chosen = memory_thresholds(options, {})
    assert chosen == MemoryThresholds(target=0.5, pause=False)
    assert options == {"n": 1}  # taken out: not ignored, not unknown
    with dask.config.set({"distributed.worker.memory.terminate": False}):
        assert memory_thresholds({"memory_spill_fraction": None}, {}).terminate is False
    with pytest.raises(ValueError, match="memory_spill_fraction"):
        memory_thresholds({"memory_spill_fraction": 7}, {})


# --- apportion worker: precedence --------------------------------------------------


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[WorkerSettings]:
    """The settings each ``apportion worker`` would have started a worker with."""
    settings: list[WorkerSettings] = []

    def run_one(address: str, given: WorkerSettings) -> int:
        settings.append(given)
        return 0

    monkeypatch.setattr("apportion.cli.worker.run_one", run_one)
    return settings


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["worker", "tcp://127.0.0.1:8786", *args], env=env)


def test_a_worker_without_apportions_settings_takes_dasks_variables(
    launched: list[WorkerSettings], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "apportion.worker")
    assert invoke(env={GPU_VARIABLE: "2"}).exit_code == 0
    assert launched[0].resources == "GPU=2"
    assert "resources 'GPU=2' from DASK_DISTRIBUTED__WORKER__RESOURCES__*" in caplog.text


def test_a_worker_without_apportions_settings_takes_dasks_configuration(
    launched: list[WorkerSettings],
) -> None:
    with dask.config.set({"distributed.worker.resources": {"GPU": 1, "licence": 2}}):
        assert invoke().exit_code == 0
    assert invoke().exit_code == 0
    assert [s.resources for s in launched] == ["GPU=1 licence=2", None]


def test_apportions_own_settings_come_before_dasks(
    launched: list[WorkerSettings], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "apportion.worker")
    config = tmp_path / "worker.toml"
    config.write_text('resources = "licence=3"\n')
    dask_env = {GPU_VARIABLE: "2"}
    assert invoke("--config", str(config), env=dask_env).exit_code == 0
    both = {**dask_env, "APPORTION_RESOURCES": "GPU=5"}
    assert invoke("--config", str(config), env=both).exit_code == 0
    assert invoke("--resources", "GPU=7", env=both).exit_code == 0
    # Given as none: apportion was told "no resources", so Dask's are not used.
    assert invoke("--resources", "none", env=dask_env).exit_code == 0
    # An empty variable counts as unset (as for every option read from a variable).
    assert invoke(env={**dask_env, "APPORTION_RESOURCES": ""}).exit_code == 0
    assert [s.resources for s in launched] == ["licence=3", "GPU=5", "GPU=7", "", "GPU=2"]
    assert f"resources 'licence=3' from resources in {config}" in caplog.text
    assert "resources 'GPU=5' from APPORTION_RESOURCES" in caplog.text
    assert "resources 'GPU=7' from --resources" in caplog.text


def test_memory_options_come_before_dasks_configuration(
    launched: list[WorkerSettings], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "apportion.worker")
    # One process that only spills and pauses: no supervisor to start.
    limited = ("--memory-limit", "1GiB", "--no-supervisor", "--memory-terminate", "off")
    with dask.config.set({"distributed.worker.memory.target": 0.4}):
        assert invoke(*limited).exit_code == 0
        assert invoke(*limited, "--memory-target", "0.5").exit_code == 0
        assert invoke().exit_code == 0  # no limit: no thresholds to read
    assert [s.memory.target for s in launched] == [0.4, 0.5, 0.6]
    assert "worker: memory thresholds target 0.4 from distributed.worker.memory" in caplog.text
    with dask.config.set({"distributed.worker.memory.pause": False}):
        assert invoke(*limited).exit_code == 0
    assert launched[-1].memory.pause is False


def test_a_malformed_dask_amount_exits_2_naming_its_source(
    launched: list[WorkerSettings],
) -> None:
    result = invoke(env={GPU_VARIABLE: "lots"})
    assert result.exit_code == 2 and not launched
    assert result.output.startswith(
        "Error: DASK_DISTRIBUTED__WORKER__RESOURCES__* environment variables: resource 'GPU'"
    )


# --- LocalCluster -------------------------------------------------------------------


def offered(cluster: LocalCluster) -> list[dict[str, int]]:
    """What each worker of ``cluster`` told the scheduler it has, by name order."""
    deadline = time.monotonic() + 5
    # In-process workers are started when the cluster is; they register a moment later.
    while len(cluster.scheduler.state.workers) < len(cluster.specs):
        assert time.monotonic() < deadline, "workers did not register"
        time.sleep(0.01)
    workers = sorted(cluster.scheduler.state.workers.values(), key=lambda w: w.name)
    return [dict(w.ledger.total) for w in workers]


@pytest.mark.tcp
def test_a_local_cluster_without_resources_takes_dasks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "apportion.worker")
    monkeypatch.setenv(GPU_VARIABLE, "2")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster:
        assert offered(cluster) == [{"GPU": 2 * SCALE}] * 2
    assert "LocalCluster: resources 'GPU=2' from DASK_DISTRIBUTED" in caplog.text
    with LocalCluster(1, 1, resources="licence=1", processes=False) as cluster:
        assert offered(cluster) == [{"licence": SCALE}]
    # Shapes given worker by worker are complete as written.
    with LocalCluster(workers=[{"nthreads": 1}], processes=False) as cluster:
        assert offered(cluster) == [{}]
    monkeypatch.delenv(GPU_VARIABLE)
    with (
        dask.config.set({"distributed.worker.resources": {"GPU": 1}}),
        LocalCluster(1, 1, processes=False) as cluster,
    ):
        assert offered(cluster) == [{"GPU": SCALE}]
