"""Recording finished runs into MLflow after training (``tracking: deferred``, the workflow's
``track`` rule and ``mcfl track``), and where to look at them: the invocation's experiment
(:func:`init_sweep`) and the command and URL that open its runs table (:func:`ui_hint`). The store,
its faults and the live :class:`~mcfl.track.MLflowTracker` are :mod:`mcfl.track`'s."""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Iterable

from mcfl.io import OUTPUTS, parse_metrics, read_csv
from mcfl.track import (VIEW_KEY, MLflowTracker, _client, _ms, _retry, check_server, differing_settings,
                        experiment_id, store_lock, tracking_uri)
from mcfl.tracked_runs import UI_PAGE
from mcfl.timing import COLUMNS

log = logging.getLogger("mcfl")


RECORD_TAG = "mcfl_record"


def record_finished(run_dirs: Iterable[str | Path], experiment: str) -> list[tuple[str, str]]:
    """Record finished runs from their files (``metrics.json`` with the resolved config,
    ``history.csv``; the run's outputs as artifacts) as live tracking would have: one MLflow run
    each, tagged with ``$MCFL_SWEEP`` if set, with the training's times (it ended when its
    ``metrics.json`` was written, and started ``wall_s`` before; each round's metrics are stamped
    with the end of that round, from the round times in ``history.csv``). A run directory already
    recorded is skipped: by ``mcfl track`` (a FINISHED run with tag ``mcfl_record``: the sha256 of
    its ``metrics.json``) or live (a FINISHED run of the same ``run_hash``), so rerunning after a
    partial rerun of the DAG adds only the new results. Idempotent under concurrency: the whole
    lookup-and-record holds the store's ``track`` lock, and a run left unfinished by a killed
    ``mcfl track`` is deleted and recorded again. Returns (run directory, MLflow run id) pairs."""
    with store_lock("track"):
        return _record_finished(run_dirs, experiment)


def _round_times(rows: list[dict], start_s: float) -> list[int]:
    """Each history row's end, in ms since the epoch: ``start_s`` plus the round times so far."""
    out, t = [], start_s
    for row in rows:
        t += sum(float(row.get(c, 0.0) or 0.0) for c in COLUMNS)
        out.append(_ms(t))
    return out


def _check_recordable(d: Path, m: dict) -> None:
    """What recording reads of ``metrics.json`` has its type, else a ValueError naming the key."""
    f = d / "metrics.json"
    if not isinstance(m["config"], dict):
        raise ValueError(f"{f}: config is {type(m['config']).__name__}, not an object")
    for key in ("run_hash", "data_hash", "git"):
        if not isinstance(m.get(key), str):
            raise ValueError(f"{f}: {key}: {'missing' if key not in m else 'not a string'}; not a finished "
                             f"run's metrics (rerun the training job to record it)")
    missing = [k for k in ("dataset", "method", "label", "seed", "params") if k not in m["config"]]
    if missing or not isinstance(m["config"]["params"], dict):
        raise ValueError(f"{f}: config: {'missing ' + ', '.join(missing) if missing else 'params is not an object'}")
    wall = m.get("wall_s")
    if wall is not None and (isinstance(wall, bool) or not isinstance(wall, (int, float))):
        raise ValueError(f"{f}: wall_s: {wall!r:.40} is not a number")


def _history(path: Path) -> list[dict]:
    """``history.csv``'s rows, its ``round`` and time columns checked to be numbers (the other
    columns are metrics, which are recorded where they are numbers, and ``diverged``'s text);
    otherwise a ValueError naming the file, the column and the value."""
    import pandas as pd

    h = read_csv(path)
    if "round" not in h:
        raise ValueError(f"{path}: no round column; not a run's history")
    for col in ("round", *COLUMNS):
        if col not in h:
            continue
        numbers = pd.to_numeric(h[col], errors="coerce")
        bad = h[col][numbers.isna() & (h[col].notna() | (col == "round"))]
        if len(bad):
            raise ValueError(f"{path}: {col}: {bad.iloc[0]!r:.40} is not a number")
        h[col] = numbers
    return h.to_dict("records")


def _record_finished(run_dirs: Iterable[str | Path], experiment: str) -> list[tuple[str, str]]:
    import math

    client = _client()
    exp = experiment_id(client, experiment)
    known, live = {}, {}
    token = None
    while True:                                       # every run of the experiment
        page = _retry(client.search_runs, [exp], max_results=5000, page_token=token)
        for r in page:
            tags = r.data.tags
            if RECORD_TAG not in tags:
                if r.info.status == "FINISHED" and tags.get("run_hash"):    # tracked live
                    live.setdefault(tags["run_hash"], r.info.run_id)
            elif r.info.status == "FINISHED":
                known[tags[RECORD_TAG]] = r.info.run_id
            else:                                     # a killed `mcfl track` left it half-recorded
                log.warning("deleting MLflow run %s, left unfinished by an earlier `mcfl track`",
                            r.info.run_id)
                _retry(client.delete_run, r.info.run_id)
        token = page.token
        if not token:
            break
    out = []
    for d in map(Path, run_dirs):
        raw = (d / "metrics.json").read_bytes()
        key = hashlib.sha256(raw).hexdigest()[:32]
        m = parse_metrics(raw, d / "metrics.json")     # a damaged file: one line naming it
        if key in known or m.get("run_hash") in live:
            out.append((str(d), known.get(key) or live[m["run_hash"]]))
            continue
        if "config" not in m:
            raise ValueError(f"{d / 'metrics.json'}: no 'config' (written by an older mcfl); "
                             f"rerun the training job to record it")
        _check_recordable(d, m)
        rows = [{k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
                for row in _history(d / "history.csv")]
        end_s = (d / "metrics.json").stat().st_mtime
        start_s = end_s - float(m.get("wall_s") or 0.0)
        t = MLflowTracker(experiment, client=client, defer=False, run_dir=d)
        t.start(m["config"], {k: m[k] for k in ("git", "data_hash", "run_hash", "threads", "torch", "cpu")
                              if k in m}, tags={RECORD_TAG: key}, start_time=_ms(start_s))
        t._replay(rows, _round_times(rows, start_s))
        t.artifacts([d / f for f in OUTPUTS if (d / f).exists()])
        t.end("FINISHED", end_time=_ms(end_s))
        out.append((str(d), t.run_id))
    return out


def init_sweep(experiment: str, runs: Iterable[dict] = ()) -> str:
    """Create the store and the experiment once, before parallel jobs start, with the runs table's
    view showing the settings that differ between ``runs`` (the invocation's planned runs); return
    the experiment's id. A store that cannot be used stops the invocation here, before any job is
    submitted (:class:`TrackingError`, one line)."""
    check_server()
    client = _client()
    return experiment_id(client, experiment, differing_settings(runs))


def ui_hint(experiment_id: str, uri: str | None = None, cwd: Path | None = None,
            mlflow: Path | None = None, runs: int | None = None) -> str:
    """What to run and open to see the runs: ``.venv/bin/mlflow ui ...  ->  URL`` for a sqlite store
    (the URL ``mlflow ui`` serves by default), the URL alone for a tracking server. The command
    names the ``mlflow`` of this interpreter's environment by its path (:func:`mlflow_command`), so
    it works in a shell where nothing is activated. With more ``runs`` than the runs table loads at
    once, it says so (the rest are behind the table's *Load more*)."""
    note = (f"  ({runs} runs: the table loads {UI_PAGE} at a time, the rest behind its Load more)"
            if runs and runs > UI_PAGE else "")
    return _ui_command(experiment_id, uri, cwd, mlflow) + note


def _ui_command(experiment_id: str, uri: str | None, cwd: Path | None, mlflow: Path | None) -> str:
    uri = uri or tracking_uri()
    if uri.startswith(("http://", "https://")):
        return runs_link(uri, experiment_id)
    store = uri
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        try:
            store = f"sqlite:///{path.relative_to((cwd or Path.cwd()).resolve())}"
        except ValueError:
            pass
    return (f"{mlflow_command(mlflow, cwd)} ui --backend-store-uri {store}  ->  "
            f"{runs_link('http://127.0.0.1:5000', experiment_id)}")


def mlflow_command(mlflow: Path | None = None, cwd: Path | None = None) -> str:
    """The ``mlflow`` script beside this interpreter (``.venv/bin/mlflow`` for the project's
    environment), relative to ``cwd`` when under it; plain ``mlflow`` when there is none there."""
    mlflow = Path(mlflow) if mlflow else Path(sys.executable).parent / "mlflow"
    if not mlflow.is_file():
        return "mlflow"
    cwd = (cwd or Path.cwd()).resolve()
    absolute = Path(os.path.abspath(mlflow))
    try:
        return str(absolute.relative_to(cwd))
    except ValueError:
        return shlex.quote(str(absolute))


def runs_link(uri: str, experiment_id: str) -> str:
    """The UI's runs table of an experiment, in the *Model training* view, with mcfl's saved view
    (columns, order). MLflow 3's UI picks its GenAI overview or the runs table by the
    ``workflowType`` parameter (else what the browser last chose, GenAI by default)."""
    return (f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs"
            f"?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}")
