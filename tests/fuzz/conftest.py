"""The fuzz suite's Hypothesis profiles and the small world every example starts from.

Profiles (``MCFL_FUZZ=<name>``, default ``ci``): ``ci`` runs few examples per test, derandomized
(a fixed seed: the same examples on every run, so ``make test`` is deterministic), without
Hypothesis's example database and without shrinking (a failure shows the example as drawn, and a
hang is not rerun while shrinking); ``deep`` runs many more, random, shrinks what fails and
remembers it in ``.hypothesis/`` (``MCFL_FUZZ=deep pytest tests/fuzz``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from conftest import make_run

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=5, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate], **_COMMON)
settings.register_profile("deep", max_examples=300, **_COMMON)
settings.load_profile(os.environ.get("MCFL_FUZZ", "ci"))

CONFIG = """\
experiment: fuzz
results: results
seeds: [0]
datasets:
  synthetic:
    prepare: {source: synthetic, clients: 6, clusters: 2, classes: 3, dim: 5, seed: 1}
    model: {name: logreg}
    train: {rounds: 2, lr: 0.1, batch_size: 5, eval_every: 1}
methods:
  - {method: FedAvg}
  - {method: FeSEM, K: 2, label: FeSEM(2)}
"""

#: the world's runs: a plain and a clustered one, run_id -> (method, params)
RUNS = {"FedAvg": ("FedAvg", {}), "FeSEM-K2": ("FeSEM", {"K": 2, "restarts": 1})}


def run_json(method: str, params: dict) -> dict:
    """A short run on the world's synthetic store, as the workflow passes it to ``mcfl train``."""
    return make_run(dataset="synthetic", method=method, params=params, rounds=2,
                    model={"name": "logreg"})


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> Path:
    """Inputs every command can start from, made once: ``stores/syn/`` (6 synthetic clients),
    ``runs/FedAvg`` and ``runs/FeSEM-K2`` (2 rounds each), their run JSONs under ``json/``,
    ``config.yaml``, ``leaf/`` (the store as LEAF JSON), ``notes.txt`` (a file of the user's),
    and ``out/report`` (an earlier report, which a failed report must leave as it was)."""
    from mcfl import cli

    w = tmp_path_factory.mktemp("fuzz-world") / "w"
    w.mkdir()
    here = os.getcwd()
    os.chdir(w)
    try:
        assert cli.main(["prepare", "synthetic", "--out", "stores/syn", "--clients", "6", "--clusters", "2",
                         "--classes", "3", "--dim", "5", "--seed", "1"]) == 0
        Path("json").mkdir()
        for run_id, (method, params) in RUNS.items():
            run = run_json(method, params)
            Path(f"json/{run_id}.json").write_text(json.dumps(run))
            assert cli.main(["train", "--run", json.dumps(run), "--store", "stores/syn", "--out",
                             f"runs/{run_id}", "--no-tracking", "--threads", "1", "--no-progress"]) == 0
        Path("config.yaml").write_text(CONFIG)
        Path("notes.txt").write_text("the user's own notes\n")
        assert cli.main(["export-leaf", "stores/syn", "--out", "leaf"]) == 0
        assert cli.main(["report", "--out", "out/report", "runs/FedAvg", "runs/FeSEM-K2"]) == 0
    finally:
        os.chdir(here)
    return w


@pytest.fixture(scope="session")
def mlflow_db(tmp_path_factory) -> Path:
    """An MLflow sqlite store with its tables created once (outside every sandbox)."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("fuzz-mlflow") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path
