"""Client methods that act on the cluster as a whole: restart, shutdown, dashboard link."""

from __future__ import annotations

import os
import time
import warnings
from functools import partial
from typing import TYPE_CHECKING, Any

from apportion.client.asynchronous import CallModes
from apportion.dashboard.auth import NONCE_BYTES, login_link
from apportion.loop_thread import in_thread
from apportion.protocol.cluster import RestartRequest

if TYPE_CHECKING:
    from apportion.deploy.local import LocalCluster
    from apportion.net.security import Security


class ClusterLifecycle(CallModes):
    """Part of ``Client``; see the module docstring."""

    if TYPE_CHECKING:  # provided by ``Client``
        cluster: LocalCluster | None
        scheduler_address: str
        timeout: float
        security: Security
        _scheduler_identity: dict[str, Any]

        def close(self) -> Any: ...

        def _close_blocking(self) -> None: ...

        async def _close_async(self) -> None: ...

        def scheduler_info(self) -> Any: ...

        def wait_for_workers(self, n_workers: int = 1, timeout: float | None = None) -> Any: ...

    @property
    def dashboard_link(self) -> str | None:
        """A fresh one-time login link to the scheduler's dashboard; None if it serves none.

        Each access mints a new link from this client's secret (the cluster's): it
        logs one browser in, once, within 24 hours (docs/dashboard.md). A blocking
        client asks the scheduler where its dashboard is the first time; an
        asynchronous one knows from when it connected.
        """
        identity = self._scheduler_identity
        if not identity and not self.asynchronous:
            self.scheduler_info()  # keeps the identity it fetches
            identity = self._scheduler_identity
        base = identity.get("dashboard")
        if not isinstance(base, str) or not base:
            return None
        return login_link(base, self.security.key(), time.time(), os.urandom(NONCE_BYTES))

    def restart(self, timeout: float | None = None, wait_for_workers: bool = True) -> Any:
        """Drop every task and result in the cluster and start every worker afresh.

        As in Dask, every future of every client is told: pending and finished
        ones become cancelled (``FutureCancelledError``, "the cluster was
        restarted"); submit again to recompute. A worker with a supervisor (those of
        a ``LocalCluster`` with processes, ``apportion worker --nworkers``) is
        replaced by a fresh process; any other forgets its tasks and data and
        registers again, but keeps its process. With ``wait_for_workers`` the call
        returns once as many workers as before are connected, a local cluster's
        from fresh processes (``TimeoutError`` after ``timeout``, by default four
        times the client's). An asynchronous client returns an awaitable of it.
        """
        if self.asynchronous:
            # Waiting for fresh worker processes has no event to await: one short-lived
            # thread runs the blocking restart while the caller's loop runs on.
            restart = partial(self.restart, timeout, wait_for_workers)
            return in_thread(restart, "apportion-client-restart")
        limit = self.timeout * 4 if timeout is None else timeout
        before = len(self.scheduler_info()["workers"])
        local = self.cluster if self.cluster is not None and not self.cluster._closed else None
        old: set[int] = set()
        if local is not None:
            old = local.worker_pids()
            local.quiet_workers()
        # The scheduler has each supervised worker leave for a fresh process.
        reply = self._session.call(lambda rid: RestartRequest(rid, "Client.restart"), limit)
        if wait_for_workers:
            if local is not None and old:
                local.wait_replaced(old, limit)
            self.wait_for_workers(max(before, reply.workers), limit)

    def shutdown(self) -> Any:
        """Close this client and its cluster, even one it did not start (as Dask's).

        Only a ``LocalCluster`` object can be closed from here: given just an
        address, the scheduler keeps running and a ``UserWarning`` says so. An
        asynchronous client returns an awaitable that does it.
        """
        cluster = self.cluster
        if cluster is None:
            warnings.warn(
                f"shutdown() closes the client, but the scheduler at {self.scheduler_address} "
                "was not started here and keeps running; stop it where it was started",
                UserWarning,
                stacklevel=2,
            )
        if self.asynchronous:
            return self._shutdown_async(cluster)
        self._close_blocking()
        if cluster is not None:
            cluster._close_blocking()
        return None

    async def _shutdown_async(self, cluster: LocalCluster | None) -> None:
        await self._close_async()
        if cluster is not None:
            await cluster._close_async()
