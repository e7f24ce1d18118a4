"""tools/compare_runs.py: a run's summary (rounds to the target, lowest test loss, summed
time columns) and a pair's discordant test images with their sign test, on runs written here."""

import importlib.util
import json

import pandas as pd
import pytest

from conftest import ROOT


def _tool():
    spec = importlib.util.spec_from_file_location("compare_runs", ROOT / "tools" / "compare_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(results, run, seed, acc, loss, hits, **machine):
    d = results / "runs" / "ds" / run / f"seed{seed}"
    d.mkdir(parents=True)
    machine = machine or {"device": "cpu", "cpu": "AVX2", "threads": 1, "torch": "2.14.1"}
    (d / "metrics.json").write_text(json.dumps({"final": {"micro_acc": acc[-1], "macro_acc": acc[-1]},
                                                "git": "abcdef0123", **machine}))
    pd.DataFrame({"round": range(1, len(acc) + 1), "micro_acc": acc, "test_loss": loss,
                  "local_s": 2.0, "aggregate_s": 0.5, "eval_s": 1.0}).to_csv(d / "history.csv", index=False)
    y = [0, 1, 2, 3, 4, 5]
    pd.DataFrame({"y": y, "pred": [t if h else -1 for t, h in zip(y, hits)]}).to_csv(d / "predictions.csv", index=False)


def test_summary_and_pair_by_hand(tmp_path, capsys):
    results = tmp_path / "results-x"
    _run(results, "A", 0, [0.5, 0.7, 0.85, 0.9], [2.0, 1.0, 0.8, 0.9], [1, 1, 1, 0, 0, 1])
    _run(results, "B", 0, [0.4, 0.6, 0.7, 0.75], [2.1, 1.5, 1.2, 1.1], [0, 0, 1, 0, 1, 1],
         device="cuda", device_name="NVIDIA H200", cpu="AVX512", threads=1, torch="2.11.0")
    assert _tool().main([str(results), "A/0", "B/0", "A/0:B/0", "--dataset", "ds"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("A seed0: micro 90.0% macro 90.0%, 80% at round 3, test loss 0.900 "
                             "(lowest 0.800 at round 3), 14 s of training and evaluation, cpu (AVX2, 1 thread(s), torch 2.14.1), git abcdef0")
    assert "80% at round never" in out[1]
    assert "cuda NVIDIA H200 (AVX512, 1 thread(s), torch 2.11.0)" in out[1]      # a GPU run names its GPU
    # A alone right on images 0 and 1, B alone on image 4: 2 / 1, p = 1.0
    assert out[2] == "A seed0 vs B seed0: 2 / 1 test images only one of them gets right, p = 1"


def test_a_missing_run_or_a_bad_spec_is_named(tmp_path):
    with pytest.raises(SystemExit, match="C/0: no finished run"):
        _tool().main([str(tmp_path / "results-x"), "C/0", "--dataset", "ds"])
    with pytest.raises(SystemExit, match="expected RUN/SEED"):
        _tool().main([str(tmp_path / "results-x"), "C", "--dataset", "ds"])
