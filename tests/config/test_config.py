"""Config validation stops bad input before any work, naming the key."""


import pytest
import yaml

from mcfl.config import ConfigError, expand_runs, load_config, read_configs, validate
from mcfl.report.paper import paper_tables
from conftest import ROOT


def default_config():
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def base():
    """The default config's datasets with three fixed method entries (the cases below index them)."""
    cfg = default_config()
    cfg["methods"] = [{"method": "FedAvg"}, {"method": "NoFed"}, {"method": "FeSEM", "K": [2, 3, 4]}]
    return cfg


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["methods"].append({"method": "FedMagic"}), r"methods\[\d+\]\.method: unknown method 'FedMagic'; did you mean FedAvg"),
    (lambda c: c["methods"][2].update(K=[0, 2]), r"methods\[2\]\.K"),
    (lambda c: c["methods"][2].update(K=101), r"methods\[2\]\.K: K=101 is larger than the number of clients"),
    (lambda c: c["datasets"]["digits"]["train"].update(lr=-0.1), r"datasets\.digits\.train\.lr: -0\.1"),
    (lambda c: c["methods"][0].update(train={"max_grad_norm": 0}), r"methods\[0\]\.train\.max_grad_norm: 0"),
    (lambda c: c["methods"][2].update(lamda=1), r"methods\[2\]\.lamda: unknown parameter of FeSEM"),
    (lambda c: c["methods"][0].update(K=2), r"methods\[0\]\.K: FedAvg does not take K"),
    (lambda c: c["methods"][2].update(distance="cosine"), r"methods\[2\]\.distance: distance must be"),
    (lambda c: c["methods"][2].update(warmup=30), r"methods\[2\]\.warmup: 30 warm-up rounds leave none of digits's 30"),
    (lambda c: c["datasets"]["digits"]["prepare"].update(clinets=5), r"datasets\.digits\.prepare\.clinets: unknown"),
    (lambda c: c["datasets"]["digits"]["model"].update(name="resnet"), r"datasets\.digits\.model\.name"),
    (lambda c: c["methods"][0].update(model={"name": "resnet"}), r"methods\[0\]\.model\.name"),
    (lambda c: c["methods"][0].update(model={"name": "logreg", "hidden": 8}),
     r"methods\[0\]\.model\.hidden: unknown"),
    (lambda c: c.update(sedes=[1]), r"Additional properties are not allowed \('sedes'"),
    (lambda c: c["methods"][0].update(seeds=[7]), r"methods\[0\]\.seeds: seed 7 is not one of the config's seeds"),
    (lambda c: c["methods"].append({"method": "FeSEM", "K": 2}), r"two entries both make run 'FeSEM-K2'"),
    (lambda c: c["datasets"]["digits"].update(prepare={"source": "celeba", "split": "user"}),
     r"datasets\.digits\.prepare: split='user' \(LEAF's -t user\) is not supported"),
    (lambda c: c["datasets"]["digits_domains"]["prepare"].update(invert=[4]),
     r"datasets\.digits_domains\.prepare: invert \[4\]: indices into angles \+ unseen, 0\.\.3"),
])
def test_bad_configs_name_the_key(mutate, message):
    cfg = base()
    mutate(cfg)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_an_entry_runs_only_its_own_seeds():
    cfg = base()
    cfg["seeds"] = [0, 1, 2]
    cfg["methods"][0]["seeds"] = [1]
    runs = expand_runs(validate(cfg))
    first = {(r["run_id"], r["seed"]) for r in runs if r["run_id"] == runs[0]["run_id"]}
    assert sorted(s for _, s in first) == [1]
    assert "seeds" not in runs[0]["params"]
    others = [r for r in runs if r["run_id"] != runs[0]["run_id"]]
    assert {r["seed"] for r in others} == {0, 1, 2}


def test_defaults_are_filled_and_runs_expanded():
    cfg = validate(default_config())
    assert cfg["datasets"]["digits"]["train"]["batch_size"] == 10
    assert cfg["datasets"]["digits"]["train"]["clients_per_round"] is None
    runs = [r for r in expand_runs(cfg) if r["dataset"] in ("digits", "synthetic")]
    variant = [r for r in runs if r["label"] == "FeSEM-SB(3)"]     # the shared-body variant, digits only
    assert [r["dataset"] for r in variant] == ["digits"] * len(cfg["seeds"])
    assert all(r["params"]["shared"] == "body" for r in variant)
    runs = [r for r in runs if r not in variant]
    labels = list(dict.fromkeys(r["label"] for r in runs))
    table2 = list(dict.fromkeys(paper_tables().query("paper == 'journal'")["method"]))
    assert labels == table2                                   # FeSEM's Table 2 rows, in its order
    assert len(runs) == 2 * len(table2) * len(cfg["seeds"])
    fesem4 = next(r for r in runs if r["label"] == "FeSEM(4)")
    assert fesem4["params"]["K"] == 4 and fesem4["params"]["restarts"] == 20
    assert fesem4["needs_centres"]


def test_method_train_overrides_apply_to_that_entry_only():
    cfg = base()
    cfg["methods"][0]["train"] = {"local_steps": 1}
    runs = expand_runs(validate(cfg))
    assert {r["train"]["local_steps"] for r in runs if r["method"] == "FedAvg"} == {1}
    assert {r["train"]["local_steps"] for r in runs if r["method"] != "FedAvg"} == {None}


def test_a_method_model_replaces_the_datasets_for_that_entry_only():
    """A baseline on another model (FedDANE on logistic regression, as its authors ran FEMNIST)
    trains that model; the other entries keep the dataset's, so their runs are unchanged."""
    cfg = base()
    cfg["methods"].append({"method": "FedDANE", "name": "FedDane-LR", "model": {"name": "logreg"}})
    runs = expand_runs(validate(cfg))
    lr = [r for r in runs if r["label"] == "FedDane-LR"]
    assert lr and all(r["model"] == {"name": "logreg"} for r in lr)
    assert "model" not in lr[0]["params"]
    before = {(r["run_id"], r["dataset"], r["seed"]): r for r in expand_runs(validate(base()))}
    assert all(r == before[(r["run_id"], r["dataset"], r["seed"])] for r in runs if r["label"] != "FedDane-LR")


def test_load_config_names_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    cfg = base()
    cfg["datasets"]["digits"]["train"]["rounds"] = 0
    p.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=rf"{p}: datasets\.digits\.train\.rounds"):
        load_config(p)


def test_runs_that_compute_the_same_centres_share_one_init_file():
    """centre_key: the method does not matter, K, k-means options and the local update do."""
    from mcfl.cluster.spec import centre_key
    from mcfl.config import expand_runs

    cfg = validate({"datasets": {"d": {"prepare": {"source": "digits"}, "model": {"name": "digits_cnn"}}},
                    "methods": [{"method": "FeSEM", "K": [3, 4]}, {"method": "FeSEM-MA", "K": 3},
                                {"method": "Robust", "K": 3}, {"method": "HypoCluster", "K": 3},
                                {"method": "FeSEM", "name": "W", "K": 3, "mstep": "weighted"},
                                {"method": "FeSEM", "name": "L", "K": 3, "train": {"lr": 0.5}},
                                {"method": "FeSEM", "name": "A", "K": "auto"}]})
    key = {r["label"]: centre_key(r) for r in expand_runs(cfg)}
    assert key["FeSEM(3)"] == key["FeSEM-MA(3)"] == key["Robust(3)"] == key["HypoCluster(3)"]
    assert key["FeSEM(3)"].startswith("K3-") and key["FeSEM(4)"].startswith("K4-")
    assert len({key["FeSEM(3)"], key["W(3)"], key["L(3)"]}) == 3
    assert key["A(auto)"] == "A-Kauto"


def _shipped_configs() -> list[tuple[str, ...]]:
    """Every shipped config as the workflow is given it: each file alone (an overlay names its base
    with ``extends:``), and ``config/NAME/X.yaml`` also after ``config/NAME.yaml`` (the two-file form)."""
    out = [(p.name,) for p in sorted((ROOT / "config").glob("*.yaml"))]
    for p in sorted((ROOT / "config").glob("*/*.yaml")):
        out.append((f"{p.parent.name}/{p.name}",))
        if yaml.safe_load(p.read_text()).get("extends") == f"../{p.parent.name}.yaml":
            out.append((f"{p.parent.name}.yaml", f"{p.parent.name}/{p.name}"))
    return out


@pytest.mark.parametrize("names", _shipped_configs(), ids=" + ".join)
def test_every_shipped_config_and_overlay_is_valid(names):
    runs = expand_runs(load_config(*(ROOT / "config" / n for n in names)))
    assert runs


def test_an_overlay_merges_as_snakemake_does_and_replace_drops_or_swaps_whole_keys():
    from mcfl.config import merge

    base = {"seeds": [0, 1], "publish": {"out": "a", "title": "A"},
            "datasets": {"d": {"train": {"lr": 0.1, "rounds": 5, "eval_protocols": {"v1": {}, "v2": {}}}}}}
    over = {"seeds": [3], "replace": ["publish", "datasets.d.train.eval_protocols"],
            "datasets": {"d": {"train": {"lr": 0.01, "eval_protocols": {"v1": {"clients": "active"}}}}}}
    out = merge(base, over)
    assert out == {"seeds": [3],                                     # a list is replaced, not appended
                   "datasets": {"d": {"train": {"lr": 0.01, "rounds": 5,   # a mapping merges key by key
                                                "eval_protocols": {"v1": {"clients": "active"}}}}}}
    with pytest.raises(ConfigError, match=r"replace: 'figures' is not a key"):
        merge({"seeds": [0]}, {"replace": ["figures"]})
    with pytest.raises(ConfigError, match="replace: must be a list"):
        merge({}, {"replace": "publish"})


def test_check_config_takes_a_base_and_overlays_and_names_every_file(tmp_path, capsys):
    from mcfl.cli import main

    over = tmp_path / "over.yaml"
    over.write_text("seeds: [7]\nresults: out-7\n")
    assert main(["check-config", str(ROOT / "config" / "config.yaml"), str(over)]) == 0
    out = capsys.readouterr().out
    assert f"config.yaml + {over}: OK" in out and "seed 7" in out and "seed 0" not in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("replace: [publish]\nseeds: [0]\n")
    with pytest.raises(ConfigError, match="bad.yaml: replace: belongs in an overlay"):
        load_config(bad)
    bad.write_text("datasets: {digits: {train: {lr: -1}}}\n")
    with pytest.raises(ConfigError, match=r"config.yaml \+ .*bad.yaml: datasets.digits.train.lr"):
        load_config(ROOT / "config" / "config.yaml", bad)


def test_a_warm_up_run_needs_no_centre_file():
    """FeSEM ``warmup: R`` clusters inside round R, so the plan schedules no init_centres job for it."""
    cfg = base()
    cfg["methods"][2].update(K=3, warmup=5)
    runs = [r for r in expand_runs(validate(cfg)) if r["method"] == "FeSEM"]
    assert runs and all(r["params"]["warmup"] == 5 and not r["needs_centres"] for r in runs)
    cfg["methods"][2]["warmup"] = 0
    assert all(r["needs_centres"] for r in expand_runs(validate(cfg)) if r["method"] == "FeSEM")


#: (input shape, classes) of each source's samples, as its store writes them
SOURCE_SHAPES = {"digits": ((1, 8, 8), 10), "digits_domains": ((1, 8, 8), 10),
                 "femnist": ((1, 28, 28), 62), "femnist_sample": ((1, 28, 28), 62),
                 "celeba": ((3, 84, 84), 2)}


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "config").glob("*.yaml")
                                        if "method: FedCG" in p.read_text()))
def test_every_shipped_fedcg_run_builds_its_network(name):
    """The schema cannot know a layer's size, so a FedCG run whose GCN projection is too large for
    its network (a d x d W on the FEMNIST CNN's last convolution: d = 51,264) passes validation and
    fails only when its job starts. Build each shipped FedCG run's network on its dataset's shape."""
    import torch

    from mcfl.algorithms.fedcg import FedCG
    from mcfl.models import build

    cfg = yaml.safe_load((ROOT / "config" / name).read_text())
    if "methods" not in cfg:
        cfg = _merged(default_config(), cfg)
    runs = [r for r in expand_runs(validate(cfg, name))
            if r["method"] == "FedCG" and r["seed"] == cfg["seeds"][0]]
    assert runs
    for run in runs:
        ds = cfg["datasets"][run["dataset"]]
        shape, classes = SOURCE_SHAPES[ds["prepare"]["source"]]
        model = dict(ds["model"])
        with torch.device("meta"):                     # shapes only: no memory for the projections
            backbone = build(model.pop("name"), shape, classes, **model)
            FedCG.network(backbone, shape, FedCG.Params(**run["params"]))


def test_command_line_values_read_yaml_words():
    """``snakemake --config tracking=false`` means what ``tracking: false`` means in a file (Snakemake
    itself only turns ``True``/``False`` into booleans); other strings stay as they are."""
    from mcfl.config import command_line_values

    got = command_line_values({"tracking": "false", "results": "results-x", "device": "cuda",
                               "nested": {"a": "true", "b": ["null", "3"]}})
    assert got == {"tracking": False, "results": "results-x", "device": "cuda",
                   "nested": {"a": True, "b": [None, "3"]}}


@pytest.mark.parametrize("overlay", sorted(p.name for p in (ROOT / "config" / "femnist-sample").glob("*.yaml")))
def test_every_femnist_sample_overlay_validates_on_its_base(overlay):
    """Each overlay in config/femnist-sample/ extends config/femnist-sample.yaml, itself or through
    another of the folder (`make femnist-sample-<name>`): read alone, it must pass the schema and expand into runs, in the
    overlay's results directory where it names one (the precision overlay's bf16 unless given)."""
    raw = yaml.safe_load((ROOT / "config" / "femnist-sample" / overlay).read_text())
    assert raw["extends"] == "../femnist-sample.yaml" or (ROOT / "config" / "femnist-sample" / raw["extends"]).is_file()
    cfg = load_config(ROOT / "config" / "femnist-sample" / overlay)
    validate(cfg, overlay)
    own = read_configs([ROOT / "config" / "femnist-sample" / overlay])["results"].replace("${precision}", "bf16")
    assert expand_runs(cfg) and cfg["results"] == own
