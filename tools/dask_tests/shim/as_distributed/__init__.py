"""What ``distributed`` means inside Dask's tests when they run against apportion.

``names(module, *names)`` answers a rewritten ``from distributed.<module> import ...``:

- a name of Dask's public API (no leading underscore) is apportion's object of that name,
  from whichever of Dask's modules it was imported (apportion keeps its public names
  at the top of the package);
- ``distributed.utils_test`` is this package's ``utils_test``: the test helpers
  (``inc``, ``slowinc``, ``cluster``...) written for apportion;
- a few pure utilities that touch no cluster (``distributed.metrics.time``,
  ``distributed.compatibility.LINUX``...) are this package's ``helpers``;
- anything else (a private name, or one apportion lacks) is a ``Missing`` that raises,
  saying which name it stands for, as soon as a test uses it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, NoReturn

import apportion

# Dask's modules whose names come from the harness's own helpers, not from apportion.
_HELPER_MODULES = {
    "distributed.utils_test": "as_distributed.utils_test",
    "distributed.metrics": "as_distributed.helpers",
    "distributed.compatibility": "as_distributed.helpers",
    "distributed.sizeof": "as_distributed.helpers",
    "distributed.system": "as_distributed.helpers",
    "distributed.protocol.pickle": "as_distributed.helpers",
    "distributed.utils": "as_distributed.helpers",
    "distributed.cluster_dump": "as_distributed.helpers",
}


class Missing:
    """A name of Dask's that apportion does not have; any use of it says so."""

    def __init__(self, qualified: str) -> None:
        self._qualified = qualified

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(f"apportion has no {self._qualified}")

    __call__ = __iter__ = __enter__ = __exit__ = _refuse

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        # A test module may subclass one of Dask's internal classes at import; the
        # subclass exists, and making one says what is missing.
        return (type(f"Missing_{self._qualified}", (), {"__init__": self._refuse}),)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"apportion has no {self._qualified} (so no .{name})")

    def __repr__(self) -> str:
        return f"<missing {self._qualified}>"


def _lookup(module: str, name: str) -> Any:
    helper = _HELPER_MODULES.get(module)
    if helper is not None:
        found = getattr(importlib.import_module(helper), name, None)
        # The helpers fall back to apportion for the public names they do not define
        # (distributed.utils.TimeoutError...).
        if found is not None:
            return found
    if not name.startswith("_"):
        found = getattr(apportion, name, None)
        if found is not None:
            return found
    return Missing(f"{module}.{name}")


def names(module: str, *wanted: str) -> tuple[Any, ...]:
    """The objects a ``from <module> import <wanted...>`` binds, in order."""
    return tuple(_lookup(module, name) for name in wanted)


class _Namespace(ModuleType):
    """``import distributed``: attribute access resolves as ``names`` does."""

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        # A test module may subclass one of Dask's internal classes at import; the
        # subclass exists, and making one says what is missing.
        return (type(f"Missing_{self._qualified}", (), {"__init__": self._refuse}),)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _lookup(self.__name__, name)


def module(name: str) -> ModuleType:
    """What ``import <name>`` binds (``import distributed``)."""
    return _Namespace(name)
