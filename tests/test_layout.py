"""The package's shape: every random stream's purpose id unique in its namespace (import cycles and
the direction of imports: tests/test_imports.py)."""

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


def test_modules_sharing_a_module_fixture_are_scheduled_whole():
    """Under pytest-xdist a module-scoped fixture is made once per worker that runs one of its tests:
    the Slurm suite's cluster must never start twice side by side, so its module goes whole."""
    from conftest import shares_a_module_fixture

    assert shares_a_module_fixture(ROOT / "tests" / "test_slurm.py")
    assert shares_a_module_fixture(ROOT / "tests" / "test_docs.py")
    assert not shares_a_module_fixture(ROOT / "tests" / "test_layout.py")
