"""Where a ``Client`` connects: the embedded cluster it starts, a cluster's address
and credentials, the scheduler file (given, or named by ``APPORTION_SCHEDULER_FILE``),
and the options it refuses or ignores. Functions of what they are given, run before
the client has a session; none of them needs the client itself."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from apportion.client.asynchronous import awaited
from apportion.client.session import Session
from apportion.deploy.cluster import ClusterManager
from apportion.deploy.cluster_options import (
    DASK_CLIENT_OPTIONS,
    IgnoredOptionWarning,
    sort_options,
    warn_ignored,
)
from apportion.deploy.local import LocalCluster
from apportion.net.scheduler_claim import SchedulerFileBusy, holder_of
from apportion.net.scheduler_file import wait_for_scheduler_file, write_scheduler_file
from apportion.net.security import Security
from apportion.protocol.base import Message
from apportion.protocol.cluster import InfoRequest

#: Names the scheduler ``Client()`` connects to when given no address (``apportion slurm``).
SCHEDULER_FILE_ENV = "APPORTION_SCHEDULER_FILE"


def start_cluster(options: dict[str, Any]) -> LocalCluster:
    """The embedded cluster of ``Client()``, given every option the client does not
    take, as Dask's does; it names the ignored ones (its own and the client's) in
    one warning and rejects what neither Dask nor apportion knows."""
    return LocalCluster(**options)


def cluster_to_use(
    address: str | LocalCluster | ClusterManager | None,
    security: Security | bool | None,
    cluster_options: dict[str, Any],
    asynchronous: bool,
) -> tuple[str | LocalCluster | ClusterManager, Security | None, LocalCluster | None]:
    """What a ``Client`` connects to, the credentials left for it to use, and the
    cluster it starts and owns (None when given an address or a cluster).

    As Dask's, a client given no address hands every keyword it does not know to
    the ``LocalCluster`` it starts (an asynchronous one's starts when the client is
    awaited), and its ``security`` too; given an address, those keywords are an
    error, or ignored with a warning for Dask's own client tuning.
    """
    own: LocalCluster | None = None
    if isinstance(address, type):
        # Dask's words first: "Scheduler address must be a string or a Cluster instance".
        raise TypeError(
            "Scheduler address must be a string or a Cluster instance, not the class "
            f"{address.__name__}: make the cluster first, Client({address.__name__}())"
        )
    if address is None:
        options = {**cluster_options, "asynchronous": True} if asynchronous else cluster_options
        if security is not None:
            options["security"], security = security, None  # the cluster's from now on
        own = address = start_cluster(options)
    else:
        ignore_client_options(cluster_options)
    if security is True:
        raise ValueError(
            "security=True makes temporary certificates for a cluster started here "
            "(Client(security=True) with no address); a client of a running scheduler "
            "takes that scheduler's Security"
        )
    return address, security or None, own


def cluster_address(
    address: str | LocalCluster | ClusterManager, security: Security | None, asynchronous: bool
) -> tuple[str, Security | None]:
    """A cluster's scheduler address and credentials (``security`` if given)."""
    if isinstance(address, str):
        return address, security or None
    security = security or address.security
    if isinstance(address, LocalCluster) and not address.scheduler_address and not asynchronous:
        raise RuntimeError(
            "this LocalCluster is asynchronous and not started: await it first, or "
            "make the client asynchronous too (await Client(cluster, asynchronous=True))"
        )
    # "" for an asynchronous LocalCluster not started yet; a cluster started elsewhere
    # (SSHCluster, SlurmCluster) is closed by its owner.
    return address.scheduler_address, security


def from_scheduler_file(
    path: str | os.PathLike[str],
    address: object,
    security: Security | bool | None,
    timeout: float,
) -> tuple[str, Security | bool | None]:
    """The address in the scheduler file at ``path``, and the credentials to use there:
    ``security`` if given (with the file's secret if it has none), else the
    environment's with the file's secret (and the file's TLS credentials if the
    environment gives none). A file not written yet is waited for up to
    ``timeout`` seconds, as Dask's client does (a job script may start before its
    scheduler has written it)."""
    if address is not None:
        raise ValueError("give an address or a scheduler_file, not both")
    found = wait_for_scheduler_file(path, timeout)
    if not isinstance(security, Security):
        security = Security.from_environment().with_token(found.token, str(path))
        if found.tls_cert and not security.has_tls:  # the file carries a client's TLS
            security = replace(
                security,
                tls_ca_file=found.tls_ca,
                tls_client_cert=found.tls_cert,
                tls_client_key=found.tls_key,
                _contexts={},
            )
    elif security.token is None:  # TLS settings given, the secret left to the file
        security = security.with_token(found.token, str(path))
    return found.address, security


def scheduler_file_from_environment(cluster_options: dict[str, Any]) -> str | None:
    """``APPORTION_SCHEDULER_FILE`` if set (emptying ``cluster_options``, with a warning:
    the cluster they would size is the one the file names), else None."""
    path = os.environ.get(SCHEDULER_FILE_ENV) or None
    if path is not None and cluster_options:
        warnings.warn(
            f"Client(): connecting to the scheduler in {SCHEDULER_FILE_ENV}={path}; "
            f"ignoring the local cluster's options {', '.join(sorted(cluster_options))}",
            IgnoredOptionWarning,
            stacklevel=4,
        )
        cluster_options.clear()
    return path


def ignore_client_options(options: dict[str, Any]) -> None:
    """A client of an existing scheduler: options meant to start a cluster are an error."""
    warn_ignored(sort_options(options, DASK_CLIENT_OPTIONS, "Client()"), "Client", stacklevel=4)


async def session_async(
    address: str,
    name: str,
    timeout: float,
    on_message: Callable[[Message], None],
    on_lost: Callable[[str], None],
    security: Security,
    *,
    wait_for_scheduler: bool = True,
) -> tuple[Session, dict[str, Any]]:
    """An asynchronous client's session, connected from the caller's running loop,
    and the scheduler's identity; the session's own loop is stopped if either fails,
    so that a client that never connected leaves no thread behind."""
    session = Session(
        address,
        name,
        timeout,
        on_message,
        on_lost,
        security=security,
        asynchronous=True,
        wait_for_scheduler=wait_for_scheduler,
    )
    try:
        await awaited(session.loop, session.connect, timeout=session.connect_timeout)
        info = await awaited(session.loop, session.request, InfoRequest(session.next_id()))
    except BaseException:
        session.loop.stop()
        raise
    return session, info.info


def write_client_file(
    path: str | os.PathLike[str], address: str, security: Security, identity: str
) -> None:
    """Write ``address`` and ``security``'s secret to the scheduler file at ``path``
    (``Client.write_scheduler_file``); refuse a file a running scheduler holds."""
    if security.token is None:
        raise ValueError("this client holds no secret to write")
    holder = holder_of(path)
    if holder is not None:
        raise SchedulerFileBusy(Path(path), holder)
    write_scheduler_file(path, address, security.token, identity)
