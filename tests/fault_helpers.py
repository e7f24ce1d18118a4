"""What the fault suite's files share: the methods it runs per algorithm (a fast tier and a slow
one), a run's result files byte for byte, the runs an MLflow store holds, and its other shared helpers."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from conftest import make_run
from mcfl import algorithms, cli
from mcfl.timing import without_times
from mcfl.track import Tracker


METHODS = sorted(algorithms.ALGORITHMS)
#: the per-method resume, determinism and order checks: the fast tier (-m "not slow") runs them for
#: one algorithm of each kind of state (a model, server moments, centres, a split tree, groups), the
#: slow tier for every other one
FAST_METHODS = {"FedAvg", "FedSGD", "FedAdam", "FeSEM", "FedCluster", "FedGSP", "NaiveGSP+ICG"}
TIERED_METHODS = [m if m in FAST_METHODS else pytest.param(m, marks=pytest.mark.slow) for m in METHODS]


def outputs(d: Path) -> dict[str, bytes]:
    """A run's result files, byte for byte; history.csv without its per-round seconds (mcfl.timing)."""
    out = {f: (d / f).read_bytes() for f in ("assignments.csv", "predictions.csv", "state.pt")}
    out["history.csv"] = without_times(pd.read_csv(d / "history.csv")).to_csv(index=False).encode()
    return out


def mlflow_runs(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


class _DieAt(Tracker):
    """A tracker that interrupts the run when round ``r`` is logged."""

    def __init__(self, r):
        self.r = r

    def log(self, metrics, step):
        if step == self.r:
            raise KeyboardInterrupt


def _one_line_error(err: str, cmd: str, message: str) -> None:
    """``err`` (a command's stderr) ends with exactly one `mcfl <cmd>: error:` line matching
    ``message``, and holds no traceback."""
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if ": error: " in x]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"mcfl {cmd}: error: ") and re.search(message, lines[0]), lines[0]


def _cli_train(run, store, out, *extra) -> int:
    return cli.main(["train", "--run", json.dumps(run), "--store", str(store), "--out", str(out),
                     "--no-tracking", "--no-progress", "--threads", "1", *extra])


def _run_json(**changes) -> str:
    run = make_run(rounds=1)
    for key, value in changes.items():
        if key.startswith("train_"):
            run["train"][key[6:]] = value
        else:
            run[key] = value
    return json.dumps(run)


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text
