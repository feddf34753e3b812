"""Results whose classes live in a package the user's thread is importing right then.

Python's import locks are per module: while one thread runs a package's
``__init__``, the package sits half made in ``sys.modules``. A second thread that
unpickles one of its classes imports the class's submodule meanwhile, that
submodule imports the package, and the first thread then imports the submodule
too: Python breaks the deadlock by handing one of them a partial module
("cannot import name ... from partially initialized module", or pandas'
"pd_parser.c could not import module pandas"). The client therefore unpickles on
the thread that asked (``client/results.py``), never on its loop or callback
thread. Each test here imports such a package on the main thread while results of
its class arrive: with unpickling on the client's threads it fails every time.

The package sleeps in its ``__init__`` only on the main thread (the test's); the
workers import it in their task threads at once.

The worker has the same race: the last test has a task import a package slowly
while a value of its class arrives from another worker. The worker keeps that value
pickled until the task thread that needs it unpickles it (``worker/still_pickled.py``);
unpickled on the worker's loop as it arrived, it fails every time.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from apportion import Client, LocalCluster, Pub, Queue, Sub, as_completed, wait
from cli_processes import Processes, poll

pytestmark = [pytest.mark.process, pytest.mark.tcp]

# Worker processes are fresh interpreters that cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: How long the main thread spends inside the package's ``__init__``; the tasks
#: finish, and their results arrive, well within it.
IMPORT_SECONDS = 1.0
TASK_SECONDS = 0.2
N = 4


def slow_package(root: Path) -> str:
    """Write a package under ``root`` whose ``__init__`` is slow on the main thread
    and whose class lives in a submodule that imports the package; its name."""
    return _package(
        root,
        "import threading, time\n"
        "if threading.current_thread() is threading.main_thread():\n"
        f"    time.sleep({IMPORT_SECONDS})\n",
    )


def _package(root: Path, slow_part: str) -> str:
    """Write a package under ``root`` whose ``__init__`` runs ``slow_part`` before it
    imports its class from a submodule that imports the package back; its name."""
    name = f"slowpkg_{uuid.uuid4().hex[:8]}"
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text(f"{slow_part}helper = 1\nfrom {name}.things import Thing\n")
    (folder / "things.py").write_text(
        f"from {name} import helper\n\n"
        "class Thing:\n"
        "    def __init__(self, n):\n"
        "        self.n = n + helper - 1\n"
    )
    return name


def make_thing(root: str, name: str, n: int) -> Any:
    """On a worker: an instance of the package's class, after a moment."""
    time.sleep(TASK_SECONDS)
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"{name}.things").Thing(n)


def publish_thing(root: str, name: str, topic: str, n: int) -> None:
    """On a worker: publish an instance of the package's class, after a moment."""
    Pub(topic).put(make_thing(root, name, n))


def queue_thing(root: str, name: str, queue: str, n: int) -> None:
    """On a worker: put an instance of the package's class in a queue, after a moment."""
    Queue(queue).put(make_thing(root, name, n))


@pytest.fixture(scope="module", params=["local", "cli"])
def address(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A scheduler with two one-thread workers: a ``LocalCluster``, or CLI processes."""
    if request.param == "local":
        with LocalCluster(n_workers=2, threads_per_worker=1) as cluster:
            yield cluster.scheduler_address
        return
    procs = Processes(tmp_path_factory.mktemp("logs"))
    try:
        yield procs.two_workers()
    finally:
        procs.stop_all()


@pytest.fixture
def package(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(its folder, its name): a fresh slow package on this process's path."""
    name = slow_package(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        yield str(tmp_path), name
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


@pytest.mark.timeout(60)
def test_as_completed_and_an_executor_while_the_main_thread_imports(
    address: str, package: tuple[str, str]
) -> None:
    root, name = package
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        futures = client.map(make_thing, [root] * N, [name] * N, range(N), pure=False)
        results = as_completed(futures, with_results=True, timeout=20)
        executor = client.get_executor(pure=False)
        standard = [executor.submit(make_thing, root, name, n) for n in range(N, 2 * N)]
        module = importlib.import_module(name)  # the results arrive meanwhile
        things = [thing for _, thing in results]
        things += [f.result(timeout=20) for f in standard]
    assert sorted(thing.n for thing in things) == list(range(2 * N))
    assert all(type(thing) is module.Thing for thing in things)


@pytest.mark.timeout(60)
def test_published_messages_while_the_main_thread_imports(
    address: str, package: tuple[str, str]
) -> None:
    root, name = package
    topic = f"things-{uuid.uuid4().hex[:6]}"
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        sub = Sub(topic)  # returns once the scheduler has the subscription
        futures = client.map(
            publish_thing, [root] * N, [name] * N, [topic] * N, range(N), pure=False
        )
        module = importlib.import_module(name)  # the messages arrive meanwhile
        got = [sub.get(timeout=20) for _ in range(N)]
        client.gather(futures)
    assert sorted(thing.n for thing in got) == list(range(N))
    assert all(type(thing) is module.Thing for thing in got)


@pytest.mark.timeout(60)
def test_asynchronous_gather_await_and_queue_get_while_their_loop_imports(
    address: str, package: tuple[str, str]
) -> None:
    root, name = package

    async def main() -> tuple[list[Any], Any]:
        async with Client(address, asynchronous=True) as client:
            await client.wait_for_workers(2, timeout=30)
            futures = client.map(make_thing, [root] * N, [name] * N, range(N), pure=False)
            queue = Queue(f"things-{uuid.uuid4().hex[:6]}", client=client)
            queued = client.submit(queue_thing, root, name, queue.name, N, pure=False)
            gathering = asyncio.ensure_future(client.gather(futures))
            awaiting = asyncio.ensure_future(futures[0])
            taking = asyncio.ensure_future(queue.get(timeout=20))
            await asyncio.sleep(0)  # all asked for before this loop blocks in the import
            module = importlib.import_module(name)  # the results arrive meanwhile
            things = await gathering
            assert type(await awaiting) is module.Thing
            taken = await taking
            assert (type(taken), taken.n) == (module.Thing, N)
            await queued
            return things, module

    things, module = asyncio.run(main())
    assert [thing.n for thing in things] == list(range(N))
    assert all(type(thing) is module.Thing for thing in things)


def slow_on_a_worker(root: Path) -> str:
    """Write a package under ``root`` whose ``__init__`` touches ``importing`` in its
    folder and sleeps midway when ``SLOW_IMPORT`` is set in its process's environment
    (the importing task's worker only), with its class in a submodule that imports
    the package; its name."""
    return _package(
        root,
        "import os, pathlib, time\n"
        "if os.environ.get('SLOW_IMPORT'):\n"
        "    pathlib.Path(__file__).with_name('importing').touch()\n"
        f"    time.sleep({2 * IMPORT_SECONDS})\n",
    )


def import_slowly(root: str, name: str) -> str:
    """On a worker: import the package, slowly (its ``__init__`` sleeps)."""
    os.environ["SLOW_IMPORT"] = "1"
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(name).Thing.__name__


def make_large_thing(root: str, name: str, n: int) -> list[Any]:
    """On a worker: an instance of the package's class with 2 MiB beside it, so that
    the worker reserved for a task taking it fetches it ahead, while busy."""
    return [make_thing(root, name, n), bytearray(2 << 20)]


def read_thing(large: list[Any], name: str) -> int:
    """On a worker: the number in an instance of the package's class."""
    thing, _ = large
    assert type(thing) is sys.modules[f"{name}.things"].Thing
    return int(thing.n)


@pytest.mark.timeout(60)
def test_a_value_arriving_at_a_worker_while_its_task_imports_the_package(
    address: str, tmp_path: Path
) -> None:
    # The worker's event loop must not unpickle what arrives while one of its tasks
    # imports the value's package: the value waits, pickled, for the task that needs it.
    root = str(tmp_path)
    name = slow_on_a_worker(tmp_path)
    with Client(address) as client:
        client.wait_for_workers(2, timeout=30)
        maker, importer = sorted(client.scheduler_info()["workers"])
        thing = client.submit(make_large_thing, root, name, 5, workers=[maker], pure=False)
        wait(thing, timeout=20)  # made, and kept on its worker
        importing = client.submit(import_slowly, root, name, workers=[importer], pure=False)
        poll((tmp_path / name / "importing").exists, 20, "the worker's task to be importing")
        # Waits for the importing task's thread; the thing is fetched meanwhile.
        read = client.submit(read_thing, thing, name, workers=[importer], pure=False)
        assert importing.result(timeout=20) == "Thing"
        assert read.result(timeout=20) == 5
