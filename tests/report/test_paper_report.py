"""FeSEM's published numbers as data, the side-by-side comparison, and the paper configs."""

import pandas as pd
import pytest
import yaml

from conftest import ROOT
from mcfl.config import expand_runs, read_configs, validate
from mcfl.report.paper import comparison, paper_tables, to_markdown

TABLE2 = ["NoFed", "FedSGD", "FedAvg", "FedDist", "FedDist+WS", "Robust(TKM)", "FedCluster",
          "HypoCluster(3)", "FedDane", "FedProx", "FeSEM(2)", "FeSEM(3)", "FeSEM(4)", "FeSEM-MA(3)"]


def test_paper_tables_are_complete():
    t = paper_tables()
    journal, conf = t[t["paper"] == "journal"], t[t["paper"] == "conference"]
    for ds in ("FEMNIST", "FedCelebA"):
        j = journal[journal["dataset"] == ds]
        assert list(dict.fromkeys(j["method"])) == TABLE2 and len(j) == 4 * len(TABLE2)
        assert j["std"].notna().all()
        c = conf[conf["dataset"] == ds]
        assert set(c["method"]) == set(TABLE2) - {"HypoCluster(3)", "FeSEM-MA(3)"} and c["std"].isna().all()
    assert t["value"].between(0, 100).all()
    assert t.query("paper == 'conference' and paper_label == 'FedDWS'")["method"].unique().tolist() == ["FedDist+WS"]


def test_journal_and_conference_differ_only_where_the_papers_do():
    t = paper_tables()
    key = ["dataset", "method", "metric"]
    both = t[t["paper"] == "journal"].merge(t[t["paper"] == "conference"], on=key, suffixes=("_j", "_c"))
    diff = both[both["value_j"] != both["value_c"]]
    got = {(r.dataset, r.method, r.metric, r.value_j, r.value_c) for r in diff.itertuples()}
    assert got == {
        ("FEMNIST", "NoFed", "micro_acc", 79.0, 79.4),
        ("FedCelebA", "FedAvg", "micro_acc", 86.9, 86.1),
        ("FEMNIST", "FedProx", "micro_acc", 72.6, 51.8), ("FEMNIST", "FedProx", "micro_f1", 62.8, 34.2),
        ("FEMNIST", "FedProx", "macro_acc", 74.3, 52.3), ("FEMNIST", "FedProx", "macro_f1", 50.6, 34.4),
        ("FedCelebA", "FedProx", "micro_acc", 83.8, 83.4), ("FedCelebA", "FedProx", "macro_acc", 84.9, 84.3),
        ("FedCelebA", "FedProx", "macro_f1", 65.7, 65.2)}


def ours_table(rows):
    out = []
    for (ds, method), vals in rows.items():
        r = {"dataset": ds, "method": method, "n_seeds": 3}
        for m, v in zip(("micro_acc", "micro_f1", "macro_acc", "macro_f1"), vals):
            r[f"{m}_mean"], r[f"{m}_std"] = v, 0.5
        out.append(r)
    return pd.DataFrame(out)


def test_comparison_matches_by_data_source_and_reports_not_run():
    ours = ours_table({("leaf_small", "FedAvg"): (80.0, 60.0, 81.0, 40.0),
                         ("digits", "FedAvg"): (10.0, 10.0, 10.0, 10.0)})
    cmp = comparison(ours, sources={"leaf_small": "femnist", "digits": "digits"})
    assert len(cmp) == len(paper_tables())                  # every paper value once (one dataset each)
    fa = cmp[(cmp["paper_dataset"] == "FEMNIST") & (cmp["method"] == "FedAvg") & (cmp["metric"] == "micro_acc")]
    assert fa["dataset"].tolist() == ["leaf_small", "leaf_small"]
    assert fa["delta"].tolist() == pytest.approx([80.0 - 84.9, 80.0 - 84.9])
    assert set(cmp[(cmp["paper_dataset"] == "FEMNIST") & (cmp["method"] != "FedAvg")]["status"]) == {"method not run"}
    assert set(cmp[cmp["paper_dataset"] == "FedCelebA"]["status"]) == {"not run"}
    md = to_markdown(cmp)
    assert "## FEMNIST (ours: `leaf_small`)" in md and "## FedCelebA (not run)" in md
    assert "| FedAvg | journal | 84.9 ± 2.0 | 80.0 ± 0.5 | -4.9 |" in md
    assert "| FedDist+WS | conference (FedDWS) |" in md


def test_comparison_by_dataset_name_without_sources():
    cmp = comparison(ours_table({("celeba", "FeSEM(4)"): (90.0, 70.0, 91.0, 60.0)}))
    hit = cmp[(cmp["status"] == "ok") & (cmp["paper"] == "journal") & (cmp["metric"] == "micro_acc")]
    assert hit[["paper_dataset", "method", "delta"]].values.tolist() == [["FedCelebA", "FeSEM(4)", pytest.approx(90.0 - 93.6)]]


@pytest.mark.parametrize("name, table, lr, epochs", [("femnist", "Table 2", 0.003, 5),
                                                      ("celeba", "Table 3", 0.03, 10)])
def test_paper_configs_run_all_table_rows_with_the_papers_settings(name, table, lr, epochs):
    cfg = read_configs([ROOT / "config" / f"paper-{name}.yaml"])      # with the file it extends
    (ds,) = cfg["datasets"].values()
    assert ds["prepare"]["source"] == name and ds["prepare"]["tf"] == 0.8
    assert (ds["train"]["lr"], ds["train"]["local_epochs"], ds["train"]["batch_size"]) == (lr, epochs, 10)
    # validate the method block against an embedded dataset (the LEAF sources are not needed here)
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["datasets"] = {"digits": default["datasets"]["digits"]}
    runs = expand_runs(validate(cfg))
    assert list(dict.fromkeys(r["label"] for r in runs)) == TABLE2
    by = {r["label"]: r for r in runs}
    assert by["FedProx"]["params"]["mu"] == 0.1
    assert by["FeSEM(3)"]["train"]["local_steps"] == 1 and by["FeSEM(3)"]["params"]["restarts"] == 20
    assert by["FeSEM-MA(3)"]["train"]["local_steps"] == 1 and by["FedAvg"]["train"]["local_steps"] is None
    expected = paper_tables().query(f"paper == 'journal' and table == '{table}'")["dataset"].unique().tolist()
    assert expected == ["FEMNIST" if name == "femnist" else "FedCelebA"]
