"""``Client()`` with no address connects where ``APPORTION_SCHEDULER_FILE`` says.

That is how a script run by ``apportion slurm`` reaches the job's cluster while the
same script, run on a laptop, starts a local one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apportion.client.client import Client
from apportion.deploy.cluster_options import IgnoredOptionWarning
from apportion.deploy.local import LocalCluster
from apportion.net.scheduler_claim import SchedulerFileBusy, SchedulerFileClaim
from apportion.net.scheduler_file import read_scheduler_file, write_scheduler_file

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def cluster_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A running local cluster, its scheduler file named by APPORTION_SCHEDULER_FILE."""
    path = tmp_path / "scheduler.json"
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False) as cluster,
        Client(cluster, set_as_default=False) as owner,
    ):
        owner.write_scheduler_file(path)
        monkeypatch.setenv("APPORTION_SCHEDULER_FILE", str(path))
        yield cluster.scheduler_address, path


def test_client_without_an_address_uses_the_scheduler_file_named(
    cluster_file: tuple[str, Path],
) -> None:
    address, _ = cluster_file
    with Client(set_as_default=False) as client:
        assert client.scheduler_address == address
        assert client.cluster is None  # nothing of its own was started
        assert client.submit(lambda x: x + 1, 1).result() == 2


def test_local_cluster_options_are_ignored_with_one_warning(
    cluster_file: tuple[str, Path],
) -> None:
    address, _ = cluster_file
    with pytest.warns(IgnoredOptionWarning, match="APPORTION_SCHEDULER_FILE=.*n_workers"):
        client = Client(n_workers=4, set_as_default=False)
    with client:
        assert client.scheduler_address == address


def test_an_address_given_wins_over_the_variable(
    cluster_file: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPORTION_SCHEDULER_FILE", str(tmp_path / "missing.json"))
    address, path = cluster_file
    with Client(scheduler_file=path, set_as_default=False) as client:
        assert client.scheduler_address == address


def test_a_scheduler_file_a_running_scheduler_holds_is_not_written_over(
    cluster_file: tuple[str, Path], tmp_path: Path
) -> None:
    _, path = cluster_file
    held = tmp_path / "held.json"
    with SchedulerFileClaim.take(held) as claim:
        claim.note("tcp://127.0.0.1:1")
        write_scheduler_file(held, "tcp://127.0.0.1:1", "t" * 32, "theirs")
        with Client(scheduler_file=path, set_as_default=False) as client:
            # Made from a scheduler file, it writes none, as Dask's: its file stays.
            with pytest.raises(ValueError, match="Scheduler file already set"):
                client.write_scheduler_file(held)
            assert client.scheduler_file == path
            client.scheduler_file = None
            with pytest.raises(SchedulerFileBusy, match="belongs to the running scheduler at"):
                client.write_scheduler_file(held)
            assert client.scheduler_file is None  # nothing written, nothing held
        assert read_scheduler_file(held).id == "theirs"
