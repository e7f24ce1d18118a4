"""Print the figures of ``src/mcfl``'s import graph: its depth in levels, its cycles and the
function-local ``mcfl`` imports outside the command line.

Units are the top-level modules and the sub-packages of ``mcfl`` (``mcfl.cost``, ``mcfl.algorithms``);
an import inside a sub-package stays inside its unit and is not an edge. Every executed import counts,
the ones inside functions too (those under ``if TYPE_CHECKING:`` never run and do not). A unit's level
is one more than the highest level among the units it imports (a unit importing nothing of ``mcfl`` is
level 1); units on a cycle share one level.

    python tools/import_graph.py            # the figures
    python tools/import_graph.py --edges    # and each unit's level and what it imports
    python tools/import_graph.py --local    # and where each function-local import is
    python tools/import_graph.py --check    # exit 1 past the limits: MAX_LEVELS, no cycle, MAX_LOCAL
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
#: the command line imports each command's modules when that command runs, on purpose
CLI = "mcfl.cli"
#: the limits ``--check`` holds the package to (``make lint``)
MAX_LEVELS, MAX_LOCAL = 8, 15


@dataclass(frozen=True)
class Import:
    """One ``import`` statement of ``mcfl``: the module it sits in, its line, the modules it names,
    and whether it runs inside a function."""

    module: str
    line: int
    targets: tuple[str, ...]
    local: bool


def module_files(src: Path = SRC) -> dict[str, Path]:
    """dotted module name -> file, for every module of the ``mcfl`` package under ``src``."""
    files = {}
    for f in sorted((src / "mcfl").rglob("*.py")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return files


def _executed(node: ast.AST, in_function: bool = False):
    """(statement, inside a function?) for each node under ``node``, skipping ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for c in child.orelse:
                yield c, in_function
                yield from _executed(c, in_function)
            continue
        yield child, in_function
        inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _executed(child, inner)


def imports(files: dict[str, Path]) -> list[Import]:
    """Every executed import of an ``mcfl`` module in ``files``."""
    out = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node, local in _executed(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            targets = tuple(n for n in names if n == "mcfl" or n.startswith("mcfl."))
            if targets:
                out.append(Import(module, node.lineno, targets, local))
    return out


def unit(module: str) -> str:
    """The unit a module belongs to: ``mcfl.algorithms.fedcg.train`` -> ``mcfl.algorithms``."""
    return ".".join(module.split(".")[:2])


def unit_graph(found: list[Import]) -> dict[str, set[str]]:
    """unit -> the other units it imports (the package ``mcfl`` itself, which imports nothing, left out)."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        src = unit(imp.module)
        graph.setdefault(src, set())
        for t in imp.targets:
            if unit(t) not in (src, "mcfl"):
                graph[src].add(unit(t))
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, set())
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def levels(graph: dict[str, set[str]]) -> dict[str, int]:
    """unit -> its level: 1 + the highest level among what it imports; a cycle's units share one."""
    component = {v: frozenset([v]) for v in graph}
    for comp in cycles(graph):
        for v in comp:
            component[v] = frozenset(comp)
    level: dict[frozenset, int] = {}

    def of(comp: frozenset) -> int:
        if comp not in level:
            level[comp] = 0                     # a placeholder while its imports are resolved
            below = {component[t] for v in comp for t in graph[v]} - {comp}
            level[comp] = 1 + max((of(c) for c in below), default=0)
        return level[comp]

    return {v: of(component[v]) for v in graph}


def local_imports(found: list[Import]) -> list[Import]:
    """The function-local ``mcfl`` imports outside the command line."""
    return [i for i in found if i.local and unit(i.module) != CLI]


def figures(src: Path = SRC) -> dict[str, object]:
    """The three figures: ``levels`` (the graph's depth), ``cycles`` and ``local_imports``."""
    found = imports(module_files(src))
    graph = unit_graph(found)
    return {"levels": max(levels(graph).values()), "cycles": cycles(graph),
            "local_imports": len(local_imports(found))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", action="store_true", help="each unit's level and what it imports")
    parser.add_argument("--local", action="store_true", help="where each function-local import is")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 above {MAX_LEVELS} levels, with a cycle, or above {MAX_LOCAL} local imports")
    args = parser.parse_args(argv)
    found = imports(module_files())
    graph = unit_graph(found)
    level = levels(graph)
    if args.edges:
        for v in sorted(graph, key=lambda u: (level[u], u)):
            print(f"{level[v]:3d}  {v}  ->  {', '.join(sorted(graph[v])) or '-'}")
    if args.local:
        for i in local_imports(found):
            print(f"     {i.module}:{i.line}  {', '.join(i.targets)}")
    print(f"levels: {max(level.values())}")
    print(f"cycles: {len(cycles(graph))}" + "".join(f"\n  {' <-> '.join(c)}" for c in cycles(graph)))
    print(f"function-local mcfl imports outside {CLI}: {len(local_imports(found))}")
    over = [what for what, bad in (
        (f"more than {MAX_LEVELS} levels", max(level.values()) > MAX_LEVELS),
        ("an import cycle", bool(cycles(graph))),
        (f"more than {MAX_LOCAL} function-local imports (import at module level, or defer a heavy "
         f"import with a one-line reason)", len(local_imports(found)) > MAX_LOCAL)) if bad]
    if args.check and over:
        print(f"import_graph: error: src/mcfl has {'; '.join(over)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
