"""``train.precision``: fp32 (absent or explicit) is today's training bit for bit, with no autocast
at all; tf32 on a CPU is fp32; bf16 trains under autocast on the CPU, close to fp32 but not equal,
on the sequential, stacked and low-rank paths alike; what ran is in metrics.json and the tables'
machine lines; a bad value is a one-line error naming the file and the key."""

import json

import pandas as pd
import pytest
import torch
import yaml

from conftest import ROOT, make_run
from mcfl.config import ConfigError, expand_runs, load_config, validate
from mcfl.data import load
from mcfl.engine import Task
from mcfl.executors import BatchedTrainer
from mcfl.federation import build_federation
from mcfl.precision import bf16_supported, precision_ran
from mcfl.report.format import machine
from mcfl.runner import train
from mcfl.timing import COLUMNS as TIME_COLUMNS

needs_bf16 = pytest.mark.skipif(not bf16_supported("cpu"), reason="this CPU's PyTorch cannot autocast to bfloat16")


def _run(store, out, **train_kw):
    """A short FedAvg run on the digits store; its history (times left out), test predictions and
    metrics.json."""
    train(make_run(rounds=3, **train_kw), store, out, progress=False)
    hist = pd.read_csv(out / "history.csv").drop(columns=list(TIME_COLUMNS))
    return hist, pd.read_csv(out / "predictions.csv"), json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def fp32_run(digits_store, tmp_path_factory):
    return _run(digits_store, tmp_path_factory.mktemp("fp32"))


def test_fp32_explicit_and_tf32_on_a_cpu_are_todays_training_bit_for_bit(digits_store, fp32_run, tmp_path,
                                                                        monkeypatch, caplog):
    """fp32 enters no autocast context (torch.autocast raising shows it), and gives exactly the run
    without the key; tf32 on a CPU warns and gives the same numbers, recorded as fp32."""
    hist, pred, m = fp32_run
    assert m["precision"] == "fp32" and "precision" not in m["config"]["train"]

    def no_autocast(*a, **k):
        raise AssertionError("fp32 must not enter torch.autocast")

    monkeypatch.setattr(torch, "autocast", no_autocast)
    h2, p2, m2 = _run(digits_store, tmp_path / "explicit", precision="fp32")
    pd.testing.assert_frame_equal(hist, h2, check_exact=True)
    pd.testing.assert_frame_equal(pred, p2, check_exact=True)
    assert m2["final"] == m["final"] and m2["precision"] == "fp32"

    h3, p3, m3 = _run(digits_store, tmp_path / "tf32", precision="tf32")
    pd.testing.assert_frame_equal(hist, h3, check_exact=True)
    assert m3["precision"] == "fp32"                   # what ran: TF32 is a mode of NVIDIA GPUs
    assert any("precision tf32 on cpu" in r.getMessage() for r in caplog.records)


def test_explicit_fp32_keeps_the_runs_identity(tmp_path):
    """In a config, `precision: fp32` makes the same run dicts (hence run hashes and centre files)
    as leaving it out; bf16 is a different run."""
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    plain = expand_runs(validate(yaml.safe_load(yaml.safe_dump(cfg))))
    for ds in cfg["datasets"].values():
        ds["train"]["precision"] = "fp32"
    assert expand_runs(validate(yaml.safe_load(yaml.safe_dump(cfg)))) == plain
    for ds in cfg["datasets"].values():
        ds["train"]["precision"] = "bf16"
    bf16 = expand_runs(validate(cfg))
    assert all(r["train"]["precision"] == "bf16" for r in bf16)


def test_a_bad_precision_names_the_file_and_the_key(tmp_path):
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["datasets"]["digits"]["train"]["precision"] = "fp16"
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=rf"^{p}: datasets\.digits\.train\.precision: 'fp16' is not one of") as e:
        load_config(p)
    assert "\n" not in str(e.value)


def test_precision_ran_and_the_machine_line():
    assert [precision_ran(p, "cpu") for p in (None, "fp32", "tf32", "bf16")] == ["fp32", "fp32", "fp32",
                                                                                 "bf16 (autocast)"]
    assert precision_ran("tf32", "cuda") == "tf32"
    m = {"device": "cuda", "device_name": "NVIDIA H100", "cpu": "AVX2", "threads": 1, "torch": "2.9"}
    assert machine(m) == "cuda NVIDIA H100 (AVX2, 1 thread(s), torch 2.9)"
    assert machine({**m, "precision": "fp32"}) == machine(m)                   # fp32 goes unsaid
    assert machine({**m, "precision": "bf16 (autocast)"}) == "cuda NVIDIA H100 (AVX2, 1 thread(s), torch 2.9, bf16 (autocast))"


@needs_bf16
def test_bf16_trains_close_to_fp32_but_not_equal(digits_store, fp32_run, tmp_path):
    hist, pred, m = fp32_run
    h, p, mb = _run(digits_store, tmp_path, precision="bf16")
    assert mb["precision"] == "bf16 (autocast)" and mb["config"]["train"]["precision"] == "bf16"
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]                  # it learns
    assert not h["train_loss"].equals(hist["train_loss"])                       # bf16 really ran
    assert h["train_loss"].to_numpy() == pytest.approx(hist["train_loss"].to_numpy(), rel=0.05)
    assert abs(mb["final"]["micro_acc"] - m["final"]["micro_acc"]) < 0.05       # within 5 points
    assert (p["pred"] == pred["pred"]).mean() > 0.9                             # mostly the same answers


def _results(trainer, tasks):
    return {t.client: (r.weights.clone(), r.loss) for t, r in trainer.run(tasks, 2)}


def _gap(a, b):
    return max(float((a[c][0] - b[c][0]).abs().max()) for c in a)


@needs_bf16
@pytest.mark.parametrize("path", ["stacked", "lowrank"])
def test_bf16_batched_matches_sequential_within_bf16_rounding(digits_store, path):
    """Under bf16 the batched executor's paths (stacked: vmapped forwards cast to bfloat16
    explicitly, as autocast does not reach into vmap on a CPU; low-rank: LowRankLinear's products in
    bfloat16) agree with the sequential one within bf16's rounding, and differ from their own fp32
    results by as much: neither silently computes in fp32."""
    local = {"local_steps": 4, "batch_size": 4} if path == "lowrank" else {"local_epochs": 1, "batch_size": 5}
    data, out = load(digits_store), {}
    for precision in ("fp32", "bf16"):
        fed = build_federation(data, {"name": "digits_cnn"}, {"lr": 0.1, "rounds": 1, "precision": precision,
                                                              **local}, seed=3)
        tasks = [Task(c, fed.w0) for c in range(fed.n_clients)]
        bat = BatchedTrainer(fed.model, fed.dev, fed.trainer.spec, fed.seed, chunk=5, fallback="stacked",
                             lowrank=0 if path == "stacked" else 0.5)
        assert bool(bat._lazy_layers(tasks, 4 * 4)) == (path == "lowrank")      # 4 steps x batch 4
        out[precision] = _results(fed.trainer, tasks), _results(bat, tasks)
    (seq32, bat32), (seq16, bat16) = out["fp32"], out["bf16"]
    assert _gap(seq32, bat32) < 1e-6
    bf16_effect = _gap(seq16, seq32)
    assert 1e-3 < bf16_effect < 0.1
    assert _gap(bat16, bat32) > 1e-3                       # the batched path computed in bf16
    assert _gap(seq16, bat16) < 2 * bf16_effect
    assert all(abs(seq16[c][1] - bat16[c][1]) < 0.02 for c in seq16)


@needs_bf16
def test_bf16_custom_loss_trains_sequentially_under_batched(digits_store, caplog):
    """A batchable custom loss (FedCG's kind) would go stacked, where its own float32 tensors meet
    bf16 parameters inside vmap: under bf16 it trains on the sequential path instead, logged once,
    with the sequential executor's weights bit for bit."""
    import torch.nn.functional as F

    def loss(module, x, y, rows, mask=None):
        per = F.cross_entropy(module(x), y, reduction="none") + 0.01 * x.flatten(1).square().mean(1)
        return per.mean() if mask is None else (per * mask).sum() / mask.sum().clamp(min=1)

    loss.batchable = True
    fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                           {"lr": 0.1, "rounds": 1, "batch_size": 5, "precision": "bf16"}, seed=3)
    tasks = [Task(c, fed.w0, loss=loss) for c in range(6)]
    seq = _results(fed.trainer, tasks)
    caplog.set_level("INFO", logger="mcfl")
    bat = _results(BatchedTrainer(fed.model, fed.dev, fed.trainer.spec, fed.seed, chunk=3, fallback="stacked"), tasks)
    assert all(torch.equal(seq[c][0], bat[c][0]) for c in seq)
    assert any("custom local loss trains on the sequential path under precision bf16" in r.getMessage()
               for r in caplog.records)
