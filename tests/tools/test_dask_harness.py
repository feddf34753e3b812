"""The harness that runs Dask.distributed's tests against apportion: its import
rewriting keeps every other byte and line number, and its shim resolves names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "dask_tests"
sys.path[:0] = [str(TOOLS), str(TOOLS / "shim")]

import as_distributed  # noqa: E402
from rewrite import rewrite  # noqa: E402
from selection import INTERNALS, select  # noqa: E402

import apportion  # noqa: E402

SOURCE = '''\
import os
from distributed import (
    Client,
    wait as wait_for_it,
)
from distributed.utils_test import inc, gen_cluster
import distributed


def test_x(c):
    from distributed.client import _global_clients
    code = """from distributed import LocalCluster"""
    assert "ünïcode" and c.submit(inc, 1).result() == 2
'''


def test_rewrite_changes_only_imports_and_keeps_line_numbers() -> None:
    out = rewrite(SOURCE)
    assert len(out.splitlines()) == len(SOURCE.splitlines())
    assert "from distributed" not in out and "import distributed\n" not in out
    assert "from apportion import LocalCluster" in out
    # Every line that holds no import of distributed is byte for byte Dask's.
    changed = {
        number
        for number, (new, old) in enumerate(zip(out.splitlines(), SOURCE.splitlines(), strict=True))
        if new != old
    }
    assert changed == {1, 2, 3, 4, 5, 6, 10, 11}
    namespace: dict[str, object] = {}
    exec(compile(out, "test_x.py", "exec"), namespace)
    assert namespace["Client"] is apportion.Client
    assert namespace["wait_for_it"] is apportion.wait
    assert namespace["inc"] is as_distributed.utils_test.inc  # type: ignore[attr-defined]
    assert namespace["distributed"].Client is apportion.Client  # type: ignore[attr-defined]


def test_a_name_apportion_lacks_fails_where_used_saying_which() -> None:
    (missing,) = as_distributed.names("distributed.client", "_global_clients")
    with pytest.raises(NotImplementedError, match=r"distributed\.client\._global_clients"):
        missing()
    with pytest.raises(AttributeError, match="_global_clients"):
        missing.clear  # noqa: B018

    class Sub(missing):  # type: ignore[misc,valid-type]
        pass

    with pytest.raises(NotImplementedError, match="_global_clients"):
        Sub()


def test_selection_names_real_tests_and_says_why_each_is_left_out(tmp_path: Path) -> None:
    assert all(reason.strip() for reason in INTERNALS.values())
    with pytest.raises(SystemExit, match="dask/distributed checkout"):
        select(tmp_path)
