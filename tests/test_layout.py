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

    assert shares_a_module_fixture(ROOT / "tests" / "workflow" / "test_slurm.py")
    assert shares_a_module_fixture(ROOT / "tests" / "test_docs.py")
    assert not shares_a_module_fixture(ROOT / "tests" / "test_layout.py")


def test_the_longest_work_is_scheduled_first():
    """Both workers end together only if the long units start first: the Slurm suite's module, then
    whole modules by their slow tests, then single slow tests (a parameter of one too), then whole
    modules of fast tests, then single fast tests."""
    from conftest import longest_first, scope_weights

    w = scope_weights(ROOT / "tests")
    slurm, fedcg, celeba, fast = ("tests/workflow/test_slurm.py", "tests/algorithms/test_fedcg.py",
                                  "tests/data/test_real_data.py::test_celeba_sample_config_runs_end_to_end",
                                  "tests/test_layout.py::test_the_longest_work_is_scheduled_first")
    assert longest_first(w, slurm) > longest_first(w, fedcg) > longest_first(w, celeba) > 0
    assert longest_first(w, "tests/test_layout.py") == 0.5 > longest_first(w, fast) == 0
    assert longest_first(w, "tests/workflow/test_workflow.py::test_bad_config_stops_before_any_job") == 1   # pytestmark
    assert longest_first(w, "tests/workflow/test_fedcg_workflow.py::test_overlays_retrain_fedcg_tables_in_their_"
                            "own_directory[six-seeds.yaml-results-6seeds-6-\"rounds\":60]") == 1
