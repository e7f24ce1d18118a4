"""A user's own config: where its outputs go when it names no `results`/`experiment`, and what
`mcfl check-config` says it costs before anything runs."""

import pytest
import yaml

from conftest import ROOT
from mcfl.config import expand_runs, load_config, name_defaults, read_yaml
from mcfl.plan import Plan

OWN = {"seeds": [0],
       "datasets": {"mine": {"prepare": {"source": "digits", "clients": 10, "clusters": 2},
                             "model": {"name": "digits_cnn"}, "train": {"rounds": 3}}},
       "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2}]}


def test_a_config_without_results_plans_its_outputs_under_its_own_folder(tmp_path):
    path = tmp_path / "my-leaf.yaml"
    path.write_text(yaml.safe_dump(OWN))
    cfg = load_config(path)
    assert cfg["results"] == "results-my-leaf" and cfg["experiment"] == "my-leaf"
    assert cfg["data_dir"] == "data-my-leaf"
    p = Plan(cfg)
    outs = p.run_outputs("metrics.json") + [p.res("table.md")] + p.targets()
    assert len(outs) > 2 and all(o.startswith("results-my-leaf/") for o in outs)
    assert p.stores() == ["data-my-leaf/mine"]
    assert {r["experiment"] for r in expand_runs(cfg)} == {"my-leaf"}


def test_explicit_names_win_and_the_default_config_keeps_results(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**OWN, "results": "out", "experiment": "e"}))
    cfg = load_config(path)
    assert (cfg["results"], cfg["experiment"]) == ("out", "e")
    # a file named config.yaml (the default config's name) keeps the schema's defaults
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(OWN))
    cfg = load_config(tmp_path / "config.yaml")
    assert (cfg["results"], cfg["data_dir"], cfg["experiment"]) == ("results", "data", "mcfl")
    # odd characters of a file name do not reach a path or an experiment name
    assert name_defaults({}, "a b{c}.yml") == {"results": "results-a_b_c_", "data_dir": "data-a_b_c_",
                                               "experiment": "a_b_c_"}


def test_a_config_reusing_a_dataset_name_never_writes_the_default_configs_store(tmp_path):
    """`digits` with other prepare settings in a config of the user's own: its store is its own
    folder's, so the default config's DVC-tracked `data/digits` (and `dvc status`) stay as they were."""
    default = load_config(ROOT / "config" / "config.yaml")
    assert default["data_dir"] == "data"
    assert yaml.safe_load((ROOT / "params.yaml").read_text())["data_dir"] == default["data_dir"]
    mine = {**OWN, "datasets": {"digits": {**OWN["datasets"]["mine"],
                                           "prepare": {"source": "digits", "clients": 7, "clusters": 3}}}}
    (tmp_path / "digits-other.yaml").write_text(yaml.safe_dump(mine))
    cfg = load_config(tmp_path / "digits-other.yaml")
    assert Plan(cfg).stores() == ["data-digits-other/digits"]
    assert Plan(default).store("digits") == "data/digits"


SHIPPED = sorted(p for p in (ROOT / "config").rglob("*.yaml") if p.name != "config.yaml")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT / "config")))
def test_no_shipped_config_but_the_default_writes_into_data(path):
    """Only config/config.yaml prepares into `data/` (the folder dvc.yaml's default entry tracks);
    every other shipped config, an overlay included (it names its base), is read alone."""
    assert load_config(path)["data_dir"] not in ("data", "data/", "./data")


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "config").glob("*.yaml")))
def test_shipped_configs_keep_their_results_folders(name):
    """The shipped configs name their folders themselves (the paper configs and the default config
    share `results/`; a config that extends another may inherit them)."""
    raw = read_yaml(ROOT / "config" / name)
    assert "extends" in raw or ("results" in raw and "experiment" in raw), name


def _costed(tmp_path, **train):
    from mcfl.config import validate

    cfg = {"seeds": [0, 1], "results": str(tmp_path / "res"), "data_dir": str(tmp_path / "data"),
           "datasets": {"mine": {"prepare": {"source": "digits", "clients": 10, "clusters": 2},
                                 "model": {"name": "digits_cnn"},
                                 "train": {"rounds": 3, "clients_per_round": 4, "batch_size": 10,
                                           "local_epochs": 2, "eval_every": 2, **train}}},
           "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2}]}
    return validate(cfg)


def test_the_estimate_is_runs_times_rounds_times_seconds_per_round(tmp_path):
    from mcfl.cost import estimate
    from mcfl.plan import Plan
    from mcfl.cost.workload import DataSize

    size = DataSize((1, 8, 8), 10, n_clients=10, n_train=200, n_test=50, origin="test")
    batches = []

    def timer(model, shape, classes, batch, device):      # 1 ms per sample trained, 1 ms per test
        batches.append(batch)
        return batch * 0.001, 0.001

    est = estimate(Plan(_costed(tmp_path)), timer=timer, sizes={"mine": size}, pending=True)
    # by hand: 20 samples a client, batches of 10 -> 2 steps an epoch x 2 epochs = 4 steps;
    # a round: 4 clients x 4 steps x 0.01 s = 0.16 s; evaluations after rounds 2 and 3: 2 x 50 x
    # 0.001 s = 0.1 s; FeSEM's centres: 10 clients x 4 steps x 0.01 s = 0.4 s, once per seed
    assert batches == [10]                                 # one measurement serves every run
    assert [(r.label, r.seed) for r in est.runs] == [("FedAvg", 0), ("FedAvg", 1), ("FeSEM(2)", 0),
                                                    ("FeSEM(2)", 1)]
    assert est.runs[0].round_s == pytest.approx(0.16) and est.runs[0].evals == 2
    assert est.runs[0].total_s == pytest.approx(3 * 0.16 + 2 * 0.05)
    assert est.runs[2].init_s == pytest.approx(0.4)
    assert est.total_s == pytest.approx(2 * (0.58 + 0.98))
    assert "4 training runs x 3 rounds = 3 s of training" in est.summary()
    assert est.hint() == ""
    # the centres' first local models are trained twice when they do not fit in 256 MiB together
    from mcfl.cost import init_passes, n_params

    assert n_params({"name": "femnist_cnn"}, DataSize((1, 28, 28), 62, 1, 1, 1, "")) == 6_603_710
    assert init_passes(105, 6_603_710) == 2 and init_passes(100, 13_706) == 1


def test_batched_steps_are_timed_on_the_round_s_clients_at_once_and_long_studies_get_a_hint(tmp_path):
    from mcfl.cost import estimate
    from mcfl.plan import Plan
    from mcfl.cost.workload import DataSize

    size = DataSize((1, 8, 8), 10, n_clients=10, n_train=200, n_test=50, origin="test")
    batches = []

    def timer(model, shape, classes, batch, device):
        batches.append(batch)
        return 1000.0, 0.0                                 # 1000 s per stacked step of 4 clients

    est = estimate(Plan(_costed(tmp_path, executor="batched")), timer=timer, sizes={"mine": size})
    assert batches == [40]                                 # the 4 clients' batches stacked
    assert est.runs[0].round_s == pytest.approx(4 * 4 * 1000 / 4)
    if est.device == "cpu":
        assert "a GPU (device: cuda)" in est.hint()
    assert "fewer rounds" in est.hint() and est.summary().endswith(est.hint())


def test_leaf_json_sizes_come_from_num_samples(tmp_path):
    import json

    from mcfl.cost.workload import data_size

    for split, counts in (("train", [30, 50]), ("test", [3, 5])):
        (tmp_path / split).mkdir()
        (tmp_path / split / "a.json").write_text(json.dumps(
            {"users": ["u", "v"], "num_samples": counts, "user_data": {}}))
    ds = {"prepare": {"source": "leaf_json", "dir": str(tmp_path), "n_classes": 62},
          "model": {"name": "femnist_cnn"}}
    s = data_size(ds, tmp_path / "none", tmp_path / "none")
    assert (s.n_clients, s.n_train, s.n_test, s.x_shape, s.n_classes) == (2, 80, 8, (1, 28, 28), 62)


def test_centre_initialisation_reports_progress_per_client(digits_store, capsys, caplog):
    """`mcfl init-centres` shows a bar over the clients and logs its steps (as training shows its
    rounds), so a long initialisation does not leave its log empty; the centres are the same."""
    import logging

    import torch

    from mcfl.cluster.init import init_centres
    from mcfl.data import load
    from mcfl.federation import build_federation

    fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                           {"lr": 0.1, "batch_size": 5, "local_epochs": 1, "rounds": 1}, seed=0)
    with caplog.at_level(logging.INFO, logger="mcfl.cluster.init"):
        shown = init_centres(fed, 2, restarts=2, progress=True)
    err = capsys.readouterr().err
    assert f"{fed.n_clients}/{fed.n_clients}" in err and "first local models" in err
    steps = [r.getMessage() for r in caplog.records]
    assert steps[0].startswith(f"first local models of {fed.n_clients} clients") and "k-means" in steps[1]
    caplog.clear()
    quiet = init_centres(fed, 2, restarts=2)
    assert capsys.readouterr().err == "" and not [r for r in caplog.records if r.levelno >= logging.INFO]
    assert torch.equal(shown.centres, quiet.centres) and torch.equal(shown.assign, quiet.assign)


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_the_own_data_example_is_a_valid_quick_config(page, tmp_path):
    """The example of 'Your own LEAF data' validates, lands in its own folder, and evaluates often
    enough that the convergence figure is a curve."""
    import re

    text = (ROOT / page).read_text()
    block = re.search(r"```yaml\n# my-leaf.yaml\n(.*?)```", text, re.S).group(1)
    for split in ("train", "test"):                  # a LEAF folder where the example's path is
        (tmp_path / "leaf" / split).mkdir(parents=True)
        (tmp_path / "leaf" / split / "a.json").write_text('{"users": [], "num_samples": [], "user_data": {}}')
    path = tmp_path / "my-leaf.yaml"
    path.write_text(block.replace("/path/to/leaf/data/femnist/data", str(tmp_path / "leaf")))
    cfg = load_config(path)
    assert cfg["results"] == "results-my-leaf"
    for r in expand_runs(cfg):
        assert r["train"]["rounds"] // r["train"]["eval_every"] >= 5
    assert "mcfl check-config my-leaf.yaml" in text and "results-my-leaf/" in text
