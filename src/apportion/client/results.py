"""Results fetched by the client's loop, unpickled on the thread that asked for them.

The client's loop thread receives results as bytes; the thread that asked (the
caller of ``result``, ``gather``, ``get``, or the one iterating ``as_completed``)
turns them into values. ``loads_here`` says why it must be that thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apportion.client import actors, shapes
from apportion.client.future import Failed, FutureOwner
from apportion.core import payload


def loads_here(client: FutureOwner, blobs: Mapping[str, payload.Pickled]) -> dict[str, Any]:
    """Results unpickled on this thread: the one that asked for them.

    Never on the client's loop thread. Unpickling imports the modules of the
    values' classes, and Python's import locks are per module: while the user's
    thread is importing a package (``import pandas``, or a lazy import inside one),
    the package is in ``sys.modules`` half made. Another thread's unpickler waits
    for the package itself, but the class's submodule it imports meanwhile (under
    that submodule's own lock) imports the package, and the importing thread soon
    wants the submodule too: each waits for the other's lock. Python breaks that
    deadlock by handing one thread a partial module ("cannot import name ... from
    partially initialized module", pandas' "could not import module pandas").
    Unpickled on the thread that asked, the values' imports come after, or inside,
    that thread's own: ordered as in a program with no cluster at all.

    Holding the interpreter's global import lock while unpickling on the loop
    thread would not do: since Python 3.3 an import holds that lock only while it
    looks up its module's own lock, not while the module runs, so it does not keep
    a half-made module away; and an unpickler waiting for the importing thread's
    module lock while holding it would block that thread's next import for good.
    """
    with actors.binding(client):
        return {key: payload.loads(blob) for key, blob in blobs.items()}


class Gathered:
    """Results fetched on the client's loop, still pickled, or the failure to raise:
    for the thread that asked to unpickle (``loads_here``)."""

    __slots__ = ("blobs", "failed", "shape", "skipped")

    def __init__(
        self,
        blobs: dict[str, payload.Pickled],
        failed: Failed | None = None,
        shape: Any = None,
        skipped: tuple[str, ...] = (),
    ) -> None:
        self.blobs = blobs
        self.failed = failed
        #: What ``gather`` was given, to give the values back in its shape.
        self.shape = shape
        self.skipped = skipped

    def values(self, client: FutureOwner) -> Any:
        """On the asking thread: the failure raised, or the values in ``shape``."""
        if self.failed is not None:
            self.failed.throw()
        values = loads_here(client, self.blobs)
        values.update(dict.fromkeys(self.skipped, shapes.SKIPPED))
        return shapes.rebuild(self.shape, values)

    def by_key(self, client: FutureOwner) -> dict[str, Any]:
        """On the asking thread: the failure raised, or the values by key."""
        if self.failed is not None:
            self.failed.throw()
        return loads_here(client, self.blobs)
