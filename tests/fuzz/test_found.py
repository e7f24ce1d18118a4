"""Every failing example the fuzz suite found, kept as an explicit test (shrunk by hand or by
Hypothesis to the one change that breaks a promise). A test marked ``xfail(strict=True)`` is a
finding not fixed yet: it fails the suite as soon as the fix makes it pass, so that the mark is
dropped then."""

from __future__ import annotations

import json

import pytest

from .conftest import run_json
from .test_cli_fuzz import RUN_DIRS, STORE, TRAIN_FLAGS, keeps_promises, run_dir_command
from .harness import sandbox, snapshot

pytestmark = pytest.mark.fuzz


def strict_promises(*args, **kwargs):
    """:func:`keeps_promises` without letting any known finding through."""
    return keeps_promises(*args, known_ok=False, **kwargs)


def test_report_writers_names_a_store_that_is_not_images(world):
    """Found on the first run: numpy's 'cannot reshape array of size 2085 into shape (417,2,2)'."""
    with sandbox(world) as w:
        strict_promises(w, run_dir_command("report-writers", RUN_DIRS), "report-writers", [STORE])


def test_fedgsp_heatmap_on_runs_without_gsp_parameters_is_one_line(world):
    """Found on the first run: a KeyError traceback ('growth')."""
    with sandbox(world) as w:
        out = strict_promises(w, run_dir_command("fedgsp heatmap", RUN_DIRS), "fedgsp", RUN_DIRS)
        assert out.code == 1


@pytest.mark.parametrize("foreign", ["notes.txt", "runs/FeSEM-K2/state.pt", "json/FedAvg.json"])
def test_train_leaves_a_foreign_checkpoint_file_alone(world, foreign):
    """``--checkpoint`` naming a file that is not this run's checkpoint: refused, the file kept."""
    with sandbox(world) as w:
        before = snapshot(w / foreign) if (w / foreign).is_dir() else (w / foreign).read_bytes()
        argv = ["train", "--run", json.dumps(run_json("FedAvg", {})), "--store", STORE, "--out",
                "out/run", "--checkpoint", foreign, *TRAIN_FLAGS]
        out = strict_promises(w, argv, "train", ["--checkpoint", foreign])
        assert out.code == 1 and (w / foreign).read_bytes() == before


def test_report_on_a_run_whose_dataset_climbs_out_writes_nothing_outside(world):
    """A run folder's metrics.json with ``dataset: ../../x``: the report must not build a path from it."""
    with sandbox(world) as w:
        m = json.loads((w / "runs/FedAvg/metrics.json").read_text())
        (w / "runs/FedAvg/metrics.json").write_text(json.dumps({**m, "dataset": "../../x"}))
        strict_promises(w, run_dir_command("report", RUN_DIRS), "report", ["runs/FedAvg", "dataset"],
                       earlier="out/report")


@pytest.mark.parametrize("cmd", ["fedgsp table", "report-fedcg", "report-protocols"])
def test_an_empty_predictions_csv_is_named(world, cmd):
    """Found: pandas' 'No columns to parse from file', naming nothing."""
    with sandbox(world) as w:
        (w / "runs/FeSEM-K2/predictions.csv").write_bytes(b"")
        strict_promises(w, run_dir_command(cmd, RUN_DIRS), cmd.split()[0],
                       ["runs/FeSEM-K2", "predictions.csv"])


def test_track_names_a_history_csv_holding_text(world, mlflow_db):
    """Found: "could not convert string to float: '../../escape'", naming neither file nor column."""
    import shutil

    from .test_cli_fuzz import environment

    with sandbox(world) as w:
        history = w / "runs/FedAvg/history.csv"
        rows = [line.split(",") for line in history.read_text().splitlines()]
        rows[2][rows[0].index("eval_s")] = "../../escape"
        history.write_text("\n".join(",".join(r) for r in rows) + "\n")
        db = w.parent.parent / f"{w.parent.name}.db"        # outside the watched folder
        shutil.copy(mlflow_db, db)
        with environment(MLFLOW_TRACKING_URI=f"sqlite:///{db}"):
            strict_promises(w, run_dir_command("track", RUN_DIRS), "track", ["runs/FedAvg", "history.csv"],
                           watch_skip=("mlartifacts",))


def test_fedgsp_table_names_a_run_without_test_loss(world):
    """Found: a KeyError 'test_loss' traceback."""
    with sandbox(world) as w:
        m = json.loads((w / "runs/FeSEM-K2/metrics.json").read_text())
        del m["final"]["test_loss"]
        (w / "runs/FeSEM-K2/metrics.json").write_text(json.dumps(m))
        strict_promises(w, run_dir_command("fedgsp table", RUN_DIRS), "fedgsp", ["runs/FeSEM-K2", "test_loss"])


def test_track_names_a_metrics_json_without_run_hash(world, mlflow_db):
    """Found: a KeyError 'run_hash' traceback (mcfl.track)."""
    import shutil

    from .test_cli_fuzz import environment

    with sandbox(world) as w:
        m = json.loads((w / "runs/FedAvg/metrics.json").read_text())
        del m["run_hash"]
        (w / "runs/FedAvg/metrics.json").write_text(json.dumps(m))
        db = w.parent.parent / f"{w.parent.name}.db"        # outside the watched folder
        shutil.copy(mlflow_db, db)
        with environment(MLFLOW_TRACKING_URI=f"sqlite:///{db}"):
            strict_promises(w, run_dir_command("track", RUN_DIRS), "track", ["runs/FedAvg", "run_hash"],
                            watch_skip=("mlartifacts",))


def test_prepare_names_a_seed_numpy_cannot_take():
    """Found: ``mcfl prepare synthetic --seed 10**400`` said numpy's 'Seed must be between 0 and
    2**32 - 1', naming no flag."""
    import tempfile
    from pathlib import Path

    from .harness import run_in_process

    with tempfile.TemporaryDirectory() as d:
        out = run_in_process(["prepare", "synthetic", "--out", "s", "--seed", "1" * 400], Path(d))
        assert out.code == 1 and out.err.startswith("mcfl prepare: error: --seed: "), str(out)
        assert list(Path(d).iterdir()) == []


def _train_edited(world, edit: dict, names: list[str]):
    run = {**run_json("FeSEM", {"K": 2, "restarts": 1}), **edit}
    with sandbox(world) as w:
        argv = ["train", "--run", json.dumps(run), "--store", STORE, "--out", "out/run", *TRAIN_FLAGS]
        out = strict_promises(w, argv, "train", names)
        assert out.code == 1


@pytest.mark.parametrize("seed", ["../x", [0]])
def test_train_names_a_seed_that_is_not_an_integer(world, seed):
    """Found: "invalid literal for int() with base 10: '../x'"; for [0], a TypeError traceback."""
    _train_edited(world, {"seed": seed}, ["seed"])


def test_train_names_a_model_without_a_name(world):
    """Found: a KeyError 'name' traceback (mcfl.federation.build_model)."""
    _train_edited(world, {"model": {}}, ["model"])


def _without(m: dict, path: tuple) -> dict:
    inner = dict(m[path[0]]) if len(path) == 2 else m
    inner.pop(path[-1])
    return {**m, path[0]: inner} if len(path) == 2 else inner


@pytest.mark.parametrize("cmd, edit", [
    ("report-protocols", lambda m: {**m, "final": {**m["final"], "micro_acc": "../x"}}),
    ("report-protocols", lambda m: _without(m, ("final", "micro_acc"))),
    ("report-fedcg", lambda m: _without(m, ("label",))),
], ids=["protocols-text-accuracy", "protocols-no-accuracy", "fedcg-no-label"])
def test_reports_name_a_metrics_json_with_a_bad_key(world, cmd, edit):
    """Found: a KeyError traceback for a missing key, 'could not convert string to float' for text."""
    with sandbox(world) as w:
        path = w / "runs/FedAvg/metrics.json"
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
        strict_promises(w, run_dir_command(cmd, RUN_DIRS), cmd, ["runs/FedAvg", "metrics.json"])
