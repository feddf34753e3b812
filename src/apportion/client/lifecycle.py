"""Client methods that act on the cluster as a whole: restart, shutdown, dashboard link."""

from __future__ import annotations


class ClusterLifecycle:
    """Part of ``Client``; see the module docstring."""
