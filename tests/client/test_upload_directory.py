"""``UploadDirectory``, as Dask's test_client.py uses it: a directory reaches every
worker, also one that joins later, and ``update_path`` makes its modules importable."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from apportion import Client, UploadDirectory
from cli_processes import Processes


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """Dask's test directory (foo.py, bar.py importing it), and what is left out."""
    root = tmp_path / "proj_upload"
    (root / "tests").mkdir(parents=True)
    (root / "foo.py").write_text("x = 123\n")
    (root / "bar.py").write_text("from foo import x\n")
    (root / "tests" / "test_foo.py").write_text("")
    (root / "stale.pyc").write_bytes(b"")
    (root / "data.csv").write_text("1,2\n")
    return root


@pytest.fixture
def clean_imports() -> Iterator[None]:
    """Whatever the test imports or puts on ``sys.path`` does not outlive it."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def names_in(plugin: UploadDirectory) -> list[str]:
    with zipfile.ZipFile(io.BytesIO(plugin.data)) as archive:
        return sorted(archive.namelist())


def test_the_directory_is_zipped_without_what_dask_skips(project: Path) -> None:
    plugin = UploadDirectory(project)
    assert plugin.name == "upload-directory-proj_upload" and plugin.path == "proj_upload"
    assert names_in(plugin) == ["proj_upload/bar.py", "proj_upload/data.csv", "proj_upload/foo.py"]
    fewer = UploadDirectory(project, skip_words=(), skip=(lambda f: f.endswith(".csv"),))
    assert names_in(fewer) == [
        "proj_upload/bar.py",
        "proj_upload/foo.py",
        "proj_upload/stale.pyc",
        "proj_upload/tests/test_foo.py",
    ]


def test_refusals_say_what_to_do(project: Path) -> None:
    with pytest.raises(ValueError, match="mode must be 'workers'"):
        UploadDirectory(project, mode="invalid")
    with pytest.raises(ValueError, match="scheduler runs no user code"):
        UploadDirectory(project, mode="all")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        UploadDirectory(project / "foo.py")
    with pytest.warns(FutureWarning, match="restart_workers"):
        assert UploadDirectory(project, restart=True).restart_workers


@pytest.mark.usefixtures("clean_imports")
def test_setup_unpacks_into_the_workers_directory(project: Path, tmp_path: Path) -> None:
    worker = SimpleNamespace(local_directory=str(tmp_path / "worker"))
    plugin = UploadDirectory(project, update_path=True, restart_workers=True)
    plugin.setup(worker)
    unpacked = tmp_path / "worker" / "proj_upload"
    assert sorted(os.listdir(unpacked)) == ["bar.py", "data.csv", "foo.py"]
    assert sys.path[0] == str(unpacked)
    import bar  # type: ignore[import-not-found]

    assert bar.x == 123
    (project / "foo.py").write_text("x = 456\n")
    UploadDirectory(project, update_path=True, restart_workers=True).setup(worker)
    # restart_workers: the modules of the old copy are forgotten, so the new one loads.
    assert "foo" not in sys.modules and "bar" not in sys.modules
    import bar  # type: ignore[import-not-found,no-redef]

    assert bar.x == 456
    plugin.teardown(worker)
    assert str(unpacked) not in sys.path


@pytest.mark.process
@pytest.mark.timeout(90)
def test_the_directory_reaches_cli_workers_and_one_that_joins_later(
    procs: Processes, project: Path
) -> None:
    def imported() -> int:
        import bar  # type: ignore[import-not-found]

        return int(bar.x)

    start = set(os.listdir())
    address = procs.two_workers()
    with Client(address, set_as_default=False) as client:
        client.wait_for_workers(2, timeout="30s")
        answers = client.register_plugin(UploadDirectory(project, update_path=True))
        assert len(answers) == 2 and all(a["status"] == "OK" for a in answers.values())
        assert set((client.run(imported) or {}).values()) == {123}
        procs.start("worker", address, "--nthreads", "1", "--name", "late")
        client.wait_for_workers(3, timeout="30s")
        assert list((client.run(imported, workers=["late"]) or {}).values()) == [123]
        assert set((client.run(imported) or {}).values()) == {123}

        async def from_an_asynchronous_client() -> dict[str, int]:
            async with Client(address, asynchronous=True) as aclient:
                (project / "foo.py").write_text("x = 7\n")
                plugin = UploadDirectory(project, update_path=True, restart_workers=True)
                await aclient.register_plugin(plugin)
                got: dict[str, int] = await aclient.run(imported)
                return got

        answered = asyncio.run(asyncio.wait_for(from_an_asynchronous_client(), 60))
        assert sorted(answered.values()) == [7, 7, 7]
    assert set(os.listdir()) == start  # nothing written where the client runs
