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
    p = Plan(cfg)
    outs = p.run_outputs("metrics.json") + [p.res("table.md")] + p.targets()
    assert len(outs) > 2 and all(o.startswith("results-my-leaf/") for o in outs)
    assert {r["experiment"] for r in expand_runs(cfg)} == {"my-leaf"}


def test_explicit_names_win_and_the_default_config_keeps_results(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**OWN, "results": "out", "experiment": "e"}))
    cfg = load_config(path)
    assert (cfg["results"], cfg["experiment"]) == ("out", "e")
    # a file named config.yaml (the default config's name) keeps the schema's defaults
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(OWN))
    cfg = load_config(tmp_path / "config.yaml")
    assert (cfg["results"], cfg["experiment"]) == ("results", "mcfl")
    # odd characters of a file name do not reach a path or an experiment name
    assert name_defaults({}, "a b{c}.yml") == {"results": "results-a_b_c_", "experiment": "a_b_c_"}


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "config").glob("*.yaml")))
def test_shipped_configs_keep_their_results_folders(name):
    """The shipped configs name their folders themselves (the paper configs and the default config
    share `results/`; overlays inherit from the config they extend)."""
    raw = read_yaml(ROOT / "config" / name)
    overlay = "methods" not in raw          # e.g. six-seeds.yaml
    assert overlay or ("results" in raw and "experiment" in raw), name
