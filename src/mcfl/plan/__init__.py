"""The workflow's planning: what the Snakemake DAG of a (validated) config contains.

``Plan(config)`` answers the questions the rule files (``workflow/rules/*.smk``) ask. It holds what
every stage shares (which runs exist, which store a dataset trains on, every path) and one planner
per stage, each a module of this package named after its rule file:

=====================  ==========================================  =================================
``P.prepare``          :mod:`mcfl.plan.data`                       ``data``, ``partition``, ``download``
``P.training``         :mod:`mcfl.plan.train`                      ``train``, ``init``, ``select_k``
``P.publishing``       :mod:`mcfl.plan.publish`                    ``protocols``, ``publish``
``P.papers[name]``     ``mcfl.papers.<name>`` (its ``planner``)    ``papers`` (one rule per job)
=====================  ==========================================  =================================

Every registered paper (:mod:`mcfl.papers`: FeSEM's figures, FedCG's and FedGSP's tables, and any an
installed package registers) has a planner here, built from the registry: the runs it adds (its
``added_runs()``, e.g. FedGSP's sweep points), the jobs of its outputs (``jobs()``, the rules of
``workflow/rules/papers.smk``) and its final outputs (``targets()``). ``P.figures``, ``P.fedcg`` and
``P.fedgsp`` are the built-in papers' planners.

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
import re
import shutil

from mcfl.cluster.spec import centre_key
from mcfl.config import expand_runs
from mcfl.data.repartition import is_identity
from mcfl.io import canonical_json
from mcfl.papers import Job, papers
from mcfl.plan.data import PreparePlan, leaf_raw
from mcfl.plan.publish import PublishPlan
from mcfl.plan.runs import RUN_FILES, RUN_PATTERN, SUFFIX, run_key
from mcfl.plan.train import TrainPlan

__all__ = ["Plan", "RUN_FILES", "RUN_PATTERN", "leaf_raw", "run_key"]

class Plan:
    """The DAG of one validated config (see the module docstring)."""

    def __init__(self, config: dict, config_file: str = "config/config.yaml"):
        self.config = config
        #: the config file the pages a paper publishes name
        self.config_file = config_file
        self.datasets: dict[str, dict] = config["datasets"]
        self.results: str = config["results"]
        self.data_dir: str = config["data_dir"]
        self.log_dir = "logs" if os.path.normpath(self.results) == "results" else f"{self.results}/logs"
        #: the configured runs, in config order: what the report's tables cover
        self.configured: dict[tuple, dict] = {run_key(r): r for r in expand_runs(config)}
        #: every run a training job exists for: the configured ones, then the new ones the papers
        #: add (FedGSP's sweep points; what `track` records)
        self.runs: dict[tuple, dict] = dict(self.configured)
        #: every registered paper's planner (see the module docstring)
        self.papers = {name: paper.load("planner")(self) for name, paper in papers().items()}
        self.figures, self.fedcg, self.fedgsp = (self.papers[p] for p in ("fesem", "fedcg", "fedgsp"))
        #: FedGSP's sweep runs {"heatmap": [(run, point)...], "kappa": [...]} (empty without `fedgsp`)
        self.sweeps: dict[str, list] = self.fedgsp.sweeps
        for planner in self.papers.values():
            for run in planner.added_runs() if hasattr(planner, "added_runs") else ():
                self.runs.setdefault(run_key(run), run)
        # one centre file per distinct centre spec and seed (runs computing the same centres share it)
        self.inits: dict[tuple, dict] = {}
        for (d, _, s), run in self.runs.items():
            if run["needs_centres"]:
                self.inits.setdefault((d, centre_key(run), s), run)
        #: extra inputs of training jobs: ``{name: (file, datasets)}``, a file a check writes before
        #: the jobs of those datasets start (``replication_check``: workflow/rules/replication.smk)
        self.gates: dict[str, tuple[str, list[str]]] = {}
        # the stages' planners (each beside its rule file: see the module docstring)
        self.prepare = PreparePlan(self)
        self.training = TrainPlan(self)
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

    def gates_of(self, dataset: str) -> dict[str, str]:
        """The gate files the training jobs of ``dataset`` wait for (see :attr:`gates`)."""
        return {name: path for name, (path, datasets) in self.gates.items() if dataset in datasets}

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
        out = [t for planner in self.papers.values() for t in planner.targets()] + self.training.targets()
        if self.config["tracking"] == "deferred":
            out.append(self.res("mlflow_runs.tsv"))
        return out + self.publishing.targets()


    def paper_jobs(self) -> list[Job]:
        """Every registered paper's jobs: the rules of ``workflow/rules/papers.smk``; a job that
        names no benchmark file gets ``<results>/benchmarks/<rule>[_<wildcards>].tsv``."""
        jobs = [job for planner in self.papers.values() for job in planner.jobs()]
        for job in jobs:
            if job.benchmark is None:
                wildcards = sorted({w for path in job.outputs.values() for w in re.findall(r"{(\w+)}", path)})
                job.benchmark = self.res(f"benchmarks/{'_'.join([job.rule, *(f'{{{w}}}' for w in wildcards)])}.tsv")
        return jobs


def dag_jobs(dag) -> list[tuple[str, dict, tuple[int, ...]]]:
    """The jobs a Snakemake DAG is about to run, as :func:`mcfl.cost.estimate` reads them: (rule,
    wildcards, indices of the jobs among them that each waits for); targets that run nothing
    (rule all) left out."""
    todo = [job for job in dag.needrun_jobs() if not job.is_norun]
    index = {job: i for i, job in enumerate(todo)}
    return [(job.rule.name, dict(job.wildcards_dict), tuple(index[d] for d in dag.dependencies[job] if d in index))
            for job in todo]
