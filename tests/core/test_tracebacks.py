"""Tracebacks cut to the user's frames: apportion's, asyncio's and concurrent.futures'
leading frames go, the rest stays (pure: tracebacks of code compiled here)."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

import apportion
from apportion.core.tracebacks import is_plumbing, raises_user_frames, trimmed, user_frames

PACKAGE = Path(apportion.__file__).resolve().parent


def compiled(filename: str, source: str) -> Callable[..., Any]:
    """The function ``f`` of ``source``, its frames named ``filename``."""
    space: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), space)
    return space["f"]  # type: ignore[no-any-return]


def user_code(x: int) -> float:
    return 1 / x


PLUMBING = str(PACKAGE / "worker" / "made_up.py")
#: apportion's frames calling the user's function, which calls apportion back.
CALLS = compiled(PLUMBING, "def f(g, *args):\n    return g(*args)\n")


def names(tb: TracebackType | None) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(tb)]


def failure(func: Callable[..., Any], *args: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        func(*args)
    return info.value


def test_leading_plumbing_frames_go_and_the_users_stay() -> None:
    exc = failure(CALLS, CALLS, user_code, 0)
    assert names(exc.__traceback__) == ["failure", "f", "f", "user_code"]
    assert names(user_frames(exc.__traceback__)) == ["failure", "f", "f", "user_code"]
    # From the first plumbing frame on, as a task's traceback starts on a worker.
    inner = exc.__traceback__
    assert inner is not None and inner.tb_next is not None
    assert names(user_frames(inner.tb_next)) == ["user_code"]


def test_plumbing_called_back_from_user_code_is_kept() -> None:
    def calls_back(x: int) -> float:
        return float(CALLS(user_code, x))

    exc = failure(CALLS, calls_back, 0)
    assert exc.__traceback__ is not None
    assert names(user_frames(exc.__traceback__.tb_next)) == ["calls_back", "f", "user_code"]


def test_a_traceback_of_plumbing_only_is_left_whole() -> None:
    raises = compiled(PLUMBING, "def f():\n    raise ValueError('ours')\n")
    exc = failure(raises)
    assert exc.__traceback__ is not None
    tb = exc.__traceback__.tb_next
    assert user_frames(tb) is tb
    assert user_frames(None) is None


def test_frames_of_the_hand_overs_and_of_other_installs_are_plumbing() -> None:
    assert is_plumbing(str(PACKAGE / "client" / "future.py"))
    assert is_plumbing(os.path.join(os.path.dirname(os.__file__), "asyncio", "tasks.py"))
    assert is_plumbing(
        os.path.join(os.path.dirname(os.__file__), "concurrent", "futures", "_base.py")
    )
    assert is_plumbing(os.path.join("x", "dask", "_task_spec.py"))
    assert is_plumbing("/opt/venv/lib/python3.12/site-packages/apportion/worker/execution.py")
    assert not is_plumbing(__file__)
    assert not is_plumbing("/home/me/apportion/analysis.py")  # a user's folder of that name
    assert not is_plumbing("<dynamic-code>")


def test_a_wrapped_call_raises_with_its_own_frame_and_the_users() -> None:
    # Stands for ``Client.gather``: apportion's frames, down to the user's function.
    gather = raises_user_frames(compiled(PLUMBING, "def f(c, g, x):\n    return c(c, g, x)\n"))
    exc = failure(gather, CALLS, user_code, 0)
    assert isinstance(exc, ZeroDivisionError)
    assert names(exc.__traceback__) == ["failure", "call", "user_code"]
    assert gather.__name__ == "f" and gather(CALLS, user_code, 2) == 0.5
    assert trimmed(exc) is exc
