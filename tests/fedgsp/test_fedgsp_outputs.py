"""FedGSP's config block, sweeps and generated tables/figures (Zeng et al., DASFAA 2022, §4), and its DAG end to end."""

import copy
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import ROOT, make_run
from mcfl.config import ConfigError, expand_runs, validate
from mcfl.papers.fedgsp.config import sweep_runs
from mcfl.fedgsp.metrics import CostModel, t_comm

BASE = {
    "seeds": [0, 1],
    "datasets": {
        "a": {"prepare": {"source": "digits", "clients": 12, "partition": "classes", "clusters": 1},
              "model": {"name": "digits_cnn"}, "train": {"rounds": 2, "clients_per_round": 4}},
        "b": {"prepare": {"source": "synthetic", "clients": 10}, "model": {"name": "logreg"}},
    },
    "methods": [{"method": "FedAvg"},
                {"method": "FedGSP", "beta": 2, "datasets": ["a"], "train": {"clients_per_round": None}}],
    "fedgsp": {"dataset": "a", "target": 0.5, "kappa": [0.3, 1.0],
               "heatmap": {"log": {"alpha": [1, 2], "beta": [2]}}},
}


def cfg(**changes):
    c = copy.deepcopy(BASE)
    c.update(changes)
    return c


def test_method_entries_can_be_restricted_to_datasets():
    runs = expand_runs(validate(cfg()))
    assert sorted({(r["dataset"], r["method"]) for r in runs}) == [("a", "FedAvg"), ("a", "FedGSP"),
                                                                    ("b", "FedAvg")]
    bad = cfg(methods=[{"method": "FedAvg", "datasets": ["c"]}])
    with pytest.raises(ConfigError, match=r"methods\[0\]\.datasets: unknown dataset 'c'"):
        validate(bad)


@pytest.mark.parametrize("mutate,message", [
    (lambda c: c["fedgsp"].update(dataset="zzz"), r"fedgsp\.dataset: unknown dataset 'zzz'"),
    (lambda c: c["fedgsp"].pop("target"), r"fedgsp: 'target' is a required property"),
    (lambda c: c["fedgsp"].update(heatmap={"cubic": {"alpha": [1], "beta": [1]}}), r"fedgsp\.heatmap"),
    (lambda c: c["fedgsp"].update(kappa=[0]), r"fedgsp\.kappa\[0\]"),
    (lambda c: c["methods"][1].update(kappa=1.5), r"methods\[1\]\.kappa: kappa must be in \(0, 1\]"),
])
def test_bad_fedgsp_settings_name_the_key(mutate, message):
    c = cfg()
    mutate(c)
    with pytest.raises(ConfigError, match=message):
        validate(c)


def test_a_config_without_fedgsp_block_gets_none():
    c = cfg()
    del c["fedgsp"]
    assert "fedgsp" not in validate(c)


def test_sweeps_vary_the_fedgsp_entry_and_reuse_identical_runs():
    c = validate(cfg(fedgsp={**BASE["fedgsp"], "sweep_seeds": [0]}))
    s = sweep_runs(c)
    kappa = [(r["run_id"], r["params"]["kappa"], r["seed"]) for r, _ in s["kappa"]]
    assert kappa == [("FedGSP", 0.3, 0), ("FedGSP-kappa1", 1.0, 0)]          # 0.3 is the FedGSP run
    heat = [(r["run_id"], r["params"]["alpha"], r["params"]["beta"]) for r, _ in s["heatmap"]]
    assert heat == [("FedGSP-log-a1-b2", 1.0, 2), ("FedGSP", 2.0, 2)]       # alpha 2, beta 2 = base
    assert all(r["train"]["clients_per_round"] is None for r, _ in s["kappa"])   # entry's overrides kept
    assert all(r["dataset"] == "a" for r, _ in s["kappa"] + s["heatmap"])


def test_paper_config_has_the_papers_settings_and_validates():
    from mcfl.data import SOURCES

    c = yaml.safe_load((ROOT / "config" / "paper-fedgsp-femnist.yaml").read_text())
    ds = c["datasets"]["femnist"]
    assert ds["train"]["lr"] == 0.01 and ds["train"]["batch_size"] == 5
    assert ds["train"]["local_epochs"] == 1 and ds["train"]["rounds"] == 500
    gsp = [e for e in c["methods"] if e["method"] == "FedGSP"][0]
    assert (gsp["growth"], gsp["alpha"], gsp["beta"], gsp["kappa"]) == ("log", 2.0, 10, 0.3)
    assert c["fedgsp"]["target"] == 0.8 and c["fedgsp"]["kappa"] == [0.1, 0.2, 0.3, 0.5, 1.0]
    if "femnist" not in SOURCES:       # until the FEMNIST source lands: check everything else
        ds["prepare"] = {"source": "digits", "clients": 368 // 4}
        ds["model"] = {"name": "digits_cnn"}
    validate(c)
    assert len(sweep_runs(c)["heatmap"]) == 3 * 4 * 3


# ----------------------------------------------------------------------------------- outputs
@pytest.fixture(scope="module")
def gsp_runs(tmp_path_factory, digits_store):
    """Tiny trained runs: FedAvg (4 clients a round), FedGSP at two alphas and two kappas."""
    from mcfl.runner import train

    out = tmp_path_factory.mktemp("runs")
    specs = {"FedAvg": ("FedAvg", {}, 4), "FedGSP": ("FedGSP", {"beta": 2}, None),
             "FedGSP-a1": ("FedGSP", {"beta": 2, "alpha": 1.0}, None),
             "FedGSP-k1": ("FedGSP", {"beta": 2, "kappa": 1.0}, None)}
    dirs, runs = {}, {}
    for name, (method, params, cpr) in specs.items():
        from mcfl.algorithms import get

        p = {**vars(get(method).Params()), **params}
        run = make_run(method=method, params=p, rounds=4, clients_per_round=cpr)
        run["label"] = run["run_id"] = name
        train(run, digits_store, out / name, progress=False)
        dirs[name], runs[name] = out / name, run
    return dirs, runs


def test_table_reports_accuracy_loss_rounds_and_costs(gsp_runs, digits_store, tmp_path):
    from mcfl.papers.fedgsp.tables import train_settings, write_table

    dirs, runs = gsp_runs
    names = ["FedAvg", "FedGSP"]
    t = write_table([dirs[n] for n in names], train_settings([runs[n] for n in names]), digits_store,
                    0.0, tmp_path).set_index("method")
    per = pd.read_csv(tmp_path / "runs.csv").set_index("method")
    assert (t["rounds_to_target_mean"] == 1).all()          # target 0: reached at the first evaluation
    h = pd.read_csv(dirs["FedAvg"] / "history.csv")
    assert t.loc["FedAvg", "accuracy_mean"] == pytest.approx(h["micro_acc"].iloc[-1])
    assert t.loc["FedAvg", "loss_mean"] == pytest.approx(h["test_loss"].iloc[-1])
    K = 16
    # FedAvg trains 4 of 16 clients a round: kappa = 4/16 in Eq. 16
    assert per.loc["FedAvg", "t_comm_s_total"] == pytest.approx(t_comm(4 / K, K, 4, CostModel()))
    g = pd.read_csv(dirs["FedGSP"] / "history.csv")
    assert per.loc["FedGSP", "t_comm_s_total"] == pytest.approx(
        t_comm((g["trained_groups"] / g["groups"]).to_numpy(), K, 4, CostModel()))
    md = (tmp_path / "table.md").read_text()
    assert "| FedGSP |" in md and "Target accuracy 0%" in md
    assert "<td>FedGSP</td>" in (tmp_path / "table.html").read_text()   # the same table, for the report
    for f in ("curves.png", "cost.png", "table.csv"):
        assert (tmp_path / f).stat().st_size > 0
    t = write_table([dirs["FedAvg"]], train_settings([runs["FedAvg"]]), digits_store, 1.01, tmp_path)
    assert t["seeds_reaching_target"].tolist() == [0] and "| ×" in (tmp_path / "table.md").read_text()


def test_heatmap_and_kappa_sweeps(gsp_runs, digits_store, tmp_path):
    from mcfl.papers.fedgsp.tables import train_settings, write_heatmap, write_kappa

    dirs, runs = gsp_runs
    h = write_heatmap([dirs["FedGSP"], dirs["FedGSP-a1"]], tmp_path)
    assert sorted(h["alpha"]) == [1.0, 2.0] and (h["growth"] == "log").all()
    final = json.loads((dirs["FedGSP-a1"] / "metrics.json").read_text())["final"]
    assert h.set_index("alpha").loc[1.0, "loss"] == pytest.approx(final["test_loss"])
    names = ["FedGSP", "FedGSP-k1"]
    k = write_kappa([dirs[n] for n in names], train_settings([runs[n] for n in names]), digits_store,
                    tmp_path).set_index("kappa")
    # kappa = 1 trains every group: more traffic than kappa = 0.3
    assert k.loc[1.0, "t_comm_s_norm"] == 1.0 and k.loc[0.3, "t_comm_s_norm"] < 1.0
    assert (tmp_path / "heatmap.png").exists() and (tmp_path / "kappa.png").exists()


def test_cpd_study_uses_the_ablations_groupings(digits_store, tmp_path):
    from mcfl.algorithms.fedgsp import NaiveGSP, NaiveGSPICG
    from mcfl.federation import build_federation
    from mcfl.data import load
    from mcfl.fedgsp.metrics import group_counts, pairwise_cpd
    from mcfl.papers.fedgsp.tables import write_cpd

    s = write_cpd(digits_store, tmp_path, 4, [0]).set_index("method")
    df = pd.read_csv(tmp_path / "cpd.csv")
    assert df.groupby("method").size().to_dict() == {"FedAvg": 16 * 15 // 2, "NaiveGSP": 6, "NaiveGSP+ICG": 6}
    assert s.loc["NaiveGSP", "median_vs_NaiveGSP_pct"] == 0
    fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                           {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 1}, 0)
    for cls, name in ((NaiveGSP, "NaiveGSP"), (NaiveGSPICG, "NaiveGSP+ICG")):
        algo = cls(fed, cls.Params(beta=4))
        group = algo.init().group.numpy()
        want = pairwise_cpd(group_counts(algo.V, group))
        assert np.allclose(df[df["method"] == name]["cpd"].to_numpy(), want)


# ---------------------------------------------------------------------------------------- DAG
def _rec(label, seed, hit, acc, dataset="femnist_sample"):
    """A finished run as load_runs gives it: two evaluations, per-image hits on 4 test images."""
    hist = pd.DataFrame({"round": [1, 2], "micro_acc": [0.5, acc], "test_loss": [1.0, 0.5]})
    run = {"label": label, "method": label, "dataset": dataset, "seed": seed, "params": {},
           "train": {"clients_per_round": 2, "local_epochs": 1}, "dir": Path(label),
           "machine": "cpu" if label == "FedAvg" else "cuda"}
    return {"run": run, "final": {"micro_acc": acc, "test_loss": 0.5}, "hist": hist,
            "y": np.zeros(4, int), "hit": np.array(hit, bool)}


def test_table_pairs_each_row_with_fedavg_of_its_seed_and_quotes_the_paper_on_femnist():
    from mcfl.papers.fedgsp.tables import paper_table1, table, table_markdown

    recs = [_rec("FedAvg", 0, [1, 1, 0, 0], 0.5), _rec("FedGSP", 0, [1, 0, 1, 1], 0.75),
            _rec("FedGSP", 1, [1, 1, 1, 1], 1.0), _rec("FedProx", 0, [1, 1, 0, 0], 0.5)]
    per, t = table(recs, 0.8, 4, 10.0, CostModel())
    t = t.set_index("method")
    # seed 1 has no FedAvg to pair with, so only seed 0 counts: images 3, 4 against image 2
    assert t.loc["FedGSP", ["only_this", "only_fedavg"]].tolist() == [2, 1]
    assert t.loc["FedGSP", "sign_p"] == pytest.approx(1.0)          # 2 of 3 discordant: binomial p = 1
    assert t.loc["FedGSP", "seeds"] == "0,1" and t.loc["FedGSP", "rounds_to_target_mean"] == 2
    assert t.loc["FedProx", ["only_this", "only_fedavg"]].tolist() == [0, 0]
    assert np.isnan(t.loc["FedAvg", "only_this"])
    assert t.loc["FedGSP", "paper_accuracy"] == pytest.approx(0.854) and t.loc["FedGSP", "paper_rounds"] == 34
    md = table_markdown(t.reset_index())
    assert "| 2 / 1 |" in md and "85.4 / 0.453 / 34" in md and "80.1 / 0.602 / 470" in md
    assert "78.7 / 0.633 / ×" in md                                   # FedProx never reaches 80% there
    assert per.set_index(["method", "seed"]).loc[("FedGSP", 1), "machine"] == "cuda"
    # the paper's row only on FEMNIST with its 80% target, and only for the rows it has
    assert paper_table1("digits_2class", "FedGSP", 0.8) is None and paper_table1("femnist", "FedGSP", 0.5) is None
    assert paper_table1("femnist", "NaiveGSP", 0.8) is None
    _, t = table([_rec("FedAvg", 0, [1, 0, 0, 0], 0.5, "digits")], 0.8, 4, 10.0, CostModel())
    assert "Paper" not in table_markdown(t) and "only FedAvg" not in table_markdown(t)


def test_table_refuses_to_pair_runs_with_different_test_images():
    from mcfl.papers.fedgsp.tables import table

    other = _rec("FedGSP", 0, [1, 0, 1, 1], 0.75)
    other["y"] = np.ones(4, int)
    with pytest.raises(ValueError, match="different test images"):
        table([_rec("FedAvg", 0, [1, 1, 0, 0], 0.5), other], 0.8, 4, 10.0, CostModel())


@pytest.mark.slow
def test_fedgsp_rules_run_in_the_dag(tmp_path, cli_env):
    c = cfg(experiment="gsp-wf", seeds=[0])
    c["datasets"] = {"a": c["datasets"]["a"]}
    c["fedgsp"].update(sweep_seeds=[0], publish={"out": "docs/results/gsp", "title": "GSP"})
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(c))
    cmd = ["snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--cores", "2"]
    r = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "results" / "fedgsp" / "a"
    for f in ("cpd.png", "cpd_summary.csv", "table.csv", "table.md", "curves.png", "cost.png",
              "heatmap.png", "heatmap.csv", "kappa.png", "kappa.csv"):
        assert (out / f).stat().st_size > 0, f
    assert pd.read_csv(out / "table.csv")["method"].tolist() == ["FedAvg", "FedGSP"]
    # Snakemake's report shows FedGSP's Table 1 inline (a page, not a CSV download)
    rep = subprocess.run([*cmd, "--report", str(tmp_path / "report.html")], env=cli_env,
                         capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-3000:]
    from dag_helpers import tables_shown

    assert tables_shown(tmp_path / "report.html", "FedGSP", "results/fedgsp/a/table.html") == 1
    # the page is written inside the results directory; nothing under the project's docs/
    assert not (tmp_path / "docs").exists()
    page = (tmp_path / "results" / "docs" / "results" / "gsp.md").read_text()
    assert page.startswith("# GSP") and "| FedGSP |" in page and "2 runs on cpu" in page
    for f in ("cpd.png", "curves.png", "cost.png"):
        assert f"](../figures/dag/gsp/{f})" in page
        assert (tmp_path / "results" / "docs" / "figures" / "dag" / "gsp" / f).is_file()
    # 2 main runs + 1 new heatmap cell + 1 new kappa value (the others reuse the FedGSP run)
    assert len(list(Path(tmp_path / "results" / "runs" / "a").glob("*/seed0/metrics.json"))) == 4
