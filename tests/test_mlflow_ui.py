"""The MLflow UI as a researcher first meets it: a real `mlflow ui` on a sqlite store holding runs that
mcfl recorded, opened in headless Chromium at the URL the DAG prints (mcfl.record.ui_hint). The first
screen must be the runs table with every run's name once (a rerun supersedes the earlier record),
its settings, the final metrics in percent and the training's Duration; no click, expand or column
pick before that.

    python tests/test_mlflow_ui.py STORE.db EXPERIMENT_ID OUT.png   # a screenshot of that screen

(the docs' figure docs/figures/mlflow-runs.png is taken this way).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import make_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UI:
    """`mlflow ui` on 127.0.0.1 on a free port, for a ``with`` block; always killed at its end."""

    def __init__(self, db: Path, log: Path, timeout: float = 300):
        self.port, self.db, self.log, self.timeout = free_port(), db, log, timeout
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        mlflow = str(Path(sys.executable).parent / "mlflow")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [mlflow, "ui", "--backend-store-uri", f"sqlite:///{self.db}", "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow ui exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise TimeoutError(f"mlflow ui did not answer on {self.url} within {self.timeout} s")

    def __exit__(self, *exc):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)      # the server and its worker
            self.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def chromium(url: str, profile: Path, *args: str, timeout: float = 240, size: str = "1600,700") -> str:
    """Headless Chromium on ``url`` (a fresh profile: a first visit), given time to render."""
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={size}",
                        "--virtual-time-budget=30000", *args, url],
                       capture_output=True, text=True, timeout=timeout)
    return r.stdout


def screenshot(db: Path, experiment_id: str, out: Path, tmp: Path) -> None:
    from mcfl.record import runs_link

    with UI(db, tmp / "ui.log") as ui:
        chromium(runs_link(ui.url, experiment_id), tmp / "profile", f"--screenshot={out}", size="2000,560")


@pytest.fixture(scope="module")
def recorded(digits_store, tmp_path_factory):
    """Three tiny runs (FedAvg seeds 0 and 1, FeSEM(2) seed 0) trained, then recorded by
    `mcfl track`'s function into a fresh sqlite store, as the DAG's `track` job does."""
    from mcfl.runner import train
    from mcfl.record import init_sweep, record_finished

    tmp = tmp_path_factory.mktemp("ui")
    runs = [make_run(method="FedAvg", rounds=2, clients_per_round=4, seed=0),
            make_run(method="FedAvg", rounds=2, clients_per_round=4, seed=1),
            make_run(method="FeSEM", params={"K": 2, "restarts": 2}, rounds=2, clients_per_round=4)]
    dirs = [tmp / "runs" / f"{i}" for i in range(len(runs))]
    for run, d in zip(runs, dirs):
        train(run, digits_store, d, progress=False)
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp / 'mlflow.db'}")
    mp.chdir(tmp)
    try:
        exp = init_sweep("ui-test", runs)
        record_finished(dirs, "ui-test")
        # a rerun of the first run folder (new metrics.json): recorded again, superseding the first
        m = json.loads((dirs[0] / "metrics.json").read_text())
        (dirs[0] / "metrics.json").write_text(json.dumps({**m, "wall_s": m["wall_s"] + 1.0}))
        record_finished(dirs, "ui-test")
    finally:
        mp.undo()
    finals = [json.loads((d / "metrics.json").read_text())["final"] for d in dirs]
    return tmp, exp, finals


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (apt-get install chromium)")
def test_the_printed_url_opens_on_the_runs_with_names_settings_and_metrics(recorded):
    from mcfl.record import ui_hint

    tmp, exp, finals = recorded
    hint = ui_hint(exp, f"sqlite:///{tmp / 'mlflow.db'}", cwd=tmp)
    assert hint.startswith(f"{Path(sys.executable).parent / 'mlflow'} ui --backend-store-uri "
                           "sqlite:///mlflow.db  ->  http://127.0.0.1:5000/")
    path = hint.split("http://127.0.0.1:5000", 1)[1]
    with UI(tmp / "mlflow.db", tmp / "ui.log") as ui:
        t0 = ui.started
        dom = chromium(ui.url + path, tmp / "profile", "--dump-dom")
        seconds = time.monotonic() - t0
    for name in ("FedAvg · digits · s0", "FedAvg · digits · s1", "FeSEM(2) · digits · s0"):
        assert dom.count(f">{name}<") == 1, name            # the rerun superseded the first record
    assert "<strong>3</strong> matching runs" in dom
    # the columns in a 1600-pixel-wide window (the grid renders only those in view; the rest,
    # macro_f1, ari and Duration, are a scroll away)
    for column in ("dataset", "method", "params.K", "seed", "micro_acc_pct", "macro_acc_pct"):
        assert f">{column}<" in dom, column
    for f in finals:                    # each run's final value in percent, as the tables give it
        for k in ("micro_acc", "macro_acc"):
            assert f">{round(f[k] * 100, 2)!r}<" in dom, (k, f)
    assert "workflowType=genai" not in dom and "Token Usage" not in dom
    # what MLflow 3.17 adds, which no server option turns off (docs/reproducing.md says the one
    # click that closes each): the shared view's banner, and on a browser's first visit to a local
    # server the Assistant panel
    assert "viewing a shared view" in dom and "Hide banner" in dom
    assert "MLflow Assistant" in dom
    with UI(tmp / "mlflow.db", tmp / "ui.log") as ui:                   # wide: every column in view
        dom = chromium(ui.url + path, tmp / "profile-wide", "--dump-dom", size="3200,700")
    assert ">Duration<" in dom and ">ari<" in dom and ">macro_f1_pct<" in dom
    print(f"first MLflow screen {seconds:.1f} s after `mlflow ui` started (server start to page with runs)")


def test_ui_hint_names_the_store_and_the_runs_url(tmp_path):
    from mcfl.track import VIEW_KEY
    from mcfl.record import ui_hint

    mlflow = tmp_path / ".venv" / "bin" / "mlflow"                # the project's environment
    mlflow.parent.mkdir(parents=True)
    mlflow.write_text("#!/bin/sh\n")
    assert ui_hint("7", f"sqlite:///{tmp_path / 'mlflow.db'}", cwd=tmp_path, mlflow=mlflow) == (
        ".venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db  ->  http://127.0.0.1:5000/#/experiments/7/runs"
        f"?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}")
    assert ui_hint("7", "sqlite:////elsewhere/m.db", cwd=tmp_path / ".venv", mlflow=mlflow).startswith(
        "bin/mlflow ui --backend-store-uri sqlite:////elsewhere/m.db  ->  ")
    assert ui_hint("7", "sqlite:////m.db", cwd=tmp_path / "x", mlflow=mlflow).startswith(f"{mlflow} ui ")
    assert ui_hint("7", "sqlite:////m.db", mlflow=tmp_path / "none").startswith("mlflow ui ")
    assert ui_hint("3", "http://host:5000/") == (
        f"http://host:5000/#/experiments/3/runs?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}")
    # more runs than the table loads at once: it says how many, and where the rest are
    assert ui_hint("3", "http://h/", runs=100) == ui_hint("3", "http://h/")
    assert ui_hint("3", "http://h/", runs=129).endswith(
        "  (129 runs: the table loads 100 at a time, the rest behind its Load more)")


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_mlflow_serves_the_default_store_with_the_projects_mlflow():
    """`make mlflow` needs nothing activated: the project's .venv/bin/mlflow on the default
    config's store; MLFLOW_STORE and MLFLOW_PORT pick another."""
    from conftest import ROOT

    def last(*args):
        out = subprocess.run(["make", "-n", "--no-print-directory", "mlflow", *args], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return out.strip().splitlines()[-1]

    assert last() == ".venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5000"
    assert last("MLFLOW_STORE=sqlite:///other.db", "MLFLOW_PORT=5001") == (
        ".venv/bin/mlflow ui --backend-store-uri sqlite:///other.db --port 5001")


def test_the_runs_view_shows_settings_that_differ_then_the_final_metrics():
    from mcfl.track import differing_settings, runs_view

    a, b = make_run(method="FedAvg"), make_run(method="FeSEM", params={"K": 2}, lr=0.05)
    assert differing_settings([a, b]) == ["method", "params.K", "train.lr"]
    assert differing_settings([a, a]) == []
    view = json.loads(runs_view(differing_settings([a, b])))
    assert view["selectedColumns"] == view["columnOrder"] == [
        "params.`dataset`", "params.`method`", "params.`params.K`", "params.`seed`",
        "metrics.`micro_acc_pct`", "metrics.`macro_acc_pct`", "metrics.`micro_f1_pct`",
        "metrics.`macro_f1_pct`", "metrics.`ari`", "attributes.`Duration`", "params.`train.lr`"]
    assert view["orderByKey"] == "tags.`mlflow.runName`" and view["orderByAsc"] is True


if __name__ == "__main__":
    import tempfile

    db, exp_id, out = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as d:
        screenshot(Path(db).resolve(), exp_id, Path(out).resolve(), Path(d))
    print(out)
