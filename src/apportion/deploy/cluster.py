"""What a client needs of a cluster started by someone else: where and how to connect.

``Client(cluster)`` takes any cluster with a scheduler address and credentials, as
Dask's reads a cluster's ``scheduler_address`` and ``security``: ``SSHCluster``,
``SlurmCluster`` and ``LocalCluster`` all have both. The client asks no more of a
cluster than this, so a new way of deploying needs no change to the client.
"""

from __future__ import annotations

from typing import Protocol

from apportion.net.security import Security


class ClusterManager(Protocol):
    """A cluster started elsewhere (``SSHCluster``): ``Client(cluster)`` connects to its
    scheduler with its credentials, as Dask's reads a cluster's address and security."""

    scheduler_address: str
    security: Security
