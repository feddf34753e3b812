"""``WorkerPlugin``: the base class Dask's documentation tells users to subclass.

apportion installs any object with ``setup(worker)`` and/or ``teardown(worker)``
(``client.register_plugin``); this class exists so that code written as Dask's
docs show it (``class MyPlugin(WorkerPlugin): ...``) imports from apportion too.
"""

from __future__ import annotations

from typing import Any


class WorkerPlugin:
    """Hooks run on each worker: ``setup`` when installed there (or when the worker
    joins later), ``teardown`` when removed or when the worker closes. Either may be
    ``async def``. Dask's ``transition`` hook is not called by apportion's workers.
    """

    #: The name the plugin is registered under, unless ``register_plugin`` gives one.
    name: str | None = None

    def setup(self, worker: Any) -> Any:
        """Run on the worker when the plugin is installed there."""

    def teardown(self, worker: Any) -> Any:
        """Run on the worker when the plugin is removed or the worker closes."""
