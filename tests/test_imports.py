"""Each command imports only what it uses. Every job of the DAG pays its imports again
(``benchmarks/job_overhead.py``), so a training job must not import MLflow (tracking off or
deferred), matplotlib (figures), SciPy or scikit-learn (k-means, figures; a clustered run scores its
clusters with scikit-learn only where the store has true clusters), pandas (reports; the run's CSVs
are written with the standard library's ``csv``), PIL or torchvision.
These tests fail when a module-level import of one of them comes back on a job's path."""

import json
import subprocess
import sys

import pytest
from conftest import make_run, small_params

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


@pytest.mark.parametrize("method", ["FedAvg", "FeSEM"])
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

    assert list(ALGORITHMS) == list(REGISTRY) and len(ALGORITHMS) == 22
    for name in REGISTRY:
        assert ALGORITHMS[name].name == name


def test_plain_values_are_checked_as_pydantic_would():
    """config's shortcut past pydantic for exact plain types agrees with pydantic's strict check."""
    from pydantic import TypeAdapter, ValidationError

    from mcfl.config import _plainly_fits

    for hint in (int, float, str, bool, int | None, float | None, str | None):
        for value in (0, 3, -1, 0.5, 1.0, "x", "", True, False, None, [1], {"a": 1}):
            if _plainly_fits(value, hint):
                TypeAdapter(hint).validate_python(value, strict=True)      # never a false accept
    for value, hint in ((True, int), (1, float), (1.0, int), (None, int), ("1", int)):
        assert not _plainly_fits(value, hint)
    with pytest.raises(ValidationError):
        TypeAdapter(int).validate_python(True, strict=True)
