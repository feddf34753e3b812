"""Worker resources from Dask's configuration, for clusters set up the Dask way.

A Dask worker with no ``--resources`` offers ``distributed.worker.resources`` from
Dask's configuration. apportion honours it only where none of its own settings is
given (``--resources``, ``APPORTION_RESOURCES``, ``resources`` in ``--config``, a
``LocalCluster``'s ``resources=``), read from two places:

1. ``DASK_DISTRIBUTED__WORKER__RESOURCES__<NAME>=<amount>`` variables, read here
   without importing Dask. The name is kept as written: Dask's own reader lowercases
   it (``GPU`` would become ``gpu``, which no ``resources={"GPU": 1}`` task matches).
2. Dask's configuration itself (its YAML files, ``dask.config.set`` in this process,
   ``DASK_DISTRIBUTED__WORKER__RESOURCES='{"GPU": 2}'``), through ``dask.config``:
   by ``apportion worker`` when Dask is installed, by a ``LocalCluster`` when its
   program has imported Dask. A name given by a variable of (1) takes the
   variable's amount, as Dask lets variables override files.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from apportion.core.resources import parse_resources

logger = logging.getLogger("apportion.worker")

#: The variables Dask reads for ``distributed.worker.resources.<NAME>``.
VARIABLE_PREFIX = "DASK_DISTRIBUTED__WORKER__RESOURCES__"
#: Where Dask's configuration keeps a worker's resources.
CONFIG_KEY = "distributed.worker.resources"


@dataclass(frozen=True, slots=True)
class DaskResources:
    """Resources found in Dask's configuration, and where, for the log."""

    #: An apportion spec (``"GPU=2 MEMORY=16e9"``), checked.
    spec: str
    #: Where they came from, as a log line or an error message names it.
    source: str


def read_dask_config(*, import_dask: bool = True) -> Mapping[str, Any] | None:
    """``distributed.worker.resources`` in Dask's configuration; None without Dask.

    Without ``import_dask``, only if this program has imported Dask already: a
    ``LocalCluster`` in a program that does not use Dask does not load it.
    """
    if sys.modules.get("dask") is None and (
        not import_dask or importlib.util.find_spec("dask") is None
    ):
        return None
    import dask.config

    value = dask.config.get(CONFIG_KEY, None)
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"{CONFIG_KEY} in Dask's configuration must map names to amounts")
    return value


def dask_worker_resources(
    environ: Mapping[str, str],
    read_config: Callable[[], Mapping[str, Any] | None] = read_dask_config,
) -> DaskResources | None:
    """The resources Dask's configuration gives a worker, or None if it gives none.

    ``ValueError`` (naming the source) for a name or amount apportion cannot take.
    """
    variables = {
        name[len(VARIABLE_PREFIX) :]: value
        for name, value in environ.items()
        if name.startswith(VARIABLE_PREFIX) and len(name) > len(VARIABLE_PREFIX)
    }
    config = dict(read_config() or {})
    # Dask's reader has these variables too, under lowercased names.
    spelt = {name.lower() for name in variables}
    amounts = {name: value for name, value in config.items() if name not in spelt}
    sources = []
    if amounts:
        sources.append(f"{CONFIG_KEY} in Dask's configuration")
    if variables:
        sources.append(f"{VARIABLE_PREFIX}* environment variables")
    amounts.update(variables)
    if not amounts:
        return None
    source = " and ".join(sources)
    spec = " ".join(f"{name}={value}" for name, value in sorted(amounts.items()))
    try:
        parse_resources(spec)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return DaskResources(spec, source)


def log_dask_resources(found: DaskResources, who: str) -> None:
    """Say that ``who`` offers Dask's resources, and why: none of apportion's was given."""
    logger.info(
        "%s: resources %r from %s (apportion's own resources setting is absent)",
        who,
        found.spec,
        found.source,
    )
