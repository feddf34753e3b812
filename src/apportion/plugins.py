"""Worker plugins users import: ``WorkerPlugin``, the base class Dask's documentation
tells users to subclass, and ``UploadDirectory``.

apportion installs any object with ``setup(worker)`` and/or ``teardown(worker)``
(``client.register_plugin``); ``WorkerPlugin`` exists so that code written as Dask's
docs show it (``class MyPlugin(WorkerPlugin): ...``) imports from apportion too.
A plugin reaches every worker as ``upload_file``'s files do: the scheduler keeps it
and installs it on workers that join later.
"""

from __future__ import annotations

import importlib
import io
import os
import sys
import warnings
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: Parts of a path ``UploadDirectory`` leaves out by default, as Dask's does.
SKIP_WORDS = (".git", ".github", ".pytest_cache", "tests", "docs")


def _compiled(filename: str) -> bool:
    return os.path.splitext(filename)[1] == ".pyc"


class WorkerPlugin:
    """Hooks run on each worker: ``setup`` when installed there (or when the worker
    joins later), ``teardown`` when removed or when the worker closes. Either may be
    ``async def``. Dask's ``transition`` hook is not called by apportion's workers.
    """

    #: The name the plugin is registered under, unless ``register_plugin`` gives one.
    name: str | None = None

    def setup(self, worker: Any) -> Any:
        """Run on the worker when the plugin is installed there."""

    def teardown(self, worker: Any) -> Any:
        """Run on the worker when the plugin is removed or the worker closes."""


class UploadDirectory(WorkerPlugin):
    """A local directory, copied to every worker (those that join later too), as
    Dask's: ``client.register_plugin(UploadDirectory("src/mypkg", update_path=True))``.

    The directory is zipped here, leaving out files under a part named in
    ``skip_words`` and those any ``skip`` predicate accepts (compiled ``.pyc`` files by
    default), and unpacked into each worker's ``local_directory``, which is on the
    worker's ``sys.path``: a package directory is importable at once. With
    ``update_path`` the directory itself goes first on ``sys.path`` too (its modules
    importable by their own names), until the plugin is removed.

    ``restart_workers`` (Dask's ``restart``) is done without restarting: a worker
    forgets the modules it imported from an earlier copy of the directory, so the
    next import reads the new files and no worker loses its data. Objects made from
    the old code keep it. ``mode`` is ``"workers"``: the scheduler runs no user code,
    so nothing is uploaded to it. A plugin is limited to 64 MiB (the scheduler
    refuses a larger one when it is registered): leave data out with ``skip``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        restart_workers: bool = False,
        update_path: bool = False,
        skip_words: Iterable[str] = SKIP_WORDS,
        skip: Iterable[Callable[[str], bool]] = (_compiled,),
        mode: str = "workers",
        *,
        restart: bool | None = None,
    ) -> None:
        if restart is not None:
            warnings.warn(
                "UploadDirectory(restart=) is Dask's old name: use restart_workers=",
                FutureWarning,
                stacklevel=2,
            )
            restart_workers = restart
        if mode in ("scheduler", "all"):
            raise ValueError(
                f"UploadDirectory(mode={mode!r}): apportion's scheduler runs no user code, "
                "so nothing is uploaded to it; use mode='workers' (run_on_scheduler "
                "functions run in the client, which has the directory already)"
            )
        if mode != "workers":
            raise ValueError(f"UploadDirectory(mode={mode!r}): mode must be 'workers'")
        source = Path(os.path.expanduser(os.fspath(path))).resolve()
        if not source.is_dir():
            raise NotADirectoryError(f"UploadDirectory: {source} is not a directory")
        #: The directory's own name: where it is unpacked on each worker.
        self.path = source.name
        self.restart_workers = restart_workers
        self.update_path = update_path
        self.name = f"upload-directory-{source.name}"
        #: The zipped directory, each file named from the directory's own name down.
        self.data = _zipped(source, set(skip_words), list(skip))

    def setup(self, worker: Any) -> None:
        """Unpack into the worker's ``local_directory``; see the class docstring."""
        base = Path(worker.local_directory)
        target = base / self.path
        if self.restart_workers:
            _forget_modules_under(target)
        with zipfile.ZipFile(io.BytesIO(self.data)) as archive:
            archive.extractall(base)
        if self.update_path and str(target) not in sys.path:
            sys.path.insert(0, str(target))
        importlib.invalidate_caches()  # new files in directories already listed

    def teardown(self, worker: Any) -> None:
        """Take the directory off ``sys.path`` (its files go with the worker's)."""
        target = str(Path(worker.local_directory) / self.path)
        if self.update_path and target in sys.path:
            sys.path.remove(target)

    def __repr__(self) -> str:
        return f"<UploadDirectory: {self.path}, {len(self.data):,} bytes zipped>"


def _zipped(source: Path, skip_words: set[str], skip: list[Callable[[str], bool]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for root, _, files in os.walk(source):
            for file in sorted(files):
                filename = os.path.join(root, file)
                if any(predicate(filename) for predicate in skip):
                    continue
                if skip_words & set(Path(filename).parts):
                    continue
                archive.write(filename, os.path.relpath(filename, source.parent))
    return buffer.getvalue()


def _forget_modules_under(directory: Path) -> None:
    """Drop imported modules whose files are in ``directory``: imported again, they
    read what is there now."""
    inside = str(directory) + os.sep
    for name, module in list(sys.modules.items()):
        filename = getattr(module, "__file__", None)
        if isinstance(filename, str) and filename.startswith(inside):
            del sys.modules[name]
