"""The workflow's planning (mcfl.plan): which runs, stores, centre files, K selections, sweep runs,
job settings and paths a config yields; and the rule files hold rules only (no planning logic)."""

import copy
import json
from types import SimpleNamespace

import pytest

from conftest import ROOT
from mcfl.cluster.spec import centre_key
from mcfl.config import ConfigError, expand_runs, read_yaml, validate
from mcfl.plan import Plan, run_key


def _config(name="config.yaml", **over):
    cfg = read_yaml(ROOT / "config" / name)
    cfg.update(over)
    return validate(cfg)


def _small(**over):
    """Two datasets prepared alike (one re-partitioned), FeSEM(2) and -MA(2) sharing centres."""
    cfg = {"experiment": "t", "seeds": [0, 1], "results": "out", "data_dir": "store",
           "datasets": {
               "a": {"prepare": {"source": "digits_domains", "clients": 10, "seed": 0,
                                 "unseen_copies": False, "angles": [0, 45]},
                     "model": {"name": "digits_cnn"}, "train": {"rounds": 2}},
               "b": {"prepare": {"source": "digits_domains", "clients": 10, "seed": 0,
                                 "unseen_copies": False, "angles": [0, 45]},
                     "partition": {"scheme": "iid", "clients": 5},
                     "model": {"name": "digits_cnn"}, "train": {"rounds": 2}}},
           "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2}, {"method": "FeSEM-MA", "K": 2},
                       {"method": "FeSEM", "K": "auto", "datasets": ["a"]}]}
    cfg.update(over)
    return cfg


@pytest.fixture(scope="module")
def default_plan():
    return Plan(_config())


def test_runs_are_the_expanded_runs_plus_the_sweep_points(default_plan):
    p = default_plan
    expanded = expand_runs(p.config)
    assert list(p.configured) == [run_key(r) for r in expanded]
    assert list(p.runs)[:len(expanded)] == list(p.configured)          # configured first, in order
    sweeps = {run_key(r) for kind in ("heatmap", "kappa") for r in p.fedgsp.sweep(kind)}
    assert len(p.sweeps["heatmap"]) == 6 and len(p.sweeps["kappa"]) == 2
    assert set(p.runs) == set(p.configured) | sweeps
    new = sweeps - set(p.configured)
    assert new and all(k[1].startswith("FedGSP-") and k[2] == "0" for k in new)   # sweep_seeds: [0]
    # the report's tables cover the configured runs; track records the sweep runs too
    assert p.run_dirs() == [p.dir_of(r) for r in expanded]
    assert len(p.run_dirs(p.runs.values())) == len(p.runs)
    # FedGSP's table: the configured runs on its dataset, not the sweep points
    assert {run_key(r) for r in p.fedgsp.main()} == {k for k in p.configured if k[0] == "digits_2class"}


def test_paths(default_plan):
    p = default_plan
    assert p.log_dir == "logs" and p.logs("report.log") == "logs/report.log"
    assert p.run_file("metrics") == "results/runs/{dataset}/{run}/seed{seed}/metrics.json"
    assert p.run_file("state") == "results/runs/{dataset}/{run}/seed{seed}/state.pt"
    assert p.run_file("history").endswith("/history.csv")
    w = SimpleNamespace(dataset="digits", run="FeSEM-K2", seed="1")
    assert p.training.checkpoint(w) == "results/checkpoints/digits/FeSEM-K2/seed1.pt"
    assert p.fedgsp.out("cpd.png") == "results/fedgsp/digits_2class/cpd.png"
    other = Plan(_config(results="results-x"))
    assert other.log_dir == "results-x/logs"                 # an overlay never overwrites logs/
    assert other.run_dir.startswith("results-x/runs/")
    assert Plan(_config(results="./results")).log_dir == "logs"


def test_stores_shared_and_partitioned():
    p = Plan(validate(_small()))
    assert p.raw_store("a") == p.raw_store("b") == "store/a"          # identical prepare: one store
    assert p.store("a") == "store/a" and p.store("b") == "store/partitioned/b"
    assert p.stores() == ["store/a", "store/partitioned/b"]
    assert p.prepare.partition_args(SimpleNamespace(dataset="b"))[:2] == ["--scheme", "iid"]
    assert "--clients" in p.prepare.partition_args(SimpleNamespace(dataset="b"))


def test_prepare_args_spell_every_kind_of_value():
    p = Plan(validate(_small()))
    args = p.prepare.prepare_args(SimpleNamespace(dataset="a"))
    assert args[0] == "digits_domains"
    assert "--no-unseen-copies" in args                               # False -> --no-flag
    i = args.index("--angles")
    assert args[i:i + 4] == ["--angles", "0", "--angles", "45"]       # a list: the flag per value
    assert "--raw-dir" not in args                                    # not a LEAF source
    leaf = Plan(_config("paper-femnist.yaml"))
    ds = next(iter(leaf.datasets))
    args = leaf.prepare.prepare_args(SimpleNamespace(dataset=ds))
    assert args[-2:] == ["--raw-dir", f"{leaf.data_dir}/raw/femnist"]


def test_centre_files_one_per_distinct_spec_and_k_selection():
    p = Plan(validate(_small()))
    fesem = [r for r in p.runs.values() if r["method"] in ("FeSEM", "FeSEM-MA") and not r["select_k"]]
    keys = {(r["dataset"], centre_key(r), str(r["seed"])) for r in fesem}
    # FeSEM(2) and FeSEM-MA(2) share a centre file per (dataset, seed)
    assert len(fesem) == 2 * len(keys)
    assert set(p.inits) >= keys
    auto = p.training.auto_k()
    assert [(k[0], k[2]) for k in auto] == [("a", "0"), ("a", "1")]
    w = SimpleNamespace(dataset="a", run=auto[0][1], seed="0")
    assert p.training.k_input(w) == {"k": f"out/select_k/a/{auto[0][1]}/seed0.json"}
    assert p.training.train_inputs(w)["k"] == p.training.k_input(w)["k"]
    plain = SimpleNamespace(dataset="a", run="FedAvg", seed="0")
    assert p.training.k_input(plain) == {} and p.training.train_inputs(plain) == {"store": "store/a"}
    w2 = SimpleNamespace(dataset="b", run=fesem[-1]["run_id"], seed=str(fesem[-1]["seed"]))
    centres = p.training.train_inputs(w2)["centres"]
    assert centres == p.training.init_path(p.run(w2)) and centres.startswith("out/init/b/K2-")
    inp = SimpleNamespace(keys=lambda: ["store", "centres", "k"], centres="c.pt", k="k.json")
    assert p.training.centres_flag(None, inp) == ["--centres", "c.pt"] and p.training.k_flag(None, inp) == ["--k-from", "k.json"]
    none = SimpleNamespace(keys=lambda: ["store"])
    assert p.training.centres_flag(None, none) == [] and p.training.k_flag(None, none) == []


def test_targets_follow_the_config(default_plan, capsys):
    p = default_plan
    t = p.targets()
    assert "results/figures/clusters_digits.png" in t and "results/figures/cases_digits.png" in t
    assert {"results/fedgsp/digits_2class/cpd.png", "results/fedgsp/digits_2class/heatmap.png",
            "results/fedgsp/digits_2class/kappa.png", "results/fedcg/tables.md",
            "results/mlflow_runs.tsv"} <= set(t)
    assert "results/select_k.md" not in t                               # no `K: auto` here
    assert p.fedcg.table_runs() and all("/digits_domains/" in d for d in p.fedcg.table_runs())
    small = Plan(validate(_small(tracking=True)))
    # FeSEM(2)'s cases on both datasets; no FeSEM(4) for the clusters figure: the default label,
    # which the config did not ask for, so skipped silently
    assert small.targets() == ["out/figures/cases_a.png", "out/figures/cases_b.png", "out/select_k.md"]
    assert capsys.readouterr().err == ""
    # a label the config names itself that matches no run is said on stderr
    asked = Plan(validate(_small(figures={"clusters": {"run": "FeSEM(5)"}})))
    assert asked.targets() == small.targets()
    assert "figures.clusters.run: no dataset has a run labelled 'FeSEM(5)'" in capsys.readouterr().err


def test_leaf_downloads_must_agree():
    cfg = _config("paper-femnist.yaml")
    p = Plan(cfg)
    assert p.prepare.download_args(SimpleNamespace(source="femnist")) == ["--source", "https://s3.amazonaws.com/nist-srd/SD19"]
    assert p.prepare.download_dir(SimpleNamespace(source="femnist")) == f"{p.data_dir}/raw/femnist"
    assert "femnist" in p.prepare.download_constraints()["source"].split("|")
    w = SimpleNamespace(dataset="femnist")
    assert p.prepare.raw_inputs(w) and all(f.startswith(f"{p.data_dir}/raw/femnist/") for f in p.prepare.raw_inputs(w))
    bad = copy.deepcopy(cfg)
    bad["datasets"]["twin"] = copy.deepcopy(bad["datasets"]["femnist"])
    bad["datasets"]["twin"]["prepare"]["md5"] = ["x=0"]
    with pytest.raises(ConfigError, match="must agree on origin and md5"):
        Plan(bad).prepare.leaf_fetch_settings("femnist")


def test_rule_files_declare_rules_only():
    """The planning is in mcfl.plan: no rule file defines a function, so nothing in the DAG depends on
    the order in which the Snakefile includes them."""
    for f in sorted((ROOT / "workflow" / "rules").glob("*.smk")) + [ROOT / "Snakefile"]:
        text = f.read_text()
        assert "\ndef " not in text and not text.startswith("def "), f.name
        assert "EXTRA_TARGETS +=" not in text and "EXTRA_TARGETS.append" not in text, f.name


def test_seeds_per_job_groups_the_runs_every_seed_has(default_plan):
    """`seeds_per_job: all`: one training job per (dataset, run) with every seed; FedGSP's sweep
    points (seed 0 only) keep their per-seed job, and the two rules' {run} patterns never overlap."""
    import re

    assert Plan(validate(_small())).training.grouped == set()                 # the schema default: 1
    p = Plan(validate(_small(seeds_per_job="all")))
    assert p.training.grouped == {r for _, r, _ in p.runs}
    assert Plan(validate(_small(seeds_per_job="all", seeds=[3]))).training.grouped == set()   # one seed
    d = default_plan
    assert d.config["seeds_per_job"] == "all"
    sweep_only = {r for _, r, _ in d.runs} - {r for _, r, _ in d.configured}
    assert sweep_only and d.training.grouped == {r for _, r, _ in d.configured}
    per_seed, grouped = d.training.run_constraint(grouped=False), d.training.run_constraint(grouped=True)
    for _, run, _ in d.runs:                  # as Snakemake embeds them: "/" follows {run}
        path = f"{run}/seed0/metrics.json"
        one = re.fullmatch(f"(?P<run>{per_seed})/seed0/metrics.json", path) is not None
        many = re.fullmatch(f"(?P<run>{grouped})/seed0/metrics.json", path) is not None
        assert one != many and many == (run in d.training.grouped), run
    w = SimpleNamespace(dataset="digits", run="FeSEM-K2")
    assert d.training.group_files("metrics") == [f"results/runs/{{dataset}}/{{run}}/seed{s}/metrics.json" for s in "012"]
    inputs = d.training.group_inputs(w)
    assert set(inputs) == {"store", "centres0", "centres1", "centres2"}
    args = d.training.group_args(w, SimpleNamespace(keys=lambda: list(inputs), **inputs))
    assert [a for a in args if a.startswith("--")] == ["--run", "--out", "--checkpoint", "--centres"] * 3
    assert args[args.index("--out") + 1] == "results/runs/digits/FeSEM-K2/seed0"
    assert [json.loads(args[i + 1])["seed"] for i, a in enumerate(args) if a == "--run"] == [0, 1, 2]
    assert args[-1] == inputs["centres2"]


def test_study_tables_and_pages_are_written_inside_the_results_directory():
    """`protocols`, `publish` and `fedgsp.publish` name a repository path (docs/results/NAME); the
    DAG writes it under the results directory, so a run never touches the tracked docs/
    (`make docs-results` copies <results>/docs/ there)."""
    p = Plan(_config(results="res", protocols={"out": "docs/results/t"},
                     publish={"out": "docs/results/page", "title": "T"}))
    assert p.publishing.protocols["out"] == "res/docs/results/t" and p.publishing.publish["out"] == "res/docs/results/page"
    targets = p.targets()
    assert "res/docs/results/t.csv" in targets and "res/docs/results/t.md" in targets
    assert "res/docs/results/page.md" in targets
    assert all(t.startswith("res/") for t in targets), [t for t in targets if not t.startswith("res/")]
    gsp = Plan(_config(results="res", fedgsp={**read_yaml(ROOT / "config" / "config.yaml")["fedgsp"],
                                              "publish": {"out": "./docs/results/g", "title": "G"}}))
    assert gsp.fedgsp.block["publish"]["out"] == "res/docs/results/g"
    assert "res/docs/results/g.md" in gsp.targets()


def test_jobs_start_longest_first_and_centres_before_the_runs_that_wait_for_them():
    """The rules' priorities (mcfl.plan.train), by hand on dataset a of the small config: no store
    yet, so the source's published size (20 clients' 1,348 training and 449 test images, here over
    10 clients: 134.8 a client, 14 steps of 10); a step counts 3 forward passes of its batch, a
    test image 1, each pass the digits CNN's 91,776 multiply-adds; in millions, rounded up."""
    import math

    train = {"rounds": 2, "batch_size": 10, "local_epochs": 1, "clients_per_round": 5, "eval_every": 1}
    cfg = _small(methods=[{"method": "FedAvg"}, {"method": "FedAvg", "name": "Long", "train": {"rounds": 4}},
                          {"method": "FeSEM", "K": 2}, {"method": "FeSEM-MA", "K": 2}])
    for ds in cfg["datasets"].values():
        ds["train"] = dict(train)
    p = Plan(validate(cfg))
    w = lambda run, seed="0": SimpleNamespace(dataset="a", run=run, seed=seed)  # noqa: E731
    mmacs = 91_776 / 1e6
    one = (2 * 5 * 14 * 3 * 10 + 2 * 449) * mmacs          # 2 rounds of 5 clients, 2 evaluations
    init = 10 * 14 * 3 * 10 * mmacs                         # every client's first local model
    assert p.training.train_priority(w("FedAvg")) == math.ceil(one) == 468
    assert p.training.train_priority(w("Long")) == math.ceil(2 * one)
    assert p.training.train_priority(w("FeSEM-K2", "1")) == math.ceil(one)
    # the centre file FeSEM(2) and FeSEM-MA(2) share: its own work plus the longer run waiting for it
    centres = SimpleNamespace(dataset="a", centres=centre_key(p.run(w("FeSEM-K2"))), seed="0")
    assert p.training.init_priority(centres) == math.ceil(init) + math.ceil(one)
    # one job for every seed: the seeds' work summed, and its centre files above it
    g = Plan(validate(dict(cfg, seeds_per_job="all")))
    assert g.training.group_priority(SimpleNamespace(dataset="a", run="FedAvg")) == math.ceil(2 * one)
    assert g.training.init_priority(centres) == math.ceil(init) + math.ceil(2 * one)


@pytest.mark.parametrize("name,shape,classes,kw", [
    ("digits_cnn", (1, 8, 8), 10, {}), ("digits_cnn", (1, 12, 12), 4, {"hidden": 32}),
    ("femnist_cnn", (1, 28, 28), 62, {}), ("femnist_cnn", (1, 28, 28), 62, {"hidden": 248}),
    ("celeba_cnn", (3, 84, 84), 2, {}), ("celeba_cnn", (3, 20, 30), 2, {"channels": 8, "blocks": 3}),
    ("logreg", (60,), 5, {})])
def test_forward_macs_counted_without_torch_match_the_built_models(name, shape, classes, kw):
    """mcfl.cost.workload.forward_macs (what job priorities use, from the architecture alone) against
    the multiply-adds of the built model's Linear and convolution layers on one sample; and
    param_count (whether first local models fit one shared file) against its parameters."""
    import torch

    from mcfl import models
    from mcfl.executors.stack import forward_macs as counted
    from mcfl.cost.workload import forward_macs

    from mcfl.cost.workload import param_count

    net = models.build(name, shape, classes, **kw)
    assert forward_macs({"name": name, **kw}, shape, classes) == counted(net, torch.zeros(1, *shape))
    assert param_count({"name": name, **kw}, shape, classes) == sum(p.numel() for p in net.parameters())
    assert forward_macs({"name": "digits_cnn"}, (1, 8, 8), 10) == 91_776
    assert forward_macs({"name": "no-such-model"}, (1, 8, 8), 10) is None
    assert forward_macs({"name": "digits_cnn"}, (60,), 5) is None             # not images: no count


def test_k_selection_and_data_jobs_start_before_what_waits_for_them():
    """A `K: auto` run's K selection above its centre file and its training job; the data jobs
    above every other job (they are short, and everything waits for them)."""
    p = Plan(validate(_small()))
    (d, run_id, seed), = [k for k in p.training.auto_k() if k[2] == "0"]
    w = SimpleNamespace(dataset=d, run=run_id, seed=seed)
    run = p.run(w)
    centres = SimpleNamespace(dataset=d, centres=centre_key(run), seed=seed)
    assert p.training.select_k_priority(w) == p.training.init_priority(centres) + 1
    everything = [p.training.select_k_priority(SimpleNamespace(dataset=a, run=r, seed=s)) for a, r, s in p.training.auto_k()]
    everything += [p.training.init_priority(SimpleNamespace(dataset=a, centres=c, seed=s)) for a, c, s in p.inits]
    everything += [p.training.train_priority(SimpleNamespace(dataset=a, run=r, seed=s)) for a, r, s in p.runs]
    assert p.training.data_priority == max(everything) + 1
