"""Point a Dask.distributed test module's imports of ``distributed`` at apportion.

Only the import statements change; every other byte of the module, its test bodies
included, stays as it was, and every line keeps its number, so a failure's traceback
points at Dask's own line. Each ``from distributed.x import a, b as c`` becomes one
call, ``a, c = <shim>.names("distributed.x", "a", "b")``, which hands back apportion's
object for each name, or a placeholder that raises when used where apportion has no
such name (so a module that imports one of Dask's internals still loads, and only the
tests that use it fail).
"""

from __future__ import annotations

import ast
import re

SHIM = "as_distributed"

# A test that runs Python code in a subprocess imports distributed inside a string.
_IMPORT_IN_TEXT = re.compile(r"\b(from|import) (?:dask\.)?distributed\b")


def _replacement(node: ast.Import | ast.ImportFrom) -> str | None:
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        # `from dask.distributed import Client` is the same import, by Dask's alias.
        module = module.removeprefix("dask.") if module.startswith("dask.distributed") else module
        if node.level or not (module == "distributed" or module.startswith("distributed.")):
            return None
        if any(alias.name == "*" for alias in node.names):
            return f"from {SHIM} import *"
        targets = ", ".join(alias.asname or alias.name for alias in node.names)
        wanted = ", ".join(repr(alias.name) for alias in node.names)
        return f"{targets}, = __import__({SHIM!r}).names({module!r}, {wanted})"
    parts = []
    for alias in node.names:
        if alias.name != "distributed" and not alias.name.startswith("distributed."):
            return None
        # `import distributed.x` binds `distributed`; `import distributed.x as y` binds x.
        bound = alias.asname or alias.name.split(".")[0]
        module = alias.name if alias.asname else "distributed"
        parts.append(f"{bound} = __import__({SHIM!r}).module({module!r})")
    return "; ".join(parts)


def rewrite(source: str) -> str:
    """``source`` with its imports of ``distributed`` pointed at the shim."""
    # The parser's column offsets count UTF-8 bytes.
    lines = source.encode().splitlines(keepends=True)
    edits: list[tuple[int, int, int, int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            new = _replacement(node)
            # Blank lines after a folded import keep every later line's number.
            padding = "\n" * ((node.end_lineno or node.lineno) - node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if not _IMPORT_IN_TEXT.search(node.value):
                continue
            new = _IMPORT_IN_TEXT.sub(r"\1 apportion", ast.get_source_segment(source, node) or "")
            padding = ""
        else:
            continue
        if new is not None and node.end_lineno is not None and node.end_col_offset is not None:
            edits.append(
                (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, new + padding)
            )
    # From the bottom up, so earlier positions stay valid.
    for lineno, col, end_lineno, end_col, new in sorted(edits, reverse=True):
        head = lines[lineno - 1][:col]
        tail = lines[end_lineno - 1][end_col:]
        lines[lineno - 1 : end_lineno] = [head + new.encode() + tail]
    return b"".join(lines).decode()
