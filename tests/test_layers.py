"""The layers of ``src/mcfl`` read from its imports (``tools/import_graph.py``, run by ``make lint``
with ``lint-imports``): levels counted by hand on small graphs, and the package within its limits."""

import importlib.util
import sys
import textwrap

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # (its dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


def test_a_level_is_one_more_than_the_highest_below_and_a_cycle_shares_one(graph):
    # d imports nothing (1); c imports d (2); b imports c and d (3); a imports b (4)
    assert graph.levels({"a": {"b"}, "b": {"c", "d"}, "c": {"d"}, "d": set()}) == {"a": 4, "b": 3, "c": 2, "d": 1}
    # x <-> y is one component on top of z: both level 2, and one cycle
    g = {"x": {"y"}, "y": {"x", "z"}, "z": set()}
    assert graph.levels(g) == {"x": 2, "y": 2, "z": 1}
    assert graph.cycles(g) == [["x", "y"]]


def test_imports_inside_functions_count_and_type_checking_ones_do_not(graph, tmp_path):
    pkg = tmp_path / "mcfl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "part.py").write_text(textwrap.dedent("""
        from typing import TYPE_CHECKING

        from . import other
        if TYPE_CHECKING:
            from mcfl.cli import App

        def f():
            from mcfl.low import x
        """))
    (pkg / "sub" / "other.py").write_text("")
    found = graph.imports(graph.module_files(tmp_path))
    assert graph.unit_graph(found) == {"mcfl.sub": {"mcfl.low"}, "mcfl.low": set()}
    assert [(i.module, i.line) for i in graph.local_imports(found)] == [("mcfl.sub.part", 9)]
    assert graph.figures(tmp_path) == {"levels": 2, "cycles": [], "local_imports": 1}


def test_the_package_is_within_its_limits(graph):
    """At most MAX_LEVELS levels, no cycle (function-local imports counted), at most MAX_LOCAL
    function-local mcfl imports outside the command line."""
    got = graph.figures()
    assert got["cycles"] == []
    assert got["levels"] <= graph.MAX_LEVELS
    assert got["local_imports"] <= graph.MAX_LOCAL
    assert graph.main(["--check"]) == 0
