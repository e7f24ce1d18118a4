"""FedCG's Tables 3-5 from run files."""

import json

import pandas as pd
import pytest

from mcfl.algorithms.fedcg import Params
from mcfl.papers.fedcg.tables import write_fedcg_report


def _run(tmp_path, name, seed, method="FedCG", acc=0.5, final=None, pred=None, domains=None,
         **params):
    d = tmp_path / f"{name}-{seed}"
    d.mkdir()
    extra = {}
    if pred is not None:                # (labels, predictions) of the test samples
        test = {"client": "c0", "y": pred[0], "pred": pred[1]}
        if domains is not None:         # (each test sample's domain, the unseen domain ids)
            test["domain"], extra["unseen_domains"] = domains
        pd.DataFrame(test).to_csv(d / "predictions.csv", index=False)
    p = {**Params().__dict__, **params} if method == "FedCG" else {}
    final = {"micro_acc": acc, "soft_acc": acc, "hard_acc": acc - 0.1, "acc_seen": acc + 0.1,
             "acc_unseen": acc - 0.2, "soft_acc_unseen": acc - 0.2, "hard_acc_unseen": acc - 0.3,
             **(final or {})}
    (d / "metrics.json").write_text(json.dumps({"dataset": "dd", "method": method, "label": name,
                                                "seed": seed, "params": p, "final": final, **extra}))
    return d


def test_tables_group_runs_by_their_hyperparameters(tmp_path):
    runs = [_run(tmp_path, "FedAvg", s, method="FedAvg", acc=0.6 + 0.02 * s) for s in (0, 1)]
    runs += [_run(tmp_path, "FedCG(3)", s, acc=0.7, K=3) for s in (0, 1)]
    runs += [_run(tmp_path, "GCN-H(32)", 0, acc=0.4, K=32, clustering="oracle", agnostic=False,
                  adjacency="hamming", projection=False, relu=False, test_assignment="source")]
    runs += [_run(tmp_path, "KM(2)", 0, acc=0.3, K=2, clustering="kmeans", test_assignment="source")]
    # oracle domains in training, the student's assignment at test: a Table 4 row, not Table 3
    runs += [_run(tmp_path, "Oracle(3)", 0, acc=0.8, K=3, clustering="oracle")]
    ts = write_fedcg_report(runs, tmp_path / "out")
    t3, t4, t5 = ts["table3"], ts["table4"], ts["table5"]
    assert t3[["Model", "A", "W", "ReLU"]].values.tolist() == [["GCN", "H", "✗", "✗"]]
    assert t3["acc_mean"].tolist() == [40.0]
    assert t4["Clusters"].tolist() == ["Clf", "K-means", "oracle"] and t4["K"].tolist() == [3, 2, 3]
    fedcg = t4[t4["label"] == "FedCG(3)"].iloc[0]
    assert fedcg["n_seeds"] == 2 and fedcg["soft_acc_mean"] == 70.0 and fedcg["hard_acc_mean"] == 60.0
    assert fedcg["soft_unseen_mean"] == pytest.approx(50.0) and fedcg["A init"] == "eye"
    avg = t5[t5["label"] == "FedAvg"].iloc[0]
    assert avg["acc_mean"] == pytest.approx(61.0) and round(avg["acc_std"], 4) == round(pd.Series([60.0, 62.0]).std(), 4)
    assert avg["unseen_mean"] == pytest.approx(41.0)
    assert set(t5["label"]) == {"FedAvg", "FedCG(3)", "GCN-H(32)", "KM(2)", "Oracle(3)"}
    md = (tmp_path / "out" / "tables.md").read_text()
    assert "Table 3" in md and "70.00" in md and "61.00 ± 1.41" in md
    page = (tmp_path / "out" / "tables.html").read_text()      # the same three tables, for the report
    assert page.count("<table>") == 3 and "<td>61.00 ± 1.41</td>" in page
    assert pd.read_csv(tmp_path / "out" / "table4.csv").shape[0] == 3


def test_table4_pairs_soft_and_hard_per_run_before_averaging(tmp_path):
    # seed 0: soft 50 vs hard 40 on the unseen domain; seed 1: 70 vs 65 -> paired +10, +5
    # and the paired test: 7 + 5 unseen images only soft gets right, 1 + 2 only hard
    runs = [_run(tmp_path, "FedCG(4)", s, K=4, final={"soft_acc_unseen": su, "hard_acc_unseen": hu,
                                                      "soft_only_unseen": w, "hard_only_unseen": l})
            for s, (su, hu, w, l) in enumerate([(0.5, 0.4, 7, 1), (0.7, 0.65, 5, 2)])]
    runs.append(_run(tmp_path, "no-unseen", 0, K=2, final={"soft_acc_unseen": None}))
    # a label whose runs do not all have the counts gets no (partial) sum
    runs += [_run(tmp_path, "mixed", s, K=3, final=f) for s, f in
             enumerate([{"soft_only_unseen": 4, "hard_only_unseen": 0}, {}])]
    t4 = write_fedcg_report(runs, tmp_path / "out")["table4"].set_index("label")
    row = t4.loc["FedCG(4)"]
    assert row["soft-hard_unseen_mean"] == pytest.approx(7.5)
    assert row["soft-hard_unseen_std"] == pytest.approx(pd.Series([10.0, 5.0]).std())
    assert row["soft_unseen_std"] > 10 > row["soft-hard_unseen_std"]     # pairing removes the seed spread
    assert pd.isna(t4.loc["no-unseen", "soft-hard_unseen_mean"])
    # exact sign test, 12 wins of 15: 2 * (C(15,12) + C(15,13) + C(15,14) + 1) / 2^15 = 1152 / 32768
    assert (row["soft_only_unseen"], row["hard_only_unseen"]) == (12, 3)
    assert row["sign_p_unseen"] == pytest.approx(1152 / 32768)
    for label in ("no-unseen", "mixed"):
        assert pd.isna(t4.loc[label, "soft_only_unseen"]) and pd.isna(t4.loc[label, "sign_p_unseen"])
    md = (tmp_path / "out" / "tables.md").read_text()
    assert "| sign-test p |" in md and "| 12 | 3 | 0.0352 |" in md


def test_table5_pairs_each_fedcg_run_with_the_fedavg_run_of_its_seed(tmp_path):
    y = [0, 1, 2, 3, 4, 5]
    # seed 0: FedAvg right on 0-3, FedCG on 2-5 -> only FedCG 2 (4, 5), only FedAvg 2 (0, 1)
    # seed 1: FedAvg right on 0-1, FedCG on 0-5 -> only FedCG 4; pooled 6 vs 2
    avg = {0: [0, 1, 2, 3, 0, 0], 1: [0, 1, 0, 0, 0, 0]}
    cg = {0: [1, 0, 2, 3, 4, 5], 1: y}
    runs = [_run(tmp_path, "FedAvg", s, method="FedAvg", pred=(y, avg[s])) for s in (0, 1)]
    runs += [_run(tmp_path, "FedCG(3)", s, K=3, pred=(y, cg[s])) for s in (0, 1)]
    runs += [_run(tmp_path, "no-pred", 0, K=4)]
    t5 = write_fedcg_report(runs, tmp_path / "out")["table5"].set_index("label")
    assert (t5.loc["FedCG(3)", "only_this"], t5.loc["FedCG(3)", "only_fedavg"]) == (6, 2)
    # 2 * P(X >= 6), X ~ Bin(8, 1/2) = 2 * (28 + 8 + 1) / 256
    assert t5.loc["FedCG(3)", "sign_p_fedavg"] == pytest.approx(74 / 256)
    assert pd.isna(t5.loc["FedAvg", "only_this"]) and pd.isna(t5.loc["no-pred", "sign_p_fedavg"])
    assert "| 6 | 2 | 0.289 |" in (tmp_path / "out" / "tables.md").read_text()


def test_table5_splits_the_paired_test_by_seen_and_unseen_domains(tmp_path):
    y, dom = [0, 1, 2, 3, 4, 5], ([0, 0, 1, 2, 2, 2], [2])       # domain 2 unseen: samples 3-5
    # FedAvg right on 0, 3, 4; FedCG on 1, 2, 3 -> seen: only FedCG 1, 2, only FedAvg 0; unseen:
    # only FedAvg 4; overall 2 vs 2
    runs = [_run(tmp_path, "FedAvg", 0, method="FedAvg", pred=(y, [0, 0, 0, 3, 4, 0]), domains=dom),
            _run(tmp_path, "FedCG(3)", 0, K=3, pred=(y, [1, 1, 2, 3, 0, 0]), domains=dom),
            _run(tmp_path, "no-domains", 0, K=4, pred=(y, y))]
    t5 = write_fedcg_report(runs, tmp_path / "out")["table5"].set_index("label")
    row = t5.loc["FedCG(3)"]
    assert (row["only_this"], row["only_fedavg"]) == (2, 2)
    assert (row["only_this_seen"], row["only_fedavg_seen"]) == (2, 1)
    assert (row["only_this_unseen"], row["only_fedavg_unseen"]) == (0, 1)
    assert row["sign_p_fedavg_seen"] == pytest.approx(1.0) and row["sign_p_fedavg_unseen"] == 1.0
    assert pd.isna(t5.loc["no-domains", "only_this_seen"]) and t5.loc["no-domains", "only_this"] == 3
    assert "| 2 | 2 | 1 | 2 | 1 | 1 | 0 | 1 | 1 |" in (tmp_path / "out" / "tables.md").read_text()


def test_table5_refuses_runs_on_different_test_samples(tmp_path):
    runs = [_run(tmp_path, "FedAvg", 0, method="FedAvg", pred=([0, 1], [0, 1])),
            _run(tmp_path, "FedCG(3)", 0, K=3, pred=([1, 1], [1, 1]))]
    with pytest.raises(ValueError, match=r"FedCG\(3\)-0/predictions.csv and .*different test samples"):
        write_fedcg_report(runs, tmp_path / "out")


def test_table5_has_fedprox_the_papers_numbers_alpha_and_the_machines(tmp_path):
    """FedProx is paired with FedAvg like FedCG; the paper's Table-5 value sits beside the FEMNIST
    rows (FedCG's only in its Table-5 setting); alpha is the deepest residual layer's, averaged over
    seeds; tables.md says which machine trained each row."""
    y = [0, 1, 2, 3]

    def run(name, seed, method, pred, dataset="femnist_sample", device=("cpu", None), **kw):
        d = _run(tmp_path, f"{name}-{dataset}", seed, method=method, pred=(y, pred), **kw)
        m = json.loads((d / "metrics.json").read_text())
        m.update(dataset=dataset, label=name, device=device[0], cpu="AVX2", threads=1, torch="2.x",
                 **({"device_name": device[1]} if device[1] else {}))
        (d / "metrics.json").write_text(json.dumps(m))
        return d

    paper_cg = dict(K=4, layers="last", test_assignment="soft", adjacency_init="eye")
    gpu = ("cuda", "NVIDIA H200")
    runs = [run("FedAvg", s, "FedAvg", [0, 1, 0, 0]) for s in (0, 1)]
    runs += [run("FedProx", 0, "FedProx", [0, 1, 2, 0])]                      # only this: 1, only FedAvg: 0
    runs += [run("FedCG(4)", s, "FedCG", [0, 0, 2, 3], device=gpu, final={"alpha_0": 9.0, "alpha_3": a},
                 **paper_cg) for s, a in ((0, 1.0), (1, 1.5))]
    runs += [run("FedCG-hard(4)", 0, "FedCG", [0, 1, 0, 0], device=gpu, **{**paper_cg, "test_assignment": "hard"})]
    runs += [run("FedAvg", 0, "FedAvg", [0, 1, 0, 0], dataset="digits")]
    t5 = write_fedcg_report(runs, tmp_path / "out")["table5"].set_index(["dataset", "label"])
    fx = t5.loc[("femnist_sample", "FedProx")]
    assert (fx["only_this"], fx["only_fedavg"]) == (1, 0) and fx["paper"] == 75.00
    cg = t5.loc[("femnist_sample", "FedCG(4)")]
    assert cg["alpha"] == pytest.approx(1.25) and cg["paper"] == 83.41       # alpha_3, not alpha_0
    assert (cg["only_this"], cg["only_fedavg"]) == (4, 2)                      # 2 per seed: images 2, 3 vs 1
    assert t5.loc[("femnist_sample", "FedAvg"), "paper"] == 77.81
    assert pd.isna(t5.loc[("femnist_sample", "FedCG-hard(4)"), "paper"])      # not the paper's setting
    assert pd.isna(t5.loc[("digits", "FedAvg"), "paper"]) and pd.isna(t5.loc[("digits", "FedAvg"), "alpha"])
    md = (tmp_path / "out" / "tables.md").read_text()
    assert "| 1.25 | 83.41 |" in md
    assert ("- cuda NVIDIA H200 (AVX2, 1 thread(s), torch 2.x): FedCG(4) (femnist_sample), "
            "FedCG-hard(4) (femnist_sample)\n") in md
