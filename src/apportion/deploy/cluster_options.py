"""Dask's keyword arguments to ``LocalCluster`` and ``Client``, sorted into ours and the rest.

Dask's ``LocalCluster`` takes some thirty keywords and forwards unknown ones to its
``Worker`` class; scripts written for it pass many that only tune Dask's own
machinery (``protocol=``, ``nanny=``, ``local_directory=``...). Those are accepted
here so that such a script runs unchanged, and named once, in one
``IgnoredOptionWarning`` per cluster, so that nothing is ignored silently. A keyword
that neither Dask nor apportion knows is a ``TypeError``, as a misspelt argument is
everywhere else in Python.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from apportion.loop_thread import is_apportion_loop
from apportion.worker.dask_config import (
    MEMORY_KEY,
    choose_thresholds,
    dask_memory_thresholds,
    read_dask_config,
)
from apportion.worker.detect import parse_memory_limit
from apportion.worker.memory_policy import MemoryThresholds, parse_fraction


class IgnoredOptionWarning(UserWarning):
    """Options of Dask that tune its internals and have no meaning here were ignored.

    Filter it like any warning: ``warnings.filterwarnings("ignore",
    category=IgnoredOptionWarning)``.
    """


#: Keywords of Dask's ``LocalCluster``, ``SpecCluster`` and ``Worker``/``Nanny`` that
#: tune Dask's own machinery: accepted, ignored, and named in one warning.
DASK_CLUSTER_OPTIONS = frozenset(
    {
        "loop",
        "start",
        "ip",
        "worker_dashboard_address",
        "services",
        "worker_services",
        "service_kwargs",
        "blocked_handlers",
        "interface",
        "worker_class",
        "scheduler_kwargs",
        "scheduler_sync_interval",
        "nanny",
        "env",
        "dashboard",
        "preload",
        "preload_argv",
        "preload_nanny",
        "lifetime",
        "lifetime_stagger",
        "lifetime_restart",
        "validate",
        "heartbeat_interval",
        "extensions",
        "data",
        "plugins",
        "shutdown_on_close",
        "scheduler_file",
        "quiet",
        "contact_address",
        "listen_address",
        "executor",
        "low_level_profiler",
        "transition_counter_max",
        "max_spill",
    }
)

#: Dask's keywords for a worker's memory thresholds, and the threshold each sets.
MEMORY_FRACTION_OPTIONS = {
    "memory_target_fraction": "target",
    "memory_spill_fraction": "spill",
    "memory_pause_fraction": "pause",
    "memory_terminate_fraction": "terminate",
}

#: Keywords of Dask's ``Client`` alone (not meant for a cluster) that tune its internals.
DASK_CLIENT_OPTIONS = frozenset(
    {
        "loop",
        "heartbeat_interval",
        "serializers",
        "deserializers",
        "extensions",
        "connection_limit",
    }
)


def sort_options(given: Mapping[str, Any], ignorable: Iterable[str], where: str) -> list[str]:
    """The names in ``given`` to ignore (sorted); ``TypeError`` for any unknown one."""
    allowed = frozenset(ignorable)
    unknown = sorted(set(given) - allowed)
    if unknown:
        # Dask's exact words, which users search for and scripts may compare; where
        # they went is a note, shown with the traceback.
        error = TypeError(f"Unexpected keyword arguments: {unknown}")
        error.add_note(f"{where} takes none of these")
        raise error
    return sorted(given)


def take_own_loop(options: dict[str, Any]) -> None:
    """Drop ``loop=`` from ``options`` when it is None or a loop apportion runs (a
    client's ``loop``): Dask scripts pass one client's loop on to the next client or
    cluster (``Client(..., loop=client.loop)``), and here each runs on a loop of its
    own whatever is passed, so there is nothing to warn of. Any other loop stays, to
    be named among the ignored options."""
    if "loop" in options and (options["loop"] is None or is_apportion_loop(options["loop"])):
        del options["loop"]


def warn_ignored(names: Iterable[str], where: str, stacklevel: int = 3) -> None:
    """One warning naming every ignored option, or none when there is nothing to say."""
    listed = sorted(names)
    if listed:
        warnings.warn(
            f"{where}: ignoring options that only tune Dask's internals: {', '.join(listed)}",
            IgnoredOptionWarning,
            stacklevel=stacklevel,
        )


def memory_limit_bytes(value: str | float | None, n_workers: int) -> int:
    """Dask's ``memory_limit`` forms as bytes per worker; 0 means no limit.

    ``"4GiB"`` or ``4_000_000_000`` (bytes), ``0.5`` (a fraction of the machine's
    memory, for each worker), ``"auto"`` (the machine's memory shared among the
    workers), ``0`` or ``None`` (no limit).
    """
    if value is None or value is False:
        return 0
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(f"memory_limit must be a size, a fraction, 'auto' or None, not {value!r}")
    text = value if isinstance(value, str) else repr(value)
    try:
        return parse_memory_limit(text, max(1, n_workers))
    except ValueError as exc:
        raise ValueError(str(exc).replace("--memory-limit", "memory_limit")) from None


def log_levels(silence_logs: int | str | bool | None) -> tuple[int, int]:
    """(level the workers log at, level from which their lines reach the user).

    Workers log one level more than the user sees (INFO at most), so that
    ``get_logs`` has the context of a warning. A falsy ``silence_logs`` shows
    everything at INFO, as Dask's "no change" would.
    """
    if silence_logs is None or silence_logs is False or silence_logs == 0:
        return logging.INFO, logging.NOTSET
    if silence_logs is True:
        level = logging.WARNING
    elif isinstance(silence_logs, str):
        named = logging.getLevelName(silence_logs.upper())
        if not isinstance(named, int):
            raise ValueError(f"silence_logs: unknown log level {silence_logs!r}")
        level = named
    else:
        level = int(silence_logs)
    return min(level, logging.INFO), level


def memory_thresholds(options: dict[str, Any], environ: Mapping[str, str]) -> MemoryThresholds:
    """Take Dask's ``memory_*_fraction`` keywords out of ``options``: each given one
    (a fraction in (0, 1], or False), else Dask's configuration if this program
    imported Dask (or its variables), else Dask's default. None means not given,
    as in Dask."""
    given = {}
    for option, name in MEMORY_FRACTION_OPTIONS.items():
        value = options.pop(option, None)
        if value is not None:
            given[name] = parse_fraction(value, option)
    found = dask_memory_thresholds(environ, lambda: read_dask_config(MEMORY_KEY, import_dask=False))
    return choose_thresholds(given, found, "LocalCluster")


def host_for_protocol(protocol: str | None, host: str | None, processes: bool) -> str | None:
    """The scheduler's host for Dask's ``protocol=`` of a local cluster: ``inproc://``
    keeps it in memory (workers in this process only), ``tls://`` names TLS,
    ``tcp://`` (or None) leaves ``host`` as given."""
    if protocol is None:
        return host
    scheme = protocol.split("://")[0].rstrip(":").lower()
    bare = None if host is None else host.split("://")[-1]
    if scheme == "inproc":
        if processes:
            raise ValueError(
                "protocol='inproc://' keeps the cluster in this process's memory: "
                "give processes=False too"
            )
        return "inproc://"
    if scheme == "tls":
        return f"tls://{bare or '127.0.0.1'}"
    if scheme == "tcp":
        return host
    raise ValueError(f"protocol must be 'tcp://', 'tls://' or 'inproc://', not {protocol!r}")
