"""The DAG builds FedCG's tables when the config has a FedCG run (and only then)."""

import pandas as pd
import pytest

from conftest import ROOT
from dag_helpers import job_counts, snakemake, write_config

pytestmark = pytest.mark.slow

TINY = {
    "experiment": "fedcg-wf-test",
    "seeds": [0],
    "tracking": False,
    "datasets": {"dd": {
        "prepare": {"source": "digits_domains", "clients": 8, "angles": [0, 90], "unseen": [45], "seed": 0},
        "model": {"name": "digits_cnn"},
        "train": {"rounds": 2, "lr": 0.1, "eval_every": 1, "clients_per_round": 4},
    }},
    "methods": [{"method": "FedAvg"},
                {"method": "FedCG", "K": [2], "bottleneck": 64, "dc_width": 4, "teacher_every": 1},
                {"method": "FedCG", "name": "Oracle", "K": [2], "clustering": "oracle",
                 "test_assignment": "source", "agnostic": False, "adjacency": "hamming",
                 "bottleneck": 64, "dc_width": 4}],
}


def test_fedcg_tables_are_built_from_the_runs(tmp_path, cli_env):
    write_config(tmp_path, TINY)
    r = snakemake(tmp_path, cli_env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "results" / "fedcg"
    t3, t4, t5 = (pd.read_csv(out / f"table{i}.csv") for i in (3, 4, 5))
    assert t3["label"].tolist() == ["Oracle(2)"] and t3["A"].tolist() == ["H"]
    assert t4["label"].tolist() == ["FedCG(2)"] and {"soft_acc_mean", "hard_unseen_mean"} <= set(t4)
    assert t5["label"].tolist() == ["FedAvg", "FedCG(2)", "Oracle(2)"] and t5["unseen_mean"].notna().all()
    pair = t5.set_index("label")[["only_this", "only_fedavg", "sign_p_fedavg"]]    # from predictions.csv
    assert pair.loc[["FedCG(2)", "Oracle(2)"]].notna().all().all() and pair.loc["FedAvg"].isna().all()
    assert "Table 4" in (out / "tables.md").read_text()
    # the discovered domains (not the oracle's) against per-client image statistics
    shares = pd.read_csv(out / "dd" / "writers-shares.csv")
    assert set(shares["label"]) == {"FedCG(2)"} and set(shares["domain"]) == {0, 1}
    assert "## Domain shares against the writer statistics" in (out / "dd" / "writers.md").read_text()
    # the report shows the three tables inline, as one page (a CSV would only be a download)
    assert (out / "tables.html").read_text().count("<table>") == 3
    rep = snakemake(tmp_path, cli_env, "--report", str(tmp_path / "report.html"))
    assert rep.returncode == 0, rep.stderr[-3000:]
    html = (tmp_path / "report.html").read_text(errors="replace")
    assert '"results/fedcg/tables.html": {"name": "tables.html"' in html     # a result of its own
    assert '"results/fedcg/table3.csv": {' not in html
    from dag_helpers import tables_shown

    assert tables_shown(tmp_path / "report.html", "FedCG", "results/fedcg/tables.html") == 3

    without = dict(TINY, methods=[{"method": "FedAvg"}])
    write_config(tmp_path, without)
    dry = snakemake(tmp_path, cli_env, "-n", "--forceall")
    assert "fedcg_tables" not in job_counts(dry.stdout)


@pytest.mark.parametrize("overlay, res, seeds, train", [
    ("six-seeds.yaml", "results-6seeds", 6, '"rounds":60'),
    ("fedcg-150.yaml", "results-fedcg150", 3, '"max_grad_norm":5.0,"rounds":150'),
])
def test_overlays_retrain_fedcg_tables_in_their_own_directory(tmp_path, cli_env, overlay, res,
                                                               seeds, train):
    r = snakemake(tmp_path, cli_env, "-n", "-p", "--configfile", str(ROOT / "config" / overlay), "--",
                  f"{res}/fedcg/tables.md")
    assert r.returncode == 0, r.stderr[-3000:]
    counts = job_counts(r.stdout)
    # FedAvg, FedCG(3), FedCG(4): one job each training every seed (the default's seeds_per_job: all)
    assert counts["train_seeds"] == 3 and "train" not in counts and counts["fedcg_tables"] == 1
    assert f"{res}/runs/digits_domains/FedCG-K4/seed{seeds - 1}/metrics.json" in r.stdout
    assert f"log: {res}/logs/train/digits_domains/FedAvg/seeds.log" in r.stdout   # not the default's
    assert " results/runs/" not in r.stdout and " logs/train" not in r.stdout
    assert r.stdout.count(train) == 3 * seeds
