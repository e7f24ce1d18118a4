"""Each command imports only what it uses. Every job of the DAG pays its imports again
(``benchmarks/job_overhead.py``), so a training job must not import MLflow (tracking off or
deferred), matplotlib (figures), SciPy or scikit-learn (k-means, figures; a clustered run scores its
clusters with scikit-learn only where the store has true clusters), pandas (reports; the run's CSVs
are written with the standard library's ``csv``), PIL or torchvision.
These tests fail when a module-level import of one of them comes back on a job's path."""

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import ROOT, make_run, small_params

#: what no training job without live tracking (and without true clusters to score) imports
NOT_IN_TRAIN = ("mlflow", "matplotlib", "pandas", "sklearn", "scipy", "PIL", "torchvision")

PROBE = """
import json, sys
from mcfl.cli import main
code = main(sys.argv[1:])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
sys.exit(code)
"""


def imported_by(*argv: str) -> set[str]:
    """The top-level packages a ``mcfl`` command (run in a fresh interpreter) has imported."""
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return set(json.loads(p.stdout.strip().splitlines()[-1]))


def test_modules_of_a_training_job_import_none_of_them():
    code = ("import sys, mcfl.cli, mcfl.runner, mcfl.track, mcfl.evaluation, mcfl.federation, "
            "mcfl.algorithms, mcfl.config, mcfl.executors, mcfl.cluster.init, mcfl.metrics, mcfl.io; "
            "mcfl.cli.build_parser(commands=['train']); "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert set(p.stdout.split()) & set(NOT_IN_TRAIN) == set()


@pytest.mark.parametrize("method", ["FedAvg", pytest.param("FeSEM", marks=pytest.mark.slow)])
def test_a_training_job_imports_none_of_them(digits_store, tmp_path, method):
    params = small_params(method)
    run = make_run(method=method, params=params, rounds=1)
    extra = []
    if method == "FeSEM":           # as in the DAG: the centres come from an init-centres job
        from mcfl.cli import main
        from mcfl.cluster.spec import centre_spec

        run["needs_centres"] = True
        assert main(["init-centres", "--run", json.dumps(centre_spec(run)), "--store", str(digits_store),
                     "--out", str(tmp_path / "centres.pt"), "--device", "cpu", "--threads", "1"]) == 0
        extra = ["--centres", str(tmp_path / "centres.pt")]
    mods = imported_by("train", "--run", json.dumps(run), "--store", str(digits_store),
                       "--out", str(tmp_path / "run"), *extra, "--no-tracking", "--no-progress",
                       "--device", "cpu", "--threads", "1")
    assert "torch" in mods and "mcfl" in mods
    # digits has true clusters, so FeSEM's run scores its assignment (ARI/NMI) with scikit-learn
    # (which imports SciPy and pandas itself)
    allowed = {"sklearn", "scipy", "pandas"} if method == "FeSEM" else set()
    assert mods & (set(NOT_IN_TRAIN) - allowed) == set()
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_help_imports_no_data_source_nor_report():
    code = ("import sys; from mcfl.cli import build_parser, _command; "
            "build_parser(commands=[_command(['--help'])]); "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    mods = set(p.stdout.split())
    assert mods & {"torch", "pandas", "PIL", "mlflow", "matplotlib", "sklearn"} == set()


def test_console_script_exits_with_the_commands_status_and_its_output_flushed(tmp_path):
    """``mcfl`` (``mcfl.cli:run``) leaves by ``os._exit`` after the command: its output, piped and
    so block-buffered, still arrives, exit handlers run, and the status is the command's."""
    import tomllib

    from conftest import ROOT

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mcfl"] == "mcfl.cli:run"
    code = ("import atexit, sys; atexit.register(lambda: print('exit handler ran', file=sys.stderr)); "
            "from mcfl.cli import run; run()")
    p = subprocess.run([sys.executable, "-c", code, "methods"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "FeSEM" in p.stdout and p.stdout.endswith("\n") and "exit handler ran" in p.stderr
    p = subprocess.run([sys.executable, "-c", code, "check-config", str(tmp_path / "none.yaml")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "mcfl check-config: error" in p.stderr and "exit handler ran" in p.stderr
    p = subprocess.run([sys.executable, "-c", code, "no-such-command"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_registry_names_its_classes():
    from mcfl.algorithms import ALGORITHMS, REGISTRY

    assert list(ALGORITHMS) == list(REGISTRY) and len(ALGORITHMS) == len(set(REGISTRY.values()))
    for name in REGISTRY:
        assert ALGORITHMS[name].name == name


def test_plain_values_are_checked_as_pydantic_would():
    """config's shortcut past pydantic for exact plain types agrees with pydantic's strict check."""
    from pydantic import TypeAdapter, ValidationError

    from mcfl.config.validate import _plainly_fits

    for hint in (int, float, str, bool, int | None, float | None, str | None):
        for value in (0, 3, -1, 0.5, 1.0, "x", "", True, False, None, [1], {"a": 1}):
            if _plainly_fits(value, hint):
                TypeAdapter(hint).validate_python(value, strict=True)      # never a false accept
    for value, hint in ((True, int), (1, float), (1.0, int), (None, int), ("1", int)):
        assert not _plainly_fits(value, hint)
    with pytest.raises(ValidationError):
        TypeAdapter(int).validate_python(True, strict=True)


# -- the direction of imports inside mcfl -----------------------------------------------------------
# Every import counts, the ones inside functions too (only those under ``if TYPE_CHECKING:``, never
# executed, do not). A module is named by its dotted path; a rule on ``mcfl.x`` covers its submodules.

#: the layers below the run: they never reach up to the runner, the config, the planning, the reports
#: or the command line
LOWER = ("mcfl.data", "mcfl.models", "mcfl.engine", "mcfl.executors")
UPPER = ("mcfl.runner", "mcfl.config", "mcfl.plan", "mcfl.report", "mcfl.cli", "mcfl.select_k", "mcfl.track")
#: what trains: the reports only read the runs' files and draw (nothing of this, even indirectly)
TRAINING = ("mcfl.runner", "mcfl.engine", "mcfl.executors", "mcfl.federation", "mcfl.algorithms",
            "mcfl.select_k", "mcfl.cluster.init", "mcfl.snapshot")


def _within(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def import_graph():
    """``tools/import_graph.py``, the import reader ``make lint`` runs."""
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # (its dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


def mcfl_imports() -> dict[str, set[str]]:
    """module -> the mcfl modules it imports, at module level or in a function (not under ``if
    TYPE_CHECKING:``); ``from a import b`` is ``a.b`` where that is a module, else ``a``. Read by
    ``tools/import_graph.py``'s parser, the one ``make lint`` runs."""
    tool = import_graph()
    files = tool.module_files(ROOT / "src")

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    out: dict[str, set[str]] = {m: set() for m in files}
    for imp in tool.imports(files):
        out[imp.module] |= {t for t in map(resolve, imp.targets) if t and t != imp.module}
    return out


def test_the_import_walk_sees_function_level_imports_and_skips_type_checking_ones():
    g = mcfl_imports()
    assert "mcfl.data.leaf.fetch" in g["mcfl.plan.data"]          # inside PreparePlan.raw_inputs
    assert "mcfl.algorithms.fedgsp" in g["mcfl.papers.fedgsp.plan"]   # inside FedGSPPlan.base_params
    assert "mcfl.snapshot" not in g["mcfl.report.figures"]   # an annotation's only


def test_lower_layers_never_import_the_upper_ones():
    g = mcfl_imports()
    bad = sorted(f"{m} -> {t}" for m, ts in g.items() if _within(m, LOWER) for t in ts if _within(t, UPPER))
    assert not bad, "imports from below the run up to runner/config/plan/report/cli: " + "; ".join(bad)


def test_reports_never_train():
    """No report module reaches what trains, directly or through the modules it imports."""
    g = mcfl_imports()
    bad = []
    for m in sorted(g):
        if not _within(m, ("mcfl.report",)):
            continue
        seen, todo = set(), [m]
        while todo:
            for t in g[todo.pop()] - seen:
                seen.add(t)
                todo.append(t)
        bad += [f"{m} -> {t}" for t in sorted(seen) if _within(t, TRAINING)]
    assert not bad, "report modules that reach training: " + "; ".join(bad)


def _source_files():
    from conftest import ROOT

    return sorted((ROOT / "src" / "mcfl").rglob("*.py"))


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p).split("src/mcfl/")[-1])
def test_every_module_is_a_room_of_its_own_size(path):
    """No file over 450 lines and no class over 40 methods: a module or class that outgrows them holds
    several things and is split by what each does."""
    import ast

    text = path.read_text()
    assert text.count("\n") <= 450, f"{path.name}: {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            assert len(methods) <= 40, f"{path.name}: class {node.name} has {len(methods)} methods"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module: ``tools/import_graph.py``'s
    (Tarjan's algorithm), the one ``make lint`` runs."""
    return import_graph().cycles(graph)


def test_cycle_finder_finds_a_cycle_through_a_function_level_import():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_mcfl():
    """A package importing its own submodules (its ``__init__``) is not a cycle with them."""
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in mcfl_imports().items()}
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
