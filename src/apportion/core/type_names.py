"""A value's type as plain text, the form in which the scheduler keeps it.

Workers name the type of each result (``TaskFinished.type_name``); the scheduler
keeps and forwards that text without importing anything (it never unpickles), and
the client turns it back into the class only when asked (``Future.type``), on
the thread that asks.
"""

from __future__ import annotations

from typing import Any


def type_name(value: Any) -> str:
    """``module.QualifiedName`` of ``value``'s class; a builtin's name alone."""
    cls = type(value)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
