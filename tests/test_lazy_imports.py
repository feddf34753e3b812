"""A process imports only what it uses: ``import apportion`` loads no client, scheduler,
deployment, dashboard or Dask; ``apportion --help`` loads no subcommand; a worker
process loads no client, scheduler, dashboard, Dask or cryptography.

Checked in fresh interpreters (``sys.modules`` of this one holds everything the other
tests imported). What is left out is what costs: the worker's start and ``--help``
were paying for the whole package.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click
import click.testing
import pytest

import apportion
from apportion.cli.main import SUBCOMMANDS, main

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

#: Modules a process that does not use them must not load (prefixes).
HEAVY = (
    "apportion.client.client",
    "apportion.client.session",
    "apportion.deploy.local",
    "apportion.scheduler.service",
    "apportion.dashboard",
    "dask",
    "cryptography",
    # apportion.joblib's: loaded only by those who import it.
    "joblib",
    "sklearn",
)


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_import_apportion_loads_no_client_scheduler_deployment_or_dask() -> None:
    assert heavy(loaded_after("import apportion")) == []


def test_a_worker_side_name_loads_no_client() -> None:
    assert heavy(loaded_after("from apportion import task_resources, get_worker, print")) == []


def test_every_public_name_loads_on_use() -> None:
    code = (
        "import apportion\n"
        "for name in apportion.__all__:\n"
        "    exec(f'from apportion import {name}')\n"
        "    assert getattr(apportion, name) is eval(name), name\n"
    )
    loaded = loaded_after(code)
    assert {"apportion.client.client", "apportion.scheduler.service"} <= loaded


def test_names_in_dir_and_unknown_names_raise() -> None:
    assert set(apportion.__all__) <= set(dir(apportion))
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        _ = apportion.Clinet  # type: ignore[attr-defined]


def test_a_cluster_alone_makes_its_client_and_closes_it_first() -> None:
    """With only the deployment imported, ``get_client`` loads the client, which puts
    its sessions first in line to close at exit."""
    code = (
        "from apportion.deploy import local\n"
        "assert local.client_type is None and not local.close_first\n"
        "cluster = local.LocalCluster(n_workers=0, processes=False, dashboard_address=None)\n"
        "client = cluster.get_client()\n"
        "assert type(client).__name__ == 'Client' and client.cluster is cluster\n"
        "assert local.close_first\n"
    )
    assert "apportion.client.client" in loaded_after(code)


def test_help_lists_every_command_without_loading_one() -> None:
    code = (
        "import contextlib, io\n"
        "from apportion.cli.main import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "print(json.dumps(out.getvalue()))\n"
    )
    script = f"import json\n{code}import sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    text_line, modules_line = done.stdout.splitlines()[-2:]
    text = json.loads(text_line)
    listed = text.partition("Commands:")[2].split()
    assert set(SUBCOMMANDS) <= set(listed)
    loaded = set(json.loads(modules_line))
    assert not {where.module for where in SUBCOMMANDS.values()} & loaded
    assert heavy(loaded) == []


@pytest.mark.parametrize("limit", [20, 45, 74, 200])
def test_each_summary_is_what_its_command_says(limit: int) -> None:
    """``--help`` shows the same short help as the loaded commands would."""
    ctx = click.Context(main)
    for name, where in SUBCOMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name
        unloaded = click.Command(name, help=where.summary)
        assert unloaded.get_short_help_str(limit) == command.get_short_help_str(limit), name


def test_an_unknown_command_is_a_usage_error() -> None:
    result = click.testing.CliRunner().invoke(main, ["nonesuch"])
    assert result.exit_code == 2 and "No such command 'nonesuch'" in result.output


@pytest.mark.tcp
def test_a_worker_process_loads_no_client_scheduler_dashboard_or_dask() -> None:
    """A supervised worker's own command line (every value explicit, as its supervisor
    writes it), run until it gives up on a scheduler that is not there."""
    argv = [sys.executable, "-X", "importtime", "-m", "apportion.cli.main", "worker"]
    argv += ["tcp://127.0.0.1:1", "--host", "127.0.0.1", "--port", "0", "--nthreads", "1"]
    argv += ["--resources", "none", "--connect-timeout", "0.2", "--memory-limit", "0"]
    for threshold in ("target", "spill", "pause", "terminate"):
        argv += [f"--memory-{threshold}", "off"]
    argv += ["--nworkers", "1", "--no-supervisor", "--name", "w-0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert "could not start" in done.stderr  # it ran as far as connecting
    loaded = {
        line.rpartition("|")[2].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "apportion.worker.service" in loaded
    assert heavy(loaded) == []
    # Of the client package, only the hook that makes Dask's compute in a task run here.
    assert sorted(m for m in loaded if m.startswith("apportion.client.")) == [
        "apportion.client.dask_default"
    ]
