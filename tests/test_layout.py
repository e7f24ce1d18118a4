"""The package's shape: every random stream's purpose id unique in its namespace (import cycles and
the direction of imports: tests/test_imports.py)."""

import pytest

from conftest import ROOT

SRC = ROOT / "src"


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


class _Item:
    """What the ordering hook reads of a collected test: its id and marks."""

    def __init__(self, module, name, *marks):
        self.nodeid = f"{module}::{name}"
        self.marks = [getattr(pytest.mark, m).mark for m in marks]

    def iter_markers(self):
        return iter(self.marks)


def test_the_longest_modules_are_scheduled_first():
    """Both workers end together only if the long modules start first: the Slurm suite's, then the
    others by their slow tests (a slow parameter counts too); equal ones keep their collection
    order."""
    from conftest import longest_first, module_weight

    slow, fast, slurm = {"slow"}, set(), {"slow", "slurm"}
    assert module_weight([slurm, slurm]) == 100 and module_weight([slow, fast, slow]) == 2
    assert module_weight([fast, fast]) == 0
    modules = {"fast": [fast], "one-slow": [fast, slow], "slurm": [slurm] * 4, "other-fast": [fast, fast],
               "two-slow": [slow, slow, fast]}
    assert longest_first(modules) == ["slurm", "two-slow", "one-slow", "fast", "other-fast"]


def test_a_worker_takes_the_longest_modules_first_each_module_together():
    """`--dist loadfile` keeps each module on one worker (its module-scoped fixtures made once); a
    pytest-xdist worker orders its collection by module length, each module's tests together and in
    their order; a plain run keeps the collection order."""
    from types import SimpleNamespace

    from conftest import _longest_modules_first

    def collected():
        return [_Item("tests/test_a.py", "fast"), _Item("tests/b/test_b.py", "one", "slow"),
                _Item("tests/test_a.py", "slow", "slow"), _Item("tests/test_a.py", "slow2", "slow"),
                _Item("tests/b/test_b.py", "two")]

    items = collected()
    _longest_modules_first(SimpleNamespace(), items)
    assert [i.nodeid for i in items] == [i.nodeid for i in collected()]
    _longest_modules_first(SimpleNamespace(workerinput={}), items)
    assert [i.nodeid for i in items] == ["tests/test_a.py::fast", "tests/test_a.py::slow", "tests/test_a.py::slow2",
                                         "tests/b/test_b.py::one", "tests/b/test_b.py::two"]
