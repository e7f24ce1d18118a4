import os
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _probe_cache(tmp_path_factory):
    """One cache of the estimate's probe timings for the whole test run, its xdist workers and
    the workflow runs they start, so that each model and method is probed once, not at every
    Snakemake start."""
    from mcfl.probe_cache import CACHE_DIR_ENV, NO_CACHE_ENV

    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "probe-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(NO_CACHE_ENV, raising=False)
        mp.setenv(CACHE_DIR_ENV, str(folder))
        yield


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every test starts on one PyTorch thread, as this file sets it: a test that runs ``mcfl train``
    in-process (default ``--threads``: every core) must not leave the rest of its worker's tests on
    two threads beside the other worker."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def real_data(name: str) -> tuple[Path, pytest.MarkDecorator]:
    """A real-data folder ``$MCFL_REAL_DATA/<name>`` (LEAF's FEMNIST sample ``femnist-leaf-sample``,
    the CelebA sample ``celeba-sample``) and a mark that skips, saying why, when it is absent: a
    clone has no real data, and the embedded FEMNIST sample covers the rest."""
    base = os.environ.get("MCFL_REAL_DATA", "")
    folder = Path(base) / name if base else Path("MCFL_REAL_DATA-is-unset") / name
    why = (f"needs real data: set MCFL_REAL_DATA to a folder holding {name}/" if not base
           else f"needs real data: {folder} is not a folder")
    return folder, pytest.mark.skipif(not (base and folder.is_dir()), reason=why)


@pytest.fixture(scope="session")
def digits_store(tmp_path_factory):
    """A small digits store: 16 clients, 4 rotation clusters."""
    from mcfl.data import prepare

    return prepare("digits", tmp_path_factory.mktemp("data") / "digits", clients=16, clusters=4,
                   alpha=0.5, seed=0)


@pytest.fixture(scope="session")
def synthetic_store(tmp_path_factory):
    from mcfl.data import prepare

    return prepare("synthetic", tmp_path_factory.mktemp("data") / "synthetic", clients=24,
                   clusters=2, seed=1)


@pytest.fixture
def cli_env(tmp_path):
    """Environment for subprocesses: `mcfl`/`snakemake` on PATH, MLflow in a temp sqlite file."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return env


def make_run(dataset="digits", method="FedAvg", params=None, seed=0, model=None, **train):
    """A run dict as `expand_runs` makes it, for tests: the schema's defaults (what validation fills
    in), short and small, with ``train`` overriding any."""
    from mcfl.trainspec import FILLED

    t = {**FILLED, "rounds": 3, "lr": 0.1, "batch_size": 5, "eval_every": 1, "checkpoint_every": 0, **train}
    params = dict(params or {})
    label = f"{method}({params['K']})" if "K" in params else method
    return {"dataset": dataset, "method": method, "label": label,
            "run_id": label.replace("(", "-K").rstrip(")"), "seed": seed, "params": params,
            "model": model or {"name": "digits_cnn" if dataset == "digits" else "logreg"},
            "train": t, "data": {}, "experiment": "test", "needs_centres": False}


def small_params(method: str) -> dict:
    """Default hyperparameters, with the conformance kit's cheap settings (``mcfl.check.SMALL``:
    K=2, few k-means restarts, FedCG's GCN bottleneck (15x less time a round on the digits CNN)
    and narrow domain classifier) where a method has them."""
    from mcfl import algorithms, check

    return check.small_params(algorithms.get(method))


def interrupt_round(monkeypatch, method: str, rnd: int):
    """Make ``method``'s round ``rnd`` raise KeyboardInterrupt, as a job killed mid-run; returns
    the call that restores the real ``round``."""
    from mcfl import algorithms

    cls = algorithms.get(method)
    real_round = cls.round

    def dying_round(self, state, clients, r):
        if r == rnd:
            raise KeyboardInterrupt
        return real_round(self, state, clients, r)

    monkeypatch.setattr(cls, "round", dying_round)
    return lambda: monkeypatch.setattr(cls, "round", real_round)


def make_concept_store(out, groups=2, clients_per_group=6, n_train=60, n_test=20, dim=10, classes=4,
                       seed=0):
    """Gaussian features labelled by one random linear teacher, with the labels permuted per group:
    group g's clients see label (y + g) mod classes (a concept shift), so group models differ
    sharply; ``groups=1`` gives IID clients. The true cluster of a client is its group."""
    import numpy as np

    from mcfl.data import write_store
    from mcfl.data.store import ClientData

    rng = np.random.default_rng(seed)
    teacher = rng.normal(size=(dim, classes))
    clients = []
    for g in range(groups):
        for j in range(clients_per_group):
            x = rng.normal(size=(n_train + n_test, dim)).astype(np.float32)
            y = ((x @ teacher).argmax(1) + g) % classes
            clients.append(ClientData(f"g{g}c{j}", x[:n_train], y[:n_train], x[n_train:], y[n_train:], g))
    return write_store(out, clients, n_classes=classes, source="concept-test", params={"seed": seed})


@pytest.fixture(scope="session")
def swapped_store(tmp_path_factory):
    """Two groups of 6 clients whose labels are shifted against each other (see make_concept_store)."""
    return make_concept_store(tmp_path_factory.mktemp("data") / "swapped", groups=2)


@pytest.fixture(scope="session")
def iid_store(tmp_path_factory):
    """12 IID clients from the same teacher."""
    return make_concept_store(tmp_path_factory.mktemp("data") / "iid", groups=1, clients_per_group=12)


# ------------------------------------------------------------------------------ the fast tier's guard
# `pytest -m "not slow"` is the inner loop: a test that runs Snakemake for real (not `-n`) or trains
# through `mcfl train` in a subprocess must carry @pytest.mark.slow. An audit hook sees every
# subprocess a test starts and fails the test that starts one of these unmarked; a collection check
# refuses a mark put on a helper instead of its test (it would mark nothing).
_DRY = {"-n", "--dry-run", "--dryrun", "--lint", "--unlock", "--version", "--help", "-h"}
_running: list = []          # the item whose setup, call or teardown is running now


def _words(argv) -> list[str]:
    import shlex

    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    out = []
    for a in argv:
        a = os.fsdecode(a)
        try:
            out += shlex.split(a) if " " in a else [a]
        except ValueError:
            out.append(a)
    return out


def expensive_command(argv) -> str | None:
    """Why ``argv`` belongs in the slow tier, or None: a Snakemake run that is not a dry run, or
    ``mcfl train``."""
    words = _words(argv)
    names = [Path(w).name for w in words]
    for i, n in enumerate(names):
        if n == "snakemake" and (i == 0 or names[i - 1] in ("-m",) or "python" in names[0]
                                 or names[0] in ("sh", "bash", "env")):
            if not _DRY & set(words[i + 1:]):
                return "runs Snakemake (not a dry run)"
        if n == "mcfl" and "train" in words[i + 1:i + 2]:
            return "trains through `mcfl train` in a subprocess"
    return None


def _audit(event, args):
    if event != "subprocess.Popen" or not _running:
        return
    item = _running[-1]
    if item.get_closest_marker("slow") is not None:
        return
    why = expensive_command(args[1])
    if why:
        item.stash[_violation] = why
        pytest.fail(f"{item.nodeid} {why} but is not marked @pytest.mark.slow "
                    f"(the fast tier, pytest -m 'not slow', must stay fast)", pytrace=False)


_violation = pytest.StashKey[str]()
sys.addaudithook(_audit)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    why = item.stash.get(_violation, None)
    if why and report.when == "call" and report.passed:      # the test caught the failure itself
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} {why} but is not marked @pytest.mark.slow"
    return report


def pytest_collection_modifyitems(config, items):
    """A mark on a module-level function that is not a test marks nothing: refuse it."""
    import inspect

    seen = set()
    for item in items:
        mod = getattr(item, "module", None)
        if mod is None or mod.__name__ in seen:
            continue
        seen.add(mod.__name__)
        for name, obj in vars(mod).items():
            if (inspect.isfunction(obj) and obj.__module__ == mod.__name__ and not name.startswith("test")
                    and any(m.name == "slow" for m in getattr(obj, "pytestmark", []))):
                raise pytest.UsageError(f"{mod.__file__}: {name} is not a test but is marked slow; "
                                        "put the mark on the test that needs it")


# ------------------------------------------------------------------------------ two workers
# `make test` runs pytest-xdist with two workers. A test module with a module-scoped fixture (one
# Snakemake run read by several tests, the Slurm cluster, a built site) goes to one worker whole, so
# the fixture is made once (and two Slurm clusters never start side by side); every other test is
# scheduled on its own. The longest work goes first (the Slurm module, then the slow tier: whole
# modules by their number of slow tests, then single slow tests), the many short tests last, so
# that both workers end together instead of one finishing a long test alone.
MODULE_FIXTURE = re.compile(r"@pytest\.fixture\(scope=[\"']module[\"']")
SLOW_MODULE = re.compile(r"^pytestmark\s*=.*\bmark\.slow\b", re.M)
SLURM_MODULE = re.compile(r"^pytestmark\s*=.*\bmark\.slurm\b", re.M)
SLOW_TEST = re.compile(r"@pytest\.mark\.slow\s*\n(?:\s*@.*\n)*\s*def (test\w*)")


def shares_a_module_fixture(path: Path) -> bool:
    return bool(MODULE_FIXTURE.search(path.read_text()))


def scope_weights(tests: Path) -> dict[str, float]:
    """A rough length of each test module (``tests/test_x.py``) and slow test
    (``tests/test_x.py::test_y``), from the marks in the source: a slow test 1, a module its slow
    tests and a half (when it goes whole, its fast tests go before the single fast ones), a module
    of the Slurm suite 100 (it runs one long sweep); what is not listed counts 0."""
    weights = {}
    for f in sorted(tests.glob("test_*.py")):
        text, module = f.read_text(), f"tests/{f.name}"
        names = set(SLOW_TEST.findall(text))
        if SLOW_MODULE.search(text):
            names |= set(re.findall(r"^def (test\w*)", text, re.M))
        weights.update({f"{module}::{n}": 1.0 for n in names})
        weights[module] = 100.0 if SLURM_MODULE.search(text) else len(names) + 0.5
    return weights


def longest_first(weights: dict[str, float], scope: str) -> float:
    """The weight of a work unit: a whole module's, or a single test's (parameters stripped)."""
    return weights.get(scope) if "::" not in scope else weights.get(scope.split("[", 1)[0], 0.0)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    whole = {f"tests/{f.name}" for f in (ROOT / "tests").glob("test_*.py") if shares_a_module_fixture(f)}
    weights = scope_weights(ROOT / "tests")

    class ModulesWithSharedFixtures(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in whole else nodeid

        def _assign_work_unit(self, node) -> None:
            # the heaviest unit still queued goes next (the first of equals: collection order)
            heaviest = max(self.workqueue, key=lambda s: longest_first(weights, s) or 0.0)
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

    return ModulesWithSharedFixtures(config, log)
