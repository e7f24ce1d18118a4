"""FeSEM's Table 2 under the authors' code settings (config/femnist-sample/authors.yaml) end to end:
a two-round variant through the workflow on the embedded FEMNIST writers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from mcfl.config import expand_runs, load_config

ROOT = Path(__file__).resolve().parents[2]
BASE, AUTHORS = ROOT / "config" / "femnist-sample.yaml", ROOT / "config" / "femnist-sample" / "authors.yaml"


def test_the_overlay_is_the_recorded_command():
    """FeSEM's rows train as the authors' recorded FEMNIST command: 250 rounds, lr 0.003, 10 local
    epochs, 2 clients of each cluster a round, the 248-unit CNN, last-layer distance, scored with V1."""
    runs = [r for r in expand_runs(load_config(BASE, AUTHORS)) if r["seed"] == 0]
    fesem = {r["label"]: r for r in runs if r["method"] == "FeSEM"}
    assert set(fesem) == {"FedDist", "FeSEM(2)", "FeSEM(3)", "FeSEM(4)"}
    for label in ("FeSEM(2)", "FeSEM(3)", "FeSEM(4)"):
        r = fesem[label]
        assert r["model"] == {"name": "femnist_cnn", "hidden": 248}
        assert {k: r["train"][k] for k in ("rounds", "lr", "local_epochs", "clients_per_cluster", "clients_per_round")} \
            == {"rounds": 250, "lr": 0.003, "local_epochs": 10, "clients_per_cluster": 2, "clients_per_round": None}
        assert r["params"]["distance"] == "last_layer" and r["params"]["lam"] == 0
        assert list(r["train"]["eval_protocols"]) == ["v1"]
    fedavg = next(r for r in runs if r["label"] == "FedAvg")            # their FedAvg configuration
    assert {k: fedavg["train"][k] for k in ("rounds", "clients_per_round", "local_epochs", "lr")} == \
        {"rounds": 100, "clients_per_round": 20, "local_epochs": 5, "lr": 0.01}
    assert [r["label"] for r in runs] == ["NoFed", "FedSGD", "FedAvg", "FedDist", "FedDist+WS", "Robust(TKM)",
                                          "FedCluster", "HypoCluster(3)", "FedDane", "FedDane-LR", "FedAvg-LR",
                                          "FedAvg-lr0.003", "FedProx",
                                          "FeSEM(2)", "FeSEM(3)", "FeSEM(4)", "FeSEM-MA(3)"]
    # their FedDANE script's FEMNIST model, logistic regression, beside FedDane on the CNN; same schedule
    dane = {r["label"]: r for r in runs if r["method"] == "FedDANE"}
    assert dane["FedDane-LR"]["model"] == {"name": "logreg"}
    assert dane["FedDane"]["model"] == {"name": "femnist_cnn", "hidden": 248}
    assert dane["FedDane-LR"]["train"] == dane["FedDane"]["train"]
    assert dane["FedDane-LR"]["params"] == dane["FedDane"]["params"]
    control = next(r for r in runs if r["label"] == "FedAvg-LR")     # FedAvg on that model, FedDane's schedule
    assert control["model"] == {"name": "logreg"} and control["train"] == dane["FedDane-LR"]["train"]
    cnn = next(r for r in runs if r["label"] == "FedAvg-lr0.003")    # and on the CNN: FedAvg at FedDane's lr
    assert cnn["model"] == dane["FedDane"]["model"] and cnn["train"] == dane["FedDane"]["train"]
    assert {k for k in cnn["train"] if cnn["train"][k] != fedavg["train"][k]} == {"lr"}


def test_the_switches_share_the_studys_runs_and_change_one_setting_each():
    """config/femnist-sample/authors-switches.yaml (it extends authors.yaml): its
    FedAvg and FeSEM(2) are the authors' study's runs (same settings, same results folder, so
    trained once), and each switched run differs from that FeSEM(2) in exactly the one setting its
    name says."""
    switches = ROOT / "config" / "femnist-sample" / "authors-switches.yaml"
    study = {r["label"]: r for r in expand_runs(load_config(BASE, AUTHORS)) if r["seed"] == 0}
    runs = {r["label"]: r for r in expand_runs(load_config(switches)) if r["seed"] == 0}
    assert list(runs) == ["FedAvg", "FeSEM(2)", "FeSEM-E1(2)", "FeSEM-C10(2)", "FeSEM-Dall(2)"]
    for label in ("FedAvg", "FeSEM(2)"):
        assert runs[label] == study[label]

    def changed(label):
        a, b = runs["FeSEM(2)"], runs[label]
        out = {f"train.{k}" for k in a["train"] if a["train"][k] != b["train"].get(k)}
        return out | {f"params.{k}" for k in a["params"] if a["params"][k] != b["params"].get(k)}

    assert changed("FeSEM-E1(2)") == {"train.local_epochs"}
    assert runs["FeSEM-E1(2)"]["train"]["local_epochs"] == 1
    assert changed("FeSEM-C10(2)") == {"train.clients_per_cluster", "train.clients_per_round"}
    assert runs["FeSEM-C10(2)"]["train"]["clients_per_round"] == 10
    assert not runs["FeSEM-C10(2)"]["train"].get("clients_per_cluster")
    assert changed("FeSEM-Dall(2)") == {"params.distance"}
    assert len({r["run_id"] for r in runs.values()}) == 5                # five run folders


@pytest.mark.slow
def test_two_round_variant_end_to_end(tmp_path, cli_env):
    """Base + authors overlay + a third overlay cutting it to one seed, FedAvg and FeSEM(2) with the
    authors' settings, 2 rounds of 2 local SGD steps (instead of 10 epochs: the amount of local work,
    not what the test checks) and a protocols table whose authors' code column reads this study's
    own results: the writers are prepared, FeSEM's random partition made, both methods trained and
    scored under V1, every FeSEM round trains exactly 2 clients of each cluster, and the table has
    the authors' code column filled."""
    from dag_helpers import snakemake

    authors = yaml.safe_load(AUTHORS.read_text())
    keep = {"FedAvg": None, "FeSEM": 2}
    methods = []
    for e in authors["methods"]:
        if e["method"] in keep and "name" not in e:
            e = {**e, "train": {**e.get("train", {}), "rounds": 2}}
            if keep[e["method"]]:
                e["K"] = keep[e["method"]]
            methods.append(e)
    tiny = {"seeds": [0], "tracking": False, "methods": methods,
            "datasets": {"femnist_sample": {"train": {"rounds": 2, "eval_every": 2, "checkpoint_every": 0,
                                                      "local_steps": 2}}},
            "figures": {"clusters": {"run": None}, "cases": {"run": None}},
            "protocols": {"reference": "FedAvg", "out": "tables/femnist-sample-authors",
                          "authors_results": "results-femnist-sample-authors", "title": "Authors' code, two rounds"}}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    r = snakemake(tmp_path, cli_env, "--configfile", str(BASE), str(AUTHORS), str(tmp_path / "tiny.yaml"))
    assert r.returncode == 0, r.stderr[-3000:]
    res = tmp_path / "results-femnist-sample-authors"
    runs = res / "runs" / "femnist_sample"
    for run in ("FedAvg", "FeSEM-K2"):
        assert (runs / run / "seed0" / "metrics.json").is_file(), run
    hist = pd.read_csv(runs / "FeSEM-K2" / "seed0" / "history.csv")
    assert hist["round"].tolist() == [1, 2]
    assert (hist[["sampled/0", "sampled/1"]] == 2).all().all()       # 2 clients of each cluster a round
    assert 0 <= hist.loc[1, "v1/micro_acc"] <= 1
    assign = pd.read_csv(runs / "FeSEM-K2" / "seed0" / "assignments.csv")
    assert len(assign) == 105 and set(assign["cluster"]) == {0, 1}
    assert "sampled/0" not in pd.read_csv(runs / "FedAvg" / "seed0" / "history.csv")
    t = pd.read_csv(res / "tables" / "femnist-sample-authors.csv").set_index("method")
    assert t["authors_seeds"].tolist() == [1, 1]
    assert t["authors_mean"].between(0, 100).all()
    md = (res / "tables" / "femnist-sample-authors.md").read_text()
    assert "ours: authors' code" in md and "not run yet" not in md
