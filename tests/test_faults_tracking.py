"""The fault suite, tracking (``pytest -m faults``): parallel jobs and `mcfl track` processes
sharing one sqlite MLflow store lose no run and record each once, and a store that cannot be
used stops the job in one line (or, deferred, lets it train untracked)."""

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, make_run
from fault_helpers import _fill, _one_line_error, _run_json, mlflow_runs
from mcfl import cli
from mcfl.runner import train
from mcfl.track import MLflowTracker

pytestmark = pytest.mark.faults


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
