"""The README's Dask parity table names every public name of Dask.distributed's
Client, LocalCluster, Future and package, and what it marks as there is there."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import apportion
from apportion import Client, LocalCluster

distributed = pytest.importorskip("distributed")

README = Path(__file__).resolve().parent.parent / "README.md"
STATUSES = {"supported", "differently", "not yet", "not planned"}
ROW = re.compile(r"^\| `([A-Za-z_]\w*)` \| ([a-z ]+?) \|(.*)\|$")


def table(section: str) -> dict[str, str]:
    """Name -> status in the README's parity subsection ``section``."""
    text = README.read_text()
    start = text.index(f"#### {section}\n")
    end = text.find("\n#### ", start + 1)
    rows: dict[str, str] = {}
    for line in text[start : end if end > 0 else None].splitlines():
        found = ROW.match(line)
        if found:
            name, status, _ = found.groups()
            assert status in STATUSES, f"{name}: unknown status {status!r}"
            assert name not in rows, f"{name} is listed twice under {section}"
            rows[name] = status
    return rows


def public(obj: Any) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


@pytest.fixture(scope="module")
def objects() -> Iterator[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # none is expected; the point is the names
        cluster = LocalCluster(n_workers=1, processes=False)
    with cluster, Client(cluster) as client:
        future = client.submit(sum, [1])
        yield {
            "Client": client,
            "LocalCluster": cluster,
            "Future": future,
            "Top-level names": apportion,
        }


@pytest.mark.tcp
@pytest.mark.parametrize(
    ("section", "dask_names"),
    [
        ("Client", public(distributed.Client)),
        ("LocalCluster", public(distributed.LocalCluster)),
        ("Future", public(distributed.Future)),
        ("Top-level names", set(distributed.__all__)),
    ],
)
def test_every_dask_name_is_in_the_table_and_supported_ones_exist(
    section: str, dask_names: set[str], objects: dict[str, Any]
) -> None:
    rows = table(section)
    assert sorted(dask_names - set(rows)) == [], f"not in the README's {section} table"
    ours = objects[section]
    claimed = [name for name, status in rows.items() if status in ("supported", "differently")]
    assert [name for name in claimed if not hasattr(ours, name)] == []
    if section == "Top-level names":
        exported = set(apportion.__all__)
        assert [name for name in claimed if name not in exported] == []
