"""The replication section (mcfl.replication) and its statistics (mcfl.replication_report),
checked by hand."""

import copy

import numpy as np
import pytest

from mcfl.config import ConfigError, expand_runs, validate
from mcfl.replication import cost_line
from mcfl.replication_report import compare, one_sided_p, stouffer, table, verdict

DIGITS = {"prepare": {"source": "digits", "clients": 12, "clusters": 2, "seed": 0},
          "model": {"name": "digits_cnn"}, "train": {"rounds": 2, "clients_per_round": 4}}
BASE = {"seeds": [0, 1], "tracking": False, "datasets": {"digits": DIGITS},
        "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": [2, 3], "restarts": 2}, {"method": "NoFed"}],
        "replication": {"draws": {"s1": {"prepare": {"seed": 1}}, "p2": {"partition": {"scheme": "iid", "seed": 2}}},
                        "methods": ["FeSEM(3)"]}}


def config(**rep):
    cfg = copy.deepcopy(BASE)
    cfg["replication"].update(rep)
    return validate(cfg)


# -- the section -----------------------------------------------------------------------------------
def test_each_draw_is_a_dataset_with_the_chosen_runs_and_the_reference():
    cfg = config()
    assert cfg["datasets"]["digits-s1"]["prepare"]["seed"] == 1
    assert cfg["datasets"]["digits-p2"]["partition"] == {"scheme": "iid", "seed": 2}
    assert cfg["datasets"]["digits-s1"]["model"] == DIGITS["model"]
    runs = {(r["dataset"], r["label"], r["seed"]): r.get("draw") for r in expand_runs(cfg)}
    assert sorted(k[:2] for k in runs if k[0] != "digits" and k[2] == 0) == [
        ("digits-p2", "FeSEM(3)"), ("digits-p2", "FedAvg"), ("digits-s1", "FeSEM(3)"), ("digits-s1", "FedAvg")]
    assert runs[("digits", "NoFed", 0)] is None and runs[("digits-p2", "FedAvg", 1)] == "p2"


def test_the_original_datasets_runs_are_the_runs_without_the_section():
    """Byte for byte the same run specs: a study replicated later reuses the runs it has."""
    from mcfl.io import canonical_json

    plain = copy.deepcopy(BASE)
    del plain["replication"]
    base = [canonical_json(r) for r in expand_runs(validate(plain))]
    assert [canonical_json(r) for r in expand_runs(config()) if r["dataset"] == "digits"] == base


def test_validating_an_expanded_config_again_changes_nothing():
    cfg = config()
    again = validate(copy.deepcopy(cfg))
    assert again == cfg


def test_a_config_without_the_section_keeps_its_runs():
    cfg = copy.deepcopy(BASE)
    del cfg["replication"]
    assert all("draw" not in r for r in expand_runs(validate(cfg)))


@pytest.mark.parametrize("rep, message", [
    ({"methods": ["FeSEM(5)"]}, "no method entry on 'digits' makes the label 'FeSEM(5)'"),
    ({"reference": "FedProx"}, "makes the label 'FedProx'"),
    ({"protocols": ["v1"]}, "replication.protocols: 'v1' is not a protocol of the dataset"),
    ({"dataset": "mnist"}, "replication.dataset: unknown dataset 'mnist'"),
    ({"draws": {"same": {"prepare": {"seed": 0}}}}, "replication.draws.same: the same prepare and partition"),
    ({"original": "s1"}, "replication.original: 's1' is also the name of a draw"),
    ({"draws": {"bad": {"prepare": {"seed": "x"}}}}, "datasets.digits-bad.prepare"),
    ({"draws": {"bad": {"seed": 1}}}, "replication.draws.bad: Additional properties"),
])
def test_a_mistake_is_one_line_naming_its_key(rep, message):
    with pytest.raises(ConfigError) as e:
        config(**rep)
    assert message in str(e.value) and "\n" not in str(e.value)


# -- the statistics, by hand -------------------------------------------------------------------------
def test_verdict_rule():
    assert verdict([1.2, 0.8], [0.01, 0.03]) == "replicates"
    assert verdict([1.2, 0.8], [0.01, 0.2]) == "inconclusive"            # one draw not significant
    assert verdict([1.2, -0.8], [0.01, 0.2]) == "inconclusive"
    assert verdict([1.2, -0.8], [0.01, 0.04]) == "contradicted"
    assert verdict([1.2, 0.5, -0.8], [0.01, 0.01, 0.04]) == "contradicted"
    assert verdict([-1.0, -2.0, -0.5], [0.001, 0.001, 0.01]) == "replicates"
    assert verdict([1.0, np.nan], [0.01, np.nan]) == "inconclusive"         # a draw without runs


def test_stouffer_by_hand():
    # z = Φ⁻¹(0.95) = 1.6449 on each draw: Z = 2 × 1.6449 / √2 = 2.3262, p = 1 - Φ(2.3262) = 0.0100
    assert stouffer([0.05, 0.05]) == pytest.approx(0.0100, abs=2e-5)
    # opposite evidence cancels: Φ⁻¹(0.95) + Φ⁻¹(0.05) = 0, p = 0.5
    assert stouffer([0.05, 0.95]) == pytest.approx(0.5)
    assert stouffer([1.0, 1.0]) > 0.999                    # no discordant images: finite, near 1


def test_one_sided_sign_test_by_hand():
    # 8 of 10 discordant images won: P(X >= 8) = (45 + 10 + 1) / 1024
    assert one_sided_p(8, 2, +1) == pytest.approx(56 / 1024)
    assert one_sided_p(8, 2, -1) == pytest.approx(1 - (10 + 1) / 1024)        # P(X <= 8) = 1 - P(X >= 9)
    assert one_sided_p(0, 0, +1) == 1.0


def _run(label, seed, draw, acc, hits, v1=None):
    hit = np.asarray(hits, dtype=bool)
    final = {"micro_acc": acc, **({"v1/micro_acc": v1} if v1 is not None else {})}
    return {"label": label, "seed": seed, "draw": draw, "dataset": f"d-{draw}", "final": final,
            "hit": hit, "y": np.zeros(len(hit))}


def test_compare_counts_images_under_standard_and_seeds_under_a_named_protocol():
    ref = [_run("FedAvg", s, "a", 0.5, [1, 1, 0, 0], v1=0.5) for s in (0, 1, 2)]
    mine = [_run("X", s, "a", 0.5 + 0.01 * (s + 1), [1, 1, 1, 0], v1=0.5 - 0.01 * (s - 1)) for s in (0, 1, 2)]
    std = compare(mine, ref, "standard")
    assert (std["seeds"], std["wins"], std["losses"]) == (3, 3, 0)          # one image a seed
    assert std["diff_mean"] == pytest.approx(2.0) and std["diff_std"] == pytest.approx(1.0)
    assert std["p"] == pytest.approx(0.25)                                  # 2 × 0.5³
    v1 = compare(mine, ref, "v1")
    assert (v1["wins"], v1["losses"]) == (1, 1)                             # +1, 0, -1 points
    assert v1["p"] == 1.0


def test_table_contradicted_when_two_draws_disagree():
    hits_ref, n = [1] * 20 + [0] * 20, 40
    runs = []
    for draw, sign in (("a", +1), ("b", -1)):
        for s in (0, 1):
            runs.append(_run("FedAvg", s, draw, 0.5, hits_ref))
            mine = [1] * 20 + [1] * 20 if sign > 0 else [0] * 20 + [0] * 20
            runs.append(_run("X", s, draw, 0.5 + sign * 0.2, mine))
    t = table(runs, "FedAvg", ["standard"], ["a", "b"])
    assert t["wins"].tolist() == [40, 0] and t["losses"].tolist() == [0, 40]
    assert (t["verdict"] == "contradicted").all()
    assert t["p_one_sided"].iloc[1] == pytest.approx(1.0)     # in the first draw's direction
    assert t["combined_p"].iloc[0] == pytest.approx(stouffer([0.5 ** 40, 1.0]))
    unnamed = [{k: v for k, v in r.items() if not (k == "draw" and v == "a")} for r in runs]
    same = table(unnamed, "FedAvg", ["standard"], ["a", "b"])       # no draw: the first (original) one
    assert same.drop(columns="dataset").equals(t.drop(columns="dataset"))


# -- the check before any training ---------------------------------------------------------------------
def test_check_draws_records_each_draws_clients(digits_store, tmp_path):
    from mcfl.data.store import load
    from mcfl.replication_report import check_draws

    n = load(digits_store).n_clients
    out = tmp_path / "checked.json"
    assert check_draws({"original": str(digits_store), "s1": str(digits_store)}, n, out) == {"original": n, "s1": n}
    assert out.exists()


def test_a_draw_with_too_few_clients_or_a_broken_store_stops_with_one_line(digits_store, tmp_path):
    import shutil

    from mcfl.replication_report import check_draws

    out = tmp_path / "checked.json"
    with pytest.raises(ValueError, match=r"^replication: draw 's1': .* clients, fewer than the 1000 its runs sample"):
        check_draws({"s1": str(digits_store)}, 1000, out)
    broken = tmp_path / "broken"
    shutil.copytree(digits_store, broken)
    f = broken / "y_train.npy"
    f.write_bytes(f.read_bytes()[:-8] + b"\1" * 8)             # same size, other labels
    with pytest.raises(ValueError, match=r"^replication: draw 'b': .*sha256 differs") as e:
        check_draws({"b": str(broken)}, 0, out)
    assert "\n" not in str(e.value) and not out.exists()


def test_check_draws_command_fails_with_one_line(digits_store, tmp_path, capsys):
    from mcfl import cli

    out = tmp_path / "checked.json"
    assert cli.main(["check-draws", "--out", str(out), "--sampled", "1000", f"s1={digits_store}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "draw 's1'" in err and not out.exists()
    assert cli.main(["check-draws", "--out", str(out), str(digits_store)]) == 1
    assert "is not DRAW=STORE" in capsys.readouterr().err


def test_the_draw_is_an_mlflow_parameter():
    from mcfl.track import flatten

    cfg = config()
    run = next(r for r in expand_runs(cfg) if r["dataset"] == "digits-s1")
    assert flatten(run)["draw"] == "s1"


@pytest.mark.slow
def test_the_draw_is_an_mlflow_tag_to_filter_by(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from conftest import make_run
    from mcfl.track import MLflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    client = MlflowClient(uri)
    ids = {}
    for draw in ("original", "s1"):
        t = MLflowTracker("draws", client=client, defer=False, run_dir=f"results/runs/{draw}/FedAvg/seed0")
        t.start({**make_run(dataset=draw), "draw": draw}, {"git": "g", "data_hash": "d", "run_hash": draw})
        t.end("FINISHED")
        ids[draw] = t.run_id
    exp = client.get_experiment_by_name("draws").experiment_id
    found = client.search_runs([exp], "tags.draw = 's1'")
    assert [r.info.run_id for r in found] == [ids["s1"]] and found[0].data.params["draw"] == "s1"


def test_the_report_reads_the_chosen_runs_and_the_redrawn_jobs_wait_for_the_check():
    from types import SimpleNamespace

    from mcfl.plan import Plan
    from mcfl.replication import ReplicationPlan

    plan = Plan(config())
    rep = ReplicationPlan(plan)
    plan.gates.update(rep.gate())
    assert rep.datasets() == ["digits", "digits-s1", "digits-p2"] and rep.draw_order() == ["original", "s1", "p2"]
    assert sorted({(r["dataset"], r["label"]) for r in rep.runs()}) == [
        ("digits", "FeSEM(3)"), ("digits", "FedAvg"), ("digits-p2", "FeSEM(3)"), ("digits-p2", "FedAvg"),
        ("digits-s1", "FeSEM(3)"), ("digits-s1", "FedAvg")]
    assert rep.sampled() == 4
    assert rep.original_flag() == ["--original-draw", "digits=original"]       # the report's draw column
    job = SimpleNamespace(dataset="digits-s1", run="FedAvg", seed="0")
    assert plan.training.train_inputs(job)["replication_check"] == rep.check_file()
    original = SimpleNamespace(dataset="digits", run="NoFed", seed="0")     # the runs without the section
    assert "replication_check" not in plan.training.train_inputs(original)


def test_pending_of_an_overlay_that_extends_its_base_names_the_draws_runs_only(tmp_path, monkeypatch):
    """tools/archive_runs.py --pending on one overlay file (``extends:`` its base, adds the section):
    the base study's archived runs are the original draw's runs, so only the draws' runs are left."""
    import importlib.util
    from pathlib import Path

    import yaml

    spec = importlib.util.spec_from_file_location("archive_runs", Path(__file__).resolve().parents[1]
                                                  / "tools" / "archive_runs.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    base = {**copy.deepcopy(BASE), "experiment": "t", "results": "results-study", "data_dir": str(tmp_path / "data")}
    del base["replication"]
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "replication.yaml").write_text(yaml.safe_dump(
        {"extends": "base.yaml", "replication": {"draws": {"s1": {"prepare": {"seed": 1}}}, "methods": ["FeSEM(3)"]}}))
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    for run in ("FedAvg", "FeSEM-K2", "FeSEM-K3", "NoFed"):          # the base study's runs, archived
        for seed in (0, 1):
            kept = tmp_path / "archived-runs" / "results-study" / "digits" / run / f"seed{seed}"
            kept.mkdir(parents=True)
            (kept / "metrics.json").write_text("{}")
    assert tool.pending([str(tmp_path / "replication.yaml")]) == [
        f"results-study/runs/digits-s1/{run}/seed{seed}/metrics.json"
        for run in ("FedAvg", "FeSEM-K3") for seed in (0, 1)]


def test_the_cost_line_counts_the_draws_runs_and_the_original_runs_still_to_train():
    from types import SimpleNamespace

    cfg = config()
    runs = [SimpleNamespace(dataset=r["dataset"], label=r["label"], seed=r["seed"], total_s=60.0)
            for r in expand_runs(cfg)]
    line = cost_line(cfg, runs, lambda s: f"{s / 60:g} min", finished={("digits", "FedAvg", 0), ("digits", "NoFed", 1)})
    assert line.startswith("replication: 2 draws beside 'original' (s1, p2): 8 more training runs, 8 min of the 16 min")
    assert line.endswith("the 8 runs on 'original' are those of the config without the section "
                         "(results/runs/digits/): 2 finished there, 6 to train (6 min)")


def test_the_results_tables_draw_column_names_the_original_for_its_runs(tmp_path):
    """table.csv: a run's own draw, else the one ``mcfl report --original-draw`` names for its dataset."""
    import json

    import pandas as pd

    from mcfl.report.table import collect, summary_table

    dirs = []
    for dataset, draw in (("d", None), ("d-s1", "s1")):
        d = tmp_path / dataset / "FedAvg" / "seed0"
        d.mkdir(parents=True)
        final = {"micro_acc": 0.5, "micro_f1": 0.5, "macro_acc": 0.5, "macro_f1": 0.5}
        (d / "metrics.json").write_text(json.dumps({"dataset": dataset, "method": "FedAvg", "label": "FedAvg",
                                                    "seed": 0, "params": {}, "final": final,
                                                    **({"draw": draw} if draw else {})}))
        pd.DataFrame({"round": [1], "micro_acc": [0.5]}).to_csv(d / "history.csv", index=False)
        dirs.append(d)
    assert summary_table(collect(dirs, {"d": "leaf-torch"})[0])["draw"].tolist() == ["leaf-torch", "s1"]
    assert summary_table(collect(dirs)[0])["draw"].tolist() == ["", "s1"]
