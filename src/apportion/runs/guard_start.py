"""Starting a run's command under its guard, and one line for users when it cannot.

The worker's guard server (``guard_server.py``) forks a guard (``guard.py``) per run
and hands it three pipes: the life line, on which the guard first reads the run's
spec (``guard_spec``), its reports (``guard PID``, then ``started PID`` or why the
command could not be executed) and the run's output. A server found dead is
replaced once. ``process.py`` runs and stops the command once it has started.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from io import FileIO
from pathlib import Path
from typing import BinaryIO

from apportion.runs.guard_server import GuardServer, GuardServerGone, server_for

#: The guard every command starts under, forked by a server run by path with the
#: standard library only (``python -I -S``): importing apportion would cost ~0.6 s.
GUARD = str(Path(__file__).with_name("guard.py"))


class RunStartError(Exception):
    """The command could not be started; the message is one line for users."""


def guard_spec(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> bytes:
    """What the guard reads on its life line: ``ARGC SIZE``, a newline, then SIZE bytes
    of NUL-separated argv, directory and ``NAME=VALUE`` environment entries."""
    items = [os.fsencode(arg) for arg in argv]
    items.append(os.fsencode(cwd))
    for name, value in env.items():
        if not name or "=" in name:
            raise ValueError(f"illegal environment variable name {name!r}")
        items.append(os.fsencode(name) + b"=" + os.fsencode(value))
    if any(b"\0" in item for item in items):
        raise ValueError("embedded null byte")
    payload = b"\0".join(items)
    return b"%d %d\n" % (len(argv), len(payload)) + payload


def start_guard(command: str, spec: bytes) -> tuple[int, int, BinaryIO, FileIO]:
    """Have this worker's guard server fork a guard for a run and give it ``spec``:
    ``(guard's pid, life line, reports, output)``. A server found dead is replaced
    once; ``RunStartError`` if a new one fails too, or the guard does."""
    replacing: GuardServer | None = None
    while True:
        try:
            server, fresh = server_for(sys.executable, GUARD, replacing=replacing)
        except OSError as exc:
            raise RunStartError(_guard_failed(command, exc.strerror or str(exc))) from exc
        life_read, life_write = os.pipe()  # not inheritable: only the guard gets an end
        report_read, report_write = os.pipe()
        output_read, output_write = os.pipe()
        try:
            server.request(life_read, report_write, output_write)
        except GuardServerGone:
            _close(life_write, report_read, output_read)
            if fresh:
                raise RunStartError(_guard_failed(command, server.failure())) from None
            replacing = server
            continue
        finally:
            _close(life_read, report_write, output_write)
        with contextlib.suppress(BrokenPipeError):  # a guard that died says so below
            _write_all(life_write, spec)
        reports = os.fdopen(report_read, "rb")
        output = os.fdopen(output_read, "rb", buffering=0)
        words = reports.readline().split()
        if len(words) == 2 and words[0] == b"guard":
            return int(words[1]), life_write, reports, output
        # No guard: the server died (killed meanwhile, or it cannot start), or the
        # guard it forked did.
        reports.close()
        os.close(life_write)
        said = _last_words(output)
        if not server.gone():
            raise RunStartError(_guard_failed(command, said or "it ended without a word"))
        if fresh:
            raise RunStartError(_guard_failed(command, server.failure()))
        replacing = server


def _guard_failed(command: str, why: str) -> str:
    return f"cannot start {command!r}: its guard ({sys.executable}) failed: {why}"


def _last_words(output: FileIO) -> str:
    """The last line written on a run's output by a guard that died before the command
    started (nothing else holds it then); closes it."""
    with output:
        said = output.read() or b""
    lines = said.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def command_started(reports: BinaryIO, life: int, output: FileIO, command: str, cwd: str) -> int:
    """The command's pid once its guard says it runs; ``RunStartError`` if it could not
    be executed (the guard has then exited)."""
    words = reports.readline().split()
    if len(words) == 2 and words[0] == b"started":
        return int(words[1])
    reports.close()
    os.close(life)
    said = _last_words(output)
    if len(words) == 2 and words[0] in (b"failed", b"nocwd"):
        errno = int(words[1])
        where = cwd if words[0] == b"nocwd" else command
        raise RunStartError(_start_failure(command, cwd, OSError(errno, os.strerror(errno), where)))
    raise RunStartError(_guard_failed(command, said or "it ended without a word"))


def _start_failure(command: str, cwd: str, exc: OSError) -> str:
    """``"cannot start 'x': No such file or directory"``, naming ``cwd`` if it is at fault."""
    reason = exc.strerror or str(exc)
    if exc.filename == cwd and cwd != command:
        return f"cannot start {command!r} in {cwd!r}: {reason}"
    return f"cannot start {command!r}: {reason}"
