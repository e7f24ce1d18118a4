"""The Snakemake DAG from nothing to a table on LEAF FEMNIST (a NIST-layout archive from a local
folder), and dry runs of the paper configurations."""

import pandas as pd
import pytest
import yaml

import leaf_helpers as H
from conftest import ROOT
from mcfl.config import load_config
from mcfl.data import load, prepare
from dag_helpers import job_counts, snakemake, write_config

pytestmark = pytest.mark.slow


def test_download_prepare_train_report_on_femnist(tmp_path, cli_env):
    nist = H.make_nist(tmp_path / "mirror", n_writers=8, sizes=(4, 9))
    prep = {"source": "femnist", "origin": str(tmp_path / "mirror"), "md5": nist.md5(), "tf": 0.8,
            "seed": 1, "split_seed": 2, "workers": 1}
    cfg = {"experiment": "leaf-wf", "seeds": [0], "tracking": False,
           "datasets": {"femnist": {"prepare": prep, "model": {"name": "femnist_cnn", "hidden": 16},
                                    "train": {"rounds": 2, "lr": 0.01, "eval_every": 1,
                                              "clients_per_round": 4}}},
           "methods": [{"method": "FedAvg"}]}
    write_config(tmp_path, cfg)
    r = snakemake(tmp_path, cli_env)
    assert r.returncode == 0, r.stderr[-3000:]
    raw = tmp_path / "data" / "raw" / "femnist"
    assert (raw / "by_class.zip").read_bytes() == nist.by_class.read_bytes()
    direct = load(prepare("femnist", tmp_path / "direct", origin=str(tmp_path / "mirror"),
                          md5=nist.md5(), raw_dir=str(tmp_path / "unused"), tf=0.8, seed=1,
                          split_seed=2, workers=1))
    assert load(tmp_path / "data" / "femnist").content_hash == direct.content_hash
    assert pd.read_csv(tmp_path / "results" / "table.csv")["method"].tolist() == ["FedAvg"]

    prep["tf"] = 0.7                        # a split setting: re-prepare and retrain, no download
    write_config(tmp_path, cfg)
    assert job_counts(snakemake(tmp_path, cli_env, "-n").stdout) == \
        {"prepare": 1, "train": 1, "report": 1, "all": 1}


@pytest.mark.parametrize("name, downloads", [("paper-femnist", 2), ("paper-celeba", 3)])
def test_paper_configs_plan_download_prepare_and_every_method(tmp_path, cli_env, name, downloads):
    """`--configfile` runs the paper config alone: nothing of the default config (present in the
    working directory, as in a checkout) is merged in."""
    cfg = load_config(ROOT / "config" / f"{name}.yaml")      # its base and method sets resolved
    write_config(tmp_path, yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    r = snakemake(tmp_path, cli_env, "-n", "--configfile", str(ROOT / "config" / f"{name}.yaml"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "digits" not in r.stdout and "synthetic" not in r.stdout
    counts = job_counts(r.stdout)
    assert counts["download"] == downloads and counts["prepare"] == 1
    runs_per_seed = sum(len(m["K"]) if isinstance(m.get("K"), list) else 1 for m in cfg["methods"])
    assert runs_per_seed >= 14                                 # every Table-2 row, FeSEM(2, 3, 4)
    assert counts["train"] == runs_per_seed * len(cfg["seeds"])
