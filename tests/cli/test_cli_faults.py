"""The fault suite, the command line (``pytest -m faults``): bad arguments get one line naming the
argument or file, a failed rerun leaves none of the earlier outputs, temporaries of killed writers
are cleaned, a full disk names the file it could not write."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_run, small_params
from fault_helpers import _cli_train, _fill, _one_line_error, _run_json
from mcfl import cli
from mcfl.engine import DivergenceError
from mcfl.runner import train

pytestmark = pytest.mark.faults


# command-line arguments: argv (with {store}, {tmp}, {run}, {file}, {dir} filled in) -> message


CLI_FAULTS = [
    ("run-empty", ["train", "--run", "{}"], r"--run: missing keys dataset, method, label"),
    ("run-list", ["train", "--run", "[1]"], r"--run: missing keys"),
    ("run-path", ["train", "--run", "{file}"], r"--run: not JSON text \(that is a file name\)"),
    ("run-rounds-0", ["train", "--run", _run_json(train_rounds=0)], r"--run: train\.rounds: 0 is less than the minimum of 1"),
    ("run-no-rounds", ["train", "--run", json.dumps({**make_run(), "train": {"lr": 0.1}})], r"--run: train\.rounds: missing"),
    ("run-lr-nan", ["train", "--run", _run_json(train_lr=float("nan"))], r"--run: train\.lr: nan is not allowed"),
    ("run-rounds-huge", ["train", "--run", _run_json(train_rounds=10**12)], r"--run: train\.rounds: 1000000000000"),
    ("run-train-list", ["train", "--run", _run_json(train=[1])], r"--run: train: must be an object"),
    ("run-method", ["train", "--run", _run_json(method="FedNope")], r"--run: method: unknown method 'FedNope'"),
    ("run-params", ["train", "--run", _run_json(method="FeSEM", params={"K": 2, "lam": "x"})], r"--run: params\.lam: 'x'"),
    ("run-unknown-param", ["train", "--run", _run_json(params={"mu": 1.0})], r"--run: params\.mu: unknown parameter of FedAvg"),
    ("checkpoint-dir", ["train", "--run", "{run}", "--checkpoint", "{dir}"], r"{dir}: --checkpoint must be a file path"),
    ("out-is-file", ["train", "--run", "{run}", "--out", "{file}"], r"{file}: --out must be a directory"),
    ("store-missing", ["train", "--run", "{run}", "--store", "{tmp}/nope"], r"{tmp}/nope/meta\.json: missing"),
    ("centres-garbage", ["train", "--run", _run_json(method="FeSEM", params={"K": 2, "restarts": 2}, needs_centres=True),
                         "--centres", "{file}"], r"{file}: not a centres file"),
    ("k-from-garbage", ["train", "--run", _run_json(method="FeSEM", params={"K": "auto"}), "--k-from", "{file}"],
     r"{file}: not a select-k result"),
    ("init-spec-empty", ["init-centres", "--run", "{}"], r"--run: missing keys dataset, seed, model, train, K"),
    ("select-k-path", ["select-k", "--run", "{file}"], r"--run: not JSON text"),
    ("download-out-file", ["download", "femnist", "--out", "{file}"], r"--out {file}: exists and is not a directory"),
    ("device-bogus", ["train", "--run", "{run}", "--device", "tpu7"], r"--device 'tpu7': not a device"),
    ("runs-one-out", ["train", "--run", "{run}", "--run", "{run}"], r"2 --run given but 1 --out: give --out once per --run"),
    ("runs-same-out", ["train", "--run", "{run}", "--out", "{tmp}/o", "--run", "{run}", "--out", "{tmp}/o/"],
     r"--out repeated: each run needs its own directory"),
    ("runs-one-centres", ["train", "--run", "{run}", "--out", "{tmp}/a", "--run", "{run}", "--out", "{tmp}/b",
                          "--centres", "{file}"], r"2 --run given but 1 --centres: give --centres once per --run or not at all"),
    ("report-no-runs", ["report", "--out", "{tmp}/rep", "{dir}"], r"{dir}"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in CLI_FAULTS], ids=[c[0] for c in CLI_FAULTS])
def test_cli_argument_faults_are_one_line_naming_the_argument_or_file(argv, message, digits_store,
                                                                      tmp_path, capsys):
    fill = {"store": str(digits_store), "tmp": str(tmp_path), "run": _run_json(),
            "file": str(tmp_path / "a file.txt"), "dir": str(tmp_path / "a dir")}
    (tmp_path / "a file.txt").write_text("not what was asked for")
    (tmp_path / "a dir").mkdir()
    argv = [_fill(a, fill) for a in argv]
    if argv[0] in ("train", "init-centres", "select-k"):       # the required arguments not given
        defaults = {"--store": str(digits_store), "--out": str(tmp_path / "out")}
        argv += [x for k, v in defaults.items() if k not in argv for x in (k, v)]
    if argv[0] == "train":
        argv += ["--no-tracking", "--no-progress"]
    assert cli.main(argv) == 1
    _one_line_error(capsys.readouterr().err, argv[0], _fill(message, {k: re.escape(v) for k, v in fill.items()}))
    assert not (tmp_path / "out" / "metrics.json").exists()


# ====================================================================================== outputs, 2
def test_a_failed_rerun_leaves_none_of_the_earlier_outputs(digits_store, tmp_path):
    from mcfl.runner import RESULTS

    run = make_run(method="FeSEM", params=small_params("FeSEM"), rounds=2)
    train(run, digits_store, tmp_path, progress=False)
    assert all((tmp_path / f).exists() for f in RESULTS)
    with pytest.raises(DivergenceError):
        train(make_run(method="FeSEM", params=small_params("FeSEM"), rounds=2, lr=1e6), digits_store,
              tmp_path, progress=False)
    assert not any((tmp_path / f).exists() for f in RESULTS)


def test_temporaries_of_killed_writers_are_removed_and_live_ones_kept(digits_store, tmp_path):
    """A SIGKILL during a write leaves `.<name>.<pid>.<random>.tmp`; the next run removes those
    whose process is gone (pid 2**22 + 1 is above Linux's pid_max), never a live writer's."""
    out, ck = tmp_path / "out", tmp_path / "ck" / "seed0.pt"
    dead, live = 2**22 + 1, os.getpid()
    stale = [out / f".{f}.{dead}.x1.tmp" for f in ("history.csv", "state.pt", "metrics.json")]
    stale += [ck.parent / f".{ck.name}.{dead}.x2.tmp", out / f".state.pt.{dead}.dir.tmp"]
    kept = [out / f".history.csv.{live}.x3.tmp", out / "notes.tmp"]
    for f in stale + kept:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.mkdir() if f.name.endswith("dir.tmp") else f.write_text("partial")
    train(make_run(rounds=2, checkpoint_every=1), digits_store, out, checkpoint=ck, progress=False)
    assert not any(f.exists() for f in stale) and all(f.exists() for f in kept)


# OSErrors: a full disk (ENOSPC) where each output is written, one line naming the output
def _enospc_at(monkeypatch, name: str) -> None:
    import errno

    import mcfl.io as mio

    real = os.replace

    def replace(src, dst):
        if Path(dst).name == name:
            raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))
        return real(src, dst)

    monkeypatch.setattr(mio.os, "replace", replace)


@pytest.mark.parametrize("name", ["seed0.pt", "history.csv", "state.pt", "metrics.json"])
def test_a_full_disk_names_the_file_in_one_line(name, digits_store, tmp_path, capsys, monkeypatch):
    _enospc_at(monkeypatch, name)
    out, ck = tmp_path / "results" / "runs" / "r", tmp_path / "results" / "checkpoints" / "seed0.pt"
    run = make_run(rounds=3, checkpoint_every=1)
    assert _cli_train(run, digits_store, out, "--checkpoint", str(ck)) == 1
    target = ck if name == "seed0.pt" else out / name
    _one_line_error(capsys.readouterr().err, "train", rf"error: {re.escape(str(target))}: no space left on device$")
    assert not (out / "metrics.json").exists()
    assert not list(tmp_path.rglob("*.tmp"))                       # no temporary left behind


def test_a_full_disk_while_writing_centres_names_the_file(digits_store, tmp_path, capsys, monkeypatch):
    out = tmp_path / "centres" / "seed0.pt"
    _enospc_at(monkeypatch, out.name)
    fesem = make_run(method="FeSEM", params={"K": 2, "restarts": 2})
    assert cli.main(["init-centres", "--run", json.dumps(fesem), "--store", str(digits_store), "--out", str(out),
                     "--threads", "1", "--device", "cpu"]) == 1
    _one_line_error(capsys.readouterr().err, "init-centres", rf"error: {re.escape(str(out))}: no space left on device$")
    assert not out.exists() and not list(tmp_path.rglob("*.tmp"))


def test_a_short_write_of_prepare_names_the_file(tmp_path, capsys, monkeypatch):
    """numpy reports a full disk while saving an array as "N requested and M written"."""
    import mcfl.data.store as store

    real = np.save

    def short(path, arr, **kw):
        if Path(path).name == "x_test.npy":
            raise OSError("1433 requested and 496 written")
        real(path, arr, **kw)

    monkeypatch.setattr(store.np, "save", short)
    out = tmp_path / "data" / "digits"
    assert cli.main(["prepare", "digits", "--out", str(out), "--clients", "8"]) == 1
    _one_line_error(capsys.readouterr().err, "prepare",
                    rf"{re.escape(str(out))}/x_test\.npy: write failed \(1433 requested and 496 written; is the disk full\?\)")
    assert not out.exists() and list(out.parent.iterdir()) == []


@pytest.mark.parametrize("content, message", [
    (lambda p: p.write_bytes(b"\x80\x04\x95" + b"garbage"), r"not a run's state\.pt"),
    (lambda p: torch.save({"centres": object()}, p), r"not a run's state\.pt: it holds objects other than tensors"),
    (lambda p: torch.save({"nothing": torch.zeros(2)}, p), r"not a state of FeSEM"),
    (lambda p: p.write_text("plain text"), r"not a run's state\.pt"),
], ids=["raw-pickle", "object", "wrong-keys", "text"])
def test_figure_clusters_refuses_a_foreign_state_in_one_line(content, message, digits_store, tmp_path, capsys):
    state = tmp_path / "state.pt"
    content(state)
    run = make_run(method="FeSEM", params={"K": 2, "restarts": 2})
    argv = ["figure", "clusters", "--run", json.dumps(run), "--store", str(digits_store), "--state", str(state),
            "--out", str(tmp_path / "fig.png"), "--device", "cpu", "--threads", "1"]
    assert cli.main(argv) == 1
    _one_line_error(capsys.readouterr().err, "figure", message)
    assert not (tmp_path / "fig.png").exists()
