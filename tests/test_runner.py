"""The round loop: a shared client stream, divergence, outputs. Determinism and resume for every
algorithm: tests/test_faults_resume.py."""

import json
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import make_run
from mcfl.engine import DivergenceError
from mcfl.federation import client_stream
from mcfl.runner import train


def test_client_stream_is_shared_and_prefix_stable():
    s10 = client_stream(50, 5, seed=3, rounds=10)
    s20 = client_stream(50, 5, seed=3, rounds=20)
    assert np.array_equal(s10, s20[:10])
    assert all(len(set(r)) == 5 for r in s20)
    assert not np.array_equal(client_stream(50, 5, seed=4, rounds=10), s10)
    assert np.array_equal(client_stream(7, None, 0, 2), np.tile(np.arange(7), (2, 1)))


def test_divergence_names_round_and_client_and_writes_no_metrics(digits_store, tmp_path):
    run = make_run(lr=1e6, rounds=3)
    with pytest.raises(DivergenceError, match=r"round 1, client \d+"):
        train(run, digits_store, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_outputs_have_assignments_and_identity(digits_store, tmp_path):
    run = make_run(method="FeSEM", params={"K": 4, "restarts": 3}, rounds=2)
    res = train(run, digits_store, tmp_path, progress=False)
    a = pd.read_csv(tmp_path / "assignments.csv")
    assert len(a) == 16 and set(a["cluster"]) <= {0, 1, 2, 3}
    assert (a["true_cluster"].values >= 0).all()
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["data_hash"] and m["git"] and {"ari", "nmi", "micro_acc"} <= set(m["final"])
    # every test sample's final prediction, in store order: their accuracy is the reported one
    from mcfl.data import load

    data = load(digits_store)
    p = pd.read_csv(tmp_path / "predictions.csv")
    assert len(p) == sum(data.n_test()) and (p["pred"] >= 0).all()
    assert p["client"].tolist() == np.repeat(data.client_ids, data.n_test()).tolist()
    assert p["y"].tolist() == np.asarray(data.y_test).tolist()
    assert (p["y"] == p["pred"]).mean() == pytest.approx(res["final"]["micro_acc"])


def _outputs(d):
    """A run directory's results without its seconds: what a grouped job must reproduce."""
    import torch

    hist = pd.read_csv(d / "history.csv")
    hist = hist.drop(columns=[c for c in hist.columns if c.endswith("_s")])
    m = json.loads((d / "metrics.json").read_text())
    state = torch.load(d / "state.pt", weights_only=True)
    return hist, m["final"], (d / "predictions.csv").read_bytes(), (d / "assignments.csv").read_bytes(), state


@pytest.mark.parametrize("method, params", [("FedAvg", {}), pytest.param("FeSEM", {"K": 2, "restarts": 2},
                                                                          marks=pytest.mark.slow)])
def test_one_process_training_several_seeds_writes_what_one_job_per_seed_writes(method, params,
                                                                                digits_store, tmp_path):
    """`mcfl train --run A --out a --run B --out b` (the workflow's `seeds_per_job: all`): each run's
    outputs equal those of training it alone, whatever ran before it in the process."""
    import torch

    from mcfl import cli

    runs = [make_run(method=method, params=params, seed=s, rounds=2) for s in (1, 0)]
    common = ["--store", str(digits_store), "--no-tracking", "--no-progress", "--threads", "1"]
    for i, run in enumerate(runs):
        assert cli.main(["train", "--run", json.dumps(run), "--out", str(tmp_path / f"alone{i}"),
                         *common]) == 0
    argv = ["train"]
    for i, run in enumerate(runs):
        argv += ["--run", json.dumps(run), "--out", str(tmp_path / f"group{i}"),
                 "--checkpoint", str(tmp_path / f"ck{i}.pt")]
    assert cli.main(argv + common) == 0
    for i in range(2):
        alone, group = _outputs(tmp_path / f"alone{i}"), _outputs(tmp_path / f"group{i}")
        pd.testing.assert_frame_equal(alone[0], group[0])
        assert alone[1:4] == group[1:4]
        assert alone[4].keys() == group[4].keys()
        for key, value in alone[4].items():
            if torch.is_tensor(value):
                assert torch.equal(value, group[4][key]), key
    # the two seeds differ: the second run did not repeat the first
    assert _outputs(tmp_path / "group0")[2] != _outputs(tmp_path / "group1")[2]


def test_checkpoint_clock_bounds_the_time_checkpoints_take():
    """Quick writes: every due checkpoint. A 2-second write: the next waits for 38 s of training
    (19 x 2 s: checkpoints then take at most 5% of the run's time)."""
    from mcfl.runner import CheckpointClock

    now = [100.0]
    c = CheckpointClock(clock=lambda: now[0])
    assert c.due()
    now[0] += 0.5                                    # a 0.5 s write: under a second, no limit
    c.wrote(100.0)
    assert c.due()
    start = now[0] = 110.0
    now[0] += 2.0                                    # a 2 s write
    c.wrote(start)
    now[0] += 37.9
    assert not c.due()
    now[0] += 0.1
    assert c.due()


def test_a_slow_checkpoint_skips_the_next_due_ones(digits_store, tmp_path, monkeypatch):
    """With every write counted as slow, the run checkpoints once (round 2 of 6, every 2 rounds)
    and still trains to the end; with the default limits this run's small checkpoints are all
    written (rounds 2 and 4)."""
    import mcfl.runner as runner

    saved = []
    orig = runner._save_checkpoint
    monkeypatch.setattr(runner, "_save_checkpoint", lambda path, algo, state, rnd, *a: saved.append(rnd)
                        or orig(path, algo, state, rnd, *a))
    run = make_run(rounds=6, checkpoint_every=2)
    train(run, digits_store, tmp_path / "a", checkpoint=tmp_path / "a.pt", progress=False)
    assert saved == [2, 4]
    saved.clear()
    monkeypatch.setattr(runner.CheckpointClock, "FREE_S", 0.0)
    monkeypatch.setattr(runner.CheckpointClock, "SHARE", 1e-9)
    res = train(run, digits_store, tmp_path / "b", checkpoint=tmp_path / "b.pt", progress=False)
    assert saved == [2] and res["final"]["micro_acc"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap settings: Linux only")
def test_keeping_freed_memory_changes_no_result(digits_store, tmp_path):
    """`mcfl train` keeps freed memory in the process (``keep_freed_memory``, glibc's heap settings):
    the same run in a process with glibc's defaults writes the same results, bit for bit (the
    batched executor's stacked path, where the step's memory is freed and taken again)."""
    import subprocess

    from mcfl.runner import keep_freed_memory

    script = ("import sys, mcfl.runner as r\n"
              "if sys.argv[1] == 'default': r.keep_freed_memory = lambda: False\n"
              "from mcfl import cli\n"
              "sys.exit(cli.main(['train', '--run', sys.argv[2], '--out', sys.argv[3], '--store', sys.argv[4],"
              " '--no-tracking', '--no-progress', '--threads', '1']))\n")
    run = json.dumps(make_run(method="FedAvg", rounds=2, executor="batched"))
    for mode in ("default", "kept"):
        subprocess.run([sys.executable, "-c", script, mode, run, str(tmp_path / mode), str(digits_store)],
                       check=True)
    default, kept = _outputs(tmp_path / "default"), _outputs(tmp_path / "kept")
    pd.testing.assert_frame_equal(default[0], kept[0])
    assert default[1:4] == kept[1:4]
    assert keep_freed_memory() is True
