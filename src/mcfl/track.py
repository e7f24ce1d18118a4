"""Experiment tracking. Only this module, :mod:`mcfl.track_store` and :mod:`mcfl.record` import MLflow; everything else calls a :class:`Tracker`.

Store: ``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<cwd>/mlflow.db`` (absolute, so jobs that
change directory still find it); artifacts under ``<cwd>/mlartifacts`` (a server keeps its own).
For runs on several machines point ``MLFLOW_TRACKING_URI`` at an ``mlflow server`` (SQLite on a
network filesystem is unsafe).

Concurrency. MLflow creates a new sqlite store's tables (and migrates an old one) when a client
first opens it, and two processes doing that at once fail (``table tags already exists``): every
client is opened under a file lock next to the sqlite file (:func:`store_lock`), so the first
process creates the tables and the others wait for it. A Snakemake invocation also creates the
store and the experiment before any job starts (:func:`mcfl.record.init_sweep`, from the Snakefile's ``onstart``);
each run is tagged with the invocation (``sweep``: config file and start time, from ``$MCFL_SWEEP``).
Runs are flat, not nested under a parent run: the runs table then lists every run as a row, so
FedAvg and FeSEM sit side by side without expanding anything, and the ``sweep`` tag still groups or
filters one invocation's runs. Writes retry when SQLite says "database is locked"
(each retry is logged). A resumed training job (see :mod:`mcfl.runner`) continues its MLflow run:
same run id, back to RUNNING, each (metric, round) pair recorded once however often the job was
killed, FINISHED at the end. A job stopped by SIGTERM or Ctrl-C marks its run KILLED, one that
fails FAILED; one killed by SIGKILL stays RUNNING until it is resumed, or, killed before its first
checkpoint, until the run starts again: the new start marks it KILLED and replaces it (one run per
name), see :meth:`MLflowTracker.start`. A run that finishes supersedes the earlier runs of its run
folder (tag ``run_dir``; a rerun after a changed or restored parameter): they are tagged
``superseded_by`` and deleted, so the runs table shows each run folder once
(:func:`mcfl.tracked_runs.supersede_older_runs`).

Faults of the store itself (a garbage file, a full disk, a path that cannot be opened, a URI MLflow
does not know) raise :class:`TrackingError`, one line naming the URI and what to do; with
``$MCFL_TRACKING_UNREACHABLE=defer`` the training goes on untracked instead (``mcfl track`` records
it later).

The UI. An experiment is tagged as a model-training experiment, and carries a saved view of its
runs table (:data:`VIEW_KEY`: columns dataset, method, K, seed, the settings that differ between the
runs, and the final metrics; MLflow's own shared-view mechanism). :func:`mcfl.record.runs_link` is the URL that
opens it: the runs table, ready to compare, instead of MLflow 3's GenAI overview.

``tracking: deferred`` records finished runs afterwards instead (:func:`mcfl.record.record_finished`, the
workflow's ``track`` rule): training jobs then never import MLflow (about 3 s of start-up per job,
a fifth of a short job's time) and one job replays every run from its output files, with the same
params, tags, per-round metrics and artifacts, and with the training's own times (start, end and
each round's); nothing is visible in the UI until it has run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from mcfl import methods
from mcfl.track_store import TrackingError, create_sqlite_store, quiet_mlflow, refuse_directory
from mcfl.tracked_runs import DURATION_COLUMN, RUN_DIR_TAG, run_dir_key, supersede_older_runs, with_percent

log = logging.getLogger("mcfl")
SWEEP_ENV = "MCFL_SWEEP"        # this invocation's name, tagged `sweep` on every run
# What a training job does when the tracking server does not answer: `fail` (default; the error names
# the URI) or `defer` (train without tracking; record the run afterwards with `mcfl track`)
UNREACHABLE_ENV = "MCFL_TRACKING_UNREACHABLE"
# Tags every mcfl experiment carries: the MLflow UI opens a `custom_model_development` experiment on
# its runs table ("Model training") instead of the GenAI overview
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
# The saved view of the runs table that `runs_link` opens (tag `mlflow.sharedViewState.<key>`)
VIEW_KEY = "mcfl-runs"
VIEW_TAG = "mlflow.sharedViewState." + VIEW_KEY
#: the final metrics the runs table shows, in this order: accuracies and F1 in percent, as the
#: tables give them (:func:`with_percent`), and ARI as the tables give it (a fraction)
METRICS = ("micro_acc_pct", "macro_acc_pct", "micro_f1_pct", "macro_f1_pct", "ari")
#: the run settings it shows (params), then those that differ between the experiment's runs
PARAMS = ("dataset", "method", "params.K", "seed")


def tracking_error(e: BaseException, uri: str | None = None) -> TrackingError:
    """``e`` (from MLflow, sqlalchemy or sqlite) as one line: which store, what is wrong, what to do."""
    if isinstance(e, TrackingError):
        return e
    uri = uri or tracking_uri()
    text = " ".join(str(e).split()).lower()
    path = uri[len("sqlite:///"):].split("?")[0] if uri.startswith("sqlite:///") else None
    if "unsupported uri" in text or "not a valid remote uri" in text or type(e).__name__.startswith("Unsupported"):
        what, todo = ("not a tracking URI MLflow knows", "set MLFLOW_TRACKING_URI to sqlite:///PATH or "
                      "http(s)://HOST:PORT, or unset it (mlflow.db in the working directory)")
    elif "disk is full" in text or "no space left" in text:
        what, todo = "the disk is full", "free space there, or point MLFLOW_TRACKING_URI at another disk"
    elif "file is not a database" in text or "malformed" in text or "can't locate revision" in text:
        what, todo = ("not an MLflow database (corrupt, or another file)",
                      f"move {path or 'it'} away (a new store is made on the next run) or point "
                      f"MLFLOW_TRACKING_URI at another")
    elif isinstance(e, OSError) and not isinstance(e, TrackingError):
        what, todo = f"cannot be opened ({e.strerror or e})", "check that the path exists and is writable"
    elif "unable to open" in text or "readonly" in text or "read-only" in text or "permission" in text:
        what, todo = "cannot be opened for writing", "check that the path exists and is writable"
    else:
        what, todo = " ".join(str(e).split())[:200] or type(e).__name__, "check the store"
    return TrackingError(f"MLflow tracking store {uri}: {what}; {todo}, or set {UNREACHABLE_ENV}=defer "
                         f"to train without it and record the run later with `mcfl track`")


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(Path.cwd() / 'mlflow.db').resolve()}"


def _retry(fn: Callable, *args, tries: int = 12, **kwargs):
    for i in range(tries):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - MLflow wraps sqlite errors in several types
            if "locked" not in str(e).lower() or i == tries - 1:
                if _store_fault(e):
                    raise tracking_error(e) from e
                raise
            wait = min(5.0, 0.1 * 2 ** i) * (0.5 + random.random())
            log.info("MLflow store busy (database is locked); retry %d in %.2f s", i + 1, wait)
            time.sleep(wait)


def _cause(e: BaseException) -> str:
    """A tracking error's message without its advice to defer (for the warning when deferring)."""
    return str(e).split(f", or set {UNREACHABLE_ENV}=defer")[0]


def _store_fault(e: BaseException) -> bool:
    """An error of the store itself (not of one request, such as a run that does not exist)."""
    if isinstance(e, (OSError, TrackingError)):
        return True
    mod = type(e).__module__
    return mod.startswith(("sqlalchemy", "sqlite3", "alembic")) or type(e).__name__.startswith("Unsupported") \
        or any(k in str(e).lower() for k in ("disk is full", "file is not a database", "unable to open"))


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
    creates or migrates its tables. A new sqlite store is made whole first
    (:func:`mcfl.track_store.create_sqlite_store`)."""
    uri = tracking_uri()
    refuse_directory(uri)                       # before MLflow's import: at once
    from mlflow import MlflowClient

    quiet_mlflow()                              # after it: MLflow sets its loggers when imported
    try:
        if not uri.startswith("sqlite:"):
            return MlflowClient(tracking_uri=uri)
        with store_lock("init", uri):
            create_sqlite_store(uri)
            return MlflowClient(tracking_uri=uri)
    except Exception as e:  # noqa: BLE001 - sqlalchemy, sqlite, MLflow's URI registry, OSError
        raise tracking_error(e, uri) from e


def experiment_id(client, name: str, differing: Iterable[str] | None = None) -> str:
    """The id of experiment ``name``, created if missing; tagged as a model-training experiment
    (:data:`EXPERIMENT_TAGS`; an experiment made by an older mcfl gets the tags now) with the runs
    table's view (:func:`runs_view`; set again when ``differing`` names the settings to show)."""
    exp = _retry(client.get_experiment_by_name, name)
    if exp is None:
        local = tracking_uri().startswith(("sqlite:", "file:"))  # a server keeps its own artifact store
        try:
            exp_id = _retry(client.create_experiment, name, artifact_location=(
                (Path.cwd() / "mlartifacts").resolve().as_uri() if local else None),
                tags={**EXPERIMENT_TAGS, VIEW_TAG: runs_view(differing or ())})
            return exp_id
        except Exception:  # created concurrently by another process, or a fault (a full disk)
            exp = _retry(client.get_experiment_by_name, name)
            if exp is None:                     # not created by anyone: the fault is the error
                raise
    want = dict(EXPERIMENT_TAGS)
    if differing is not None or VIEW_TAG not in exp.tags:
        want[VIEW_TAG] = runs_view(differing or ())
    for k, v in want.items():
        if exp.tags.get(k) != v:
            _retry(client.set_experiment_tag, exp.experiment_id, k, v)
    return exp.experiment_id


def runs_view(differing: Iterable[str] = ()) -> str:
    """The runs table's saved view (MLflow's shared-view state, JSON): columns for :data:`PARAMS`,
    the params in ``differing`` (flattened run-config keys such as ``train.lr``), the final
    :data:`METRICS` and MLflow's Duration (the training's time: runs carry its start and end), in
    the order PARAMS, METRICS, Duration, the differing settings (what a run is, how it scored, then
    the rest, so the metrics are on the first screen); rows sorted by run name
    (method · dataset · seed), every run drawn in the charts."""
    params = list(dict.fromkeys([*PARAMS, *sorted(set(differing) - set(PARAMS))]))[:16]
    cols = [*(f"params.`{k}`" for k in params[:len(PARAMS)]), *(f"metrics.`{k}`" for k in METRICS),
            *(f"params.`{k}`" for k in params[len(PARAMS):])]
    at = len(PARAMS) + len(METRICS)
    cols = [*cols[:at], DURATION_COLUMN, *cols[at:]]
    return json.dumps({"selectedColumns": cols, "columnOrder": cols, "orderByKey": "tags.`mlflow.runName`", "orderByAsc": True,
                       "runsHiddenMode": "SHOW_ALL", "lifecycleFilter": "Active"}, separators=(",", ":"))


def differing_settings(runs: Iterable[dict]) -> list[str]:
    """The flattened run-config keys whose values differ between ``runs`` (what to compare on)."""
    seen: dict[str, set] = {}
    runs = list(runs)
    for run in runs:
        for k, v in flatten(run).items():
            seen.setdefault(k, set()).add(json.dumps(v, sort_keys=True, default=str))
    keys = {k for k in seen if k not in ("label", "run_id", "experiment")}
    return sorted(k for k in keys if len(seen[k]) > 1 or sum(k in flatten(r) for r in runs) < len(runs))


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


def run_name(run: dict) -> str:
    """The run's name in the UI: ``FeSEM(4) · digits · s0`` (method label, dataset, seed)."""
    return f"{run['label']} · {run['dataset']} · s{run['seed']}"


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(round(seconds * 1000))


def method_origin(method: str) -> str:
    """Where a run's method comes from (``mcfl.methods.origin``: built-in, its ``module:Class``,
    or its entry point with the distribution's name and version), for the run's ``method_origin``
    tag; a method that no longer resolves is recorded as such."""
    try:
        return methods.origin(method)
    except methods.MethodError as e:
        return f"unresolved: {e}"[:500]


class MLflowTracker(Tracker):
    """One MLflow run per training run; per-round metrics buffered and sent with ``log_batch``.

    With ``defer`` (default: ``$MCFL_TRACKING_UNREACHABLE=defer``) a store that fails during the run
    (a full disk) stops the tracking with one warning and the training goes on; otherwise the fault is
    a :class:`TrackingError`."""

    def __init__(self, experiment: str, flush_every: int = 200, client=None, defer: bool | None = None,
                 run_dir: str | Path | None = None):
        self.experiment, self.flush_every = experiment, flush_every
        self.run_dir = run_dir_key(run_dir) if run_dir is not None else None
        self.defer = os.environ.get(UNREACHABLE_ENV, "fail") == "defer" if defer is None else defer
        self.client = client or _client()
        self.run_id: str | None = None
        self.buffer: list = []
        self.logged: dict[str, int] = {}    # metric -> last step already in the store (resumed runs)
        self.failed = False

    def _guard(self, fn, *args, **kwargs):
        """``fn`` against the store; a store fault ends the tracking (``defer``) or is raised."""
        if self.failed:
            return None
        try:
            return fn(*args, **kwargs)
        except TrackingError as e:
            if not self.defer:
                raise
            self.failed = True
            log.warning("%s; %s=defer: training goes on without tracking, record the run later "
                        "with `mcfl track`", _cause(e), UNREACHABLE_ENV)
            return None

    def start(self, run, identity, resume_id=None, history=(), tags=None, start_time=None):
        return self._guard(self._start, run, identity, resume_id, history, tags, start_time)

    def _start(self, run, identity, resume_id=None, history=(), tags=None, start_time=None):
        from mlflow.entities import Param, RunTag

        if resume_id and self._reopen(resume_id):
            self._replay(history)
            return resume_id
        if resume_id:
            log.warning("MLflow run %s is not in %s; recording the resumed run as a new one",
                        resume_id, tracking_uri())
        exp = experiment_id(self.client, self.experiment)
        name = run_name(run)
        self._replace_unfinished(exp, identity["run_hash"], name)
        tags = {"dataset": run["dataset"], "method": run["method"], "label": run["label"],
                "seed": str(run["seed"]), "K": str(run["params"].get("K", "")),
                "git_sha": identity["git"], "data_hash": identity["data_hash"],
                "run_hash": identity["run_hash"], "mlflow.runName": name, "method_origin": method_origin(run["method"]),
                **{k: run[k] for k in ["draw"] if k in run}, **(tags or {})}   # draw: mcfl.replication
        if self.run_dir:
            tags[RUN_DIR_TAG] = self.run_dir
        tags.update({k: str(identity[k]) for k in ("threads", "torch", "cpu") if k in identity})
        if os.environ.get(SWEEP_ENV):
            tags["sweep"] = os.environ[SWEEP_ENV]
        r = _retry(self.client.create_run, exp, start_time=start_time, tags=tags, run_name=name)
        self.run_id = r.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in sorted(flatten(run).items())]
        _retry(self.client.log_batch, self.run_id, params=params,
               tags=[RunTag("config_json", json.dumps(run, sort_keys=True)[:5000])])
        self._replay(history)
        return self.run_id

    def _replace_unfinished(self, exp: str, run_hash: str, name: str) -> None:
        """A run of the same training (``run_hash``) left unfinished (RUNNING: its job was killed
        before its first checkpoint; or KILLED/FAILED): marked KILLED if still RUNNING, then deleted,
        so that the run starting now replaces it instead of adding a second row of the same name."""
        old = _retry(self.client.search_runs, [exp], max_results=100,
                     filter_string=f"tags.run_hash = '{run_hash}' and attributes.status != 'FINISHED'")
        for r in old:
            if r.data.tags.get("mlflow.runName") != name:
                continue
            if r.info.status == "RUNNING":
                _retry(self.client.set_terminated, r.info.run_id, "KILLED")
            log.warning("MLflow run %s (%s) was left %s by a training that did not finish: marked "
                        "KILLED and replaced by this run", r.info.run_id, name, r.info.status)
            _retry(self.client.delete_run, r.info.run_id)

    def _reopen(self, run_id: str) -> bool:
        """Continue run ``run_id``: back to RUNNING, and note the last round stored per metric
        (a killed job may have sent rounds after its checkpoint) so none is recorded twice."""
        try:
            stored = _retry(self.client.get_run, run_id)
        except TrackingError:
            raise
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

    def _replay(self, history, times=None):
        for i, row in enumerate(history):
            self.log({k: v for k, v in row.items() if k != "round"}, step=int(row["round"]),
                     timestamp=None if times is None else times[i])

    def log(self, metrics, step, timestamp=None):
        from mlflow.entities import Metric

        if self.failed:
            return
        ts = int(time.time() * 1000) if timestamp is None else int(timestamp)
        self.buffer += [Metric(k, float(v), ts, step) for k, v in with_percent(metrics).items()
                        if isinstance(v, (int, float)) and step > self.logged.get(k, 0)]
        if len(self.buffer) >= self.flush_every:
            self.flush()

    def flush(self):
        if self.buffer and self.run_id and not self.failed:
            self._guard(_retry, self.client.log_batch, self.run_id, metrics=self.buffer)
            self.buffer = []

    def artifacts(self, paths):
        for p in paths:
            if Path(p).is_file() and self.run_id:
                self._guard(_retry, self.client.log_artifact, self.run_id, str(p))

    def end(self, status, end_time=None):
        if self.run_id and not self.failed:
            try:
                self.flush()
            finally:
                self._guard(_retry, self.client.set_terminated, self.run_id, status, end_time=end_time)
        if status == "FINISHED" and self.run_dir and self.run_id and not self.failed:
            self._guard(supersede_older_runs, self.client, self.run_id, self.run_dir, _retry)


def make_tracker(enabled: bool, experiment: str, run_dir: str | Path | None = None) -> Tracker:
    """The job's tracker. A store that cannot be used (a tracking server that does not answer, a
    garbage or full sqlite file, an unknown URI) fails the job before training with one line naming
    the URI, or, with ``$MCFL_TRACKING_UNREACHABLE=defer``, the job trains untracked (its files are
    the record: ``mcfl track RUN_DIR`` records it later)."""
    if not enabled:
        return Tracker()
    try:
        check_server()
        tracker = MLflowTracker(experiment, run_dir=run_dir)
        experiment_id(tracker.client, experiment)        # opens the store: its faults show here
        return tracker
    except ConnectionError as e:                        # TrackingError too
        if os.environ.get(UNREACHABLE_ENV, "fail") != "defer":
            raise
        log.warning("%s; %s=defer: training without tracking, record the run later with "
                    "`mcfl track`", _cause(e), UNREACHABLE_ENV)
        return Tracker()
