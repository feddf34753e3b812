"""The parts of a persisted Dask collection, as Dask task nodes.

A persisted collection's graph maps each key to the future of its part. apportion
sees the future and uses the part where it lives; any other scheduler would hand
the future back as if it were the value, so a part refuses to run elsewhere.
Imported only by ``Client.persist``, once Dask is there.
"""

from __future__ import annotations

from typing import Any

from dask._task_spec import DataNode

from apportion.client.future import Future


class PersistedPart(DataNode):  # type: ignore[misc]
    """A part: a future while on the client, its value once pickled to a worker."""

    __slots__ = ()

    def __call__(self, values: Any = ()) -> Any:
        if isinstance(self.value, Future):
            raise RuntimeError(
                f"{self.key!r} is part of a collection persisted on an apportion cluster; "
                "compute the collection with the apportion client that persisted it, "
                "while that client is open"
            )
        return self.value

    def copy(self) -> PersistedPart:
        return PersistedPart(self.key, self.value)

    def substitute(self, subs: Any, key: Any = None) -> PersistedPart:
        if key is not None and key != self.key:
            return PersistedPart(key, self.value)
        return self

    def __reduce__(self) -> tuple[type[PersistedPart], tuple[Any, Any]]:
        return PersistedPart, (self.key, self.value)
