"""Replication through the Snakemake DAG: a small digits config trained on two partition draws,
then the replication page with one verdict per (method, protocol)."""

import json

import pandas as pd
import pytest

from dag_helpers import job_counts, snakemake, write_config

pytestmark = pytest.mark.slow

CONFIG = {
    "experiment": "replication-test",
    "seeds": [0, 1],
    "tracking": False,
    "datasets": {"digits": {
        "prepare": {"source": "digits", "clients": 12, "clusters": 2, "seed": 0},
        "model": {"name": "digits_cnn"},
        "train": {"rounds": 2, "lr": 0.1, "eval_every": 1, "clients_per_round": 4, "checkpoint_every": 0,
                  "eval_protocols": {"active": {"clients": "active"}}}}},
    "methods": [{"method": "FedAvg"}, {"method": "FedProx", "mu": 0.1}, {"method": "NoFed"}],
    "replication": {"draws": {"seed1": {"prepare": {"seed": 1}}}, "methods": ["FedProx"],
                    "protocols": ["standard", "active"]},
}


def test_two_partition_draws_train_alike_and_get_a_verdict(tmp_path, cli_env):
    write_config(tmp_path, CONFIG)
    dry = snakemake(tmp_path, cli_env, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = job_counts(dry.stdout)       # NoFed stays on the original draw; the reference trains on both
    assert counts["prepare"] == 2 and counts["train"] == 3 * 2 + 2 * 2
    assert counts["replication_check"] == 1 and counts["replication"] == 1
    r = snakemake(tmp_path, cli_env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = tmp_path / "results"
    metrics = json.loads((res / "runs" / "digits-seed1" / "FedProx" / "seed1" / "metrics.json").read_text())
    assert metrics["draw"] == "seed1" and metrics["config"]["data"]["seed"] == 1
    # the original dataset's runs are the runs without the section: no draw of their own
    assert "draw" not in json.loads((res / "runs" / "digits" / "FedAvg" / "seed0" / "metrics.json").read_text())
    table = pd.read_csv(res / "table.csv")
    assert table[["dataset", "draw", "method"]].values.tolist() == [
        ["digits", "original", "FedAvg"], ["digits", "original", "FedProx"], ["digits", "original", "NoFed"],
        ["digits-seed1", "seed1", "FedAvg"], ["digits-seed1", "seed1", "FedProx"]]
    rep = pd.read_csv(res / "replication.csv")
    assert rep[["method", "protocol", "draw"]].values.tolist() == [
        ["FedProx", "standard", "original"], ["FedProx", "standard", "seed1"],
        ["FedProx", "active", "original"], ["FedProx", "active", "seed1"]]
    assert (rep["seeds"] == 2).all() and rep["verdict"].isin(["replicates", "contradicted", "inconclusive"]).all()
    standard = rep[rep["protocol"] == "standard"]
    assert (standard["wins"] + standard["losses"] >= 0).all() and standard["p"].between(0, 1).all()
    page = (res / "replication.md").read_text()
    assert "draw `seed1`" in page and "Stouffer" in page and "**replicates** when" in page
    assert (res / "replication.png").stat().st_size > 5000
