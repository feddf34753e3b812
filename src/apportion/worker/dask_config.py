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
   by ``apportion worker`` when Dask is installed and has settings beyond its
   defaults to read (``dask_may_set``), by a ``LocalCluster`` when its program has
   imported Dask. A name given by a variable of (1) takes the
   variable's amount, as Dask lets variables override files.

A worker's memory thresholds (``target``, ``spill``, ``pause``, ``terminate``: see
``worker.memory_policy``) come from Dask's ``distributed.worker.memory.<name>``
likewise, where apportion's own options leave one unset (``--memory-target``, a
``LocalCluster``'s ``memory_target_fraction=``...). Through ``dask.config`` when
it is available: it has read the ``DASK_DISTRIBUTED__WORKER__MEMORY__<NAME>``
variables itself, and ``dask.config.set`` may override them, as in Dask. Without
it, those variables are read here.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import site
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from apportion.core.resources import parse_resources
from apportion.worker.memory_policy import (
    THRESHOLD_NAMES,
    Fraction,
    MemoryThresholds,
    parse_fraction,
)

logger = logging.getLogger("apportion.worker")

#: The variables Dask reads for ``distributed.worker.resources.<NAME>``.
VARIABLE_PREFIX = "DASK_DISTRIBUTED__WORKER__RESOURCES__"
#: Where Dask's configuration keeps a worker's resources.
CONFIG_KEY = "distributed.worker.resources"
#: Where Dask's configuration keeps a worker's memory thresholds.
MEMORY_KEY = "distributed.worker.memory"
#: The variables Dask reads for ``distributed.worker.memory.<name>``.
MEMORY_VARIABLE_PREFIX = "DASK_DISTRIBUTED__WORKER__MEMORY__"


@dataclass(frozen=True, slots=True)
class DaskResources:
    """Resources found in Dask's configuration, and where, for the log."""

    #: An apportion spec (``"GPU=2 MEMORY=16e9"``), checked.
    spec: str
    #: Where they came from, as a log line or an error message names it.
    source: str


def read_dask_config(
    key: str = CONFIG_KEY, *, import_dask: bool = True
) -> Mapping[str, Any] | None:
    """The table at ``key`` (``distributed.worker.resources``) in Dask's configuration;
    None without Dask, or when it has no such table.

    Without ``import_dask``, only if this program has imported Dask already: a
    ``LocalCluster`` in a program that does not use Dask does not load it.
    """
    if sys.modules.get("dask") is None and (
        not import_dask
        or not dask_may_set(key, os.environ)
        or importlib.util.find_spec("dask") is None
    ):
        return None
    import dask.config

    value = dask.config.get(key, None)
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"{key} in Dask's configuration must be a table of names to values")
    return value


def dask_may_set(key: str, environ: Mapping[str, str]) -> bool:
    """Whether Dask's configuration, not yet loaded, may hold more than its defaults
    at ``key``: a file where Dask looks for them, a variable naming ``key`` or a table
    above it (``DASK_DISTRIBUTED__WORKER='{...}'``), or the settings Dask hands its own
    subprocesses. Without any, the defaults are all it has, and a worker's start
    spares the 0.1 s of CPU that importing Dask costs.

    The ``DASK_<KEY>__<NAME>`` variables below ``key`` are read without Dask (see the
    module's docstring), so they alone do not count."""
    if "DASK_INTERNAL_INHERIT_CONFIG" in environ:
        return True
    parts = key.upper().split(".")
    tables = {"DASK_" + "__".join(parts[:end]) for end in range(1, len(parts) + 1)}
    if any(name.upper().replace("-", "_") in tables for name in environ):
        return True
    return any(_holds_settings(path) for path in _dask_config_paths(environ))


def _dask_config_paths(environ: Mapping[str, str]) -> list[str]:
    """Where Dask reads its YAML and JSON settings from, as ``dask.config`` lists them."""
    home = environ.get("HOME") or os.path.expanduser("~")
    paths = [
        environ.get("DASK_ROOT_CONFIG", "/etc/dask"),
        os.path.join(sys.prefix, "etc", "dask"),
        *[os.path.join(prefix, "etc", "dask") for prefix in site.PREFIXES],
        os.path.join(home, ".config", "dask"),
    ]
    if "DASK_CONFIG" in environ:
        paths.append(environ["DASK_CONFIG"])
    return paths


def _holds_settings(path: str) -> bool:
    """A settings file, or a folder with one (``.yaml``, ``.yml``, ``.json``)."""
    if os.path.isfile(path):
        return True
    try:
        names = os.listdir(path)
    except OSError:  # absent, or not ours to read: Dask skips it too
        return False
    return any(os.path.splitext(name)[1].lower() in (".json", ".yaml", ".yml") for name in names)


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


@dataclass(frozen=True, slots=True)
class DaskMemory:
    """Memory thresholds found in Dask's settings (only those set there), and where."""

    #: Threshold name (``target``...) -> fraction or False, checked.
    fractions: Mapping[str, Fraction]
    #: Where they came from, as a log line or an error message names it.
    source: str


def dask_memory_thresholds(
    environ: Mapping[str, str],
    read_config: Callable[[], Mapping[str, Any] | None] = lambda: read_dask_config(MEMORY_KEY),
) -> DaskMemory | None:
    """The thresholds Dask's settings give a worker, or None if they give none.

    Dask's configuration when it is there (it includes the variables); else the
    ``DASK_DISTRIBUTED__WORKER__MEMORY__<NAME>`` variables. ``ValueError`` naming
    the setting for a value that is neither a fraction in (0, 1] nor false.
    """
    config = read_config()
    if config is not None:
        raw = {name: config[name] for name in THRESHOLD_NAMES if name in config}
        source = f"{MEMORY_KEY} in Dask's configuration"
        where = f"{MEMORY_KEY}.{{}}"
    else:
        raw = {
            name: environ[MEMORY_VARIABLE_PREFIX + name.upper()]
            for name in THRESHOLD_NAMES
            if MEMORY_VARIABLE_PREFIX + name.upper() in environ
        }
        source = f"{MEMORY_VARIABLE_PREFIX}* environment variables"
        where = MEMORY_VARIABLE_PREFIX + "{}"
    if not raw:
        return None
    fractions = {
        name: parse_fraction(value, where.format(name.upper() if config is None else name))
        for name, value in raw.items()
    }
    return DaskMemory(fractions, source)


def choose_thresholds(
    given: Mapping[str, Fraction], found: DaskMemory | None, who: str
) -> MemoryThresholds:
    """apportion's own settings (``given``), then Dask's, then the defaults. What
    Dask's settings change from the defaults is logged, naming where it came from."""
    taken = {
        name: fraction
        for name, fraction in (found.fractions.items() if found is not None else ())
        if name not in given
    }
    defaults = MemoryThresholds()
    changed = {name: f for name, f in taken.items() if f != getattr(defaults, name)}
    if changed and found is not None:
        logger.info(
            "%s: memory thresholds %s from %s",
            who,
            MemoryThresholds(**changed).describe(only=changed),
            found.source,
        )
    return MemoryThresholds(**{**taken, **given})
