"""Simulated clusters with several clients, for the tests of shares."""

from __future__ import annotations

from apportion.testing.simulation import SimulatedCluster


def cluster(*clients: str) -> SimulatedCluster:
    """A simulated cluster with these clients (each its own share), no worker yet."""
    sim = SimulatedCluster()
    for client in clients:
        sim.add_client(client)
    return sim


def queue(sim: SimulatedCluster, client: str, n: int, resources: object = None) -> list[str]:
    """Submit ``n`` tasks ``<client>-<i>`` from ``client``; their keys."""
    keys = [f"{client}-{i}" for i in range(n)]
    for key in keys:
        sim.submit(key, resources=resources, client=client)  # type: ignore[arg-type]
    return keys
