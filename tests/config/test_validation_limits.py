"""Validation that neither lets through what fails later nor refuses what is valid: config files
read with a byte limit that holds for devices and streams, numbers checked in the precision they
are used in (float32), YAML merge keys, and a ``snakemake --config`` value blamed by name."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT
from mcfl import cli
from mcfl.config import ConfigError, load_config, parse_run, read_yaml, validate, validate_with_overrides
from mcfl.config.files import MAX_BYTES
from mcfl.inputs import InputError, read_limited

MCFL = Path(sys.executable).parent / "mcfl"


def _base() -> dict:
    """The default config with two method entries."""
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["methods"] = [{"method": "FedAvg"}, {"method": "FeSEM", "K": [2, 3]}]
    cfg.pop("fedgsp", None)
    return cfg


def _one_line(err: str, cmd: str, message: str) -> None:
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if ": error: " in x]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"mcfl {cmd}: error: ") and re.search(message, lines[0]), lines[0]


# ---------------------------------------------------------------------------- bounded reads
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_check_config_refuses_a_device_before_reading_it(device, capsys):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    assert cli.main(["check-config", device]) == 1
    _one_line(capsys.readouterr().err, "check-config", rf"{device}: is a character device, not a config file")


def test_check_config_reads_an_endless_pipe_only_up_to_the_limit():
    """``mcfl check-config <(yes)``: a pipe is read, but at most MAX_BYTES + 1 bytes of it."""
    proc = subprocess.run(["bash", "-c", f"{MCFL} check-config <(yes)"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    _one_line(proc.stderr, "check-config", rf"/dev/fd/\d+: more than {MAX_BYTES} bytes; a config file "
                                           rf"may hold at most {MAX_BYTES} bytes")


def test_a_short_config_from_a_pipe_is_read():
    """A pipe (a shell's ``<(cat config.yaml)``) is a config file like any other, up to the limit."""
    import threading

    text = (ROOT / "config" / "config.yaml").read_bytes()
    r, w = os.pipe()

    def feed():
        with os.fdopen(w, "wb") as f:
            f.write(text)

    threading.Thread(target=feed, daemon=True).start()
    try:
        assert read_yaml(f"/dev/fd/{r}") == yaml.safe_load(text)
    finally:
        os.close(r)


def test_read_limited_refuses_a_fifo_without_opening_it_where_pipes_are_not_allowed(tmp_path):
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)                              # no writer: opening it would block
    with pytest.raises(InputError, match=r"f\.json: is a pipe \(FIFO\), not a data file"):
        read_limited(fifo, 100, what="data file")


def test_read_limited_names_a_dangling_link_and_reads_a_link_to_a_file(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(InputError, match=r"dangling: a symbolic link to a missing file"):
        read_limited(tmp_path / "dangling", 100)
    (tmp_path / "real").write_bytes(b"12345")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_limited(tmp_path / "link", 5) == b"12345"
    with pytest.raises(InputError, match=r"real: 5 bytes; a file may hold at most 4 bytes"):
        read_limited(tmp_path / "real", 4)


# -------------------------------------------------------------------- float32 range of numbers
@pytest.mark.parametrize("key, value, becomes", [("lr", 1e300, "inf"), ("lr", -1e39, "inf"),
                                                 ("lr", 1e-300, "0"), ("max_grad_norm", 1e-46, "0")])
def test_a_float_that_float32_makes_inf_or_0_is_refused_naming_the_key(key, value, becomes):
    cfg = _base()
    cfg["datasets"]["digits"]["train"][key] = value
    with pytest.raises(ConfigError, match=rf"datasets\.digits\.train\.{key}: {re.escape(str(value))} is "
                                          rf"not allowed: it is {becomes} as a float32"):
        validate(cfg)


def test_method_parameters_are_checked_in_float32_too():
    cfg = _base()
    cfg["methods"][1]["lam"] = 1e39
    with pytest.raises(ConfigError, match=r"methods\[1\]\.lam: 1e\+39 is not allowed: it is inf as a float32"):
        validate(cfg)


@pytest.mark.parametrize("value", [3.4e38, 1.5e-45, 1e-30, 0.0])
def test_floats_that_float32_holds_pass(value):
    cfg = _base()
    cfg["datasets"]["digits"]["train"]["max_grad_norm"] = value or None
    cfg["methods"][1]["lam"] = value
    validate(cfg)


def test_a_run_json_with_a_float32_overflow_is_refused_naming_the_flag():
    from mcfl.config import expand_runs
    import json

    run = expand_runs(validate(_base()))[0]
    run["train"]["lr"] = 1e300
    with pytest.raises(ConfigError, match=r"--run: train\.lr: 1e\+300 is not allowed: it is inf as a float32"):
        parse_run(json.dumps(run))


def test_check_config_refuses_lr_1e300_with_one_line(tmp_path, capsys):
    text = (ROOT / "config" / "config.yaml").read_text()
    path = tmp_path / "c.yaml"
    path.write_text(re.sub(r"lr: 0\.2,", "lr: 1.0e+300,", text, count=1))
    assert cli.main(["check-config", str(path)]) == 1
    _one_line(capsys.readouterr().err, "check-config", r"c\.yaml: datasets\.\w+\.train\.lr: 1e\+300 is not allowed")


# ---------------------------------------------------------------------------- YAML merge keys
MERGE = """\
datasets:
  a:
    train: &train {rounds: 3, lr: 0.1}
  b:
    train: {<<: *train, lr: 0.05}
  c:
    train:
      <<: [*train, {batch_size: 4}]
"""


def test_yaml_merge_keys_are_accepted_and_explicit_keys_override(tmp_path):
    (tmp_path / "c.yaml").write_text(MERGE)
    cfg = read_yaml(tmp_path / "c.yaml")
    assert cfg["datasets"]["b"]["train"] == {"rounds": 3, "lr": 0.05}
    assert cfg["datasets"]["c"]["train"] == {"rounds": 3, "lr": 0.1, "batch_size": 4}
    assert cfg == yaml.safe_load(MERGE)


def test_a_duplicate_key_beside_a_merge_key_is_still_refused(tmp_path):
    (tmp_path / "c.yaml").write_text("a: &a {x: 1}\nb: {<<: *a, y: 1, y: 2}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: line 2: duplicate key 'y'"):
        read_yaml(tmp_path / "c.yaml")


def test_a_config_using_merge_keys_validates(tmp_path):
    lines = (ROOT / "config" / "config.yaml").read_text().splitlines()
    first, second = [i for i, x in enumerate(lines) if x.startswith("    train: {rounds:")][:2]
    lines[first] = lines[first].replace("train: {", "train: &first {")
    lines[second] = "    train: {<<: *first, lr: 0.05}"
    (tmp_path / "c.yaml").write_text("\n".join(lines) + "\n")
    cfg = load_config(tmp_path / "c.yaml")
    first_train, second_train = (ds["train"] for ds in list(cfg["datasets"].values())[:2])
    assert second_train == {**first_train, "lr": 0.05}


# ------------------------------------------------------------------ snakemake --config blame
def test_a_bad_command_line_value_is_blamed_on_the_command_line():
    with pytest.raises(ConfigError, match=r"^--config seeds=abc: seeds: 'abc' is not of type 'array'"):
        validate_with_overrides(_base(), {"seeds": "abc"}, "config/config.yaml")


def test_a_bad_file_is_still_blamed_on_the_file_with_command_line_values():
    cfg = _base()
    cfg["seeds"] = "x"
    with pytest.raises(ConfigError, match=r"^config/config\.yaml: seeds: 'x'"):
        validate_with_overrides(cfg, {"experiment": "e"}, "config/config.yaml")


def test_command_line_values_override_the_files():
    cfg = validate_with_overrides(_base(), {"seeds": [3, 4], "tracking": "false"}, "c.yaml")
    assert cfg["seeds"] == [3, 4] and cfg["tracking"] is False


@pytest.mark.slow
def test_snakemake_names_the_config_value(tmp_path, cli_env):
    (tmp_path / "c.yaml").write_text((ROOT / "config" / "config.yaml").read_text())
    proc = subprocess.run(["snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "-n",
                           "--configfile", str(tmp_path / "c.yaml"), "--config", "seeds=abc"],
                          capture_output=True, text=True, env=cli_env, timeout=300)
    assert proc.returncode != 0
    assert "invalid configuration: --config seeds=abc: seeds: 'abc' is not of type 'array'" in proc.stdout + proc.stderr


# ------------------------------------------------------------------------ Dirichlet's alpha
def test_a_tiny_alpha_deals_each_class_whole_to_a_client_that_is_not_full():
    """alpha -> 0 puts all of p_k on one client; where that client is full, the reference code's 0/0
    gave NaN cut points and dealt the class to the last client past its N/J cap: the try is redone."""
    import warnings

    import numpy as np

    from mcfl.data.partition import dirichlet_partition

    labels = np.repeat(np.arange(6), 20)
    for seed in range(5):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            parts = dirichlet_partition(labels, 3, 1e-300, np.random.default_rng(seed))
        assert sorted(np.concatenate(parts).tolist()) == list(range(120))
        assert all(len(set(labels[p].tolist()) & {k}) == 0 or set(np.flatnonzero(labels == k)) <= set(p.tolist())
                   for p in parts for k in range(6))             # each class whole on one client
        assert max(len(p) for p in parts) == 40                  # none past N/J = 40


def test_alpha_whose_proportions_float64_cannot_hold_is_refused():
    import numpy as np

    from mcfl.data.partition import dirichlet_partition

    with pytest.raises(ValueError, match=r"alpha: 1\.7e\+308 is not allowed: its Dirichlet proportions"):
        dirichlet_partition(np.repeat(np.arange(3), 10), 10, 1.7e308, np.random.default_rng(0))


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    from mcfl.data import prepare

    return prepare("digits", tmp_path_factory.mktemp("data") / "digits", clients=8, clusters=2, seed=0)


@pytest.mark.parametrize("alpha, message", [
    ("nan", r"--alpha: nan is not allowed: a Dirichlet concentration must be a positive finite number"),
    ("inf", r"--alpha: inf is not allowed"), ("-0.5", r"--alpha: -0\.5 is not allowed"),
    ("1.7e308", r"--alpha: 1\.7e\+308 is not allowed: its Dirichlet proportions are not defined in float64"),
])
def test_partition_refuses_an_alpha_without_a_valid_draw_naming_the_flag(alpha, message, small_store,
                                                                         tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["partition", str(small_store), "--out", str(out), "--scheme", "dirichlet",
                     "--alpha", alpha]) == 1
    _one_line(capsys.readouterr().err, "partition", message)
    assert not out.exists()


def test_a_tiny_alpha_gives_a_valid_partition_or_a_clear_refusal(small_store, tmp_path, capsys):
    from mcfl.data import load

    args = ["partition", str(small_store), "--scheme", "dirichlet", "--alpha", "1e-300"]
    assert cli.main(args + ["--out", str(tmp_path / "few")]) == 0      # 8 clients, 10 classes
    src, few = load(small_store), load(tmp_path / "few")
    assert len(few.y_train) + len(few.y_test) == len(src.y_train) + len(src.y_test)
    sizes = np.diff(few.offsets_train) + np.diff(few.offsets_test)
    assert sizes.min() >= 5
    capsys.readouterr()
    assert cli.main(args + ["--clients", "40", "--out", str(tmp_path / "many")]) == 1
    _one_line(capsys.readouterr().err, "partition", r"Dirichlet\(1e-300\) partition gave a client fewer than 5")
    assert not (tmp_path / "many").exists()


# ------------------------------------------------------------- JSON files the package reads back
def test_a_runs_metrics_json_that_is_a_device_or_fifo_is_refused_by_name(tmp_path):
    from mcfl.io import read_run

    (tmp_path / "a").mkdir()
    os.mkfifo(tmp_path / "a" / "metrics.json")
    with pytest.raises(InputError, match=r"a/metrics\.json: is a pipe \(FIFO\), not a run's metrics\.json"):
        read_run(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.json").write_text('{"label": ')
    with pytest.raises(InputError, match=r"b/metrics\.json: not a run's metrics \(not UTF-8 JSON"):
        read_run(tmp_path / "b")


def test_a_store_whose_meta_json_is_a_device_is_refused_by_name(tmp_path):
    from mcfl.data import load
    from mcfl.data.store import StoreError

    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "meta.json").symlink_to("/dev/zero")
    with pytest.raises(StoreError, match=r"s/meta\.json: is a character device, not a store's meta\.json"):
        load(tmp_path / "s")


def test_a_runs_optional_csv_that_is_a_fifo_is_refused_not_taken_for_absent(tmp_path):
    from mcfl.io import read_run

    (tmp_path / "metrics.json").write_text('{"label": "FedAvg", "seed": 0, "final": {}}')
    os.mkfifo(tmp_path / "predictions.csv")
    assert read_run(tmp_path)["label"] == "FedAvg"           # not asked for: not touched
    with pytest.raises(InputError, match=r"predictions\.csv: is a pipe \(FIFO\), not a run's predictions\.csv"):
        read_run(tmp_path, predictions=True)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "metrics.json").write_text("[1, 2]")
    with pytest.raises(InputError, match=r"x/metrics\.json: not a run's metrics\.json \(a JSON object\)"):
        read_run(tmp_path / "x")


def test_a_merge_key_given_twice_is_a_duplicate_key(tmp_path):
    (tmp_path / "c.yaml").write_text("x: &x {p: 1}\ny: &y {q: 2}\na: {<<: *x,\n    <<: *y}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: line 4: duplicate key '<<' \(first given on line 3\); "
                                          r"merge several mappings with <<: \[\*a, \*b\]"):
        read_yaml(tmp_path / "c.yaml")


def test_a_tensor_file_that_is_a_fifo_is_refused_instead_of_blocking(tmp_path):
    from mcfl.io import load_tensors

    os.mkfifo(tmp_path / "centres.pt")
    with pytest.raises(InputError, match=r"centres\.pt: is a pipe \(FIFO\), not a regular file"):
        load_tensors(tmp_path / "centres.pt", "a centres file")
    with pytest.raises(FileNotFoundError):
        load_tensors(tmp_path / "absent.pt", "a centres file")


@pytest.mark.parametrize("key, value, message", [
    ("seed", "../x", r"--run: seed: '\.\./x' is not allowed: a seed is a non-negative integer"),
    ("seed", [0], r"--run: seed: \[0\] is not allowed"), ("seed", True, r"--run: seed: True is not allowed"),
    ("seed", -1, r"--run: seed: -1 is not allowed"),
    ("model", {}, r"--run: model\.name: None is not allowed; known models: "),
    ("model", {"name": "nope"}, r"--run: model\.name: 'nope' is not allowed"),
    ("model", {"name": "digits_cnn", "hidden": "big"}, r"--run: model\.hidden: 'big' is not allowed"),
])
def test_a_run_json_with_a_bad_seed_or_model_is_refused_naming_the_key(key, value, message):
    import json

    from mcfl.config import expand_runs

    run = expand_runs(validate(_base()))[0]
    run[key] = value
    with pytest.raises(ConfigError, match=message):
        parse_run(json.dumps(run))
