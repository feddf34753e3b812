"""``SSHCluster``'s option dictionaries, in Dask's names, read into ``ssh_commands``'
typed options. Dask passes ``connect_options`` to asyncssh; here they become ``ssh``
arguments. An option not understood is a ``ValueError`` naming it: an SSH setting
quietly dropped would connect somewhere, or somehow, the user did not ask for.
"""

from __future__ import annotations

from typing import Any

from apportion.core.resources import ResourceSpec, format_resources, parse_supply
from apportion.deploy.ssh_commands import ConnectOptions, SchedulerOptions, WorkerOptions


def connect_options(given: dict[str, Any]) -> ConnectOptions:
    """``port``, ``username``, ``known_hosts`` (a file; None: do not check host keys,
    as asyncssh's None), ``client_keys`` (identity files), ``config`` (an ssh config
    file; None: none at all) and ``options`` (raw ``ssh`` arguments)."""
    words: list[str] = []
    if "port" in given:
        words += ["-p", str(int(given.pop("port")))]
    if "username" in given:
        words += ["-l", str(given.pop("username"))]
    if "known_hosts" in given:
        known = given.pop("known_hosts")
        if known is None:
            words += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        else:
            words += ["-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes"]
    if "client_keys" in given:
        keys = given.pop("client_keys")
        for key in [keys] if isinstance(keys, str) else keys:
            words += ["-i", str(key)]
        words += ["-o", "IdentitiesOnly=yes"]
    if "config" in given:
        config = given.pop("config")
        words += ["-F", "/dev/null" if config is None else str(config)]
    options = given.pop("options", ())
    words += [options] if isinstance(options, str) else [str(word) for word in options]
    ssh = str(given.pop("ssh", "ssh"))
    _refuse_rest(given, "connect_options")
    return ConnectOptions(ssh, tuple(words))


def scheduler_options(given: dict[str, Any]) -> SchedulerOptions:
    """``port`` (0: any free) and ``host`` (the interface to listen on)."""
    defaults = SchedulerOptions()
    port = int(given.pop("port", defaults.port))
    if not 0 <= port < 65536:
        raise ValueError(f"scheduler_options port {port} is not a TCP port")
    host = given.pop("host", None)
    _refuse_rest(given, "scheduler_options")
    return SchedulerOptions(port, None if host is None else str(host))


def worker_options(given: dict[str, Any]) -> WorkerOptions:
    """``n_workers`` (Dask's name) or ``nworkers`` per host, ``nthreads``,
    ``resources`` (a spec's text or a dict) and ``host`` (the data port's interface)."""
    if "n_workers" in given and "nworkers" in given:
        raise ValueError("worker_options: give n_workers or nworkers, not both")
    nworkers = int(given.pop("n_workers", given.pop("nworkers", 1)))
    if nworkers < 1:
        raise ValueError(f"worker_options: {nworkers} workers per host; give at least 1")
    nthreads = given.pop("nthreads", None)
    if nthreads is not None and int(nthreads) < 1:
        raise ValueError(f"worker_options: nthreads {nthreads}; give at least 1")
    resources = _resources_text(given.pop("resources", None))
    host = given.pop("host", None)
    _refuse_rest(given, "worker_options")
    return WorkerOptions(
        nworkers,
        None if nthreads is None else int(nthreads),
        resources,
        None if host is None else str(host),
    )


def _resources_text(resources: ResourceSpec) -> str | None:
    """The spec's text, checked here rather than by every remote worker."""
    if resources is None:
        return None
    amounts, units = parse_supply(resources)
    return resources if isinstance(resources, str) else format_resources(amounts, units)


def _refuse_rest(given: dict[str, Any], what: str) -> None:
    if given:
        names = ", ".join(sorted(given))
        raise ValueError(f"{what}: not understood here: {names}")
