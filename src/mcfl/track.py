"""Experiment tracking. Only this module imports MLflow; everything else calls a :class:`Tracker`.

Store: ``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<cwd>/mlflow.db`` (absolute, so jobs that
change directory still find it); artifacts under ``<cwd>/mlartifacts`` (a server keeps its own).
For runs on several machines point ``MLFLOW_TRACKING_URI`` at an ``mlflow server`` (SQLite on a
network filesystem is unsafe).

Concurrency. MLflow creates a new sqlite store's tables (and migrates an old one) when a client
first opens it, and two processes doing that at once fail (``table tags already exists``): every
client is opened under a file lock next to the sqlite file (:func:`store_lock`), so the first
process creates the tables and the others wait for it. A Snakemake invocation also creates the
store, the experiment and one parent *sweep* run before any job
starts (``init_sweep``, from the Snakefile's ``onstart``); each training job finds the sweep's id in
``$MCFL_SWEEP_RUN_ID`` and nests its run under it. Writes retry when SQLite says "database is locked"
(each retry is logged). A resumed training job (see :mod:`mcfl.runner`) continues its MLflow run:
same run id, back to RUNNING, each (metric, round) pair recorded once however often the job was
killed, FINISHED at the end. A job stopped by SIGTERM or Ctrl-C marks its run KILLED, one that
fails FAILED; one killed by SIGKILL stays RUNNING until it is resumed.

``tracking: deferred`` records finished runs afterwards instead (:func:`record_finished`, the
workflow's ``track`` rule): training jobs then never import MLflow (about 3 s of start-up per job,
a fifth of a short job's time) and one job replays every run from its output files, with the same
params, tags, per-round metrics and artifacts; nothing is visible in the UI until it has run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from mcfl.io import OUTPUTS

log = logging.getLogger("mcfl")
SWEEP_ENV = "MCFL_SWEEP_RUN_ID"
# What a training job does when the tracking server does not answer: `fail` (default; the error names
# the URI) or `defer` (train without tracking; record the run afterwards with `mcfl track`)
UNREACHABLE_ENV = "MCFL_TRACKING_UNREACHABLE"
# Tags every mcfl experiment carries: the MLflow UI opens a `custom_model_development` experiment on
# its runs table ("Model training") instead of the GenAI overview
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(Path.cwd() / 'mlflow.db').resolve()}"


def _retry(fn: Callable, *args, tries: int = 12, **kwargs):
    for i in range(tries):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - MLflow wraps sqlite errors in several types
            if "locked" not in str(e).lower() or i == tries - 1:
                raise
            wait = min(5.0, 0.1 * 2 ** i) * (0.5 + random.random())
            log.info("MLflow store busy (database is locked); retry %d in %.2f s", i + 1, wait)
            time.sleep(wait)


def store_lock(purpose: str, uri: str | None = None):
    """A file lock shared by this machine's processes that use tracking store ``uri``: next to a
    sqlite file (``mlflow.db.<purpose>.lock``), else in the temporary directory."""
    from filelock import FileLock

    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///"):
        return FileLock(f"{uri[len('sqlite:///'):].split('?')[0]}.{purpose}.lock")
    key = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return FileLock(Path(tempfile.gettempdir()) / f"mcfl-mlflow-{key}.{purpose}.lock")


def _client():
    """An MLflow client; opened under the store's ``init`` lock, since opening a sqlite store
    creates or migrates its tables."""
    from mlflow import MlflowClient

    uri = tracking_uri()
    if not uri.startswith("sqlite:"):
        return MlflowClient(tracking_uri=uri)
    with store_lock("init", uri):
        return MlflowClient(tracking_uri=uri)


def experiment_id(client, name: str) -> str:
    """The id of experiment ``name``, created if missing; tagged as a model-training experiment
    (:data:`EXPERIMENT_TAGS`; an experiment made by an older mcfl gets the tags now)."""
    exp = _retry(client.get_experiment_by_name, name)
    if exp is None:
        local = tracking_uri().startswith(("sqlite:", "file:"))  # a server keeps its own artifact store
        try:
            return _retry(client.create_experiment, name, artifact_location=(
                (Path.cwd() / "mlartifacts").resolve().as_uri() if local else None),
                tags=EXPERIMENT_TAGS)
        except Exception:  # created concurrently by another process
            exp = _retry(client.get_experiment_by_name, name)
    for k, v in EXPERIMENT_TAGS.items():
        if exp.tags.get(k) != v:
            _retry(client.set_experiment_tag, exp.experiment_id, k, v)
    return exp.experiment_id


def check_server(uri: str | None = None, wait: float | None = None) -> None:
    """For an ``http(s)://`` tracking URI, wait up to ``wait`` seconds (``$MCFL_TRACKING_WAIT``,
    default 30) for the server's ``/health`` to answer; raise :class:`ConnectionError` naming the
    URI if it does not. Other stores (sqlite, file) need no server."""
    import urllib.request

    uri = uri or tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return
    wait = float(os.environ.get("MCFL_TRACKING_WAIT", 30) if wait is None else wait)
    deadline, err = time.monotonic() + wait, None
    while True:
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as r:
                if r.status == 200:
                    return
                err = f"HTTP {r.status}"
        except Exception as e:  # noqa: BLE001 - refused, timeout, DNS, HTTP error
            err = str(e)
        if time.monotonic() >= deadline:
            break
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
    raise ConnectionError(
        f"MLflow tracking server {uri} is unreachable ({err}). Start it (docs/cluster.md), or set "
        f"{UNREACHABLE_ENV}=defer to train without it and record the run later with `mcfl track`")


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class Tracker:
    def start(self, run: dict, identity: dict, resume_id: str | None = None,
              history: Iterable[dict] = ()) -> str | None:
        """Open (or, given ``resume_id``, reopen) the run and record the ``history`` rows so far."""
        return None

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def artifacts(self, paths: Iterable[Path]) -> None:
        pass

    def end(self, status: str) -> None:
        pass


NullTracker = Tracker


class MLflowTracker(Tracker):
    """One MLflow run per training run; per-round metrics buffered and sent with ``log_batch``."""

    def __init__(self, experiment: str, flush_every: int = 200, client=None):
        self.experiment, self.flush_every = experiment, flush_every
        self.client = client or _client()
        self.run_id: str | None = None
        self.buffer: list = []
        self.logged: dict[str, int] = {}    # metric -> last step already in the store (resumed runs)

    def start(self, run, identity, resume_id=None, history=(), tags=None):
        from mlflow.entities import Param, RunTag

        if resume_id and self._reopen(resume_id):
            self._replay(history)
            return resume_id
        if resume_id:
            log.warning("MLflow run %s is not in %s; recording the resumed run as a new one",
                        resume_id, tracking_uri())
        exp = experiment_id(self.client, self.experiment)
        tags = {"dataset": run["dataset"], "method": run["method"], "label": run["label"],
                "seed": str(run["seed"]), "K": str(run["params"].get("K", "")),
                "git_sha": identity["git"], "data_hash": identity["data_hash"],
                "run_hash": identity["run_hash"], "mlflow.runName":
                f"{run['dataset']}/{run['label']}/seed{run['seed']}", **(tags or {})}
        tags.update({k: str(identity[k]) for k in ("threads", "torch", "cpu") if k in identity})
        if os.environ.get(SWEEP_ENV):
            tags["mlflow.parentRunId"] = os.environ[SWEEP_ENV]
        r = _retry(self.client.create_run, exp, tags=tags)
        self.run_id = r.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in sorted(flatten(run).items())]
        _retry(self.client.log_batch, self.run_id, params=params,
               tags=[RunTag("config_json", json.dumps(run, sort_keys=True)[:5000])])
        self._replay(history)
        return self.run_id

    def _reopen(self, run_id: str) -> bool:
        """Continue run ``run_id``: back to RUNNING, and note the last round stored per metric
        (a killed job may have sent rounds after its checkpoint) so none is recorded twice."""
        try:
            stored = _retry(self.client.get_run, run_id)
        except Exception as e:  # noqa: BLE001 - deleted run, or another tracking store
            log.debug("cannot reopen MLflow run %s: %s", run_id, e)
            return False
        if stored.info.lifecycle_stage != "active":
            return False
        self.run_id = run_id
        self.logged = {k: max((m.step for m in _retry(self.client.get_metric_history, run_id, k)),
                              default=0) for k in stored.data.metrics}
        _retry(self.client.update_run, run_id, status="RUNNING")
        return True

    def _replay(self, history):
        for row in history:
            self.log({k: v for k, v in row.items() if k != "round"}, step=int(row["round"]))

    def log(self, metrics, step):
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self.buffer += [Metric(k, float(v), ts, step) for k, v in metrics.items()
                        if isinstance(v, (int, float)) and step > self.logged.get(k, 0)]
        if len(self.buffer) >= self.flush_every:
            self.flush()

    def flush(self):
        if self.buffer and self.run_id:
            _retry(self.client.log_batch, self.run_id, metrics=self.buffer)
            self.buffer = []

    def artifacts(self, paths):
        for p in paths:
            if Path(p).is_file():
                _retry(self.client.log_artifact, self.run_id, str(p))

    def end(self, status):
        if self.run_id:
            try:
                self.flush()
            finally:
                _retry(self.client.set_terminated, self.run_id, status)


def make_tracker(enabled: bool, experiment: str) -> Tracker:
    """The job's tracker. With a tracking server (``http(s)://`` URI) that does not answer, the job
    fails before training with a message naming the URI, or, with ``$MCFL_TRACKING_UNREACHABLE=defer``,
    trains untracked (its files are the record: ``mcfl track RUN_DIR`` records it later)."""
    if not enabled:
        return Tracker()
    try:
        check_server()
    except ConnectionError as e:
        if os.environ.get(UNREACHABLE_ENV, "fail") != "defer":
            raise
        log.warning("%s; %s=defer: training without tracking, record the run later with "
                    "`mcfl track`", e, UNREACHABLE_ENV)
        return Tracker()
    return MLflowTracker(experiment)


RECORD_TAG = "mcfl_record"


def record_finished(run_dirs: Iterable[str | Path], experiment: str) -> list[tuple[str, str]]:
    """Record finished runs from their files (``metrics.json`` with the resolved config,
    ``history.csv``; the run's outputs as artifacts) as live tracking would have: one MLflow run
    each, nested under ``$MCFL_SWEEP_RUN_ID`` if set. A run directory whose ``metrics.json`` is
    already recorded (a FINISHED run with tag ``mcfl_record``: its sha256) is skipped, so rerunning
    after a partial rerun of the DAG adds only the new results. Idempotent under concurrency: the
    whole lookup-and-record holds the store's ``track`` lock, and a run left unfinished by a killed
    ``mcfl track`` is deleted and recorded again. Returns (run directory, MLflow run id) pairs."""
    with store_lock("track"):
        return _record_finished(run_dirs, experiment)


def _record_finished(run_dirs: Iterable[str | Path], experiment: str) -> list[tuple[str, str]]:
    import math

    import pandas as pd

    client = _client()
    exp = experiment_id(client, experiment)
    known = {}
    token = None
    while True:                                       # every recorded run of the experiment
        page = _retry(client.search_runs, [exp], filter_string=f"tags.{RECORD_TAG} != ''",
                      max_results=5000, page_token=token)
        for r in page:
            if r.info.status == "FINISHED":
                known[r.data.tags[RECORD_TAG]] = r.info.run_id
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
        if key in known:
            out.append((str(d), known[key]))
            continue
        m = json.loads(raw)
        if "config" not in m:
            raise ValueError(f"{d / 'metrics.json'}: no 'config' (written by an older mcfl); "
                             f"rerun the training job to record it")
        rows = [{k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
                for row in pd.read_csv(d / "history.csv").to_dict("records")]
        t = MLflowTracker(experiment, client=client)
        t.start(m["config"], {k: m[k] for k in ("git", "data_hash", "run_hash", "threads", "torch", "cpu")
                              if k in m}, history=rows,
                tags={RECORD_TAG: key})
        t.artifacts([d / f for f in OUTPUTS if (d / f).exists()])
        t.end("FINISHED")
        out.append((str(d), t.run_id))
    return out


def init_sweep(experiment: str, name: str) -> str:
    """Create the store and experiment (once, before parallel jobs) and a parent run; return its id.
    A tracking server that does not answer stops the sweep here, before any job is submitted."""
    check_server()
    client = _client()
    exp = experiment_id(client, experiment)
    run = _retry(client.create_run, exp, tags={"mlflow.runName": name, "sweep": "true"})
    return run.info.run_id


def end_sweep(run_id: str, status: str) -> None:
    """Mark the sweep run ended; with a tracking server, print the link to its runs table (the
    *Model training* view: MLflow 3.17's UI otherwise opens the GenAI overview; docs/cluster.md)."""
    client = _client()
    _retry(client.set_terminated, run_id, status)
    uri = tracking_uri()
    if uri.startswith(("http://", "https://")):
        exp = _retry(client.get_run, run_id).info.experiment_id
        print(f"MLflow runs: {runs_link(uri, exp)}", file=sys.stderr)


def runs_link(uri: str, experiment_id: str) -> str:
    """The UI's runs table of an experiment, in the *Model training* view."""
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
