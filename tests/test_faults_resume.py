"""The fault suite, resume and determinism (``pytest -m faults``): a run killed at any point
resumes bit for bit from its checkpoint (in-process, a killed CLI process, Snakemake's
``--rerun-incomplete``), checkpoints refused or moved as they must be, the same seed repeating
bitwise, divergence stopping the run. Tests parametrised by ``METHODS`` cover every registered
algorithm, so a new method is checked against the state contract of ``algorithms/base.py``.
"""

import copy
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from conftest import ROOT, interrupt_round, make_run, small_params
from fault_helpers import TIERED_METHODS, _DieAt, _cli_train, _one_line_error, mlflow_runs, outputs
from mcfl import cli
from mcfl.config import expand_runs, validate
from mcfl.data import load
from mcfl.engine import DivergenceError, Task
from mcfl.federation import build_federation
from mcfl.report.format import machine
from mcfl.runner import train
from mcfl.timing import without_times
from mcfl.track import MLflowTracker

pytestmark = pytest.mark.faults


# =========================================================================================== resume
@pytest.mark.parametrize("method", TIERED_METHODS)
def test_interrupted_run_resumes_bitwise_from_a_fresh_instance(method, digits_store, tmp_path, monkeypatch):
    """The checkpoint holds everything between rounds: a fresh algorithm instance (as in a new
    process; init() is not called) resumed from it ends bitwise where an uninterrupted run ends."""
    run = make_run(method=method, params=small_params(method), rounds=5, clients_per_round=4,
                   checkpoint_every=2, eval_every=2)
    full = train(run, digits_store, tmp_path / "full", progress=False)
    ck = tmp_path / "ck.pt"
    restore = interrupt_round(monkeypatch, method, 4)     # the job dies during round 4
    with pytest.raises(KeyboardInterrupt):
        train(run, digits_store, tmp_path / "resumed", checkpoint=ck, progress=False)
    restore()
    assert torch.load(ck, weights_only=True)["round"] == 2
    assert not (tmp_path / "resumed" / "metrics.json").exists()
    resumed = train(run, digits_store, tmp_path / "resumed", checkpoint=ck, progress=False)
    assert resumed["final"] == full["final"]
    assert outputs(tmp_path / "resumed") == outputs(tmp_path / "full")
    assert not ck.exists()                            # removed once the run is done


@pytest.mark.slow
def test_a_checkpoint_of_this_run_with_other_settings_is_ignored(digits_store, tmp_path, caplog):
    """(A file that is no checkpoint of this run is refused: tests/test_foreign_files.py.)"""
    run = make_run(rounds=2, checkpoint_every=1)
    ref = train(run, digits_store, tmp_path / "ref", progress=False)
    ck = tmp_path / "ck.pt"
    other = make_run(rounds=4, checkpoint_every=1, lr=0.05)      # killed run of another config
    with pytest.raises(KeyboardInterrupt):
        train(other, digits_store, tmp_path / "b", checkpoint=ck, progress=False, tracker=_DieAt(3))
    with caplog.at_level(logging.WARNING, "mcfl"):
        assert train(run, digits_store, tmp_path / "c", checkpoint=ck, progress=False)["final"] == ref["final"]
    assert "belongs to another configuration" in caplog.text


@pytest.mark.parametrize("method", ["NaiveGSP+ICG", "FeSEM", "NoFed"])
def test_a_checkpoint_puts_models_on_the_run_device_and_indices_on_the_cpu(method, digits_store,
                                                                           tmp_path, monkeypatch):
    """Resuming on another device (tests/executors/test_cuda.py does it on a GPU): the float tensors (models)
    go to the resuming run's device, here PyTorch's "meta" device, and the index tensors (groups,
    assignments, flags) stay on the CPU, where init() makes them and round() reads them with
    .numpy(). Mapping the whole state to the device broke CPU -> CUDA resumes."""
    from mcfl.io import state_on

    run = make_run(method=method, params=small_params(method), rounds=3, clients_per_round=6,
                   checkpoint_every=1)
    ck = tmp_path / "ck.pt"
    restore = interrupt_round(monkeypatch, method, 2)
    with pytest.raises(KeyboardInterrupt):
        train(run, digits_store, tmp_path / "out", checkpoint=ck, progress=False)
    restore()
    state = torch.load(ck, weights_only=True)["state"]
    moved = state_on(state, torch.device("meta"))
    tensors = {k: v for k, v in moved.items() if torch.is_tensor(v)}
    floats = {k for k, v in tensors.items() if v.is_floating_point()}
    assert floats and len(floats) < len(tensors)            # both kinds are present
    for k, v in tensors.items():
        assert v.device.type == ("meta" if k in floats else "cpu"), k
        assert v.shape == state[k].shape and v.dtype == state[k].dtype, k


@pytest.mark.slow
def test_a_checkpoint_from_another_cpu_or_torch_resumes_with_a_warning(digits_store, tmp_path,
                                                                         caplog, monkeypatch):
    run = make_run(rounds=3, checkpoint_every=1)
    ck = tmp_path / "ck.pt"
    with pytest.raises(KeyboardInterrupt):
        train(run, digits_store, tmp_path / "a", checkpoint=ck, progress=False, tracker=_DieAt(2))
    assert torch.load(ck, weights_only=True)["cpu"] == torch.backends.cpu.get_cpu_capability()
    real_cpu, real_torch = torch.backends.cpu.get_cpu_capability(), str(torch.__version__)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "OTHER_ISA")
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    with caplog.at_level(logging.WARNING, "mcfl"):
        m = train(run, digits_store, tmp_path / "b", checkpoint=ck, progress=False)
    assert "written with cpu" in caplog.text and "resuming with OTHER_ISA" in caplog.text
    assert "written with torch" in caplog.text and "resuming with 0.0.0-other" in caplog.text
    assert (m["cpu"], m["torch"]) == ("OTHER_ISA", "0.0.0-other")       # recorded in metrics.json
    assert m["rounds"] == 3
    # which machine trained which rounds: round 1 here (the checkpoint), rounds 2-3 on the "other" one
    first, second = m["segments"]
    assert (first["from"], first["to"], first["device"], first["torch"]) == (1, 1, "cpu", real_torch)
    assert (second["from"], second["to"], second["cpu"], second["torch"]) == (2, 3, "OTHER_ISA", "0.0.0-other")
    assert machine(m) == (f"cpu ({real_cpu}, 1 thread(s), torch {real_torch}) rounds 1-1 + "
                          "cpu (OTHER_ISA, 1 thread(s), torch 0.0.0-other) rounds 2-3")
    assert "segments" not in train(run, digits_store, tmp_path / "c", progress=False)   # not resumed


def test_a_checkpoint_without_segments_names_its_rounds_from_its_identity(digits_store, tmp_path):
    """A checkpoint written before runs recorded their segments (a GPU run's, say) still says, in
    the resumed run's metrics.json, which rounds it held and the torch/CPU that wrote them."""
    run = make_run(rounds=3, checkpoint_every=1)
    ck = tmp_path / "ck.pt"
    with pytest.raises(KeyboardInterrupt):
        train(run, digits_store, tmp_path / "a", checkpoint=ck, progress=False, tracker=_DieAt(2))
    old = torch.load(ck, weights_only=True)
    del old["segments"]
    old["torch"] = "2.11.0+cu130"
    torch.save(old, ck)
    m = train(run, digits_store, tmp_path / "b", checkpoint=ck, progress=False)
    assert [(s["from"], s["to"], s["device"]) for s in m["segments"]] == [(1, 1, "?"), (2, 3, "cpu")]
    assert machine(m).startswith("? (") and "torch 2.11.0+cu130) rounds 1-1 + cpu (" in machine(m)


def _checkpoint_round(path: Path) -> int:
    try:
        return int(torch.load(path, weights_only=True)["round"])
    except Exception:  # noqa: BLE001 - not there yet
        return 0


def _wait_for_checkpoint(proc, path: Path, rnd: int, timeout: float = 300) -> None:
    end = time.time() + timeout
    while _checkpoint_round(path) < rnd:
        if proc.poll() is not None:
            raise AssertionError(f"process ended ({proc.returncode}) before checkpoint {rnd}")
        if time.time() > end:
            raise AssertionError(f"no checkpoint of round {rnd} after {timeout} s")
        time.sleep(0.02)


@pytest.mark.slow
def test_killed_cli_process_resumes_bitwise_and_continues_its_mlflow_run(digits_store, tmp_path, mlflow_uri):
    """`mcfl train` is killed at random rounds (SIGTERM once, then SIGKILL), rerun each time, and
    must end bitwise equal to an uninterrupted run, in one MLflow run with every round once."""
    seed = int(os.environ.get("MCFL_FAULT_SEED") or time.time_ns() % 10_000)
    rng = random.Random(seed)
    R = 16
    kills = [rng.randint(1, 3)]
    for _ in range(2):                                             # three kill points, <= R - 3
        kills.append(kills[-1] + rng.randint(3, 4))
    run = make_run(method="FeSEM", params={"K": 2, "restarts": 2}, rounds=R, clients_per_round=8,
                   checkpoint_every=1, eval_every=3)
    ref = train(run, digits_store, tmp_path / "ref", progress=False)
    out, ck = tmp_path / "out", tmp_path / "ck.pt"
    cmd = [shutil.which("mcfl", path=str(Path(sys.executable).parent)) or "mcfl", "train",
           "--run", json.dumps(run), "--store", str(digits_store), "--out", str(out),
           "--checkpoint", str(ck), "--no-progress", "--threads", "1"]
    env = dict(os.environ, MLFLOW_TRACKING_URI=mlflow_uri)
    client, _ = mlflow_runs(mlflow_uri, "test")
    why = f"(MCFL_FAULT_SEED={seed}, kill points {kills})"
    run_id = None
    for i, k in enumerate(kills):
        proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)     # a few log lines only
        _wait_for_checkpoint(proc, ck, k)
        time.sleep(rng.uniform(0, 0.15))                          # somewhere in a later round
        proc.send_signal(signal.SIGTERM if i == 0 else signal.SIGKILL)
        err = proc.communicate(timeout=120)[1]
        assert proc.returncode == (128 + signal.SIGTERM if i == 0 else -signal.SIGKILL), err + why
        assert not (out / "metrics.json").exists(), why
        run_id = run_id or torch.load(ck, weights_only=True)["tracking_id"]
        assert torch.load(ck, weights_only=True)["tracking_id"] == run_id
        assert client.get_run(run_id).info.status == ("KILLED" if i == 0 else "RUNNING"), why
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + why
    assert "resuming" in done.stderr
    final = json.loads((out / "metrics.json").read_text())["final"]
    assert final == ref["final"], why
    assert outputs(out) == outputs(tmp_path / "ref"), why
    _, runs = mlflow_runs(mlflow_uri, "test")
    assert [r.info.run_id for r in runs] == [run_id] and runs[0].info.status == "FINISHED"
    hist = without_times(pd.read_csv(tmp_path / "ref" / "history.csv"))     # seconds differ per run
    for key in hist.columns.drop("round"):
        want = hist[["round", key]].dropna()
        got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert got == list(zip(want["round"], want[key].astype(float))), f"{key} {why}"
    print(f"resumed identically after kills at checkpoints {kills} (MCFL_FAULT_SEED={seed})")


@pytest.mark.slow
def test_snakemake_rerun_incomplete_resumes_a_killed_job(tmp_path, cli_env):
    """Snakemake and its training job are SIGKILLed; `--unlock` then `--rerun-incomplete` resumes
    the job from its checkpoint (which lives outside the job's outputs) to the same result."""
    import psutil

    cfg = {"experiment": "ri-test", "seeds": [0],
           "datasets": {"digits": {"prepare": {"source": "digits", "clients": 12, "clusters": 2, "seed": 0},
                                   "model": {"name": "digits_cnn"},
                                   "train": {"rounds": 30, "lr": 0.1, "eval_every": 5,
                                             "clients_per_round": 6, "checkpoint_every": 2}}},
           "methods": [{"method": "FedAvg"}]}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    smk = [shutil.which("snakemake", path=str(Path(sys.executable).parent)) or "snakemake",
           "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--cores", "1"]
    ck = tmp_path / "results" / "checkpoints" / "digits" / "FedAvg" / "seed0.pt"
    run_dir = tmp_path / "results" / "runs" / "digits" / "FedAvg" / "seed0"
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(smk, env=cli_env, stdout=log, stderr=subprocess.STDOUT)
    _wait_for_checkpoint(proc, ck, 6)
    tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    for p in tree:                                                 # Snakemake first: no clean-up
        p.kill()
    proc.wait()
    assert not (run_dir / "metrics.json").exists()
    assert subprocess.run(smk + ["--unlock"], env=cli_env, capture_output=True).returncode == 0
    r = subprocess.run(smk + ["--rerun-incomplete"], env=cli_env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming FedAvg from round" in (tmp_path / "logs/train/digits/FedAvg/seed0.log").read_text()
    ref = train(expand_runs(validate(copy.deepcopy(cfg)))[0], tmp_path / "data" / "digits",
                tmp_path / "ref", progress=False)
    assert json.loads((run_dir / "metrics.json").read_text())["final"] == ref["final"]
    assert outputs(run_dir) == outputs(tmp_path / "ref")
    assert not ck.exists()
    _, runs = mlflow_runs(cli_env["MLFLOW_TRACKING_URI"], "ri-test")
    jobs = [r for r in runs if r.data.tags.get("sweep") != "true"]
    assert len(jobs) == 1 and jobs[0].info.status == "FINISHED"


class _DyingMLflow(MLflowTracker):
    """An MLflow tracker that interrupts the run when round ``r`` is logged."""

    def __init__(self, r, **kw):
        super().__init__("test", **kw)
        self.r = r

    def log(self, metrics, step):
        if step == self.r:
            raise KeyboardInterrupt
        super().log(metrics, step)


@pytest.mark.slow
def test_resume_whose_mlflow_run_was_deleted_records_a_new_run(digits_store, tmp_path, mlflow_uri, caplog):
    run = make_run(rounds=3, checkpoint_every=1)
    ck = tmp_path / "ck.pt"
    with pytest.raises(KeyboardInterrupt):
        train(run, digits_store, tmp_path / "out", checkpoint=ck, tracker=_DyingMLflow(3), progress=False)
    client, (old,) = mlflow_runs(mlflow_uri, "test")
    client.delete_run(old.info.run_id)
    with caplog.at_level(logging.WARNING, "mcfl"):
        train(run, digits_store, tmp_path / "out", checkpoint=ck, tracker=MLflowTracker("test"), progress=False)
    assert f"MLflow run {old.info.run_id} is not in" in caplog.text
    _, (new,) = mlflow_runs(mlflow_uri, "test")                # deleted runs are not listed
    assert new.info.run_id != old.info.run_id and new.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(new.info.run_id, "train_loss")] == [1, 2, 3]


@pytest.mark.slow
def test_resumed_mlflow_run_records_each_round_once(digits_store, tmp_path, mlflow_uri):
    """A job killed after MLflow already holds rounds beyond its checkpoint: the resumed job
    continues the same MLflow run without recording any round twice."""
    run = make_run(rounds=6, checkpoint_every=3, eval_every=2)
    ck = tmp_path / "ck.pt"
    with pytest.raises(KeyboardInterrupt):             # sends every metric at once, dies in round 5
        train(run, digits_store, tmp_path / "out", checkpoint=ck, tracker=_DyingMLflow(5, flush_every=1),
              progress=False)
    client, runs = mlflow_runs(mlflow_uri, "test")
    (killed,) = runs
    assert killed.info.status == "KILLED"
    assert max(m.step for m in client.get_metric_history(killed.info.run_id, "train_loss")) == 4
    train(run, digits_store, tmp_path / "out", checkpoint=ck, tracker=MLflowTracker("test"), progress=False)
    _, runs = mlflow_runs(mlflow_uri, "test")
    assert [r.info.run_id for r in runs] == [killed.info.run_id] and runs[0].info.status == "FINISHED"
    hist = pd.read_csv(tmp_path / "out" / "history.csv")
    for key in ("train_loss", "micro_acc"):
        got = sorted((m.step, m.value) for m in client.get_metric_history(killed.info.run_id, key))
        want = hist[["round", key]].dropna()
        assert got == list(zip(want["round"], want[key].astype(float))), key
    assert len(list((tmp_path / "mlartifacts").rglob("metrics.json"))) == 1


def test_lock_errors_are_retried_and_logged(monkeypatch, caplog):
    from mcfl import track

    monkeypatch.setattr(track.time, "sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "ok"

    with caplog.at_level(logging.INFO, "mcfl"):
        assert track._retry(flaky) == "ok"
    assert len(calls) == 3 and caplog.text.count("database is locked); retry") == 2
    with pytest.raises(KeyError):                   # anything else is not retried
        track._retry(lambda: {}["x"])


def test_cli_sets_cublas_workspace_before_anything_runs(monkeypatch, capsys):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert cli.main(["methods"]) == 0
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.cuda.is_initialized()


# ===================================================================================== determinism
@pytest.mark.parametrize("method", TIERED_METHODS)
def test_same_seed_repeats_bitwise_other_seed_differs(method, digits_store, tmp_path):
    run = make_run(method=method, params=small_params(method), rounds=3, clients_per_round=4)
    a = train(run, digits_store, tmp_path / "a", progress=False)
    b = train(run, digits_store, tmp_path / "b", progress=False)
    assert a["final"] == b["final"]
    assert outputs(tmp_path / "a") == outputs(tmp_path / "b")
    c = train(dict(run, seed=1), digits_store, tmp_path / "c", progress=False)
    assert c["final"] != a["final"]


def test_local_update_does_not_depend_on_order_or_other_clients(digits_store):
    fed = build_federation(load(digits_store), {"name": "digits_cnn"}, make_run()["train"], 0)
    alone = {c: fed.trainer.train(Task(c, fed.w0), 5).weights for c in (3, 7, 11)}
    crowd = {t.client: r.weights for t, r in fed.trainer.run([Task(c, fed.w0) for c in range(15, -1, -1)], 5)}
    assert all(torch.equal(alone[c], crowd[c]) for c in alone)


# ======================================================================================= divergence
def test_divergence_fails_the_mlflow_run_and_leaves_no_result(digits_store, tmp_path, mlflow_uri, capsys):
    out = tmp_path / "out"

    def cli_train(run):
        return cli.main(["train", "--run", json.dumps(run), "--store", str(digits_store),
                         "--out", str(out), "--no-progress", "--threads", "1"])

    assert cli_train(make_run(rounds=2)) == 0 and (out / "metrics.json").exists()
    assert cli_train(make_run(rounds=2, lr=1e6)) == 1
    assert re.search(r"round 1, client \d+: local training diverged", capsys.readouterr().err)
    assert not (out / "metrics.json").exists()                 # the earlier result is gone too
    _, runs = mlflow_runs(mlflow_uri, "test")
    assert sorted(r.info.status for r in runs) == ["FAILED", "FINISHED"]


def test_non_finite_server_metric_stops_the_run(digits_store, tmp_path, monkeypatch):
    from mcfl.algorithms.fedavg import FedAvg

    real = FedAvg.round
    monkeypatch.setattr(FedAvg, "round", lambda self, s, c, r: (real(self, s, c, r)[0], {"train_loss": float("inf")}))
    with pytest.raises(DivergenceError, match=r"round 1: non-finite train_loss"):
        train(make_run(rounds=2), digits_store, tmp_path, progress=False)
    assert not (tmp_path / "metrics.json").exists()


# checkpoints: validated on load (round in range, history one row per round, types)
def _damage_checkpoint(ck: Path, **changes) -> None:
    d = torch.load(ck, weights_only=True)
    for k, v in changes.items():
        d[k] = v(d) if callable(v) else v
    torch.save(d, ck)


CHECKPOINT_FAULTS = [
    ("round-at-rounds", {"round": 4}, r"round is 4, outside 1\.\.3"),
    ("round-past-rounds", {"round": 99}, r"round is 99, outside 1\.\.3"),
    ("round-zero", {"round": 0}, r"round is 0, outside 1\.\.3"),
    ("round-text", {"round": "2"}, r"round is '2', not an integer"),
    ("round-float", {"round": 2.0}, r"round is 2\.0, not an integer"),
    ("history-none", {"history": None}, r"history is NoneType, not a list of rows"),
    ("history-short", {"history": lambda d: d["history"][:1]}, r"history has 1 rows for 2 rounds done"),
    ("history-renumbered", {"history": lambda d: d["history"][::-1]}, r"history rows are not rounds 1\.\.2"),
    ("state-list", {"state": []}, r"state is list, not a mapping of tensors"),
    ("tracking-id-int", {"tracking_id": 7}, r"tracking_id is not a string"),
    ("segments-text", {"segments": "x"}, r"segments is not a list of mappings"),
]


@pytest.mark.parametrize("changes, message", [c[1:] for c in CHECKPOINT_FAULTS], ids=[c[0] for c in CHECKPOINT_FAULTS])
def test_a_damaged_checkpoint_is_one_line_naming_the_key(changes, message, digits_store, tmp_path, capsys):
    run, ck = make_run(rounds=4, checkpoint_every=1), tmp_path / "ck.pt"
    with pytest.raises(KeyboardInterrupt):
        train(run, digits_store, tmp_path / "a", checkpoint=ck, progress=False, tracker=_DieAt(3))
    _damage_checkpoint(ck, **changes)
    assert _cli_train(run, digits_store, tmp_path / "out", "--checkpoint", str(ck)) == 1
    _one_line_error(capsys.readouterr().err, "train", rf"{re.escape(str(ck))}: {message}; the checkpoint is damaged")
    assert ck.exists() and not (tmp_path / "out" / "metrics.json").exists()


def test_sigterm_during_the_final_rename_leaves_no_metrics_json(digits_store, tmp_path, monkeypatch):
    """SIGTERM arriving while metrics.json is renamed into place (the CLI turns it into SystemExit
    right after the rename): the run is KILLED and every output it wrote is removed."""
    import mcfl.io as mio

    real = os.replace

    def replace(src, dst):
        real(src, dst)
        if Path(dst).name == "metrics.json":
            cli._terminate(signal.SIGTERM, None)

    monkeypatch.setattr(mio.os, "replace", replace)
    with pytest.raises(SystemExit) as e:
        train(make_run(rounds=2), digits_store, tmp_path / "out", progress=False)
    assert e.value.code == 128 + signal.SIGTERM
    assert [p.name for p in (tmp_path / "out").iterdir()] == []
