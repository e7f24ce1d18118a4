"""How a run shows in MLflow beyond its params and metrics, for :mod:`mcfl.track`: the run folder
it records (tag :data:`RUN_DIR_TAG`), so that a rerun of a folder supersedes the folder's older runs
and the runs table shows each folder once; accuracies and F1 scores also in percent, the results
tables' unit; and the runs table's Duration column."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("mcfl")

#: the run's folder (relative to the working directory), tagged on its MLflow run: a rerun's run
#: supersedes the older runs of the same folder (:func:`supersede_older_runs`)
RUN_DIR_TAG = "run_dir"
#: set on a run that a later run of the same folder superseded (then deleted): that run's id
SUPERSEDED_TAG = "superseded_by"
#: how many runs MLflow's runs table loads at a time (the rest behind its "Load more")
UI_PAGE = 100

#: MLflow UI's column of a run's end minus its start
DURATION_COLUMN = "attributes.`Duration`"


def with_percent(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` and, for each accuracy or F1 score (a fraction: ``micro_acc``,
    ``seen/macro_f1``, ...), the same in percent as ``<name>_pct``, rounded to 0.01 (the results
    tables' unit; MLflow allows no ``%`` in a metric's name)."""
    out = dict(metrics)
    for k, v in metrics.items():
        if k.rsplit("/", 1)[-1].endswith(("_acc", "_f1")) and isinstance(v, (int, float)) and v == v:
            out[f"{k}_pct"] = round(float(v) * 100, 2)
    return out


def run_dir_key(run_dir: str | Path) -> str:
    """A run folder as its MLflow tag names it: relative to the working directory (where the DAG
    and the store live), with ``/``; absolute where it is not under it."""
    path = Path(os.path.abspath(run_dir))
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _once(fn: Callable, *args, **kwargs):
    return fn(*args, **kwargs)


def supersede_older_runs(client, run_id: str, run_dir: str, retry: Callable = _once) -> list[str]:
    """Mark the experiment's other active runs of folder ``run_dir`` (tag :data:`RUN_DIR_TAG`), and
    those of its name and parameters recorded before runs carried their folder (no such tag),
    superseded by ``run_id`` (tag :data:`SUPERSEDED_TAG`) and delete them (MLflow's lifecycle
    ``deleted``: the runs table's default view hides them; its filter for deleted runs, or
    ``mlflow gc``, reaches them), so each run folder has one visible run: its latest. Each call to
    the store goes through ``retry`` (:mod:`mcfl.track`'s, for a busy sqlite store). Returns the
    ids deleted."""
    run = retry(client.get_run, run_id)
    where = "" if "'" in run_dir else f"tags.{RUN_DIR_TAG} = '{run_dir}'"   # matched exactly below
    older = [r for r in retry(client.search_runs, [run.info.experiment_id], filter_string=where,
                              max_results=5000) if r.data.tags.get(RUN_DIR_TAG) == run_dir]
    gone = []
    for r in older + _untagged_twins(client, run, retry):
        if r.info.run_id == run_id or r.info.run_id in gone:
            continue
        retry(client.set_tag, r.info.run_id, SUPERSEDED_TAG, run_id)
        retry(client.delete_run, r.info.run_id)
        gone.append(r.info.run_id)
    if gone:
        log.info("MLflow: %s superseded by run %s (%s): deleted", ", ".join(gone), run_id, run_dir)
    return gone


def _untagged_twins(client, run, retry: Callable = _once) -> list:
    """The experiment's active runs recorded before runs carried their folder (no tag
    :data:`RUN_DIR_TAG`) that have ``run``'s name and parameters: earlier records of the same
    run, which ``run`` supersedes as it does its folder's."""
    name = run.data.tags.get("mlflow.runName") or run.info.run_name
    if not name or "'" in name:
        return []
    found = retry(client.search_runs, [run.info.experiment_id],
                  filter_string=f"tags.`mlflow.runName` = '{name}'", max_results=5000)
    return [r for r in found if RUN_DIR_TAG not in r.data.tags and r.data.params == run.data.params]
