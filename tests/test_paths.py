"""Names never become a way out of the output folder, and no command writes over its own input
(mcfl.paths): a run's JSON, a config and a run folder's metrics.json are all held to one rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, make_run
from mcfl import cli
from mcfl.config import ConfigError, load_config, parse_run
from mcfl.io import OUTPUTS, read_run, write_json, write_text
from mcfl.paths import MAX_NAME_BYTES, child, plain_name, refuse_overlap

HOSTILE = ["../../x", "..", ".", ".hidden", "a/b", "a\\b", "", "a\x00b", "tab\there", "x" * (MAX_NAME_BYTES + 1),
           "é" * (MAX_NAME_BYTES // 2 + 1), 7, None]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_is_not_one_plain_component_is_refused_naming_the_key(name):
    with pytest.raises(ValueError, match=r"^metrics.json: dataset: .* is not a plain name \(") as e:
        plain_name(name, "metrics.json: dataset")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["digits", "FeSEM(2)", "Robust(TKM)", "FedProx-mu0.01", "a+b", "x" * MAX_NAME_BYTES,
                                  "pkg.mod:Class"])
def test_plain_names_pass_unchanged_and_stay_inside_their_folder(name, tmp_path):
    assert plain_name(name, "k") == name
    assert child(tmp_path, name, "k", prefix="convergence_", suffix=".png").parent == tmp_path


@pytest.mark.parametrize("key", ["dataset", "label", "run_id", "method"])
def test_mcfl_train_refuses_a_run_json_whose_name_is_a_path(key):
    run = make_run()
    run[key] = "../../x"
    with pytest.raises(ConfigError, match=rf"^--run: {key}: '\.\./\.\./x' is not a plain name"):
        parse_run(json.dumps(run))


def test_the_cli_refuses_it_in_one_line_before_writing(tmp_path, capsys):
    run = make_run()
    run["dataset"] = "../../x"
    assert cli.main(["train", "--run", json.dumps(run), "--store", str(tmp_path / "s"),
                     "--out", str(tmp_path / "out"), "--no-tracking", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("mcfl train: error: --run: dataset: '../../x' is not a plain name") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_config_label_that_climbs_out_is_refused(tmp_path):
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["methods"] = [dict(cfg["methods"][0], label="..")]
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=r"methods: label: '\.\.' is not a plain name"):
        load_config(str(f))


def _fake_run(d: Path, **metrics) -> Path:
    d.mkdir(parents=True)
    write_text(d / "history.csv", "round,train_loss,micro_acc\n1,1.0,0.5\n2,0.9,0.6\n")
    m = {"dataset": "digits", "method": "FedAvg", "label": "FedAvg", "run_id": "FedAvg", "seed": 0,
         "final": {"micro_acc": 0.6, "macro_acc": 0.6, "micro_f1": 0.6, "macro_f1": 0.6}, **metrics}
    write_json(d / "metrics.json", m)
    return d


def test_a_run_folder_cannot_steer_where_the_report_writes(tmp_path, capsys):
    """metrics.json's dataset becomes figures/convergence_<dataset>.png: a path there is refused
    in one line naming the file and the key, and nothing is written anywhere."""
    run = _fake_run(tmp_path / "runs" / "r", dataset="../../../escaped")
    out = tmp_path / "deep" / "er" / "report"
    assert cli.main(["report", "--out", str(out), str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"mcfl report: error: {run / 'metrics.json'}: dataset: '../../../escaped' is not a plain "
                   f"name (it holds a path separator)")
    assert not out.exists() and not (tmp_path / "escaped").exists()
    assert not list(tmp_path.rglob("*.png"))


def test_read_run_names_a_truncated_or_binary_metrics_file(tmp_path):
    d = _fake_run(tmp_path / "r")
    (d / "metrics.json").write_text('{"dataset": "dig')
    with pytest.raises(ValueError, match=rf"^{d / 'metrics.json'}: not a run's metrics \(not UTF-8 JSON"):
        read_run(d)
    (d / "metrics.json").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match=rf"^{d / 'metrics.json'}: not a run's metrics"):
        read_run(d)
    (d / "metrics.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"a JSON list, not an object"):
        read_run(d)


def test_read_run_names_a_history_that_is_not_utf8(tmp_path):
    d = _fake_run(tmp_path / "r")
    (d / "history.csv").write_bytes(b"round,train_loss\n1,\xff\xfe\n")
    with pytest.raises(ValueError, match=rf"^{d / 'history.csv'}: not a readable CSV file"):
        read_run(d, history=True)


# ------------------------------------------------------------------- outputs that are inputs
def test_refuse_overlap_refuses_an_output_that_is_or_contains_an_input(tmp_path):
    (tmp_path / "S").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "S")
    for out in (tmp_path / "S", tmp_path, tmp_path / "link", tmp_path / "S" / ".." / "S"):
        with pytest.raises(ValueError, match="--out .*: (is|contains) the input"):
            refuse_overlap([out], [tmp_path / "S"])
    refuse_overlap([tmp_path / "T"], [tmp_path / "S"])
    refuse_overlap([tmp_path / "S" / "sub"], [tmp_path / "S"])        # inside an input: not replaced


def test_partition_onto_its_own_store_is_refused_and_the_store_kept(digits_store, tmp_path, capsys):
    store = shutil.copytree(digits_store, tmp_path / "S")
    before = {f.name: f.read_bytes() for f in store.iterdir()}
    for out in (store, tmp_path):
        assert cli.main(["partition", str(store), "--out", str(out), "--scheme", "iid"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"mcfl partition: error: --out {out}: ") and "the input" in err
    assert {f.name: f.read_bytes() for f in store.iterdir()} == before


def test_a_folder_the_command_did_not_write_is_not_replaced(digits_store, tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("keep me")
    assert cli.main(["partition", str(digits_store), "--out", str(notes), "--scheme", "iid"]) == 1
    assert "a folder this command did not write" in capsys.readouterr().err
    assert (notes / "mine.txt").read_text() == "keep me" and len(list(notes.iterdir())) == 1
    out = tmp_path / "P"
    for _ in range(2):                          # its own earlier output is replaced
        assert cli.main(["partition", str(digits_store), "--out", str(out), "--scheme", "iid"]) == 0
    assert (out / "meta.json").is_file()


def test_a_report_over_one_of_its_run_folders_is_refused(tmp_path, capsys):
    run = _fake_run(tmp_path / "r")
    assert cli.main(["report", "--out", str(run), str(run)]) == 1
    assert capsys.readouterr().err.strip() == (f"mcfl report: error: --out {run}: is the input {run}; "
                                               f"write the output elsewhere")
    assert sorted(f.name for f in run.iterdir()) == ["history.csv", "metrics.json"]
    assert set(OUTPUTS) >= {"history.csv", "metrics.json"}
