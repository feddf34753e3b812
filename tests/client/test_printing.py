"""``apportion.print`` and ``warn`` (Dask's ``distributed.print``/``warn``): in a task
they print or warn on the worker and on every client; elsewhere they are the builtins.
Dask's test_client.py (test_print_remote, test_warn_remote, ...) in our shapes."""

from __future__ import annotations

import asyncio
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from apportion import Client, Sub, print, warn
from apportion.client.printing import _SHOWN, show_print, show_warning
from apportion.core import payload
from apportion.testing import InMemoryCluster
from cli_processes import Processes
from cluster_checks import checked_client


class PrescientWarning(UserWarning):
    """A warning class of the user's own."""


def chatty(x: int) -> int:
    print("Hello!", x, sep=":")
    return x


def to_stderr() -> None:
    print("meow", file=sys.stderr)


def to_a_file() -> None:
    with open("/dev/null", "w") as f:
        print("meow", file=f)


def warns(kind: type[Warning]) -> int:
    warn(f"{kind.__name__} from a task", kind)
    return 1


# --- pure: what a client does with what arrives ---------------------------------------


def test_a_print_message_is_printed_as_the_builtin_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    show_print({"args": ("Hello!", "123"), "sep": None, "end": None, "flush": None})
    show_print({"args": (), "sep": ":", "end": "."})
    show_print({"args": ("meow",), "file": 2})
    show_print("by hand")  # not from apportion.print: shown as it is
    assert capsys.readouterr() == ("Hello! 123\n.by hand\n", "meow\n")


def test_a_warn_message_is_emitted_under_local_filters() -> None:
    with pytest.warns(PrescientWarning, match="Cassandra says"):
        show_warning({"message": PrescientWarning("Cassandra says..."), "category": None})
    with pytest.warns(DeprecationWarning, match="deprecated"):
        show_warning({"message": "deprecated", "category": DeprecationWarning})
    with pytest.warns(UserWarning, match="by hand"):
        show_warning("by hand")


def _packed(message: Any) -> bytes:
    """A message as a worker publishes it (``Pub.put``'s one argument)."""
    blob, _ = payload.pack_call((message,), {})
    return bytes(blob)


def test_a_message_that_cannot_be_shown_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    printer, warner = _SHOWN
    with caplog.at_level(logging.ERROR, logger="apportion.client"):
        printer.receive(_packed({"args": "not a tuple"}))
        printer.receive(_packed({"args": ("hello",), "file": "bad value"}))
        warner.receive(_packed({}))
        printer.receive(b"not a pickle")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.exc_info[0] if r.exc_info else None for r in errors] == [TypeError] * 3 + [
        RuntimeError
    ]
    assert capsys.readouterr() == ("", "")


def test_outside_a_task_they_are_the_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    print("Hello!", 123, sep=":")
    print("err", file=sys.stderr)
    assert capsys.readouterr() == ("Hello!:123\n", "err\n")
    with pytest.warns(DeprecationWarning, match="old"):
        warn("old", DeprecationWarning)


# --- in memory: every client gets what a task prints ----------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[InMemoryCluster]:
    with InMemoryCluster([{"nthreads": 1}]) as c:
        yield c


def test_every_client_gets_what_tasks_print_and_warn(cluster: InMemoryCluster) -> None:
    with checked_client(cluster) as client, checked_client(cluster) as other:
        printed = Sub("print", client=other)  # any client's subscription gets them
        # This client's: shown, like the warning itself, before the result returns.
        warned = Sub("warn", client=client)
        assert client.submit(chatty, 7).result() == 7
        assert printed.get(timeout="5s") == {
            "args": ("Hello!", "7"),
            "sep": ":",
            "end": "\n",
            "flush": False,
        }
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert client.submit(warns, PrescientWarning).result() == 1
            assert len(warned.buffer) == 1
            # The other client emits it too, on its own loop: let it, before the filters
            # go back to turning warnings into errors.
            other.submit(int, 0).result()
        got = warned.get(timeout="5s")
        assert got["category"] is PrescientWarning and "from a task" in got["message"]
        with pytest.raises(TypeError, match=r"file must be None, sys\.stdout or sys\.stderr"):
            client.submit(to_a_file).result()


def test_an_asynchronous_client_shows_what_tasks_print(
    cluster: InMemoryCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    async def main() -> None:
        async with Client(cluster.scheduler.address, asynchronous=True) as client:
            capsys.readouterr()
            await client.submit(to_stderr)
            # The worker shares this process: its own copy, then the client's.
            assert capsys.readouterr() == ("", "meow\nmeow\n")
            with pytest.warns(PrescientWarning) as record:
                await client.submit(warns, PrescientWarning)
            assert len(record) == 2  # here, the worker's and the client's

    asyncio.run(asyncio.wait_for(main(), 30))


# --- real processes: the client prints what a CLI worker's task printed -----------------


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_cli_workers_task_prints_on_the_client_before_its_result(
    procs: Processes, capsys: pytest.CaptureFixture[str]
) -> None:
    # Defined here, so that they travel by value to workers that cannot import tests.
    def chatty(x: int) -> int:
        print("Hello!", x, sep=":")
        return x

    def to_stderr() -> None:
        print("meow", file=sys.stderr)

    def warns(kind: type[Warning]) -> int:
        warn(f"{kind.__name__} from a task", kind)
        return 1

    address = procs.two_workers()
    with Client(address, set_as_default=False) as client:
        client.wait_for_workers(2, timeout="20s")
        capsys.readouterr()
        assert client.submit(chatty, 1).result() == 1
        assert capsys.readouterr() == ("Hello!:1\n", "")  # once: the worker's went to its log
        client.submit(to_stderr).result()
        assert capsys.readouterr() == ("", "meow\n")
        with pytest.warns(DeprecationWarning, match="DeprecationWarning from a task"):
            client.submit(warns, DeprecationWarning).result()

        async def main() -> None:
            async with Client(address, asynchronous=True) as aclient:
                capsys.readouterr()
                assert await aclient.submit(chatty, 2) == 2
                out = capsys.readouterr().out
                # Both clients are connected: each prints what any task printed, the
                # other one on its own loop, maybe a moment later.
                for _ in range(500):
                    if out.count("Hello!:2") == 2:
                        break
                    await asyncio.sleep(0.01)
                    out += capsys.readouterr().out
                assert out == "Hello!:2\nHello!:2\n"

        asyncio.run(asyncio.wait_for(main(), 30))
