import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)


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
    """A run dict as `expand_runs` makes it, for tests."""
    t = {"rounds": 3, "clients_per_round": None, "lr": 0.1, "batch_size": 5, "local_epochs": 1,
         "local_steps": None, "eval_every": 1, "finetune_epochs": 0, "checkpoint_every": 0}
    t.update(train)
    params = dict(params or {})
    label = f"{method}({params['K']})" if "K" in params else method
    return {"dataset": dataset, "method": method, "label": label,
            "run_id": label.replace("(", "-K").rstrip(")"), "seed": seed, "params": params,
            "model": model or {"name": "digits_cnn" if dataset == "digits" else "logreg"},
            "train": t, "data": {}, "experiment": "test", "needs_centres": False}
