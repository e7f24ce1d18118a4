"""The fault suite (``pytest -m faults``): resume after kills, determinism, divergence, bad config and
bad data, atomic outputs, concurrent tracking. The README's "Reliability" section tabulates what
the user sees for each failure mode. Tests parametrised by ``METHODS`` cover every registered
algorithm, so a new method is checked against the state contract of ``algorithms/base.py``.
"""

import copy
import json
import logging
import os
import random
import re
import shutil
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from conftest import ROOT, interrupt_round, make_run, small_params
from mcfl import algorithms, cli
from mcfl.config import ConfigError, expand_runs, validate
from mcfl.data import ClientData, StoreError, load, write_store
from mcfl.data.store import content_hash
from mcfl.data.write import write_arrays
from mcfl.engine import DivergenceError, Task
from mcfl.federation import build_federation
from mcfl.io import sha256_file
from mcfl.report.format import machine
from mcfl.runner import train
from mcfl.timing import without_times
from mcfl.track import MLflowTracker, Tracker

pytestmark = pytest.mark.faults
METHODS = sorted(algorithms.ALGORITHMS)
#: the per-method resume, determinism and order checks: the fast tier (-m "not slow") runs them for
#: one algorithm of each kind of state (a model, server moments, centres, a split tree, groups), the
#: slow tier for every other one
FAST_METHODS = {"FedAvg", "FedSGD", "FedAdam", "FeSEM", "FedCluster", "FedGSP", "NaiveGSP+ICG"}
TIERED_METHODS = [m if m in FAST_METHODS else pytest.param(m, marks=pytest.mark.slow) for m in METHODS]


def outputs(d: Path) -> dict[str, bytes]:
    """A run's result files, byte for byte; history.csv without its per-round seconds (mcfl.timing)."""
    out = {f: (d / f).read_bytes() for f in ("assignments.csv", "predictions.csv", "state.pt")}
    out["history.csv"] = without_times(pd.read_csv(d / "history.csv")).to_csv(index=False).encode()
    return out


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory):
    """An MLflow sqlite store with its tables created once (a fresh one costs seconds)."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def mlflow_uri(migrated_db, tmp_path, monkeypatch):
    db = tmp_path / "mlflow.db"
    shutil.copy(migrated_db, db)
    uri = f"sqlite:///{db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)                       # artifacts land in tmp_path/mlartifacts
    return uri


def mlflow_runs(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


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


@pytest.mark.parametrize("method", METHODS)
def test_algorithms_keep_nothing_outside_their_state(method, digits_store):
    """The contract of algorithms/base.py: init() and round() set no attribute; State holds only
    tensors and numbers (so checkpoints load with weights_only=True)."""
    cls = algorithms.get(method)
    fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                           make_run(rounds=2, clients_per_round=8)["train"], 0)
    algo = cls(fed, cls.Params(**small_params(method)))
    before = dict(vars(algo))
    state = algo.init()
    for r in (1, 2):
        state, _ = algo.round(state, fed.clients(r), r)
    assert vars(algo).keys() == before.keys(), f"{method} set {set(vars(algo)) - set(before)}"
    assert all(vars(algo)[k] is v for k, v in before.items())
    assert all(isinstance(v, (torch.Tensor, int, float, bool)) for v in algo.state_dict(state).values())


class _DieAt(Tracker):
    """A tracker that interrupts the run when round ``r`` is logged."""

    def __init__(self, r):
        self.r = r

    def log(self, metrics, step):
        if step == self.r:
            raise KeyboardInterrupt


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
    """Resuming on another device (tests/test_cuda.py does it on a GPU): the float tensors (models)
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


@pytest.mark.parametrize("method", TIERED_METHODS)
def test_client_processing_order_does_not_change_results(method, digits_store):
    """Reversing the order clients are processed in changes only float rounding of server sums."""
    cls = algorithms.get(method)
    states = []
    for order in (1, -1):
        fed = build_federation(load(digits_store), {"name": "digits_cnn"},
                               make_run(rounds=2, clients_per_round=6)["train"], 0)
        algo = cls(fed, cls.Params(**small_params(method)))
        state = algo.init()
        for r in (1, 2):
            state, _ = algo.round(state, fed.clients(r)[::order].copy(), r)
        states.append(algo.state_dict(state))
    # FedMMD's local objective reads the global model twice (start and frozen stream) through a
    # kernel whose width follows the features: round 1's 3e-8 sum rounding grows to ~2e-6 in round 2
    atol = 1e-5 if method == "FedMMD" else 1e-6
    for key, a in states[0].items():
        b = states[1][key]
        if torch.is_tensor(a) and a.is_floating_point():
            assert torch.allclose(a, b, rtol=1e-5, atol=atol), key
        else:
            assert torch.equal(torch.as_tensor(a), torch.as_tensor(b)), key


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


# ============================================================================================= data
def _clients(n=3, n_train=4, n_test=2):
    rng = np.random.default_rng(0)
    return [ClientData(f"c{i}", rng.random((n_train, 2, 3), dtype=np.float32), np.arange(n_train) % 3,
                       rng.random((n_test, 2, 3), dtype=np.float32), np.arange(n_test) % 3) for i in range(n)]


def _arrays(clients):
    cat = lambda a: np.concatenate([getattr(c, a) for c in clients])   # noqa: E731
    off = lambda a: np.concatenate([[0], np.cumsum([len(getattr(c, a)) for c in clients])])   # noqa: E731
    arrays = {"x_train": cat("x_train"), "y_train": cat("y_train"), "offsets_train": off("y_train"),
              "x_test": cat("x_test"), "y_test": cat("y_test"), "offsets_test": off("y_test"),
              "cluster": np.full(len(clients), -1)}
    meta = {"format": "mcfl-store/2", "n_classes": 3, "x_shape": [2, 3], "x_scale": 1.0,
            "client_ids": [c.id for c in clients]}
    return arrays, meta


def _empty_train(cs):
    cs[1].x_train, cs[1].y_train = cs[1].x_train[:0], cs[1].y_train[:0]


def _no_tests(cs):
    for c in cs:
        c.x_test, c.y_test = c.x_test[:0], c.y_test[:0]


def _bad_label(cs):
    cs[2].y_test = np.array([0, 3])


def _bad_shape(cs):
    cs[1].x_train = np.zeros((4, 3, 2), np.float32)


def _nan(cs):
    cs[0].x_train[1, 0, 0] = np.nan


def _dup(cs):
    cs[2].id = "c0"


DATA_FAULTS = [(_empty_train, "no training samples"),
               (_bad_label, r"labels outside \[0, 2\] \(first: 3, client 'c2'\)"),
               (_bad_shape, "shape"), (_nan, "NaN or inf"), (_dup, "duplicate client ids")]


@pytest.mark.parametrize("fault, message", DATA_FAULTS)
def test_bad_data_is_rejected_by_write_store_and_write_arrays(fault, message, tmp_path):
    cs = _clients()
    fault(cs)
    with pytest.raises(StoreError, match=message):
        write_store(tmp_path / "s", cs, n_classes=3, source="unit", params={})
    if fault is not _bad_shape:          # pre-concatenated arrays (LEAF import) cannot mix shapes
        with pytest.raises(StoreError, match=message):
            write_arrays(tmp_path / "a", *_arrays(cs))
    assert list(tmp_path.iterdir()) == []                     # nothing half-written


@pytest.mark.parametrize("fault, message", DATA_FAULTS)
def test_bad_data_in_an_existing_store_is_rejected_at_load(fault, message, tmp_path):
    good = write_store(tmp_path / "s", _clients(), n_classes=3, source="unit", params={})
    cs = _clients()
    if fault is not _bad_shape:
        fault(cs)
    arrays, meta = _arrays(cs)
    if fault is _bad_shape:
        arrays["x_train"] = np.zeros((12, 3, 2), np.float32)
    stored = json.loads((good / "meta.json").read_text())
    for name, a in arrays.items():                  # a hand-made store: bad content, right hashes
        np.save(good / f"{name}.npy", a)
        stored["files"][f"{name}.npy"] = sha256_file(good / f"{name}.npy")
    stored["client_ids"] = meta["client_ids"]
    stored["content_hash"] = content_hash(stored)
    (good / "meta.json").write_text(json.dumps(stored))
    with pytest.raises(StoreError, match=message):
        load(good, verify=fault is _nan)                      # NaN scan: at write, or with verify


def test_a_store_without_any_test_sample_is_written_but_not_trained_on(tmp_path, caplog):
    cs = _clients()
    _no_tests(cs)
    with caplog.at_level(logging.WARNING, "mcfl"):
        store = write_store(tmp_path / "s", cs, n_classes=3, source="unit", params={})
    assert "no client has test samples" in caplog.text
    run = make_run(dataset="unit", model={"name": "logreg"})
    with pytest.raises(StoreError, match="no client has test samples, so nothing could be evaluated"):
        train(run, store, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_partitioner_rejects_clients_too_small_to_split():
    from mcfl.data.partition import classes_partition

    with pytest.raises(ValueError, match=r"clients got fewer than 2 samples"):
        classes_partition(np.repeat(np.arange(10), 3), 40, 1, np.random.default_rng(0), min_size=2)


@pytest.mark.parametrize("method", METHODS)
def test_one_sample_and_untested_clients_train_and_are_reported(method, tmp_path, caplog):
    """Documented skips: a client with one training sample trains on it; a client without test
    samples trains, is left out of the test metrics, and is named in a warning."""
    if method in ("FedCG", "FedFusion"):
        pytest.skip(f"{method} needs a convolutional model (image inputs); this store has 2x3 features")
    cs = _clients(n=6, n_train=5, n_test=3)
    cs[0].x_train, cs[0].y_train = cs[0].x_train[:1], cs[0].y_train[:1]
    cs[1].x_test, cs[1].y_test = cs[1].x_test[:0], cs[1].y_test[:0]
    with caplog.at_level(logging.WARNING, "mcfl"):
        store = write_store(tmp_path / "s", cs, n_classes=3, source="unit", params={})
        run = make_run(dataset="unit", method=method, params=small_params(method), rounds=2,
                       model={"name": "logreg"})
        res = train(run, store, tmp_path / "out", progress=False)
    assert caplog.text.count("1 of 6 clients have no test samples (c1)") == 2    # at write and at train
    assert 0 <= res["final"]["micro_acc"] <= 1
    assert (tmp_path / "out" / "metrics.json").exists()


# ========================================================================================== outputs
@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_store_killed_mid_write_leaves_nothing(error, tmp_path, monkeypatch):
    import mcfl.data.store as store

    real, calls = np.save, []

    def failing_save(path, arr, **kw):
        calls.append(path)
        if len(calls) == 4:
            raise error
        real(path, arr, **kw)

    monkeypatch.setattr(store.np, "save", failing_save)
    with pytest.raises(type(error)):
        write_store(tmp_path / "s", _clients(), n_classes=3, source="unit", params={})
    assert list(tmp_path.iterdir()) == []


# ====================================================================================== concurrency
@pytest.mark.slow
def test_parallel_jobs_share_one_sqlite_store_without_losing_a_run(tmp_path, cli_env):
    """8 training jobs at --cores 4 write to one sqlite MLflow store: every run recorded, FINISHED,
    with every round's metrics, and no lock error reaches a job."""
    cfg = {"experiment": "conc", "seeds": [0, 1, 2, 3],
           "datasets": {"digits": {"prepare": {"source": "digits", "clients": 12, "clusters": 2, "seed": 0},
                                   "model": {"name": "digits_cnn"},
                                   "train": {"rounds": 6, "lr": 0.1, "eval_every": 2,
                                             "clients_per_round": 4, "checkpoint_every": 1}}},
           "methods": [{"method": "FedAvg"}, {"method": "NoFed"}]}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    smk = [shutil.which("snakemake", path=str(Path(sys.executable).parent)) or "snakemake",
           "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--cores", "4"]
    r = subprocess.run(smk, env=cli_env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    client, runs = mlflow_runs(cli_env["MLFLOW_TRACKING_URI"], "conc")
    jobs = [x for x in runs if x.data.tags.get("sweep", "").startswith("config.yaml ")]
    assert len(jobs) == 8 == len(runs) and {x.info.status for x in jobs} == {"FINISHED"}
    for x in jobs:
        assert [m.step for m in client.get_metric_history(x.info.run_id, "train_loss")] == list(range(1, 7))
        assert sorted(m.step for m in client.get_metric_history(x.info.run_id, "micro_acc")) == [2, 4, 6]
    logs = "".join(p.read_text() for p in (tmp_path / "logs" / "train").rglob("*.log"))
    assert "Traceback" not in logs and "OperationalError" not in logs
    retries = logs.count("database is locked); retry")
    print(f"8 concurrent runs recorded; {retries} lock retries")


# ==================================================================================== fault tables
# Each table row is (case id, bad input, regex the one-line error must match). Add a row to add a
# case; families too large to list are generated from the schema or the store format. The README's
# reliability section counts these rows.


def _one_line_error(err: str, cmd: str, message: str) -> None:
    """``err`` (a command's stderr) ends with exactly one `mcfl <cmd>: error:` line matching
    ``message``, and holds no traceback."""
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if ": error: " in x]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"mcfl {cmd}: error: ") and re.search(message, lines[0]), lines[0]


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


# stores: every way a prepared store can change after `mcfl prepare` (generated per array file)
def _flip_byte(f: Path) -> None:
    b = bytearray(f.read_bytes())
    b[-1] ^= 0xFF                                # the last data byte: header and size unchanged
    f.write_bytes(bytes(b))


def _edit_meta(**kv):
    def edit(store: Path) -> None:
        meta = json.loads((store / "meta.json").read_text())
        meta.update(kv)
        (store / "meta.json").write_text(json.dumps(meta))
    return edit


STORE_FILES = ("x_train", "y_train", "offsets_train", "x_test", "y_test", "offsets_test", "cluster")
STORE_FAULTS = [
    *[(f"flip-{a}", (lambda s, a=a: _flip_byte(s / f"{a}.npy")), rf"{a}\.npy: sha256 differs from meta\.json")
      for a in STORE_FILES],
    *[(f"truncate-{a}", (lambda s, a=a: (s / f"{a}.npy").write_bytes((s / f"{a}.npy").read_bytes()[:-1])),
       rf"{a}\.npy: \d+ bytes, its header implies \d+") for a in STORE_FILES],
    *[(f"delete-{a}", (lambda s, a=a: (s / f"{a}.npy").unlink()), rf"{a}\.npy: missing from the store")
      for a in STORE_FILES],
    *[(f"meta-{k}", _edit_meta(**{k: v}), r"meta\.json: content hash does not match")
      for k, v in (("x_scale", 1.0), ("n_classes", 11), ("content_hash", "0" * 64),
                   ("client_ids", [f"x{i}" for i in range(16)]), ("x_dtype", "int8"))],
    ("meta-n_classes-text", _edit_meta(n_classes="ten"), r"meta\.json: n_classes must be an integer >= 1, found 'ten'"),
    ("meta-x_scale-text", _edit_meta(x_scale="big"), r"meta\.json: x_scale must be a finite number > 0"),
    ("meta-x_scale-nan", _edit_meta(x_scale=float("nan")), r"meta\.json: x_scale must be a finite number > 0"),
    ("meta-x_shape", _edit_meta(x_shape="8x8"), r"meta\.json: x_shape must be a list of integers"),
    ("meta-files", _edit_meta(files=[]), r"meta\.json: files must be an object of file hashes"),
    ("meta-old-format", _edit_meta(format="mcfl-store/1"), r"meta\.json: format 'mcfl-store/1'.*older mcfl"),
    ("meta-no-client_ids", lambda s: _edit_meta()(s) or _drop_meta_key(s, "client_ids"),
     r"meta\.json: missing key 'client_ids'"),
    ("meta-not-json", lambda s: (s / "meta.json").write_text("{"), r"meta\.json: not valid JSON"),
    ("meta-not-utf8", lambda s: (s / "meta.json").write_bytes(b"\xff{}"), r"meta\.json: not valid JSON"),
    ("meta-missing", lambda s: (s / "meta.json").unlink(), r"meta\.json: missing; .* is not a prepared store"),
    ("npy-garbage", lambda s: (s / "y_test.npy").write_bytes(b"garbage"), r"y_test\.npy: not a readable \.npy file"),
]


def _drop_meta_key(store: Path, key: str) -> None:
    meta = json.loads((store / "meta.json").read_text())
    del meta[key]
    (store / "meta.json").write_text(json.dumps(meta))


def _cli_train(run, store, out, *extra) -> int:
    return cli.main(["train", "--run", json.dumps(run), "--store", str(store), "--out", str(out),
                     "--no-tracking", "--no-progress", "--threads", "1", *extra])


@pytest.mark.parametrize("damage, message", [c[1:] for c in STORE_FAULTS], ids=[c[0] for c in STORE_FAULTS])
def test_a_changed_store_is_never_trained_on(damage, message, digits_store, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(digits_store, store)
    damage(store)
    assert _cli_train(make_run(rounds=1), store, tmp_path / "out") == 1
    _one_line_error(capsys.readouterr().err, "train", message)
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_a_checkpoint_is_not_resumed_on_a_changed_store(digits_store, tmp_path, capsys):
    store, ck = tmp_path / "store", tmp_path / "ck.pt"
    shutil.copytree(digits_store, store)
    run = make_run(rounds=3, checkpoint_every=1)
    with pytest.raises(KeyboardInterrupt):
        train(run, store, tmp_path / "out", checkpoint=ck, progress=False, tracker=_DieAt(2))
    _flip_byte(store / "x_train.npy")
    assert _cli_train(run, store, tmp_path / "out", "--checkpoint", str(ck)) == 1
    _one_line_error(capsys.readouterr().err, "train", r"x_train\.npy: sha256 differs")
    assert ck.exists() and not (tmp_path / "out" / "metrics.json").exists()


def test_the_content_hash_covers_metadata_but_not_provenance(tmp_path):
    a = write_store(tmp_path / "a", _clients(), n_classes=3, source="unit", params={"x": 1})
    b = write_store(tmp_path / "b", _clients(), n_classes=3, source="other", params={"x": 2})
    c = write_store(tmp_path / "c", _clients(), n_classes=4, source="unit", params={"x": 1})
    d = write_store(tmp_path / "d", _clients(), n_classes=3, source="unit", params={"x": 1}, x_scale=0.5)
    hashes = [load(s).content_hash for s in (a, b, c, d)]
    assert hashes[0] == hashes[1] and len(set(hashes)) == 3


# command-line arguments: argv (with {store}, {tmp}, {run}, {file}, {dir} filled in) -> message
def _run_json(**changes) -> str:
    run = make_run(rounds=1)
    for key, value in changes.items():
        if key.startswith("train_"):
            run["train"][key[6:]] = value
        else:
            run[key] = value
    return json.dumps(run)


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


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


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


# ===================================================================================== tracking, 2
_OPEN_STORE = ("import sys; from mcfl.track import _client, experiment_id; c = _client(); "
               "c.create_run(experiment_id(c, 'race'))")


@pytest.mark.slow
def test_parallel_processes_open_a_new_sqlite_store_once(tmp_path, cli_env):
    """Four processes open a sqlite store that does not exist yet, at once: MLflow creates its
    tables on first open and two doing that together fail; the store's init lock serialises it."""
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN_STORE], env=cli_env, cwd=tmp_path,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(e[-800:] for e in errs)
    _, runs = mlflow_runs(cli_env["MLFLOW_TRACKING_URI"], "race")
    assert len(runs) == 4


def _finished_run_dirs(store, root: Path, n: int) -> list[Path]:
    dirs = [root / f"run{i}" for i in range(n)]
    for i, d in enumerate(dirs):
        train(make_run(rounds=2, seed=i), store, d, progress=False)
    return dirs


@pytest.mark.slow
def test_concurrent_mcfl_track_records_each_run_once(digits_store, tmp_path, cli_env):
    dirs = _finished_run_dirs(digits_store, tmp_path, 3)
    mcfl = shutil.which("mcfl", path=str(Path(sys.executable).parent)) or "mcfl"
    procs = [subprocess.Popen([mcfl, "track", "--experiment", "trk", "--out", str(tmp_path / f"t{i}.tsv"),
                               *map(str, dirs)], env=cli_env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(errs)
    _, runs = mlflow_runs(cli_env["MLFLOW_TRACKING_URI"], "trk")
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    assert (tmp_path / "t0.tsv").read_text() == (tmp_path / "t1.tsv").read_text()


def test_mcfl_track_redoes_a_run_a_killed_track_left_half_recorded(digits_store, tmp_path, mlflow_uri, caplog):
    from mcfl.record import RECORD_TAG, record_finished

    (d,) = _finished_run_dirs(digits_store, tmp_path, 1)
    ((_, first),) = record_finished([d], "trk")
    client, _ = mlflow_runs(mlflow_uri, "trk")
    client.set_terminated(first, "RUNNING")                    # as if killed before its end
    with caplog.at_level(logging.WARNING, "mcfl"):
        ((_, second),) = record_finished([d], "trk")
    assert f"deleting MLflow run {first}" in caplog.text
    _, runs = mlflow_runs(mlflow_uri, "trk")
    assert [r.info.run_id for r in runs] == [second] != [first]
    assert runs[0].info.status == "FINISHED" and RECORD_TAG in runs[0].data.tags
    assert record_finished([d], "trk") == [(str(d), second)]    # now recorded: skipped


@pytest.mark.slow
def test_parallel_tracked_train_jobs_on_a_new_sqlite_store(digits_store, tmp_path, cli_env):
    """Three `mcfl train --tracking` at once, with MLFLOW_TRACKING_URI naming a file not yet made."""
    mcfl = shutil.which("mcfl", path=str(Path(sys.executable).parent)) or "mcfl"
    procs = [subprocess.Popen([mcfl, "train", "--run", json.dumps(make_run(rounds=1, seed=i)),
                               "--store", str(digits_store), "--out", str(tmp_path / f"o{i}"),
                               "--tracking", "--no-progress"], env=cli_env, cwd=tmp_path,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, "\n".join(e[-1500:] for e in errs)
    _, runs = mlflow_runs(cli_env["MLFLOW_TRACKING_URI"], "test")
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    assert all((tmp_path / f"o{i}" / "metrics.json").exists() for i in range(3))


# tracking faults
# A store that cannot be used: (case id, MLFLOW_TRACKING_URI with {tmp}/{file}/{port} filled in, or
# "full" for a disk that fills under the store, regex of the one line). Without
# MCFL_TRACKING_UNREACHABLE the job stops before training; with it set to `defer` it trains untracked.
TRACKING_FAULTS = [
    ("store-garbage-file", "sqlite:///{file}", r"MLflow tracking store sqlite:///{file}: not an MLflow database .*move"),
    ("store-bogus-uri", "bogus://x", r"MLflow tracking store bogus://x: not a tracking URI MLflow knows; set MLFLOW_TRACKING_URI"),
    ("store-under-a-file", "sqlite:///{file}/mlflow.db", r"MLflow tracking store sqlite:///{file}/mlflow\.db: cannot be opened"),
    ("store-disk-full", "full", r"MLflow tracking store sqlite:///.*: the disk is full; free space"),
    ("server-unreachable", "http://127.0.0.1:{port}", r"MLflow tracking server http://127\.0\.0\.1:{port} is unreachable"),
]


@pytest.mark.parametrize("defer", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["fail", "defer"])
@pytest.mark.parametrize("uri, message", [c[1:] for c in TRACKING_FAULTS], ids=[c[0] for c in TRACKING_FAULTS])
def test_tracking_store_faults_are_one_line_and_defer_trains_on(uri, message, defer, digits_store, migrated_db,
                                                                tmp_path, monkeypatch, capsys, caplog):
    import socket
    import sqlite3

    with socket.socket() as sock:                              # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    fill = {"tmp": str(tmp_path), "file": str(tmp_path / "garbage.db"), "port": port}
    (tmp_path / "garbage.db").write_bytes(bytes(range(256)) * 40)
    if uri == "full":
        shutil.copy(migrated_db, tmp_path / "mlflow.db")
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        from mlflow import MlflowClient

        def full(*a, **k):
            raise sqlite3.OperationalError("database or disk is full")
        monkeypatch.setattr(MlflowClient, "log_batch", full)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _fill(uri, fill))
    monkeypatch.setenv("MCFL_TRACKING_WAIT", "0")
    monkeypatch.chdir(tmp_path)
    if defer:
        monkeypatch.setenv("MCFL_TRACKING_UNREACHABLE", "defer")
    with caplog.at_level(logging.WARNING, "mcfl"):
        code = cli.main(["train", "--run", _run_json(), "--store", str(digits_store), "--out",
                         str(tmp_path / "out"), "--tracking", "--no-progress", "--threads", "1"])
    err = capsys.readouterr().err
    message = _fill(message, {k: re.escape(v) for k, v in fill.items()})
    if not defer:
        assert code == 1
        _one_line_error(err, "train", message)
        assert not (tmp_path / "out" / "metrics.json").exists()
    else:                                                      # one warning, then the run trains
        assert code == 0 and "Traceback" not in err + caplog.text, err
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and re.search(message, warned[0]) and "\n" not in warned[0], warned
        assert "defer: training" in warned[0] and (tmp_path / "out" / "metrics.json").exists()


def test_a_run_killed_before_its_first_checkpoint_is_replaced_by_its_rerun(digits_store, tmp_path, mlflow_uri,
                                                                           caplog):
    run = make_run(rounds=2)
    t = MLflowTracker("orphan")
    first = t.start(run, {"git": "x", "data_hash": "d", "run_hash": "h"})    # then SIGKILL: stays RUNNING
    client, runs = mlflow_runs(mlflow_uri, "orphan")
    assert [r.info.status for r in runs] == ["RUNNING"]
    t = MLflowTracker("orphan")
    with caplog.at_level(logging.WARNING, "mcfl"):
        second = t.start(run, {"git": "x", "data_hash": "d", "run_hash": "h"})
    t.end("FINISHED")
    assert f"MLflow run {first} (FedAvg · digits · s0) was left RUNNING" in caplog.text
    assert client.get_run(first).info.status == "KILLED"
    assert client.get_run(first).info.lifecycle_stage == "deleted"
    _, runs = mlflow_runs(mlflow_uri, "orphan")                 # one run of that name
    assert [(r.info.run_id, r.info.status, r.info.run_name) for r in runs] == \
        [(second, "FINISHED", "FedAvg · digits · s0")]


def test_mcfl_track_skips_a_run_tracked_live(digits_store, tmp_path, mlflow_uri):
    from mcfl.record import record_finished

    train(make_run(rounds=2), digits_store, tmp_path / "run", tracker=MLflowTracker("live"), progress=False)
    _, (live,) = mlflow_runs(mlflow_uri, "live")
    assert record_finished([tmp_path / "run"], "live") == [(str(tmp_path / "run"), live.info.run_id)]
    _, runs = mlflow_runs(mlflow_uri, "live")
    assert [r.info.run_id for r in runs] == [live.info.run_id]


# ====================================================================================== quoting
RULE_FILES = sorted((ROOT / "workflow" / "rules").glob("*.smk"))


def _shell_fields(path: Path) -> list[str]:
    """The {fields} of every shell command in a rule file."""
    text = path.read_text()
    blocks = re.findall(r"\n(\s+)shell:\n((?:\1\s+\".*\"\s*\n)+)", text)
    return [f for _, block in blocks for f in re.findall(r"\{([^{}]+)\}", "".join(re.findall(r'"(.*)"', block)))]


@pytest.mark.parametrize("path", RULE_FILES, ids=[p.name for p in RULE_FILES])
def test_every_value_in_a_shell_command_is_quoted(path):
    """The quoting rule (workflow/rules/common.smk): every {field} of a shell command is {field:q}."""
    fields = _shell_fields(path)
    assert [f for f in fields if not f.endswith(":q")] == []
    assert fields or path.name in ("common.smk",) or "shell:" not in path.read_text()


@pytest.mark.slow
def test_config_paths_with_spaces_and_semicolons_stay_one_word(tmp_path, cli_env):
    """`snakemake -n -p` with results, experiment and figure titles holding a space, a `;`, quotes
    and `$(...)`: every printed command still parses with each of them inside one word."""
    evil = "r s;touch INJECTED 'q\" $(touch INJECTED)"
    cfg = {"experiment": evil, "seeds": [0], "tracking": "deferred", "results": evil, "data_dir": evil,
           "datasets": {"digits": {"prepare": {"source": "digits", "clients": 12, "clusters": 2, "seed": 0},
                                   "model": {"name": "digits_cnn"}, "train": {"rounds": 2}}},
           "methods": [{"method": "FedAvg"}, {"method": "FeSEM", "K": 2}, {"method": "FeSEM", "name": "A", "K": "auto",
                                                                          "select_k": {"K": [2, 3]}}],
           "figures": {"clusters": {"run": "FeSEM(2)"}, "cases": {"run": "FeSEM(2)"}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    smk = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or "snakemake"
    r = subprocess.run([smk, "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--configfile",
                        str(tmp_path / "c.yaml"), "-n", "-p", "--cores", "1"], env=cli_env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cmds = [x.split(": ", 1)[1] for x in r.stdout.splitlines() if x.startswith("Shell command: mcfl ")]
    rules = {c.split()[1] for c in cmds}
    assert {"train", "init-centres", "select-k", "report", "track", "figure", "report-select-k"} <= rules
    for c in cmds:
        words = list(shlex.shlex(c, posix=True, punctuation_chars=True))
        assert "touch" not in words and "INJECTED" not in words and ";" not in words, c
        assert any(evil in w for w in words), c


def test_the_snakefile_rejects_a_duplicated_key_before_any_job(tmp_path, cli_env):
    text = (ROOT / "config" / "config.yaml").read_text().replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2]\nseeds: [5]")
    (tmp_path / "c.yaml").write_text(text)
    smk = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or "snakemake"
    r = subprocess.run([smk, "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--configfile",
                        str(tmp_path / "c.yaml"), "-n", "--cores", "1"], env=cli_env,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr                       # Snakemake prints a WorkflowError on stdout
    assert r.returncode != 0 and re.search(r"c\.yaml: line \d+: duplicate key 'seeds'", out), out[-2000:]


# ========================================================================= reliability: round three
# Faults of the data-aware bounds, the config loader's limits, stores whose metadata lies (hashes
# recomputed), every command that opens a store, LEAF input, OSErrors and checkpoints. Each table
# row is (case id, bad input, regex of the one-line error); every case checks stderr for a traceback.

def _rehash(store: Path, arrays: dict | None = None, **meta_changes) -> None:
    """Replace arrays and edit meta.json of ``store``, then recompute every hash: a store whose
    metadata lies but whose hashes are valid (what a careless hand-made store looks like)."""
    meta = json.loads((store / "meta.json").read_text())
    for name, a in (arrays or {}).items():
        np.save(store / f"{name}.npy", a)
        meta["files"][f"{name}.npy"] = sha256_file(store / f"{name}.npy")
    meta.update(meta_changes)
    meta["content_hash"] = content_hash(meta)
    (store / "meta.json").write_text(json.dumps(meta))


def _arr(store: Path, name: str) -> np.ndarray:
    return np.load(store / f"{name}.npy")


LYING_STORES = [
    ("float-labels", lambda s: _rehash(s, {"y_train": _arr(s, "y_train").astype(np.float64)}),
     r"y_train\.npy: labels of dtype float64; expected int64"),
    ("2d-labels", lambda s: _rehash(s, {"y_test": _arr(s, "y_test").reshape(-1, 1)}),
     r"y_test\.npy: 2-D array of shape \(\d+, 1\); expected one dimension"),
    ("5d-images", lambda s: _rehash(s, {"x_train": _arr(s, "x_train")[..., None], "x_test": _arr(s, "x_test")[..., None]},
                                    x_shape=json.loads((s / "meta.json").read_text())["x_shape"] + [1]),
     r"meta\.json: x_shape \[1, 8, 8, 1\] has 4 dimensions"),
    ("big-endian", lambda s: _rehash(s, {"x_train": _arr(s, "x_train").astype(">f4")}, x_dtype="float32"),
     r"x_train\.npy: stored big-endian \(>f4\)"),
    ("x_dtype-lies", lambda s: _rehash(s, x_dtype="float32"), r"x_train\.npy: dtype uint8 but meta\.json's x_dtype says 'float32'"),
    ("n_train-lies", lambda s: _rehash(s, n_train=5), r"meta\.json: n_train is 5 but offsets_train\.npy says \d+"),
    ("n_test-lies", lambda s: _rehash(s, n_test="many"), r"meta\.json: n_test is 'many' but offsets_test\.npy says \d+"),
    ("n_clients-lies", lambda s: _rehash(s, n_clients=3), r"meta\.json: n_clients is 3 but client_ids says 16"),
    ("huge-n_classes", lambda s: _rehash(s, n_classes=10**9 + 1), r"meta\.json: n_classes 1000000001 is larger than 100000"),
    ("float-offsets", lambda s: _rehash(s, {"offsets_test": _arr(s, "offsets_test").astype(np.float32)}),
     r"offsets_test\.npy: entries of dtype float32; expected int64"),
    ("int8-clusters", lambda s: _rehash(s, {"cluster": _arr(s, "cluster").astype(np.int8)}),
     r"cluster\.npy: entries of dtype int8; expected int64"),
    ("complex-x", lambda s: _rehash(s, {f"x_{t}": _arr(s, f"x_{t}").astype(np.complex64) for t in ("train", "test")},
                                    x_dtype="complex64"), r"x_train\.npy: dtype complex64; inputs are one of uint8"),
]


@pytest.mark.parametrize("damage, message", [c[1:] for c in LYING_STORES], ids=[c[0] for c in LYING_STORES])
def test_a_store_whose_metadata_lies_is_refused_in_one_line(damage, message, digits_store, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(digits_store, store)
    damage(store)
    assert _cli_train(make_run(rounds=1), store, tmp_path / "out") == 1
    _one_line_error(capsys.readouterr().err, "train", message)
    assert not (tmp_path / "out").exists()


# every command that reads a store verifies it in full before writing anything
def _store_commands(store: Path, tmp: Path) -> dict[str, list[str]]:
    fesem = make_run(method="FeSEM", params={"K": 2, "restarts": 2})
    (tmp / "assignments.csv").write_text("client,true_cluster,cluster\n" +
                                         "".join(f"c{i},0,{i % 2}\n" for i in range(16)))
    return {
        "partition": ["partition", str(store), "--out", str(tmp / "new"), "--scheme", "iid"],
        "export-leaf": ["export-leaf", str(store), "--out", str(tmp / "new")],
        "init-centres": ["init-centres", "--run", json.dumps(fesem), "--store", str(store),
                         "--out", str(tmp / "new"), "--threads", "1", "--device", "cpu"],
        "first-models": ["first-models", "--run", json.dumps(fesem), "--store", str(store),
                         "--out", str(tmp / "new"), "--threads", "1", "--device", "cpu"],
        "train": ["train", "--run", json.dumps(make_run(rounds=1)), "--store", str(store), "--out",
                  str(tmp / "new"), "--no-tracking", "--no-progress", "--threads", "1"],
        "figure": ["figure", "cases", "--store", str(store), "--assignments", str(tmp / "assignments.csv"),
                   "--out", str(tmp / "new")],
    }


STORE_COMMANDS = ("partition", "export-leaf", "init-centres", "first-models", "train", "figure")


@pytest.mark.parametrize("command", STORE_COMMANDS)
@pytest.mark.parametrize("damage, message", [
    (lambda s: _flip_byte(s / "x_train.npy"), r"x_train\.npy: sha256 differs from meta\.json"),
    (lambda s: _flip_byte(s / "y_test.npy"), r"y_test\.npy: sha256 differs from meta\.json"),
    (lambda s: _rehash(s, n_train=3), r"meta\.json: n_train is 3 but"),
], ids=["flip-x_train", "flip-y_test", "n_train-lies"])
def test_every_command_refuses_a_changed_store_before_writing(command, damage, message, digits_store,
                                                              tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(digits_store, store)
    damage(store)
    argv = _store_commands(store, tmp_path)[command]
    assert cli.main(argv) == 1
    _one_line_error(capsys.readouterr().err, command, message)
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".new.*"))


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


# LEAF input: each fault names the file (and user) or the flag, and leaves no store
def _leaf_dir(root: Path, train, test) -> Path:
    for split, users in (("train", train), ("test", test)):
        (root / split).mkdir(parents=True)
        text = users if isinstance(users, str) else json.dumps(
            {"users": list(users), "num_samples": [len(v["y"]) for v in users.values()], "user_data": users})
        (root / split / "d.json").write_text(text)
    return root


_PIX = [[(i + j) % 256 / 255 for j in range(784)] for i in range(3)]
_OK_TEST = {"u1": {"x": _PIX[:1], "y": [0]}}

LEAF_FAULTS = [
    ("label-1e9", {"u1": {"x": _PIX, "y": [0, 1, 10**9]}}, _OK_TEST, [],
     r"train/d\.json: user 'u1': y has the label 1000000000; labels must be below 100000"),
    ("label-30-digits", {"u1": {"x": _PIX, "y": [0, 1, 10**30]}}, _OK_TEST, [],
     r"train/d\.json: user 'u1': y has a value too large to store"),
    ("int-5000-digits", '{"users": ["u1"], "user_data": {"u1": {"x": [[0.5]], "y": [' + "7" * 5000 + "]}}}", _OK_TEST, [],
     r"train/d\.json: not valid LEAF JSON \(Exceeds the limit \(4300 digits\)"),
    ("nested-json", '{"users": ["u1"], "user_data": {"u1": {"x": ' + "[" * 50_000 + "]" * 50_000 + ', "y": [0]}}}',
     _OK_TEST, [], r"train/d\.json: not valid LEAF JSON \(nested too deeply\)"),
    ("empty-samples", {"u1": {"x": [[], []], "y": [0, 1]}}, {"u1": {"x": [[]], "y": [0]}}, [],
     r"train/d\.json: user 'u1': x holds samples of no values"),
    ("no-test-data", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, {"u1": {"x": [], "y": []}}, [],
     r"test: no user has test samples; a store needs test data"),
    ("n-classes-huge", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, _OK_TEST, ["--n-classes", "1000000000000"],
     r"n_classes \(--n-classes\): 1000000000000 is not allowed; give a number of classes from 1 to 100000"),
    ("n-classes-small", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, _OK_TEST, ["--n-classes", "2"],
     r"labels go up to 2 but n_classes is 2"),
    ("x-shape-negative", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, _OK_TEST, ["--x-shape", "-1", "--x-shape", "-1"],
     r"x_shape \(--x-shape\): \[-1, -1\] is not allowed"),
    ("x-shape-zero", {"u1": {"x": _PIX, "y": [0, 1, 2]}}, _OK_TEST, ["--x-shape", "0"], r"x_shape \(--x-shape\): \[0\] is not allowed"),
]


@pytest.mark.parametrize("train_users, test_users, flags, message", [c[1:] for c in LEAF_FAULTS],
                         ids=[c[0] for c in LEAF_FAULTS])
def test_leaf_faults_are_one_line_naming_the_file_or_flag(train_users, test_users, flags, message, tmp_path, capsys):
    src = _leaf_dir(tmp_path / "leaf", train_users, test_users)
    assert cli.main(["prepare", "leaf_json", "--dir", str(src), "--out", str(tmp_path / "store"), *flags]) == 1
    _one_line_error(capsys.readouterr().err, "prepare", message)
    assert not (tmp_path / "store").exists()


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
