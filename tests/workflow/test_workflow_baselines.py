"""The DAG with the Table 2 baselines, a `K: auto` entry and the paper comparison (slow)."""

import json

import pandas as pd
import pytest

from dag_helpers import snakemake, write_config

pytestmark = pytest.mark.slow

TINY = {
    "experiment": "wf-baselines",
    "seeds": [0],
    "datasets": {"digits": {
        "prepare": {"source": "digits", "clients": 12, "clusters": 2, "seed": 0},
        "model": {"name": "digits_cnn"},
        "train": {"rounds": 2, "lr": 0.1, "eval_every": 1, "clients_per_round": 6},
    }},
    "methods": [{"method": "FedProx"},
                {"method": "FedDWS", "name": "FedDist+WS"},
                {"method": "Robust", "K": 2, "label": "Robust(TKM)", "restarts": 2},
                {"method": "FeSEM", "K": "auto", "restarts": 2,
                 "select_k": {"K": [2, 3], "clients": 8, "rounds": 1}}],
}


def test_baselines_k_auto_and_paper_comparison_end_to_end(tmp_path, cli_env):
    write_config(tmp_path, TINY)
    r = snakemake(tmp_path, cli_env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = tmp_path / "results"
    table = pd.read_csv(res / "table.csv")
    assert table["method"].tolist() == ["FedProx", "FedDist+WS", "Robust(TKM)", "FeSEM(auto)"]
    chosen = json.loads((res / "select_k" / "digits" / "FeSEM-Kauto" / "seed0.json").read_text())
    assert chosen["K"] in (2, 3) and [s["K"] for s in chosen["scores"]] == [2, 3]
    metrics = json.loads((res / "runs" / "digits" / "FeSEM-Kauto" / "seed0" / "metrics.json").read_text())
    assert metrics["params"]["K"] == chosen["K"]                      # training used the chosen K
    assignments = pd.read_csv(res / "runs" / "digits" / "FeSEM-Kauto" / "seed0" / "assignments.csv")
    assert assignments["cluster"].max() < chosen["K"]
    assert "| digits | FeSEM(auto) | 0 | accuracy |" in (res / "select_k.md").read_text()
    cmp = pd.read_csv(res / "paper_comparison.csv")
    assert set(cmp["status"]) == {"not run"}                          # digits is not in the papers
    assert "## FEMNIST (not run)" in (res / "paper_comparison.md").read_text()
