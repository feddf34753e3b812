"""Run Dask.distributed's tests of its public API against apportion (or against Dask).

Usage::

    python tools/dask_tests/run.py --checkout PATH [--against apportion|dask]
                                   [-k EXPR] [--timeout S] [--report FILE]

``PATH`` is a checkout of dask/distributed (a clone of the 2026.8.0 tag). Its test files
are read from there at run time; the copies this makes in a temporary folder differ
from Dask's only in their imports of ``distributed``, which point at apportion
(``rewrite.py``). Which tests run, and which are left out because they read Dask's
internals, is ``selection.py``'s business. ``--against dask`` runs the same selection,
unchanged, on the Dask.distributed installed here, as the baseline.

Prints each test that did not pass with the first line of why, then the count.
``make dask-tests DASK_CHECKOUT=PATH`` runs it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rewrite import rewrite
from selection import Selected, select

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim"

PYTEST_INI = """\
[pytest]
addopts = -p no:cacheprovider
timeout_method = signal
markers =
    slow
    flaky
    leaking
    ci1
    extra_packages
    gpu
    workerstate
    avoid_ci
    isolated
"""


@dataclass
class Outcome:
    test: str  # file stem::test id
    status: str  # passed, failed, error, skipped
    why: str = ""


def _prepare(selected: list[Selected], folder: Path, against: str) -> list[str]:
    """Write the test files into ``folder``; the pytest node ids of the selection."""
    (folder / "pytest.ini").write_text(PYTEST_INI)
    if against == "dask":
        (folder / "conftest.py").write_text('pytest_plugins = ["distributed.utils_test"]\n')
    nodes = []
    for chosen in selected:
        source = chosen.path.read_text()
        target = folder / chosen.path.name
        target.write_text(rewrite(source) if against == "apportion" else source)
        nodes += [f"{target.name}::{test}" for test in chosen.tests]
    return nodes


def _outcomes(junit: Path) -> list[Outcome]:
    found = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        status, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed"}.get(child.tag, child.tag)
                message = child.get("message") or (child.text or "")
                why = message.strip().splitlines()[0][:200] if message.strip() else ""
                break
        found.append(Outcome(test, status, why))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, required=True)
    parser.add_argument("--against", choices=("apportion", "dask"), default="apportion")
    parser.add_argument("-k", dest="keyword", help="only the tests pytest's -k selects")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("--report", type=Path, help="also write the result here")
    parser.add_argument("--keep", type=Path, help="write the test files here and keep them")
    args = parser.parse_args()

    selected = select(args.checkout.resolve())
    left_out = [(c.path.stem, t, why) for c in selected for t, why in c.left_out]
    with tempfile.TemporaryDirectory(prefix="dask-tests-") as scratch:
        folder = args.keep.resolve() if args.keep else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        nodes = _prepare(selected, folder, args.against)
        junit = folder / "results.xml"
        command = [sys.executable, "-m", "pytest", "-q", f"--timeout={args.timeout}"]
        command += [f"--junitxml={junit}", "-o", "junit_family=xunit1"]
        if args.against == "apportion":
            command += ["-p", "as_distributed.fixtures"]
        if args.keyword:
            command += ["-k", args.keyword]
        # Workers started by the tests import the test modules and the helpers to run
        # the functions defined there, as Dask's own workers do.
        paths = [str(folder)] + ([str(SHIM)] if args.against == "apportion" else [])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(":")
        subprocess.run([*command, *nodes], cwd=folder, env=env, check=False)
        outcomes = _outcomes(junit) if junit.exists() else []

    lines = _summary(outcomes, left_out, args)
    print("\n".join(lines))
    if args.report:
        args.report.write_text("\n".join(lines) + "\n")
    return 0 if outcomes else 1


def _summary(
    outcomes: list[Outcome], left_out: list[tuple[str, str, str]], args: argparse.Namespace
) -> list[str]:
    counts = Counter(o.status for o in outcomes)
    ran = counts["passed"] + counts["failed"] + counts["error"]
    lines = [f"# Dask.distributed's public-API tests against {args.against}", ""]
    for title, status in (("Did not pass", ("failed", "error")), ("Skipped", ("skipped",))):
        chosen = [o for o in outcomes if o.status in status]
        if chosen:
            lines += [f"## {title}", ""]
            lines += [f"- `{o.test}` ({o.status}): {o.why}" for o in chosen]
            lines.append("")
    if left_out:
        lines += [f"## Left out: they read Dask's internals ({len(left_out)})", ""]
        lines += [f"- `{stem}::{test}`: {why}" for stem, test, why in left_out]
        lines.append("")
    share = 100 * counts["passed"] / ran if ran else 0.0
    lines.append(
        f"**{counts['passed']} of {ran} passed ({share:.1f} %)**"
        f"; {counts['skipped']} skipped; {len(left_out)} left out as internals"
    )
    return lines


if __name__ == "__main__":
    sys.exit(main())
