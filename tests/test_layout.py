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
