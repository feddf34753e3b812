"""pyproject.toml in the form setuptools accepts without its deprecation banner."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_licence_is_an_spdx_expression_and_setuptools_is_new_enough_for_it() -> None:
    data = tomllib.loads(PYPROJECT.read_text())
    # A table ({text = ...}) makes every install print setuptools' deprecation banner.
    assert data["project"]["license"] == "BSD-3-Clause"
    (setuptools,) = [r for r in data["build-system"]["requires"] if r.startswith("setuptools")]
    found = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools)
    assert found, setuptools
    assert int(found[1]) >= 77  # the first to take an SPDX string for project.license
