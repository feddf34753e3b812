"""Print the import graph of ``src/apportion`` as Graphviz DOT, for people to look at.

Usage: ``python tools/import_graph.py [--packages] > graph.dot; dot -Tsvg graph.dot``

Reads the source with ``ast`` (imports inside functions included; those under
``if TYPE_CHECKING:`` left out, as they never run, unless asked for: a cycle through
them still ties modules together for a reader and a type checker). ``--packages`` folds modules
into their package (``apportion.scheduler``) and drops edges within one package.
``tests/test_import_contracts.py`` checks the same graph for cycles and impurity.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def module_name(path: Path, root: Path = SRC) -> str:
    """``src/apportion/scheduler/state.py`` -> ``apportion.scheduler.state``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, name: str, type_checking: bool = False) -> set[str]:
    """Every module ``path`` imports when it runs (any depth), and with
    ``type_checking`` those it imports for annotations only."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if not type_checking and isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # ``from apportion.scheduler import relay`` imports the module relay.
            found.update(f"{base}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path = SRC, type_checking: bool = False) -> dict[str, set[str]]:
    """apportion module -> every module it imports (apportion's own and outside ones);
    ``type_checking``: annotation-only imports too."""
    paths = {module_name(p, root): p for p in sorted((root / "apportion").rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        raw = imports_of(path, name, type_checking)
        # Keep outside modules by their top name; keep only apportion names that exist.
        graph[name] = {
            imported
            for imported in raw
            if imported in paths or not imported.startswith("apportion")
        } - {name}
    return graph


def internal(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph restricted to apportion's own modules."""
    return {name: {i for i in deps if i in graph} for name, deps in graph.items()}


def package_of(name: str) -> str:
    """``apportion.scheduler.state`` -> ``apportion.scheduler``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else name


def to_dot(graph: dict[str, set[str]], packages: bool) -> str:
    """DOT text of the apportion-internal edges."""
    edges: set[tuple[str, str]] = set()
    for name, deps in internal(graph).items():
        for dep in deps:
            a, b = (package_of(name), package_of(dep)) if packages else (name, dep)
            if a != b:
                edges.add((a, b))
    lines = ["digraph apportion {", "  rankdir=LR;", "  node [shape=box, fontsize=10];"]
    lines += [f'  "{a}" -> "{b}";' for a, b in sorted(edges)]
    lines.append("}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", action="store_true", help="one node per package")
    args = parser.parse_args()
    print(to_dot(import_graph(), args.packages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
