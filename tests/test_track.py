"""`tracking: deferred`: finished runs recorded from their files equal live tracking's record."""

import json
import os

import pytest
import torch

from conftest import make_run
from mcfl.runner import train
from mcfl.timing import COLUMNS as TIME_COLUMNS
from mcfl.track import MLflowTracker
from mcfl.record import record_finished
from dag_helpers import job_counts, snakemake, write_config


def _record(client, run_id):
    r = client.get_run(run_id)
    skip = {"mcfl_record", "run_dir", "mlflow.user", "mlflow.source.name",
            "mlflow.source.type", "mlflow.source.git.commit"}
    metrics = {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)]
               for k in r.data.metrics}
    arts = sorted(a.path for a in client.list_artifacts(run_id))
    return r.data.params, {k: v for k, v in r.data.tags.items() if k not in skip}, metrics, arts, r.info.status


@pytest.mark.slow
def test_deferred_record_equals_live_tracking_and_is_not_repeated(digits_store, tmp_path, mlflow_uri):
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    runs = [make_run(method="FedAvg", rounds=3, eval_every=2, clients_per_round=4),
            make_run(method="FeSEM", params={"K": 2, "restarts": 2}, rounds=3, eval_every=2, seed=1)]
    live, dirs = [], []
    for i, run in enumerate(runs):
        train(run, digits_store, tmp_path / f"live{i}", tracker=MLflowTracker("live"), progress=False)
        train(run, digits_store, tmp_path / f"def{i}", progress=False)    # no tracking
        dirs.append(tmp_path / f"def{i}")
    exp = client.get_experiment_by_name("live").experiment_id
    live = sorted(client.search_runs([exp]), key=lambda r: r.data.tags["mlflow.runName"])

    first = record_finished(dirs, "deferred")
    assert [d for d, _ in first] == [str(d) for d in dirs]
    again = record_finished(dirs, "deferred")
    assert again == first                                     # recorded once, found again
    exp2 = client.get_experiment_by_name("deferred").experiment_id
    assert len(client.search_runs([exp2])) == 2
    deferred = sorted((client.get_run(r) for _, r in first), key=lambda r: r.data.tags["mlflow.runName"])
    for a, b in zip(live, deferred):
        pa, ta, ma, aa, sa = _record(client, a.info.run_id)
        pb, tb, mb, ab, sb = _record(client, b.info.run_id)
        assert (pa, ta, aa, sa) == (pb, tb, ab, sb)
        assert ta["cpu"] == torch.backends.cpu.get_cpu_capability() and ta["torch"] == str(torch.__version__)
        assert ma.keys() == mb.keys() and "micro_acc" in ma and "micro_acc_pct" in ma
        for k in ma:                                          # same steps, values to csv precision
            assert [s for s, _ in ma[k]] == [s for s, _ in mb[k]], k
            if k in TIME_COLUMNS:                             # seconds: two trainings, two timings
                continue
            assert [v for _, v in ma[k]] == pytest.approx([v for _, v in mb[k]], rel=1e-12), k


@pytest.mark.slow
def test_workflow_records_runs_once_in_one_track_job(tmp_path, cli_env):
    cfg = {"experiment": "wf-deferred", "seeds": [0], "tracking": "deferred",
           "datasets": {"digits": {"prepare": {"source": "digits", "clients": 8, "clusters": 2, "seed": 0},
                                   "model": {"name": "digits_cnn"},
                                   "train": {"rounds": 1, "lr": 0.1, "eval_every": 1}}},
           "methods": [{"method": "FedAvg"}, {"method": "NoFed"}]}
    write_config(tmp_path, cfg)
    r = snakemake(tmp_path, cli_env)
    assert r.returncode == 0, r.stderr[-3000:]
    import mlflow

    mlflow.set_tracking_uri(cli_env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["wf-deferred"])
    # flat runs, tagged with the invocation, named method · dataset · seed, with true durations
    assert len(runs) == 2 and set(runs["status"]) == {"FINISHED"}
    assert runs["tags.sweep"].str.match(r"config\.yaml \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$").all()
    assert sorted(runs["tags.mlflow.runName"]) == ["FedAvg · digits · s0", "NoFed · digits · s0"]
    dirs = dict(line.split("\t")[::-1] for line in
                (tmp_path / "results" / "mlflow_runs.tsv").read_text().splitlines()[1:])
    for _, row in runs.iterrows():
        d = tmp_path / dirs[row["run_id"]]
        m = json.loads((d / "metrics.json").read_text())
        seconds = (row["end_time"] - row["start_time"]).total_seconds()
        assert seconds == pytest.approx(m["wall_s"], abs=0.01)
        assert row["end_time"].timestamp() == pytest.approx((d / "metrics.json").stat().st_mtime, abs=0.01)
    # the last lines: where the tables are, then the project's mlflow by its path (nothing to activate)
    tables, last = r.stderr.rstrip().splitlines()[-2:]
    assert tables == "Tables: results/table.md, results/paper_comparison.md"
    mlflow_bin = last.removeprefix("MLflow: ").split(" ui ")[0]
    assert mlflow_bin.endswith("/mlflow") and os.access(mlflow_bin, os.X_OK), last
    assert " ui --backend-store-uri sqlite:///mlflow.db  ->  http://127.0.0.1:5000/" in last
    assert runs["tags.run_dir"].str.startswith("results/runs/digits/").all()
    assert (tmp_path / "results" / "mlflow_runs.tsv").read_text().count("\n") == 3
    cfg["methods"].append({"method": "FedProx", "mu": 0.1})                # one more run
    write_config(tmp_path, cfg)
    assert job_counts(snakemake(tmp_path, cli_env, "-n").stdout) == \
        {"train": 1, "report": 1, "track": 1, "all": 1}
    assert snakemake(tmp_path, cli_env).returncode == 0
    runs = mlflow.search_runs(experiment_names=["wf-deferred"])
    assert len(runs) == 3                                                 # the first two not again


def test_experiments_are_model_training_experiments(mlflow_uri):
    """The `mlflow.experimentKind` tag on new experiments, and added to one made without it."""
    from mlflow import MlflowClient

    from mcfl.track import EXPERIMENT_TAGS, experiment_id

    client = MlflowClient(mlflow_uri)
    new = experiment_id(client, "new")
    old = client.create_experiment("old")                      # as an older mcfl made it
    assert experiment_id(client, "old") == old
    for e in (new, old):
        assert client.get_experiment(e).tags["mlflow.experimentKind"] == "custom_model_development"
    assert EXPERIMENT_TAGS == {"mlflow.experimentKind": "custom_model_development"}


def test_unreachable_server_fails_naming_the_uri_or_defers(monkeypatch, digits_store, tmp_path):
    import socket

    from mcfl.track import MLflowTracker, Tracker, check_server, make_tracker

    with socket.socket() as s:                                 # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MCFL_TRACKING_WAIT", "0")
    with pytest.raises(ConnectionError, match=f"MLflow tracking server {uri} is unreachable.*defer"):
        make_tracker(True, "exp")
    assert type(make_tracker(False, "exp")) is Tracker           # untracked jobs never look
    check_server("sqlite:///x.db")                               # no server, nothing to check
    monkeypatch.setenv("MCFL_TRACKING_UNREACHABLE", "defer")
    t = make_tracker(True, "exp")
    assert type(t) is Tracker and not isinstance(t, MLflowTracker)
    res = train(make_run(rounds=1), digits_store, tmp_path / "run", tracker=t, progress=False)
    assert (tmp_path / "run" / "metrics.json").exists() and res["final"]["micro_acc"] > 0
    # ... and recorded later from its files (`mcfl track`)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'later.db'}")
    monkeypatch.chdir(tmp_path)
    [(d, run_id)] = record_finished([tmp_path / "run"], "later")
    assert d == str(tmp_path / "run") and run_id


def test_a_rerun_of_a_run_folder_supersedes_its_earlier_runs(mlflow_uri):
    """One visible MLflow run per run folder: a finished run deletes the experiment's older runs of
    its folder (tagged with the run that superseded them); another folder's run stays; an unfinished
    rerun leaves the earlier run visible."""
    from mlflow import MlflowClient

    from mcfl.tracked_runs import RUN_DIR_TAG, SUPERSEDED_TAG

    client = MlflowClient(mlflow_uri)
    run = make_run(method="FedAvg")
    identity = {"git": "g", "data_hash": "d", "run_hash": "h"}

    def record(run_dir, status="FINISHED", acc=0.5):
        t = MLflowTracker("reruns", client=client, defer=False, run_dir=run_dir)
        t.start(run, identity)
        t.log({"micro_acc": acc, "train_loss": 1.25}, step=1)
        t.end(status)
        return t.run_id

    first = record("results/runs/digits/FedAvg/seed0")
    other = record("results-mine/runs/digits/FedAvg/seed0")          # same name, another folder
    second = record("results/runs/digits/FedAvg/seed0", acc=0.65994962)
    failed = record("results/runs/digits/FedAvg/seed0", status="FAILED")
    exp = client.get_experiment_by_name("reruns").experiment_id
    visible = {r.info.run_id for r in client.search_runs([exp])}
    assert visible == {other, second, failed}
    old = client.get_run(first)
    assert old.info.lifecycle_stage == "deleted" and old.data.tags[SUPERSEDED_TAG] == second
    assert client.get_run(second).data.tags[RUN_DIR_TAG] == "results/runs/digits/FedAvg/seed0"
    # accuracy also in percent (the tables' unit), the loss as it is
    assert client.get_run(second).data.metrics == {"micro_acc": 0.65994962, "micro_acc_pct": 65.99,
                                                   "train_loss": 1.25}


def test_percent_companions_and_run_folder_keys(tmp_path, monkeypatch):
    from mcfl.tracked_runs import run_dir_key, with_percent

    assert with_percent({"micro_acc": 0.123456, "seen/macro_f1": 0.5, "ari": 0.9, "train_loss": 2.0,
                         "macro_acc": float("nan")}) == {
        "micro_acc": 0.123456, "micro_acc_pct": 12.35, "seen/macro_f1": 0.5, "seen/macro_f1_pct": 50.0,
        "ari": 0.9, "train_loss": 2.0, "macro_acc": pytest.approx(float("nan"), nan_ok=True)}
    monkeypatch.chdir(tmp_path)
    assert run_dir_key("results/runs/d/FedAvg/seed0/") == "results/runs/d/FedAvg/seed0"
    assert run_dir_key(tmp_path / "r" / "s0") == "r/s0"
    assert run_dir_key("/elsewhere/r") == "/elsewhere/r"
