"""The partition stage and the figure rules inside the Snakemake DAG, on a tiny config."""

import pandas as pd
import pytest

from dag_helpers import job_counts, snakemake, write_config

pytestmark = pytest.mark.slow

DIGITS = {"prepare": {"source": "digits", "clients": 12, "clusters": 4, "seed": 0},
          "model": {"name": "digits_cnn"},
          "train": {"rounds": 2, "lr": 0.1, "eval_every": 1}}
CONFIG = {
    "experiment": "partition-test",
    "seeds": [0],
    "tracking": False,
    "datasets": {"digits": DIGITS, "digits-iid": {**DIGITS, "partition": {"scheme": "iid", "clients": 8}}},
    "methods": [{"method": "FeSEM", "K": [2, 4], "restarts": 2}],
    "figures": {"clusters": {"clients": 5}},
}


def test_partitioned_variant_shares_the_prepared_store_and_gets_figures(tmp_path, cli_env):
    write_config(tmp_path, CONFIG)
    dry = snakemake(tmp_path, cli_env, "-n")
    assert job_counts(dry.stdout) == {"prepare": 1, "partition": 1, "init_centres": 4, "train": 4,
                                      "figure_clusters": 2, "figure_cases": 2, "report": 1, "all": 1}
    r = snakemake(tmp_path, cli_env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["digits", "partitioned"]
    table = pd.read_csv(tmp_path / "results" / "table.csv")
    assert table[["dataset", "partition", "method"]].values.tolist() == [
        ["digits", "natural", "FeSEM(2)"], ["digits", "natural", "FeSEM(4)"],
        ["digits-iid", "iid", "FeSEM(2)"], ["digits-iid", "iid", "FeSEM(4)"]]
    assert table["ari_mean"].notna().tolist() == [True, True, False, False]   # iid: truth unknown
    fig = tmp_path / "results" / "figures"
    for name in ("clusters_digits", "clusters_digits-iid", "cases_digits", "cases_digits-iid"):
        assert (fig / f"{name}.png").stat().st_size > 5000
    assert len(pd.read_csv(fig / "clusters_digits.csv")) == 5
    assert (pd.read_csv(fig / "clusters_digits-iid.csv")["true_cluster"] == -1).all()

    rep = snakemake(tmp_path, cli_env, "--report", str(tmp_path / "report.html"))
    assert rep.returncode == 0, rep.stderr[-3000:]
    html = (tmp_path / "report.html").read_text(errors="replace")
    assert "clusters_digits-iid.png" in html and "cases_digits.png" in html

    changed = dict(CONFIG, datasets={"digits": DIGITS, "digits-iid": {
        **DIGITS, "partition": {"scheme": "dirichlet", "alpha": 0.5, "clients": 8}}})
    write_config(tmp_path, changed)
    counts = job_counts(snakemake(tmp_path, cli_env, "-n").stdout)
    assert counts["partition"] == 1 and counts["train"] == 2 and "prepare" not in counts
