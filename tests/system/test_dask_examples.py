"""Scripts in the shape of Dask's documentation run with only their import changed.

Each script in ``tests/system/dask_examples/`` is written for Dask.distributed
(``from dask.distributed import ...``) and prints its answers as JSON on its last
line. The test rewrites that import to ``from apportion import ...``, runs the
script in a fresh interpreter, as a user would, and compares its answers with the
ones Dask.distributed gave for the unchanged script, recorded in
``tests/system/dask_examples/expected/``. A recording names the hash of the script it came
from, so a script changed without recording Dask's answers again fails here.

Record Dask's answers again (Dask.distributed installed) with::

    .venv/bin/python tests/system/test_dask_examples.py --record [NAME ...]
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from cli_processes import run_python_script

pytestmark = pytest.mark.tcp  # an in-process cluster over real TCP

HERE = Path(__file__).parent / "dask_examples"
EXPECTED = HERE / "expected"
SCRIPTS = sorted(p.stem for p in HERE.glob("*.py"))

#: Modules a script needs beyond the test extras' (skipped, saying so, without them).
NEEDS = {"dataframe": ["pandas", "pyarrow"]}

_IMPORT = re.compile(r"^from (dask\.distributed|distributed) import ", re.MULTILINE)


def switched(source: str) -> str:
    """The script with its Dask.distributed import changed to apportion's."""
    changed, count = _IMPORT.subn("from apportion import ", source)
    assert count >= 1, "an example must import from dask.distributed"
    return changed


def digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def run_script(source: str, timeout: float) -> dict[str, Any]:
    """Run ``source`` in a fresh interpreter; its answers from the last line of output."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "script.py"
        path.write_text(source)
        done = run_python_script(path, {**os.environ, "PYTHONWARNINGS": "default"}, timeout)
    if done.returncode != 0 or not done.stdout.strip():
        raise AssertionError(
            f"exit status {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n"
            f"--- stderr\n{done.stderr[-6000:]}"
        )
    answers: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answers


@pytest.mark.process
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_with_the_import_changed(name: str) -> None:
    for module in NEEDS.get(name, []):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{name} needs {module}, which is not installed")
    source = (HERE / f"{name}.py").read_text()
    recorded = json.loads((EXPECTED / f"{name}.json").read_text())
    assert recorded["script_sha256"] == digest(source), (
        f"{name}.py changed since Dask's answers were recorded: "
        f"run `.venv/bin/python tests/system/test_dask_examples.py --record {name}`"
    )
    assert run_script(switched(source), timeout=150) == recorded["answers"]


def record(names: list[str]) -> None:
    """Run the unchanged scripts on Dask.distributed and keep their answers."""
    import distributed

    EXPECTED.mkdir(exist_ok=True)
    for name in names or SCRIPTS:
        source = (HERE / f"{name}.py").read_text()
        answers = run_script(source, timeout=600)
        entry = {
            "script_sha256": digest(source),
            "distributed": distributed.__version__,
            "answers": answers,
        }
        (EXPECTED / f"{name}.json").write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
        print(f"{name}: recorded {len(answers)} answers")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--record"]:
        sys.exit("usage: test_dask_examples.py --record [NAME ...]")
    record(sys.argv[2:])
