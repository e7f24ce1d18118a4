"""The package's shape: no import cycle inside mcfl (imports inside functions count too), and every
random stream's purpose id unique in its namespace."""

import ast

from conftest import ROOT

SRC = ROOT / "src"


def module_names() -> dict[str, object]:
    mods = {}
    for f in (SRC / "mcfl").rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the mcfl modules it imports anywhere in its file (module level or in a function).
    ``from a.b import c`` counts as importing ``a.b.c`` when that is a module, else ``a.b``."""
    mods = module_names()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for t in filter(None, map(resolve, targets)):
                if t != m and not m.startswith(t + "."):      # a package's own submodules: no edge
                    graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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


def test_cycle_finder_finds_a_cycle_through_a_function_level_import():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions():
    g = import_graph()
    assert "mcfl.data.leaf.fetch" in g["mcfl.plan.data"]      # `from mcfl.data.leaf.fetch import is_url` in a function
    assert "mcfl.algorithms.matching" in g["mcfl.algorithms.fesem_ma"]   # `from mcfl.algorithms import matching`


def test_no_import_cycle_inside_mcfl():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_random_stream_purposes_are_unique_per_namespace():
    from mcfl import streams

    text = (SRC / "mcfl" / "streams.py").read_text()
    top, server, local = (text.split("# -- ")[i] for i in (1, 2, 3))

    def ids(block):
        names = [line.split("=")[0].strip() for line in block.splitlines()
                 if "=" in line and line[:1].isupper()]
        return {n: getattr(streams, n) for n in names}

    for block in (top, server, local):
        values = list(ids(block).values())
        assert values and len(values) == len(set(values)), ids(block)
    assert len(ids(top)) == 10 and set(ids(server)) == {"GSP_GROUPING", "GSP_SAMPLING"}
