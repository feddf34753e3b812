"""The frames of a task's failure that its user wrote, not apportion's plumbing.

A task's exception travels from a worker thread (apportion's task runner, the
unpacking of a Dask task node) to the client, where it is raised again through
the client's own layers (a call handed to the loop thread, a ``concurrent.futures``
hand-over, an ``asyncio`` wrapper). A traceback of a dozen frames of which one is
the user's hides the line that failed, so, as Dask does, both ends drop the
leading frames that are apportion's, the standard library's hand-overs, or Dask's
task-spec machinery. Only leading frames: where user code called back into
apportion, what follows is kept. A traceback that is all plumbing (apportion's
own error) is left whole, so that it still says where it came from. Pure.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_STDLIB = Path(os.__file__).parent
#: Directories (with a trailing separator) whose frames are plumbing: apportion's
#: package, and the standard library's ``asyncio`` and ``concurrent.futures``.
_PLUMBING_DIRS = tuple(
    f"{directory}{os.sep}"
    for directory in (
        Path(__file__).resolve().parents[1],
        _STDLIB / "asyncio",
        _STDLIB / "concurrent" / "futures",
    )
)
#: Dask's task-spec module (``dask/_task_spec.py``), where a graph's node calls the
#: user's function; matched by name, since apportion never imports Dask itself.
_PLUMBING_NAMES = (os.path.join("dask", "_task_spec"),)


def is_plumbing(filename: str) -> bool:
    """True for a frame of apportion itself, ``asyncio``, ``concurrent.futures`` or
    Dask's task nodes."""
    if filename.startswith(_PLUMBING_DIRS):
        return True
    if any(name in filename for name in _PLUMBING_NAMES):
        return True
    # Frames rebuilt from another machine name that machine's paths: apportion's
    # installed package there still sits in a directory named ``apportion``.
    return f"{os.sep}apportion{os.sep}" in filename and f"{os.sep}site-packages{os.sep}" in filename


def user_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from its first frame that is not plumbing; ``tb`` itself when every
    frame is."""
    start = tb
    while start is not None and is_plumbing(start.tb_frame.f_code.co_filename):
        start = start.tb_next
    return tb if start is None else start


def trimmed(exc: BaseException) -> BaseException:
    """``exc``, its traceback cut to the user's frames (``user_frames``)."""
    return exc.with_traceback(user_frames(exc.__traceback__))


def raises_user_frames(func: Callable[P, R]) -> Callable[P, R]:
    """``func``, whose exceptions reach its caller with the user's frames only
    (``trimmed``): for the calls that raise a task's failure (``gather``, ``get``),
    whose own frames and the loop hand-over beneath them would bury it."""

    @functools.wraps(func)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            try:
                raise trimmed(exc)
            finally:
                del exc  # else this frame and the exception's traceback hold each other

    return call
