"""Client methods that run code on workers outside tasks: run, uploads, plugins."""

from __future__ import annotations


class RemoteCalls:
    """Part of ``Client``; see the module docstring."""
