"""Client methods for data and facts kept by the scheduler: datasets, metadata, who has what."""

from __future__ import annotations


class SharedData:
    """Part of ``Client``; see the module docstring."""
