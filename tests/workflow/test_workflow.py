"""The Snakemake DAG end to end on a tiny config, in a scratch directory."""

import re

import pandas as pd
import pytest

from dag_helpers import job_counts, snakemake, write_config

pytestmark = pytest.mark.slow

TINY = {
    "experiment": "wf-test",
    "seeds": [0, 1],
    "datasets": {"digits": {
        "prepare": {"source": "digits", "clients": 12, "clusters": 2, "seed": 0},
        "model": {"name": "digits_cnn"},
        "train": {"rounds": 2, "lr": 0.1, "eval_every": 1, "clients_per_round": 6},
    }},
    "methods": [{"method": "FedAvg"}, {"method": "NoFed"}, {"method": "FeSEM", "K": [2], "restarts": 2}],
}


def test_dag_runs_end_to_end_and_reruns_only_what_changed(tmp_path, cli_env):
    write_config(tmp_path, TINY)
    r = snakemake(tmp_path, cli_env)
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(tmp_path / "results" / "table.csv")
    assert table["method"].tolist() == ["FedAvg", "NoFed", "FeSEM(2)"]
    assert (table["n_seeds"] == 2).all()
    assert table.loc[2, "ari_mean"] == table.loc[2, "ari_mean"]       # not NaN for FeSEM
    assert pd.isna(table.loc[0, "ari_mean"])
    assert "± " in (tmp_path / "results" / "table.md").read_text()
    assert (tmp_path / "results" / "figures" / "convergence_digits.png").stat().st_size > 1000

    # MLflow: the 6 training runs, flat, tagged with this invocation
    import mlflow

    mlflow.set_tracking_uri(cli_env["MLFLOW_TRACKING_URI"])
    children = mlflow.search_runs(experiment_names=["wf-test"])
    assert len(children) == 6 and children["tags.sweep"].nunique() == 1
    assert set(children["status"]) == {"FINISHED"}
    assert children["tags.git_sha"].notna().all() and children["tags.data_hash"].notna().all()
    assert "metrics.micro_acc" in children and "metrics.micro_acc_pct" in children
    assert children["tags.run_dir"].str.match(r"results/runs/digits/[^/]+/seed[01]$").all()   # one per folder
    assert children["tags.run_dir"].nunique() == 6

    nothing = snakemake(tmp_path, cli_env, "-n")
    assert nothing.returncode == 0 and "Nothing to be done" in nothing.stdout + nothing.stderr

    changed = dict(TINY, datasets={"digits": dict(TINY["datasets"]["digits"],
                                                  train=dict(TINY["datasets"]["digits"]["train"], rounds=3))})
    write_config(tmp_path, changed)
    dry = snakemake(tmp_path, cli_env, "-n")
    assert job_counts(dry.stdout) == {"train": 6, "report": 1, "figure_cases": 1, "all": 1}  # Fig. 5: FeSEM(2)
    # every training job carries its priority (longest first: mcfl.plan.train)
    assert len(re.findall(r"^rule train:\n(?:    .*\n)*?    priority: [1-9]\d*$", dry.stdout, re.M)) == 6


def test_bad_config_stops_before_any_job(tmp_path, cli_env):
    bad = dict(TINY, methods=[{"method": "FeSEM", "K": [2, 13]}])
    write_config(tmp_path, bad)
    r = snakemake(tmp_path, cli_env)
    assert r.returncode != 0
    assert "methods[0].K: K=13 is larger than the number of clients" in r.stderr + r.stdout
    assert not (tmp_path / "data").exists() and not (tmp_path / "results").exists()
