"""The real-writer protocol table (mcfl.report.protocols): hand-checkable numbers on made-up run directories, and
the real-writer config's small variant end to end through the workflow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from conftest import real_data
from mcfl.report.protocols import table, write

ROOT = Path(__file__).resolve().parents[2]
FEMNIST_SAMPLE, needs_femnist = real_data("femnist-leaf-sample")


def fake_run(root: Path, label: str, seed: int, acc: float, hits: list[int] | None = None,
             clusters: dict[str, int] | None = None, time_s: dict[str, float] | None = None,
             **named) -> Path:
    """A finished run directory; ``clusters``: each client's final cluster (assignments.csv), the
    test images then belonging to the clients in turn (as many images as hits, round robin);
    ``time_s``: the seconds its rounds took, by part."""
    d = root / label / f"seed{seed}"
    d.mkdir(parents=True)
    final = {"micro_acc": acc, **{f"{k}/micro_acc": v for k, v in named.items()}}
    (d / "metrics.json").write_text(json.dumps({"label": label, "seed": seed, "final": final,
                                                "device": "cpu", "cpu": "AVX2", "threads": 1,
                                                "torch": "2.x", **({"time_s": time_s} if time_s else {})}))
    clients = list(clusters or ["f0"])
    if hits is not None:
        y = np.arange(len(hits)) % 3
        pd.DataFrame({"client": [clients[i % len(clients)] for i in range(len(hits))], "y": y,
                      "pred": np.where(np.asarray(hits) == 1, y, (y + 1) % 3)}).to_csv(
            d / "predictions.csv", index=False)
    pd.DataFrame({"client": clients, "true_cluster": "",
                  "cluster": [clusters[c] for c in clients] if clusters else ""}).to_csv(
        d / "assignments.csv", index=False)
    return d


def test_table_numbers_by_hand(tmp_path):
    """Two seeds of FedAvg and FeSEM(2): paper value, mean ± std, paired difference, sign test on the
    images only one of the two gets right (summed over seeds), and the named protocols' columns."""
    runs = [fake_run(tmp_path, "FedAvg", 0, 0.80, [1, 1, 0, 0, 1], v1=0.85),
            fake_run(tmp_path, "FedAvg", 1, 0.70, [1, 0, 0, 1, 1], v1=0.75),
            fake_run(tmp_path, "FeSEM(2)", 0, 0.90, [1, 1, 1, 1, 0], v1=0.95),
            fake_run(tmp_path, "FeSEM(2)", 1, 0.60, [1, 1, 1, 1, 1], v1=0.50)]
    paper = [fake_run(tmp_path / "paper", "FeSEM(2)", 0, 0.5, v1=0.88)]
    t = write(runs, tmp_path / "out" / "tab", paper_results=tmp_path / "nowhere")
    assert t["paper_protocol_seeds"].tolist() == [0, 0]        # no such results directory: not run
    from mcfl.report.protocols import load

    t = table(load(runs), load(paper)).set_index("method")
    fesem, fedavg = t.loc["FeSEM(2)"], t.loc["FedAvg"]
    assert fedavg["paper_mean"] == 84.9 and fesem["paper_mean"] == 84.8          # FeSEM Table 2 (journal)
    assert fesem["standard_mean"] == pytest.approx(75.0) and fesem["standard_std"] == pytest.approx(np.std([90, 60], ddof=1))
    assert fesem["v1_mean"] == pytest.approx(72.5)
    assert fesem["paper_protocol_mean"] == pytest.approx(88.0) and fesem["paper_protocol_seeds"] == 1
    # paired differences: seed 0 +10, seed 1 -10 points
    assert fesem["diff_vs_ref_mean"] == pytest.approx(0.0) and fesem["diff_vs_ref_std"] == pytest.approx(np.std([10, -10], ddof=1))
    # seed 0: only FeSEM images 2, 3; only FedAvg image 4. seed 1: only FeSEM images 1, 2.
    assert (fesem["only_this"], fesem["only_ref"]) == (4, 1)
    assert fesem["sign_p"] == pytest.approx(binomtest(4, 5, 0.5).pvalue)
    assert pd.isna(fedavg["diff_vs_ref_mean"])
    md = (tmp_path / "out" / "tab.md").read_text()
    assert md.startswith("# FeSEM's Table 2 on real FEMNIST writers\n")          # the default title
    write(runs, tmp_path / "titled", title="Two methods")
    assert (tmp_path / "titled.md").read_text().startswith("# Two methods\n")
    assert "| FeSEM(2) | 84.8 ± 1.1 | not run | 75.0 ± 21.2 |" in md and "`v1`" in md
    assert "authors' code" not in md               # no authors' code results named: no such column
    assert "cpu (AVX2, 1 thread(s), torch 2.x)" in md


def test_the_authors_code_column_reads_v1_of_its_own_results(tmp_path):
    """The authors' code column: mean ± std of its runs' V1 scores (not their standard ones), with
    their seeds; a row those runs lack says "not run" once the study has runs, "not run yet" before."""
    runs = [fake_run(tmp_path / "std" / "runs" / "d", "FedAvg", 0, 0.80),
            fake_run(tmp_path / "std" / "runs" / "d", "FeSEM(2)", 0, 0.70)]
    authors = tmp_path / "authors" / "runs" / "d"
    for seed, v1 in ((0, 0.60), (1, 0.70), (2, 0.80)):
        fake_run(authors, "FeSEM(2)", seed, 0.1, v1=v1)
    t = write(runs, tmp_path / "t", authors_results=tmp_path / "authors").set_index("method")
    assert t.loc["FeSEM(2)", "authors_mean"] == pytest.approx(70.0)
    assert t.loc["FeSEM(2)", "authors_std"] == pytest.approx(10.0)            # std of 60, 70, 80
    assert t.loc["FeSEM(2)", "authors_seeds"] == 3 and t.loc["FedAvg", "authors_seeds"] == 0
    md = (tmp_path / "t.md").read_text()
    assert "| FeSEM(2) | 84.8 ± 1.1 | not run | 70.0 ± 10.0 (3 seeds) | 70.0 |" in md
    assert "| FedAvg | 84.9 ± 2.0 | not run | not run | 80.0 |" in md and "not run yet" not in md
    write(runs, tmp_path / "none", authors_results=tmp_path / "nowhere")
    none = (tmp_path / "none.md").read_text()           # named but not run (yet): says so
    assert "| FedAvg | 84.9 ± 2.0 | not run | not run yet | 80.0 |" in none
    assert "(this study has not been run yet)" in none


def test_the_authors_code_section_pairs_its_runs_with_its_own_fedavg(tmp_path):
    """Under the authors' code settings: FeSEM(2)'s authors' runs against the authors' FedAvg of the
    same seeds (not the standard FedAvg): the paper's margin (84.8 - 84.9), Δ under V1 paired over
    seeds, Δ under the standard evaluation with the sign test over images, by hand."""
    runs = [fake_run(tmp_path / "std" / "runs" / "d", "FedAvg", 0, 0.99, [1, 1, 1, 1, 1]),
            fake_run(tmp_path / "std" / "runs" / "d", "FeSEM(2)", 0, 0.10, [0, 0, 0, 0, 0])]
    authors = tmp_path / "authors" / "runs" / "d"
    fake_run(authors, "FedAvg", 0, 0.80, [1, 1, 0, 0, 1], v1=0.70)
    fake_run(authors, "FedAvg", 1, 0.60, [1, 0, 0, 1, 1], v1=0.80)
    # seed 0: clients a, b in cluster 0 and c alone in cluster 1, with images 3 and 5 (a b c a b)
    fake_run(authors, "FeSEM(2)", 0, 0.70, [1, 1, 1, 1, 0], {"a": 0, "b": 0, "c": 1}, v1=0.90,
             time_s={"local": 1500.0, "eval": 89.0, "aggregate": 1.0})      # 1,590 s: 26.5 -> 26 min
    fake_run(authors, "FeSEM(2)", 1, 0.90, [1, 1, 1, 1, 1], {"a": 1, "b": 0, "c": 1}, v1=0.85,
             time_s={"local": 3000.0, "eval": 31.0})                        # 3,031 s: 50.5 -> 51 min
    fake_run(authors, "FeSEM(2)", 2, 0.50, [0, 0, 0, 0, 0], {"a": 0, "b": 0, "c": 0},
             v1=0.10)                                      # no FedAvg seed 2: not paired
    fake_run(authors, "FeSEM-E1(2)", 0, 0.60, [1, 1, 1, 0, 0], v1=0.65)  # a switch only the authors' runs have
    t = write(runs, tmp_path / "t", authors_results=tmp_path / "authors").set_index("method")
    fesem = t.loc["FeSEM(2)"]
    assert fesem["authors_paired_seeds"] == 2
    # V1: seed 0 +20, seed 1 +5 points; standard: seed 0 -10, seed 1 +30
    assert fesem["authors_v1_diff_mean"] == pytest.approx(12.5)
    assert fesem["authors_v1_diff_std"] == pytest.approx(np.std([20, 5], ddof=1))
    assert fesem["authors_diff_vs_ref_mean"] == pytest.approx(10.0)
    # seed 0: only FeSEM images 2, 3, only FedAvg image 4; seed 1: only FeSEM images 1, 2
    assert (fesem["authors_only_this"], fesem["authors_only_ref"]) == (4, 1)
    assert fesem["authors_sign_p"] == pytest.approx(binomtest(4, 5, 0.5).pvalue)
    assert fesem["diff_vs_ref_mean"] == pytest.approx(-89.0)          # the standard column is untouched
    md = (tmp_path / "t.md").read_text()
    assert "## Under the authors' code settings" in md
    # clusters: seed 0 sizes 2 + 1, the smallest (c) with 1 test image (image 3); seed 1 2 + 1, the
    # smallest (b) with images 2 and 5; seed 2 all in one cluster
    assert fesem["authors_clusters_by_seed"] == "2+1 (1) / 2+1 (2) / 3"
    assert ("| FeSEM(2) | -0.1 | 61.7 ± 44.8 | 90.0 / 85.0 / 10.0 | 2+1 (1) / 2+1 (2) / 3 | +12.5 ± 10.6 "
            "| 70.0 ± 20.0 | +10.0 ± 28.3 | 4 / 1 | 0.38 | 3 (2 paired) | 26 / 51 / ? |") in md
    assert "| FedAvg |  | 75.0 ± 7.1 | 70.0 / 80.0 |  |  | 70.0 ± 14.1 |  |  |  | 2 |  |" in md
    # the switch: its own row of the section (seed 0: V1 -5, standard -20; only it gets image 2, only FedAvg
    # image 4), not one of the table above
    assert "| FeSEM-E1(2) |  | 65.0 | 65.0 |  | -5.0 | 60.0 | -20.0 | 1 / 1 | 1 | 1 |  |" in md
    assert md.count("FeSEM-E1(2)") == 1 and t.loc["FeSEM-E1(2)", "seeds"] == 0
    write(runs, tmp_path / "none", authors_results=tmp_path / "nowhere")
    assert "## Under the authors' code settings" not in (tmp_path / "none.md").read_text()


def test_the_machines_section_names_the_cells_each_machine_made(tmp_path):
    """Runs from a GPU beside CPU runs: each machine's line lists the rows and columns it trained."""
    runs = [fake_run(tmp_path, "FedAvg", 0, 0.80), fake_run(tmp_path, "FeSEM(2)", 0, 0.70)]
    paper = fake_run(tmp_path / "paper" / "runs" / "d", "FeSEM(2)", 0, 0.5, v1=0.6)
    m = json.loads((paper / "metrics.json").read_text())
    (paper / "metrics.json").write_text(json.dumps({**m, "device": "cuda", "device_name": "NVIDIA H200",
                                                    "cpu": "AVX512", "torch": "2.y"}))
    write(runs, tmp_path / "t", paper_results=tmp_path / "paper")
    md = (tmp_path / "t.md").read_text()
    assert "- cpu (AVX2, 1 thread(s), torch 2.x): standard: FedAvg, FeSEM(2)\n" in md
    assert "- cuda NVIDIA H200 (AVX512, 1 thread(s), torch 2.y): paper's protocol: FeSEM(2)\n" in md


def test_a_row_with_seeds_the_reference_lacks_says_how_many_were_paired(tmp_path):
    """FeSEM(2) has seeds 0-2, FedAvg only seed 0: Δ is seed 0's alone, and the cell says so."""
    runs = [fake_run(tmp_path, "FedAvg", 0, 0.80, [1, 1, 0, 0, 1])]
    runs += [fake_run(tmp_path, "FeSEM(2)", s, a, [1, 1, 1, 1, 0]) for s, a in ((0, 0.90), (1, 0.10), (2, 0.20))]
    t = write(runs, tmp_path / "t").set_index("method")
    assert t.loc["FeSEM(2)", "paired_seeds"] == 1 and t.loc["FeSEM(2)", "seeds"] == 3
    assert t.loc["FeSEM(2)", "diff_vs_ref_mean"] == pytest.approx(10.0)     # 90 - 80, not the 3-seed mean's 40 - 80
    assert "| +10.0 (1 of 3 seeds) | 2 / 1 |" in (tmp_path / "t.md").read_text()


def test_a_missing_reference_is_named(tmp_path):
    runs = [fake_run(tmp_path, "FeSEM(2)", 0, 0.9)]
    with pytest.raises(ValueError, match="no run labelled 'FedAvg'"):
        write(runs, tmp_path / "t")


@pytest.mark.slow
@needs_femnist
def test_femnist_sample_config_small_variant_end_to_end(tmp_path, cli_env):
    """config/femnist-sample.yaml cut to one seed, FedAvg and FeSEM(2), 2 rounds of 2 local steps, a
    128-unit hidden layer (the amount of local work and the model's width are not what the test
    checks; with 2048 units FeSEM's centres train every writer's first local model twice, as 105 of
    them do not fit in memory) and the 2048-dimensional projection for k-means that the 2048-unit
    model gets by itself: the real writers go through prepare, centres, training with every named
    protocol, the report and the protocol table."""
    import yaml

    from dag_helpers import snakemake

    cfg = yaml.safe_load((ROOT / "config" / "femnist-sample.yaml").read_text())
    cfg["seeds"] = [0]
    cfg["datasets"]["femnist_sample"]["train"].update(rounds=2, eval_every=2, checkpoint_every=0,
                                                         local_steps=2)
    cfg["datasets"]["femnist_sample"]["model"]["hidden"] = 128
    cfg["methods"] = [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2, "restarts": 2, "init_projection": 2048}]
    cfg["figures"] = {"clusters": {"run": None}, "cases": {"run": None}}
    cfg["protocols"].update(out="tables/femnist-sample", title="Two methods, two rounds")
    del cfg["protocols"]["paper_results"]       # optional: the command must then leave out the flag
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = snakemake(tmp_path, cli_env, "--configfile", str(tmp_path / "c.yaml"))
    assert r.returncode == 0, r.stderr[-3000:]
    t = pd.read_csv(tmp_path / "results-femnist-sample" / "tables" / "femnist-sample.csv")
    assert t["method"].tolist() == ["FedAvg", "FeSEM(2)"]
    for col in ("standard_mean", "v1_mean", "v2_mean", "active_mean", "finetune_mean", "cluster_mean_mean"):
        assert t[col].between(0, 100).all(), col
    n_test = len(pd.read_csv(tmp_path / "results-femnist-sample" / "runs" / "femnist_sample" / "FedAvg"
                             / "seed0" / "predictions.csv"))
    assert n_test == 1685                                          # every test image of the 105 writers
    assert t.loc[1, "only_this"] + t.loc[1, "only_ref"] <= n_test
    md = (tmp_path / "results-femnist-sample" / "tables" / "femnist-sample.md").read_text()
    assert "not run" in md and md.startswith("# Two methods, two rounds\n")      # protocols.title
    clusters = pd.read_csv(tmp_path / "results-femnist-sample" / "tables" / "femnist-sample-clusters.csv")
    assert set(clusters["label"]) == {"FeSEM(2)"} and clusters["eta2"].between(0, 1).all()


def test_image_stats_by_hand():
    """A vertical bar has no slant, a diagonal bar x = y has slant 1; ink is measured from the
    background whether the background is white (LEAF's FEMNIST) or black."""
    from mcfl.report.writers import image_stats

    vertical = np.zeros((28, 28))
    vertical[4:24, 14] = 1.0
    diagonal = np.zeros((28, 28))
    diagonal[np.arange(4, 24), np.arange(4, 24)] = 0.8
    diagonal[10, 10] = 1.0
    s = image_stats(np.stack([vertical, 1 - vertical, diagonal]))
    assert s["slant"] == pytest.approx([0.0, 0.0, 1.0], abs=1e-9)
    assert s["ink_fraction"] == pytest.approx([20 / 784, 20 / 784, 20 / 784])
    assert s["ink_darkness"] == pytest.approx([1.0, 1.0, (19 * 0.8 + 1.0) / 20])


def test_association_eta2_is_one_when_clusters_split_a_statistic_and_zero_when_they_do_not():
    from mcfl.report.writers import STATS, association

    stats = pd.DataFrame({k: [1.0, 1.0, 5.0, 5.0] for k in STATS})
    stats["slant"] = [0.1, 0.3, 0.1, 0.3]                  # the same spread in both clusters
    a = association(stats, pd.Series([0, 0, 1, 1])).set_index("stat")
    assert a.loc["ink_darkness", "eta2"] == pytest.approx(1.0)
    assert a.loc["slant", "eta2"] == pytest.approx(0.0)


def test_publish_copies_the_table_and_figures_with_their_provenance(tmp_path):
    from mcfl.report.publish import publish

    runs = [fake_run(tmp_path / "res" / "runs", "FedAvg", s, 0.8) for s in (0, 1)]
    res = tmp_path / "res"
    (res / "figures").mkdir()
    (res / "table.md").write_text("| method | acc |\n|---|---|\n| FedAvg | 80.0 |\n")
    (res / "figures" / "convergence_x.png").write_bytes(b"png")
    page = publish(res, runs, tmp_path / "docs" / "results" / "study", "config/x.yaml", "Study")
    text = page.read_text()
    assert text.startswith("# Study") and "| FedAvg | 80.0 |" in text
    assert "2 runs on cpu" in text and "CPU kernels AVX2" in text and "`config/x.yaml`" in text
    assert "![convergence_x](../figures/dag/study/convergence_x.png)" in text
    assert (tmp_path / "docs" / "figures" / "dag" / "study" / "convergence_x.png").read_bytes() == b"png"
    # figures from the results folder itself
    (res / "curves.png").write_bytes(b"c")
    text = publish(res, runs, tmp_path / "docs" / "results" / "gsp", "config/x.yaml", "GSP", figures=".").read_text()
    assert "![curves](../figures/dag/gsp/curves.png)" in text and "convergence_x" not in text


def test_domain_shares_are_ranked_against_the_writer_statistics(tmp_path):
    """FedCG's per-writer domain shares (assignments.csv's domain_share_<k>): a share that rises
    with a writer statistic has rho 1 with it, and the report names that domain; the
    majority-domain clusters get the usual eta2."""
    from mcfl.data import write_store
    from mcfl.data.store import ClientData
    from mcfl.report.writers import STATS, share_association, write as write_writers

    stats = pd.DataFrame({k: [1.0, 2.0, 3.0, 4.0] for k in STATS})
    stats["slant"] = [0.5, 0.5, 0.5, 0.5]                     # constant: no rank correlation
    shares = pd.DataFrame({"domain_share_0": [0.1, 0.2, 0.6, 0.9], "domain_share_1": [0.9, 0.8, 0.4, 0.1]})
    r = share_association(stats, shares).set_index(["domain", "stat"])
    assert r.loc[(0, "ink_darkness"), "rho"] == pytest.approx(1.0)
    assert r.loc[(1, "ink_darkness"), "rho"] == pytest.approx(-1.0)
    assert np.isnan(r.loc[(0, "slant"), "rho"])

    rng = np.random.default_rng(0)
    clients = []
    for i in range(4):                                        # a broader stroke writer by writer
        x = np.zeros((3, 28, 28), np.float32)
        x[:, 6:22, 12:13 + i] = 1.0
        clients.append(ClientData(f"w{i}", x.reshape(3, -1), rng.integers(0, 62, 3),
                                  x[:1].reshape(1, -1), np.array([0])))
    store = write_store(tmp_path / "s", clients, n_classes=62, source="test", params={})
    d = fake_run(tmp_path / "runs", "FedCG(2)", 0, 0.5)
    pd.DataFrame({"client": [f"w{i}" for i in range(4)], "true_cluster": "", "cluster": [1, 1, 0, 0],
                  **shares}).to_csv(d / "assignments.csv", index=False)
    write_writers(store, [d], tmp_path / "out" / "w", shares=True)
    sh = pd.read_csv(tmp_path / "out" / "w-shares.csv").set_index(["domain", "stat"])
    assert sh.loc[(0, "ink_fraction"), "rho"] == pytest.approx(1.0)
    assert np.isnan(sh.loc[(0, "ink_darkness"), "rho"])     # every pen equally dark
    md = (tmp_path / "out" / "w.md").read_text()
    assert "## Domain shares against the writer statistics" in md
    assert "+1.00 (domain 0" in md or "-1.00 (domain" in md
    assert "0.45 / 50%" in md                                 # domain 0: mean share, writers >= 1/2
    assert "| FedCG(2) | 0 of 1 |" in md                       # the writers spread: not collapsed
    clusters = pd.read_csv(tmp_path / "out" / "w.csv").set_index("stat")
    assert clusters.loc["ink_fraction", "eta2"] > 0.5


def test_a_student_that_puts_every_image_in_one_domain_is_reported_collapsed():
    """FedCG's student can send all images to one domain (seen on the real writers): the report
    counts such seeds and says the constant shares have no correlation instead of a blank cell."""
    from mcfl.report.writers import STATS, collapsed, shares_markdown, to_markdown

    one = np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    spread = np.array([[0.2, 0.8], [1.0, 0.0], [0.0, 1.0]])    # each writer in one domain, not the same
    assert collapsed(one) and not collapsed(spread)
    sh = pd.DataFrame([{"label": "FedCG(2)", "seed": s, "domain": k, "stat": "slant", "rho": np.nan, "p": np.nan}
                       for s in (0, 1) for k in (0, 1)])
    md = shares_markdown(sh, {"FedCG(2)": [one, spread]})
    assert "| FedCG(2) | 1 of 2 |" in md
    assert "n/a (share or statistic constant)" in md
    t = pd.DataFrame([{"label": "FedCG(2)", "seed": 0, "stat": st, "eta2": 0.0, "kruskal_p": np.nan,
                       "clusters": 1} for st in STATS])
    assert "n/a (one cluster)" in to_markdown(t, {})


def test_a_cell_whose_seeds_ran_on_two_machines_says_so(tmp_path):
    """The paper-protocol and standard cells count the machines their seeds ran on when there are
    several (a run's metrics.json names its device); one machine adds nothing."""
    runs = [fake_run(tmp_path, "FedAvg", s, 0.8) for s in (0, 1)]
    paper = [fake_run(tmp_path / "paper" / "runs" / "ds", "FedAvg", s, 0.5, v1=0.7) for s in (0, 1)]
    for d in (runs[1], paper[1]):
        m = json.loads((d / "metrics.json").read_text())
        (d / "metrics.json").write_text(json.dumps(dict(m, device="cuda", device_name="H200")))
    write(runs, tmp_path / "out" / "tab", paper_results=tmp_path / "paper")
    row = next(line for line in (tmp_path / "out" / "tab.md").read_text().splitlines() if line.startswith("| FedAvg"))
    assert "70.0 ± 0.0 (2 seeds, 2 machines)" in row and "80.0 ± 0.0 (2 machines)" in row
    write(runs[:1], tmp_path / "out" / "one", paper_results=tmp_path / "nowhere")
    row = next(line for line in (tmp_path / "out" / "one.md").read_text().splitlines() if line.startswith("| FedAvg"))
    assert "machines" not in row
