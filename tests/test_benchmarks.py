"""The benchmark scripts that plan studies run on a small config and print arithmetic that adds up.

``benchmarks/study_cost.py`` is what a user runs before starting a multi-hour study; it once
broke silently (it passed the whole train dict where the evaluation protocols were expected, so
every config with ``eval_protocols`` failed before timing anything)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_study_cost_times_every_run_and_adds_up(tmp_path):
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    digits = cfg["datasets"]["digits"]
    digits["prepare"].update(clients=12)
    digits["train"].update(rounds=7, eval_every=3, local_epochs=1,
                           eval_protocols={"active": {"clients": "active"},
                                           "finetune": {"clients": "all", "finetune_epochs": 1}})
    cfg["datasets"] = {"digits": digits}
    cfg["seeds"] = [0, 1]
    for block in ("fedgsp", "figures"):
        cfg.pop(block, None)
    cfg["methods"] = [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2, "restarts": 2}]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                     os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "study_cost.py"), str(path),
                        "--rounds", "2", "--warmup", "0", "--data", str(tmp_path / "data")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines()
            if line.startswith("| digits |")]
    assert [c[1].strip() for c in rows] == ["FedAvg", "FeSEM-K2"]
    total_min = 0.0
    for _, _, executor, round_s, eval_s, init_s, run_min in rows:
        assert executor.strip() == "batched"
        round_s, eval_s, init_s, run_min = map(float, (round_s, eval_s, init_s, run_min))
        assert round_s > 0 and eval_s > 0
        # 7 rounds, evaluated at 3, 6 and the last: 3 evaluations (to the printed rounding)
        expect = (init_s + 7 * round_s + 3 * eval_s) / 60
        assert abs(run_min - expect) <= 0.05 + 0.01 * expect
        total_min += 2 * run_min                                   # both seeds cost the same
    total = re.search(r"Total \(all 2 seeds.*: ([0-9.]+) h \((\d+) min\)", r.stdout)
    assert total, r.stdout
    assert abs(float(total.group(2)) - total_min) <= 1 + 0.1 * len(rows)


def test_benchmarks_hold_speed_and_memory_and_every_study_is_listed_and_starts():
    """benchmarks/ keeps the package's speed and memory scripts; the one-off investigations live in
    studies/, each listed in its README, and each still finds the benchmarks' helpers (its --help
    runs: the imports resolve from a checkout)."""
    studies = sorted(p for p in (ROOT / "studies").glob("*.py"))
    assert {p.stem for p in studies} >= {"fedmmd_penalty", "fedmmd_select", "ida_weights", "projection",
                                        "digits_cnn_forms", "stacked_conv_forms", "matching_speed",
                                        "fesem_memory", "icg_speed", "methods_round", "fedgsp_round",
                                        "eval_round", "precision_accuracy", "gpu_plan"}
    assert not any((ROOT / "benchmarks" / p.name).exists() for p in studies)
    readme = (ROOT / "studies" / "README.md").read_text()
    assert all(f"`{p.name}`" in readme for p in studies)
    code = ("import runpy, sys\n"
            "for f in sys.argv[1:]:\n"
            "    sys.argv = [f, '--help']\n"
            "    try:\n"
            "        runpy.run_path(f, run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        assert e.code in (0, None), (f, e.code)\n"
            "    print('ok', f)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                     os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", code, *map(str, studies)], capture_output=True,
                       text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("ok ") == len(studies)


def test_gpu_plan_prices_a_run_from_an_archived_run_of_its_label(tmp_path, monkeypatch):
    """studies/gpu_plan.py by hand: an archived FedAvg GPU run that trained 10 clients x 8 steps
    (synthetic: 80 training samples a client, batch 10) in 1 s a round and scored 2,000 test samples
    in 2 s prices a FedAvg run of 20 clients a round, 30 rounds, evaluated 3 times, at
    30 x 2 s + 3 x 2 s = 66 s."""
    monkeypatch.syspath_prepend(str(ROOT / "studies"))
    import gpu_plan

    data = {"source": "synthetic", "clients": 100, "seed": 1}
    train = {"rounds": 10, "clients_per_round": 10, "local_epochs": 1, "batch_size": 10, "eval_every": 5,
             "lr": 0.1}
    run = {"label": "FedAvg", "model": {"name": "logreg"}, "data": data, "train": train, "params": {}}
    d = tmp_path / "runs" / "FedAvg" / "seed0"
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({"device": "cuda", "device_name": "GPU X", "label": "FedAvg",
                                                "rounds": 10, "config": run,
                                                "time_s": {"local": 10.0, "eval": 4.0, "aggregate": 0.1}}))
    runs = gpu_plan.archived(tmp_path / "runs")
    assert [(r["steps"], r["local_s"], r["eval_s"], r["n_test"]) for r in runs] == [(80, 1.0, 2.0, 2000)]
    cfg = tmp_path / "study.yaml"
    cfg.write_text(yaml.safe_dump({"seeds": [0], "datasets": {"s": {
        "prepare": data, "model": {"name": "logreg"},
        "train": {**train, "rounds": 30, "clients_per_round": 20, "eval_every": 10}}},
        "methods": [{"method": "FedAvg"}]}))
    by_label = {"FedAvg": runs}
    n, fitted, seconds = gpu_plan.price([str(cfg)], {"a": 0.0, "b": 0.0, "d": 0.0}, by_label)
    assert (n, fitted) == (1, 0) and seconds == pytest.approx(66.0)
    n, fitted, seconds = gpu_plan.price([str(cfg)], {"a": 0.5, "b": 0.01, "d": 0.0}, {})   # no such label
    assert fitted == 1 and seconds == pytest.approx(30 * (0.5 + 0.01 * 160))


def _run(root: Path, label: str, seed: int, y, pred, precision: str = "fp32") -> None:
    d = root / "femnist_sample" / label / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({"dataset": "femnist_sample", "label": label, "seed": seed,
                                                "precision": precision, "device_name": "GPU X"}))
    (d / "predictions.csv").write_text("client,y,pred\n" + "".join(f"c,{a},{b}\n" for a, b in zip(y, pred)))


def test_precision_accuracy_pairs_each_run_with_its_fp32_twin(tmp_path, monkeypatch):
    """studies/precision_accuracy.py by hand: 4 test images, fp32 right on images 0 and 1, bf16 on
    0, 2 and 3 (seed 0); seed 1 both right on all four. Accuracy 75 and 100 (mean 87.5) against 50
    and 100; Δ +25 and 0; images only bf16 / only fp32: 2 / 1; sign test p = 1.0 (3 discordant)."""
    monkeypatch.syspath_prepend(str(ROOT / "studies"))
    import precision_accuracy as pa

    y = [1, 2, 3, 4]
    _run(tmp_path / "fp32", "FedAvg", 0, y, [1, 2, 0, 0])
    _run(tmp_path / "bf16", "FedAvg", 0, y, [1, 0, 3, 4], "bf16 (autocast)")
    _run(tmp_path / "fp32", "FedAvg", 1, y, y)
    _run(tmp_path / "bf16", "FedAvg", 1, y, y, "bf16 (autocast)")
    _run(tmp_path / "bf16", "FeSEM(2)", 0, y, y, "bf16 (autocast)")      # no fp32 twin: left out
    [row] = pa.compare(pa.runs(tmp_path / "fp32"), pa.runs(tmp_path / "bf16"))
    assert (row["method"], row["precision"], row["seeds"]) == ("FedAvg", "bf16 (autocast)", 2)
    assert row["acc"][0] == pytest.approx(87.5) and row["fp32"][0] == pytest.approx(75.0)
    assert row["delta"][0] == pytest.approx(12.5) and row["only"] == (2, 1)
    assert row["p"] == pytest.approx(1.0)
    assert "| FedAvg | bf16 (autocast) | 87.5 ± 17.7 | 75.0 ± 35.4 | +12.5 ± 17.7 | 2 / 1 | 1 | 2 | GPU X |" \
        in pa.table([row])


def test_workflow_stages_replays_job_times_longest_first_and_in_random_orders(monkeypatch, capsys):
    """Jobs of 3, 2 and 2 s on 2 slots: longest first ends at 4 s (3 | 2+2); the order 2, 2, 3
    ends at 5 s (2+3 | 2), and a random order is one of the two."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import workflow_stages as ws

    assert ws.makespan([3, 2, 2], 2) == 4 and ws.makespan([2, 2, 3], 2) == 5
    longest, median = ws.replay([2, 3, 2], 2, orders=20)
    assert longest == 4 and median in (4, 5)
    assert "longest first 4 s" in capsys.readouterr().out


def test_workflow_stages_replays_a_dag_by_priority(monkeypatch):
    """Two slots; a 1 s centre file that a 4 s run waits for, and two runs of 3 s. Centre file
    first (what its priority asks): 1 | 3, then the 4 s run at 1 and the other 3 s run at 3 ->
    ends at 6 s (1+4 | 3+3). The two 3 s runs first: the centre file at 3, its run at 4 -> 8 s."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import workflow_stages as ws

    times, deps = [1, 4, 3, 3], [[], [0], [], []]
    assert ws.makespan_dag(times, deps, 2, [0, 1, 2, 3]) == 6
    assert ws.makespan_dag(times, deps, 2, [2, 3, 0, 1]) == 8


def test_stacked_conv_forms_compute_the_executors_step(monkeypatch):
    """The grouped forms that stacked_conv_forms.py times against vmap are the same function: the
    digits CNN's step for 5 clients gives the same loss and, up to rounding, the same gradients of
    every client's parameters, in both memory formats; and a client's gradients are its own
    (changing client 0's input leaves client 1's gradients unchanged)."""
    monkeypatch.syspath_prepend(str(ROOT / "studies"))
    import torch
    import stacked_conv_forms as scf

    gen = torch.Generator().manual_seed(0)
    net = scf.build("digits_cnn", None)
    params = scf.stacked_params(net, 5, torch.device("cpu"), gen)
    x = torch.rand((5, 4, 1, 8, 8), generator=gen)
    y = torch.randint(0, 10, (5, 4), generator=gen)
    ref = scf.step_fn(scf.vmap_loss(net), params, x, y)()
    for channels_last in (False, True):
        loss = scf.grouped_loss(net, channels_last)
        assert torch.allclose(loss(params, x, y), scf.vmap_loss(net)(params, x, y), rtol=1e-6)
        for g, r in zip(scf.step_fn(loss, params, x, y)(), ref):
            assert g.shape == r.shape and torch.allclose(g, r, rtol=1e-4, atol=1e-6)
    x2 = x.clone()
    x2[0] = torch.rand((4, 1, 8, 8), generator=gen)
    moved = scf.step_fn(scf.grouped_loss(net, False), params, x2, y)()
    assert all(torch.allclose(m[1:], r[1:], rtol=1e-4, atol=1e-6) for m, r in zip(moved, ref))
    assert not torch.allclose(moved[0][0], ref[0][0])
