"""``Future.type``: the class of a result, from the type name its worker gave.

The scheduler keeps and forwards a result's type as text (``module.QualifiedName``);
the class is looked up here only when ``Future.type`` is read, on the thread that
reads it, never on the client's loop thread: finding the class may import its
module, and an import on the loop thread can meet a half-made module that the
user's thread is importing at the same moment (``results.loads_here`` says how).
"""

from __future__ import annotations

import builtins
import importlib
import sys
from typing import Any


def result_class(name: str) -> type | None:
    """The class named ``name`` (``"int"``, ``"pandas.core.frame.DataFrame"``,
    ``"mod.Outer.Inner"``), importing its module if need be; None when ``name`` is
    empty or names nothing importable here (a class defined inside a function, a
    module this process cannot import)."""
    if not name:
        return None
    parts = name.split(".")
    if len(parts) == 1:
        builtin = getattr(builtins, name, None)
        return builtin if isinstance(builtin, type) else None
    # The module is the longest importable prefix: "mod.Outer.Inner" is Inner of
    # Outer in mod, "a.b.C" is C in a.b.
    for cut in range(len(parts) - 1, 0, -1):
        module = _module(".".join(parts[:cut]))
        if module is None:
            continue
        found: Any = module
        for attribute in parts[cut:]:
            found = getattr(found, attribute, None)
            if found is None:
                return None
        return found if isinstance(found, type) else None
    return None


def _module(name: str) -> Any:
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
