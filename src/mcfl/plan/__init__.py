"""The workflow's planning: what the Snakemake DAG of a (validated) config contains.

``Plan(config)`` answers the questions the rule files (``workflow/rules/*.smk``) ask. It holds what
every stage shares (which runs exist, which store a dataset trains on, every path) and one planner
per stage, each a module of this package named after its rule file:

=====================  ==========================================  =================================
``P.prepare``          :mod:`mcfl.plan.data`                       ``data``, ``partition``, ``download``
``P.training``         :mod:`mcfl.plan.train`                      ``train``, ``init``, ``select_k``
``P.figures``          :mod:`mcfl.plan.figures`                    ``figures`` (FeSEM Figs. 4-5)
``P.fedcg``            :mod:`mcfl.plan.fedcg`                      ``fedcg`` (FedCG Tables 3-5)
``P.fedgsp``           :mod:`mcfl.plan.fedgsp`                     ``fedgsp`` (FedGSP §4.2)
``P.publishing``       :mod:`mcfl.plan.publish`                    ``protocols``, ``publish``
=====================  ==========================================  =================================

The rule files only declare rules over these, so this package is where the DAG's logic is tested
(``tests/plan/test_plan.py``) and nothing depends on the order in which the rule files are included.

One convention for a job's settings: a rule's ``params`` are a planner's values or methods of the
job's wildcards (``w``); those derived from the job's files take ``(w, input)``. The rule's shell
command quotes each one (``{params.x:q}``).

Paths: ``res(...)`` is under the config's ``results``, ``data(...)`` under its ``data_dir``,
``logs(...)`` under the results' job logs (``logs/`` for the default results directory, else
``<results>/logs``, so an overlay config's runs never overwrite the default runs' logs; data jobs
always log to ``logs/``). A run's directory is ``res("runs/{dataset}/{run}/seed{seed}")``.
"""

from __future__ import annotations

import os
import shutil

from mcfl.cluster.spec import centre_key
from mcfl.config import expand_runs
from mcfl.data.repartition import is_identity
from mcfl.fedgsp.config import sweep_runs
from mcfl.io import canonical_json
from mcfl.plan.data import PreparePlan, leaf_raw
from mcfl.plan.fedcg import FedCGPlan
from mcfl.plan.fedgsp import FedGSPPlan
from mcfl.plan.figures import FiguresPlan
from mcfl.plan.publish import PublishPlan
from mcfl.plan.runs import RUN_FILES, RUN_PATTERN, SUFFIX, run_key
from mcfl.plan.train import TrainPlan

__all__ = ["Plan", "RUN_FILES", "RUN_PATTERN", "leaf_raw", "run_key"]

class Plan:
    """The DAG of one validated config (see the module docstring)."""

    def __init__(self, config: dict):
        self.config = config
        self.datasets: dict[str, dict] = config["datasets"]
        self.results: str = config["results"]
        self.data_dir: str = config["data_dir"]
        self.log_dir = "logs" if os.path.normpath(self.results) == "results" else f"{self.results}/logs"
        #: the configured runs, in config order: what the report's tables cover
        self.configured: dict[tuple, dict] = {run_key(r): r for r in expand_runs(config)}
        #: FedGSP's sweep runs {"heatmap": [(run, point)...], "kappa": [...]} (empty without `fedgsp`)
        self.sweeps: dict[str, list] = sweep_runs(config) if "fedgsp" in config else {"heatmap": [], "kappa": []}
        #: every run a training job exists for: the configured ones, then new sweep points (what
        #: `track` records)
        self.runs: dict[tuple, dict] = dict(self.configured)
        for points in self.sweeps.values():
            for run, _ in points:
                self.runs.setdefault(run_key(run), run)
        # one centre file per distinct centre spec and seed (runs computing the same centres share it)
        self.inits: dict[tuple, dict] = {}
        for (d, _, s), run in self.runs.items():
            if run["needs_centres"]:
                self.inits.setdefault((d, centre_key(run), s), run)
        #: extra inputs of every training job: files a check writes before any training starts
        #: (``replication_check``: workflow/rules/replication.smk)
        self.gates: dict[str, str] = {}
        # the stages' planners (each beside its rule file: see the module docstring)
        self.prepare = PreparePlan(self)
        self.training = TrainPlan(self)
        self.figures = FiguresPlan(self)
        self.fedcg = FedCGPlan(self)
        self.fedgsp = FedGSPPlan(self)
        self.publishing = PublishPlan(self)

    # -- paths -------------------------------------------------------------------------------------
    def res(self, path: str) -> str:
        return f"{self.results}/{path}"

    def page(self, out: str) -> str:
        """Where the DAG writes a table or page the documentation shows: inside the results directory,
        at the repository path the config names (``out: docs/results/NAME`` ->
        ``<results>/docs/results/NAME``); ``make docs-results`` copies ``<results>/docs/`` into ``docs/``."""
        return self.res(out.removeprefix("./"))

    def data(self, path: str) -> str:
        return f"{self.data_dir}/{path}"

    def logs(self, path: str) -> str:
        return f"{self.log_dir}/{path}"

    @property
    def run_dir(self) -> str:
        """A run's directory, with the wildcards {dataset}, {run} and {seed}."""
        return self.res("runs/{dataset}/{run}/seed{seed}")

    def run_file(self, name: str) -> str:
        """``metrics.json`` etc. of RUN_FILES in a run's directory (with wildcards)."""
        return f"{self.run_dir}/{name}.{SUFFIX.get(name, 'csv')}"

    def dir_of(self, run: dict) -> str:
        d, r, s = run_key(run)
        return self.run_dir.format(dataset=d, run=r, seed=s)

    def run_dirs(self, runs=None) -> list[str]:
        """The directories of ``runs`` (default: the configured runs)."""
        return [self.dir_of(r) for r in (self.configured.values() if runs is None else runs)]

    def run_outputs(self, name: str, runs=None) -> list[str]:
        return [f"{d}/{name}" for d in self.run_dirs(runs)]

    @staticmethod
    def input_dirs(wildcards, input) -> list[str]:
        """The directories of a job's input files (a param derived from its inputs)."""
        return [os.path.dirname(f) for f in input]

    # -- stores --------------------------------------------------------------------------------------
    def raw_store(self, dataset: str) -> str:
        """The prepared store; datasets with identical `prepare` blocks share one (prepared once)."""
        prep = canonical_json(self.datasets[dataset]["prepare"])
        return self.data(next(d for d, ds in self.datasets.items() if canonical_json(ds["prepare"]) == prep))

    def store(self, dataset: str) -> str:
        """The store a dataset's runs train on: the prepared one, or its re-partitioned copy when its
        `partition` block changes the clients or the split."""
        if is_identity(self.datasets[dataset].get("partition")):
            return self.raw_store(dataset)
        return self.data(f"partitioned/{dataset}")

    def stores(self) -> list[str]:
        return [self.store(d) for d in self.datasets]

    def store_of(self, w) -> str:
        return self.store(w.dataset)

    # -- wildcards and settings every job shares --------------------------------------------------
    def wildcard_constraints(self) -> dict[str, str]:
        return {"dataset": "|".join(self.datasets), "run": RUN_PATTERN, "centres": RUN_PATTERN,
                "first": r"first-[0-9a-f]+", "seed": r"\d+"}

    def gpu(self) -> int:
        """GPU units per training job: one when CUDA may be used (cap with ``--resources gpu=N``)."""
        return 0 if self.config["device"] == "cpu" or not shutil.which("nvidia-smi") else 1

    def run(self, w) -> dict:
        return self.runs[(w.dataset, w.run, w.seed)]

    def tracking_flag(self) -> str:
        return "--tracking" if self.config["tracking"] is True else "--no-tracking"

    # -- what `rule all` asks for besides the report --------------------------------------------
    def targets(self) -> list[str]:
        """The final outputs of the optional stages, each present when the config asks for it."""
        out = self.figures.targets() + self.fedgsp.targets() + self.training.targets()
        out += self.fedcg.targets()
        if self.config["tracking"] == "deferred":
            out.append(self.res("mlflow_runs.tsv"))
        return out + self.publishing.targets()


def dag_jobs(dag) -> list[tuple[str, dict, tuple[int, ...]]]:
    """The jobs a Snakemake DAG is about to run, as :func:`mcfl.cost.estimate` reads them: (rule,
    wildcards, indices of the jobs among them that each waits for); targets that run nothing
    (rule all) left out."""
    todo = [job for job in dag.needrun_jobs() if not job.is_norun]
    index = {job: i for i, job in enumerate(todo)}
    return [(job.rule.name, dict(job.wildcards_dict), tuple(index[d] for d in dag.dependencies[job] if d in index))
            for job in todo]
