"""Faults of the MLflow store and of the files `mcfl track` reads: a kill while a new sqlite store is
created leaves nothing half-migrated, a URI naming a directory fails at once, MLflow's own log
lines stay off the screen, and a damaged run file is named."""

from __future__ import annotations

import logging
import shutil

import pytest

from mcfl import cli
from mcfl.track import TrackingError, _client, experiment_id
from test_paths import _fake_run


#: what `mcfl track` reads of a run's metrics.json besides its final metrics
RECORDABLE = {"run_hash": "h" * 16, "data_hash": "d" * 16, "git": "abc", "wall_s": 2.0,
              "config": {"dataset": "digits", "method": "FedAvg", "label": "FedAvg", "seed": 0, "params": {}}}


@pytest.fixture(scope="module")
def fresh_store(tmp_path_factory):
    """A store created by mcfl (under a temporary name, then renamed): made once, copied by tests."""
    d = tmp_path_factory.mktemp("mlflow")
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{d / 'mlflow.db'}")
    mp.chdir(d)
    try:
        experiment_id(_client(), "made")
    finally:
        mp.undo()
    return d / "mlflow.db"


@pytest.fixture
def store_uri(fresh_store, tmp_path, monkeypatch):
    db = tmp_path / "mlflow.db"
    shutil.copy(fresh_store, db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.chdir(tmp_path)
    return f"sqlite:///{db}"


def test_a_new_store_is_whole_and_leaves_no_temporary(fresh_store):
    import sqlite3

    names = {r[0] for r in sqlite3.connect(fresh_store).execute("select name from sqlite_master")}
    assert {"experiments", "runs", "metrics", "alembic_version"} <= names
    assert not any(n.startswith("_alembic_tmp") for n in names)
    assert sorted(p.name for p in fresh_store.parent.iterdir() if p.name.startswith(".")) == []


def test_a_kill_while_the_store_is_created_leaves_no_half_migrated_store(tmp_path, monkeypatch):
    import mlflow.store.db.utils as db_utils

    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.chdir(tmp_path)
    real = db_utils._initialize_tables

    def killed(engine):
        with engine.begin() as c:                          # part of the tables, then SIGTERM
            c.exec_driver_sql("create table _alembic_tmp_experiments (x int)")
        raise SystemExit(143)

    monkeypatch.setattr(db_utils, "_initialize_tables", killed)
    with pytest.raises(SystemExit):
        _client()
    assert not db.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".mlflow.db")] == []   # nor its journal
    monkeypatch.setattr(db_utils, "_initialize_tables", real)
    assert experiment_id(_client(), "after") == "1"       # the next run makes it whole


def test_a_sqlite_uri_naming_a_directory_fails_at_once(tmp_path, monkeypatch, capsys):
    import mlflow.store.db.utils as db_utils

    def no_retries(uri):
        raise AssertionError("MLflow was asked to open a directory")

    monkeypatch.setattr(db_utils, "create_sqlalchemy_engine_with_retry", no_retries)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}")
    with pytest.raises(TrackingError, match=rf"^MLflow tracking store sqlite:///{tmp_path}: {tmp_path} is a "
                                            r"directory, not a database file; point MLFLOW_TRACKING_URI"):
        _client()
    run = _fake_run(tmp_path / "r")
    assert cli.main(["track", "--experiment", "e", "--out", str(tmp_path / "t.tsv"), str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("mcfl track: error: MLflow tracking store") and "\n" not in err


def test_mlflow_log_lines_stay_off_the_screen_unless_verbose(store_uri, capfd):
    _client()
    logging.getLogger("mlflow.store.db.utils").error("Traceback (most recent call last): ...")
    logging.getLogger("alembic.runtime.migration").warning("Running upgrade ...")
    assert capfd.readouterr().err == ""
    mcfl_log = logging.getLogger("mcfl")
    old = mcfl_log.level
    mcfl_log.setLevel(logging.DEBUG)
    try:
        for name in ("mlflow", "alembic", "sqlalchemy"):
            logging.getLogger(name).setLevel(logging.NOTSET)
        _client()
        assert logging.getLogger("mlflow").level == logging.NOTSET      # -v: everything shows
    finally:
        mcfl_log.setLevel(old)


@pytest.mark.parametrize("damage", ["truncated metrics", "binary metrics", "history not utf-8"])
def test_mcfl_track_names_a_damaged_run_file(damage, store_uri, tmp_path, capsys):
    run = _fake_run(tmp_path / "runs" / "r", **RECORDABLE)
    if damage == "truncated metrics":
        f = run / "metrics.json"
        f.write_bytes(f.read_bytes()[:30])
    elif damage == "binary metrics":
        f = run / "metrics.json"
        f.write_bytes(b"\x80\x81\x00\xff" * 8)
    else:
        f = run / "history.csv"
        f.write_bytes(b"round,train_loss\n1,\xff\xfe\x00\n")
    assert cli.main(["track", "--experiment", "e", "--out", str(tmp_path / "t.tsv"), str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mcfl track: error: {f}: not a") and "\n" not in err
    assert not (tmp_path / "t.tsv").exists()


def test_an_experiment_that_cannot_be_created_on_a_full_disk_is_one_line(store_uri):
    """MLflow's create_experiment fails on the full disk and no other process made it: the store's
    fault is the error (it once fell through to an AttributeError on the missing experiment)."""
    import sqlite3

    class FullDisk:
        def get_experiment_by_name(self, name):
            return None

        def create_experiment(self, *args, **kwargs):
            raise sqlite3.OperationalError("database or disk is full")

    with pytest.raises(TrackingError, match=rf"^MLflow tracking store {store_uri}: the disk is full; free space"):
        experiment_id(FullDisk(), "new")


def test_what_a_sigkill_left_while_creating_the_store_is_cleared(tmp_path, monkeypatch):
    """A SIGKILL during the creation leaves the temporary database and SQLite's journal beside it
    (no mlflow.db): the next run removes both and creates the store."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    half = tmp_path / ".mlflow.db.999999999.x1.tmp"          # no such process
    half.write_bytes(b"SQLite format 3\x00half")
    (tmp_path / (half.name + "-journal")).write_bytes(b"journal")
    assert experiment_id(_client(), "again") == "1"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("cell, column", [("../../escape", "eval_s"), ("x", "round")])
def test_mcfl_track_names_a_history_cell_that_is_not_a_number(cell, column, store_uri, tmp_path, capsys):
    run = _fake_run(tmp_path / "runs" / "r", **RECORDABLE)
    (run / "history.csv").write_text(f"round,train_loss,eval_s\n1,1.0,0.1\n{cell if column == 'round' else 2},"
                                     f"0.9,{cell if column == 'eval_s' else 0.2}\n")
    assert cli.main(["track", "--experiment", "e", "--out", str(tmp_path / "t.tsv"), str(run)]) == 1
    assert capsys.readouterr().err.strip() == (f"mcfl track: error: {run / 'history.csv'}: {column}: "
                                               f"{cell!r} is not a number")


@pytest.mark.parametrize("change, message", [
    ({"config": [1]}, "config is list, not an object"),
    ({"run_hash": None}, "run_hash: missing; not a finished run's metrics"),
    ({"git": 3}, "git: not a string; not a finished run's metrics"),
    ({"config": {"dataset": "digits"}}, "config: missing method, label, seed, params"),
    ({"wall_s": "soon"}, "wall_s: 'soon' is not a number"),
], ids=["config", "no-run-hash", "git", "config-keys", "wall_s"])
def test_mcfl_track_names_metrics_of_the_wrong_shape(change, message, store_uri, tmp_path, capsys):
    metrics = {k: v for k, v in {**RECORDABLE, **change}.items() if v is not None}
    run = _fake_run(tmp_path / "runs" / "r", **metrics)
    assert cli.main(["track", "--experiment", "e", "--out", str(tmp_path / "t.tsv"), str(run)]) == 1
    assert capsys.readouterr().err.strip().startswith(f"mcfl track: error: {run / 'metrics.json'}: {message}")
