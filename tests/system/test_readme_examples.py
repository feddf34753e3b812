"""The README's examples marked ``<!-- runs as written ... -->`` run as written, and so
does ``make demo``'s script.

A marked example is the Python block right after the marker line. Each runs in a
fresh interpreter, as a user would run it pasted into a file, in an empty directory
with an ``APPORTION_HOME`` of its own, and must exit 0. So the README cannot drift
from what apportion does: a renamed argument, a resource the embedded cluster does
not offer or a name the block never defines fails here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest

from cli_processes import run_python_script

README = Path(__file__).resolve().parents[2] / "README.md"

#: The marker line, then the example's fenced block.
_MARKED = re.compile(r"^<!-- runs as written\b[^\n]*-->\n```python\n(.*?)^```$", re.M | re.S)
#: Modules an example needs beyond apportion's own (skipped, saying so, without them).
_OPTIONAL = ("dask",)


def marked_examples(text: str) -> list[tuple[int, str]]:
    """``(line of its opening fence, code)`` of every marked Python block of ``text``."""
    return [(text.count("\n", 0, found.start()) + 2, found[1]) for found in _MARKED.finditer(text)]


def test_the_first_example_and_several_of_the_tour_are_marked() -> None:
    text = README.read_text()
    examples = marked_examples(text)
    first_block = text.index("```python\n")
    assert examples and examples[0][0] == text.count("\n", 0, first_block) + 1, (
        "the README's first Python example must be marked to run as written"
    )
    assert len(examples) >= 3
    # A marker not followed by a Python block would be skipped silently.
    assert text.count("<!-- runs as written") == len(examples)


def test_markers_are_found_only_right_before_a_python_block() -> None:
    text = (
        "<!-- runs as written -->\n```python\nprint(1)\n```\n"
        "```python\nnot_marked()\n```\n"
        "<!-- runs as written: with a note -->\n```python\nx = 2\nprint(x)\n```\n"
    )
    assert marked_examples(text) == [(2, "print(1)\n"), (9, "x = 2\nprint(x)\n")]


EXAMPLES = marked_examples(README.read_text())


def _run(code: str, folder: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    script = folder / "example.py"
    script.write_text(code)
    env = {**os.environ, "APPORTION_HOME": str(folder / "home"), "PYTHONWARNINGS": "default"}
    return run_python_script(script, env, timeout)


@pytest.mark.process
@pytest.mark.tcp
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("line", "code"), EXAMPLES, ids=[f"line-{n}" for n, _ in EXAMPLES])
def test_the_example_runs_as_written(line: int, code: str, tmp_path: Path) -> None:
    for module in _OPTIONAL:
        if re.search(rf"^\s*(import|from) {module}\b", code, re.M) and not (
            importlib.util.find_spec(module)
        ):
            pytest.skip(f"the example at README.md:{line} needs {module}, which is not installed")
    done = _run(code, tmp_path, timeout=100)
    assert done.returncode == 0, (
        f"README.md:{line}: exit status {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n"
        f"--- stderr\n{done.stderr[-6000:]}"
    )


@pytest.mark.process
@pytest.mark.tcp
@pytest.mark.timeout(120)
def test_make_demo_runs(tmp_path: Path) -> None:
    """``make demo``'s script, the first example's fuller form, which the README names."""
    source = (README.parent / "examples" / "seed_resources.py").read_text()
    done = _run(source, tmp_path, timeout=100)
    assert done.returncode == 0, done.stderr[-6000:]
    assert "peak concurrent GPU tasks per worker" in done.stdout
    assert "UnsatisfiableError: task 'process-" in done.stdout
