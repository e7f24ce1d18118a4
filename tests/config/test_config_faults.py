"""The fault suite, configs (``pytest -m faults``): a bad config, a bad value of any train key, a
damaged config file or a hostile YAML is refused in one line naming the key, and settings are
checked against the store and the free memory before anything large is allocated."""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, make_run
from fault_helpers import _cli_train, _one_line_error
from mcfl import cli
from mcfl.config import ConfigError, expand_runs, validate
from mcfl.data import load

pytestmark = pytest.mark.faults


# =========================================================================================== config
def _base():
    """The default config's datasets with three fixed method entries (the cases below index them)."""
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["methods"] = [{"method": "FedAvg"}, {"method": "NoFed"}, {"method": "FeSEM", "K": [2, 3, 4]}]
    cfg.pop("fedgsp", None)
    return cfg


BAD_CONFIGS = [
    (lambda c: c["datasets"]["digits"]["prepare"].update(clients="ten"),
     r"datasets\.digits\.prepare\.clients: 'ten' is not allowed: Input should be a valid integer"),
    (lambda c: c["datasets"]["digits"]["prepare"].update(partition="shards"),
     r"datasets\.digits\.prepare\.partition: .*'dirichlet' or 'classes'"),
    (lambda c: c["datasets"]["digits"]["prepare"].update(alpha=0), r"prepare\.alpha: 0 .*greater than 0"),
    (lambda c: c["datasets"]["digits"]["prepare"].update(min_samples=1), r"prepare\.min_samples: 1 .*greater than or equal to 2"),
    (lambda c: c["datasets"]["digits"]["prepare"].update(test_fraction=1.0), r"prepare\.test_fraction: 1\.0 .*less than 1"),
    (lambda c: c["datasets"]["synthetic"]["prepare"].update(variant="fedavg"), r"prepare\.variant: .*'leaf' or 'fedprox'"),
    (lambda c: c["datasets"]["digits"]["model"].update(hidden="big"), r"datasets\.digits\.model\.hidden: 'big'"),
    (lambda c: c["methods"][2].update(lam="high"), r"methods\[2\]\.lam: 'high' .*valid number"),
    (lambda c: c["methods"][2].update(lam=-1.0), r"methods\[2\]\.lam: lam must be >= 0"),
    (lambda c: c["methods"][2].update(restarts=2.5), r"methods\[2\]\.restarts: 2\.5 .*valid integer"),
    (lambda c: c["methods"][2].update(K=[2, 2]), r"methods\[2\]\.K: \[2, 2\] has non-unique elements"),
    (lambda c: c["methods"][2].update(K=[0, 2]), r"methods\[2\]\.K\[0\]: 0 is less than the minimum of 1"),
    (lambda c: c.update(seeds=[0, 0]), r"seeds: \[0, 0\] has non-unique elements"),
    (lambda c: c.update(experiment=""), r"experiment: '' should be non-empty"),
    (lambda c: c.update(device="gpu"), r"device: 'gpu' does not match .*auto\|cpu\|cuda"),
    (lambda c: c.update(tracking="yes"), r"tracking: 'yes' is not one of \[True, False, 'deferred'\]"),
    (lambda c: c["datasets"]["digits"]["train"].update(clients_per_round=500),
     r"datasets\.digits\.train\.clients_per_round: 500 is larger than the number of clients"),
    (lambda c: c["methods"][0].update(train={"clients_per_round": 101}), r"methods\[0\]\.train\.clients_per_round: 101"),
    (lambda c: c["methods"][0].update(train={"momentum": 0.9}),
     r"methods\[0\]\.train: .*'momentum' was unexpected\); allowed: rounds, clients_per_round, lr"),
    (lambda c: c["datasets"]["digits"]["train"].update(checkpoint_every=-1), r"train\.checkpoint_every: -1"),
    (lambda c: c.update(sedes=[1]), r"\(top level\): .*'sedes' was unexpected\); allowed: experiment, seeds"),
]


@pytest.mark.parametrize("mutate, message", BAD_CONFIGS)
def test_bad_config_names_key_and_allowed_values(mutate, message):
    cfg = _base()
    mutate(cfg)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_check_config_cli_rejects_with_exit_code_1(tmp_path, capsys):
    cfg = _base()
    cfg["datasets"]["digits"]["prepare"]["partition"] = "shards"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert cli.main(["check-config", str(tmp_path / "c.yaml")]) == 1
    assert "prepare.partition" in capsys.readouterr().err


# ==================================================================================== fault tables
# Each table row is (case id, bad input, regex the one-line error must match). Add a row to add a
# case; families too large to list are generated from the schema or the store format. The README's
# reliability section counts these rows.


def _train_schema() -> dict:
    from mcfl.config import _schema

    return _schema()["$defs"]["train"]["properties"]


def _numeric_train_keys(kind):
    return sorted(k for k, v in _train_schema().items()
                  if kind in (v.get("type") if isinstance(v.get("type"), list) else [v.get("type")]))


def _train_block(c, where):
    if where == "dataset":
        return c["datasets"]["digits"]["train"]
    return c["methods"][0].setdefault("train", {})


def _train_path(where):
    return r"datasets\.digits\.train" if where == "dataset" else r"methods\[0\]\.train"


# config values: every number of the train block must be finite (generated: 3 values x keys x 2
# places), and no count unreasonably large (every integer train key, a prepare and a model size)
CONFIG_VALUE_FAULTS = [
    *[(f"{where}-{key}-{value}", (lambda c, where=where, key=key, value=value: _train_block(c, where).update({key: value})),
       rf"{_train_path(where)}\.{key}: {value} is not allowed: numbers must be finite")
      for where in ("dataset", "method") for key in _numeric_train_keys("number") + _numeric_train_keys("integer")
      for value in (float("nan"), float("inf"), float("-inf"))],
    *[(f"huge-{key}", (lambda c, key=key: c["datasets"]["digits"]["train"].update({key: 10**12})),
       rf"datasets\.digits\.train\.{key}: 1000000000000 is (not allowed: larger than 1e\+09|greater than the maximum)")
      for key in _numeric_train_keys("integer")],
    ("rounds-over-max", lambda c: c["datasets"]["digits"]["train"].update(rounds=2_000_000),
     r"datasets\.digits\.train\.rounds: 2000000 is greater than the maximum of 1000000"),
    ("huge-clients", lambda c: c["datasets"]["digits"]["prepare"].update(clients=10**12),
     r"datasets\.digits\.prepare\.clients: 1000000000000 is not allowed: larger than 1e\+09"),
    ("huge-K", lambda c: c["methods"][2].update(K=[2, 10**10]), r"methods\[2\]\.K\[1\]: 10000000000 is not allowed"),
    ("nan-lam", lambda c: c["methods"][2].update(lam=float("nan")), r"methods\[2\]\.lam: nan is not allowed"),
    ("unused-dataset", lambda c: [m.update(datasets=["digits"]) for m in c["methods"]],
     r"datasets\.synthetic: no method entry runs on it"),
    ("empty-results", lambda c: c.update(results=""), r"results: '' should be non-empty"),
    ("brace-results", lambda c: c.update(results="res{x}"), r"results: 'res\{x\}' does not match"),
    ("newline-data-dir", lambda c: c.update(data_dir="da\nta"), r"data_dir: 'da\\nta' does not match"),
]


@pytest.mark.parametrize("mutate, message", [c[1:] for c in CONFIG_VALUE_FAULTS],
                         ids=[c[0] for c in CONFIG_VALUE_FAULTS])
def test_config_value_faults_name_the_key(mutate, message):
    cfg = _base()
    mutate(cfg)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


# config files: what `mcfl check-config FILE` must say (FILE's text, or a callable making the path)
CONFIG_FILE_FAULTS = [
    ("duplicate-key", "seeds: [0]\nseeds: [1]\n", r"c\.yaml: line 2: duplicate key 'seeds' \(first given on line 1\)"),
    ("duplicate-nested-key", "datasets:\n  d:\n    train: {lr: 0.1, lr: 0.2}\n", r"line 3: duplicate key 'lr'"),
    ("nan-lr", None, r"c\.yaml: datasets\.digits\.train\.lr: nan is not allowed: numbers must be finite"),
    ("not-utf8", b"seeds: [0]\n# \xff\xfe\n", r"c\.yaml: not UTF-8 text"),
    ("not-yaml", "seeds: [0\n", r"c\.yaml: not valid YAML"),
    ("top-level-list", "- 1\n", r"c\.yaml: top level must be a mapping"),
    ("directory", "DIR", r"c\.yaml: is a directory, not a config file"),
    ("missing", "MISSING", r"c\.yaml: no such config file"),
]


@pytest.mark.parametrize("content, message", [c[1:] for c in CONFIG_FILE_FAULTS],
                         ids=[c[0] for c in CONFIG_FILE_FAULTS])
def test_check_config_file_faults_are_one_line(content, message, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    if content == "DIR":
        path.mkdir()
    elif content is None:                     # the default config with `lr: .nan`
        text = (ROOT / "config" / "config.yaml").read_text()
        path.write_text(re.sub(r"lr: 0\.2,", "lr: .nan,", text, count=1))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content != "MISSING":
        path.write_text(content)
    assert cli.main(["check-config", str(path)]) == 1
    _one_line_error(capsys.readouterr().err, "check-config", message)


# bounds that know the data: checked against the store before anything large is allocated
BOUNDS_FAULTS = [
    ("batch-1e9", {"batch_size": 10**9}, r"--run: |train\.batch_size: 1000000000 is larger than the largest "
                                          r"client's training set \(\d+ samples in .*\); at most \d+"),
    ("batch-over-largest", {"batch_size": 5000}, r"train\.batch_size: 5000 is larger than the largest client"),
    ("clients-per-round", {"clients_per_round": 17}, r"train\.clients_per_round: 17 is larger than the number of "
                                                     r"clients of .* \(16\)"),
    ("steps-1e9", {"local_steps": 10**9, "batch_size": 50},
     r"train: needs at least [\d.]+ [GT]B \(batch plan [\d.]+ GB.*free; lower train\.batch_size or train\.local_steps"),
    ("K-over-clients", {"method": "FeSEM", "params": {"K": 17, "restarts": 1}}, r"K: K=17 is larger than the number of clients"),
    ("model-shape", {"model": {"name": "digits_cnn"}},                    # on the synthetic store
     r"model\.name: 'digits_cnn' cannot be built for .*synthetic's samples of shape \[60\]"),
]


@pytest.mark.parametrize("change, message", [c[1:] for c in BOUNDS_FAULTS], ids=[c[0] for c in BOUNDS_FAULTS])
def test_settings_are_checked_against_the_store_before_allocation(change, message, digits_store, synthetic_store,
                                                                  tmp_path, capsys):
    import resource

    run = make_run(rounds=1)
    store = synthetic_store if "model" in change else digits_store
    for k, v in change.items():
        (run if k in ("method", "params", "model") else run["train"])[k] = v
    if "params" in change:
        run["label"] = "FeSEM(17)"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    assert _cli_train(run, store, tmp_path / "out") == 1
    _one_line_error(capsys.readouterr().err, "train", message)
    assert time.perf_counter() - t0 < 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500_000     # KiB: nothing big
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_a_run_larger_than_free_memory_names_the_setting(digits_store, tmp_path, capsys, monkeypatch):
    """The memory estimate against what the machine has free (psutil or /proc/meminfo, here
    replaced by 1 MB): the error names the largest part and the setting that shrinks it."""
    from mcfl import bounds

    monkeypatch.setattr(bounds, "available_memory", lambda device="cpu": 10 * 2**10)
    assert _cli_train(make_run(rounds=1), digits_store, tmp_path / "out") == 1
    _one_line_error(capsys.readouterr().err, "train", r"run: needs at least [\d.]+ [kM]B \(.*\) but cpu has 10 kB "
                                                      r"free; lower (a smaller store|the model's width)")


def test_free_memory_is_read_from_psutil_or_proc_meminfo(monkeypatch):
    from mcfl import bounds

    free = bounds.available_memory("cpu")
    assert free is not None and free > 0
    monkeypatch.setitem(sys.modules, "psutil", None)                 # not installed
    text = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    if "MemAvailable:" not in text:
        pytest.skip("no /proc/meminfo on this system")
    want = int(re.search(r"MemAvailable:\s+(\d+) kB", text).group(1)) * 1024
    assert abs(bounds.available_memory("cpu") - want) < 2**30


def test_the_memory_estimate_counts_the_largest_allocations(digits_store):
    """By hand: the batch plan pads whole epochs to the batch size (int64 row indices); the stacked
    weights are one client's P float32 (results stream), a batched chunk's three copies of each of
    its clients' P float32; K centres twice K x P."""
    from mcfl.bounds import estimate, model_size

    d = load(digits_store)
    P = model_size({"name": "digits_cnn"}, d)
    n = int(d.n_train().max())
    t = make_run(batch_size=7, local_epochs=2, clients_per_round=5)["train"]
    parts = estimate(t, d, P, K=3)
    assert parts["batch plan"] == 2 * -(-n // 7) * 7 * 8
    assert parts["stacked weights"] == P * 4
    assert parts["centres"] == 3 * P * 4 * 2
    assert estimate(dict(t, executor="batched", executor_chunk=2), d, P)["stacked weights"] == 2 * P * 4 * 3
    import torch.nn as nn

    from mcfl import models
    assert P == sum(p.numel() for p in models.build("digits_cnn", d.x_shape, d.n_classes).parameters())
    assert isinstance(models.build("digits_cnn", d.x_shape, d.n_classes), nn.Module)


# the config loader: bounded in size, depth and expanded aliases; keys are strings; values that
# reach a file name, a wildcard or a plot label hold no braces or `$`
def _alias_bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nseeds: [0]\n"


def _config_with(change) -> str:
    cfg = _base()
    change(cfg)
    return yaml.safe_dump(cfg)


LOADER_FAULTS = [
    ("alias-bomb", _alias_bomb(), r"c\.yaml: line \d+: the config stands for more than 100000 values once its "
                                  r"YAML aliases \(\*name\) are expanded"),
    ("deep-lists", "seeds: " + "[" * 400 + "]" * 400 + "\n", r"c\.yaml: line 1: nested more than 32 levels deep"),
    ("deep-maps", "".join("  " * i + f"k{i}:\n" for i in range(40)) + "  " * 40 + "v: 1\n",
     r"c\.yaml: line \d+: nested more than 32 levels deep"),
    ("big-file", "seeds: [" + ", ".join(["0"] * 400_000) + "]\n", r"c\.yaml: \d+ bytes; a config file may hold at most 1048576"),
    ("int-dataset-key", _config_with(lambda c: c["datasets"].update({1: c["datasets"].pop("digits")})),
     r"c\.yaml: datasets\.1: keys must be strings, found int 1 \(quote it\)"),
    ("float-key", "seeds: [0]\n1.5: x\n", r"c\.yaml: 1\.5: keys must be strings, found float"),
    ("many-seeds", _config_with(lambda c: c.update(seeds=list(range(1001)))), r"c\.yaml: seeds: .* is too long"),
    ("many-runs", _config_with(lambda c: c.update(seeds=list(range(1000))) or c["methods"][2].update(K=list(range(1, 60)))),
     r"c\.yaml: methods: the config makes up to \d+ runs; at most 100000"),
    ("brace-publish-out", _config_with(lambda c: c.update(publish={"out": "docs/{x}", "title": "t"})),
     r"c\.yaml: publish\.out: 'docs/\{x\}' does not match"),
    ("dollar-publish-title", _config_with(lambda c: c.update(publish={"out": "docs/x", "title": "$x^$"})),
     r"c\.yaml: publish\.title: '\$x\^\$' does not match"),
    ("brace-protocols-out", _config_with(lambda c: c.update(protocols={"out": "r/{dataset}"})),
     r"c\.yaml: protocols\.out: 'r/\{dataset\}' does not match"),
    ("dollar-protocols-title", _config_with(lambda c: c.update(protocols={"out": "r/t", "title": "$\\alpha"})),
     r"c\.yaml: protocols\.title: .* does not match"),
    ("dollar-label", _config_with(lambda c: c["methods"][0].update(label="$Fed_{Avg}$")),
     r"c\.yaml: methods\[0\]\.label: '\$Fed_\{Avg\}\$' does not match"),
    ("dollar-figure-run", _config_with(lambda c: c.update(figures={"clusters": {"run": "$x$"}})),
     r"c\.yaml: figures\.clusters\.run: '\$x\$' does not match"),
    ("newline-experiment", _config_with(lambda c: c.update(experiment="a\nb")), r"c\.yaml: experiment: 'a\\nb' does not match"),
    ("empty-file", "", r"c\.yaml: top level must be a mapping"),
]


@pytest.mark.parametrize("content, message", [c[1:] for c in LOADER_FAULTS], ids=[c[0] for c in LOADER_FAULTS])
def test_config_loader_faults_are_one_line_and_quick(content, message, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(content)
    t0 = time.perf_counter()
    assert cli.main(["check-config", str(path)]) == 1
    _one_line_error(capsys.readouterr().err, "check-config", message)
    assert time.perf_counter() - t0 < 20          # the checks themselves: the alias bomb below


def test_a_small_alias_bomb_is_refused_in_under_a_second(tmp_path):
    from mcfl.config import read_yaml

    text = _alias_bomb(12)                         # 10^12 values in about 600 bytes
    assert len(text) < 1000
    (tmp_path / "bomb.yaml").write_text(text)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"more than 100000 values"):
        read_yaml(tmp_path / "bomb.yaml")
    assert time.perf_counter() - t0 < 1.0


def test_the_default_config_keeps_its_aliases(tmp_path):
    """Aliases are allowed within the bound: the default config uses one (`datasets: *table2`)."""
    from mcfl.config import load_config

    assert "*" in (ROOT / "config" / "config.yaml").read_text()
    assert expand_runs(load_config(ROOT / "config" / "config.yaml"))


def test_errors_are_never_empty():
    assert cli.error_line(MemoryError()) == "out of memory"
    assert cli.error_line(ValueError()) == "ValueError"
    assert cli.error_line(RecursionError("maximum recursion depth exceeded")).startswith("input nested too deeply")
    assert cli.error_line(OSError(28, "No space left on device", "r/state.pt")) == "r/state.pt: no space left on device"


@pytest.mark.slow
def test_the_snakefile_reads_configs_with_the_mcfl_loader(tmp_path, cli_env):
    """`snakemake --configfile` with an integer dataset key and with an alias bomb: the Snakefile
    reads the file again with mcfl's loader and stops before planning, with check-config's message."""
    smk = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or "snakemake"
    cases = {"int.yaml": (_config_with(lambda c: c["datasets"].update({1: c["datasets"].pop("digits")})),
                          r"int\.yaml: datasets\.1: keys must be strings"),
             "bomb.yaml": (_alias_bomb(), r"bomb\.yaml: line \d+: the config stands for more than 100000 values")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        r = subprocess.run([smk, "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--configfile",
                            str(tmp_path / name), "-n", "--cores", "1"], env=cli_env,
                           capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode != 0 and re.search(message, out), out[-2000:]
