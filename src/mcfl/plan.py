"""The workflow's planning: what the Snakemake DAG of a (validated) config contains.

``Plan(config)`` answers every question the rule files (``workflow/rules/*.smk``) ask: which runs
exist (the configured ones and FedGSP's sweep points), which store a dataset trains on, which
centre-initialisation files and K selections there are, each job's settings (the values of its
``params``) and every path. The rule files only declare rules over it, so this module is where the
DAG's logic is tested (``tests/test_plan.py``) and nothing depends on the order in which the rule
files are included.

One convention for a job's settings: a rule's ``params`` are the plan's values or methods of the
job's wildcards (``w``); those derived from the job's files take ``(w, input)``. The rule's shell
command quotes each one (``{params.x:q}``).

Paths: ``res(...)`` is under the config's ``results``, ``data(...)`` under its ``data_dir``,
``logs(...)`` under the results' job logs (``logs/`` for the default results directory, else
``<results>/logs``, so an overlay config's runs never overwrite the default runs' logs; data jobs
always log to ``logs/``). A run's directory is ``res("runs/{dataset}/{run}/seed{seed}")``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from typing import Any

from mcfl.cluster.spec import centre_key, centre_spec
from mcfl.config import ConfigError, expand_runs
from mcfl.data.repartition import is_identity
from mcfl.data.repartition import resolve as resolve_partition
from mcfl.io import canonical_json

#: the files a training job writes into its run directory (the ``train`` rule's outputs)
RUN_FILES = ("metrics", "history", "assignments", "predictions", "state")
_SUFFIX = {"state": "pt", "metrics": "json"}

#: what a wildcard may match besides a configured dataset name
RUN_PATTERN = "[A-Za-z0-9_+.()-]+"


def run_key(run: dict) -> tuple[str, str, str]:
    """(dataset, run id, seed as a string): how the rules' wildcards name a run."""
    return run["dataset"], run["run_id"], str(run["seed"])


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
        self.sweeps: dict[str, list] = {"heatmap": [], "kappa": []}
        if "fedgsp" in config:
            from mcfl.fedgsp.config import sweep_runs

            self.sweeps = sweep_runs(config)
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

    # -- paths -------------------------------------------------------------------------------------
    def res(self, path: str) -> str:
        return f"{self.results}/{path}"

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
        return f"{self.run_dir}/{name}.{_SUFFIX.get(name, 'csv')}"

    @property
    def init_file(self) -> str:
        """A centre file: {centres} is ``K<K>-<hash>`` (:func:`mcfl.cluster.spec.centre_key`)."""
        return self.res("init/{dataset}/{centres}/seed{seed}.pt")

    @property
    def select_k_file(self) -> str:
        return self.res("select_k/{dataset}/{run}/seed{seed}.json")

    @property
    def raw_dir(self) -> str:
        return self.data("raw")

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

    # -- wildcards and job settings ------------------------------------------------------------------
    def wildcard_constraints(self) -> dict[str, str]:
        return {"dataset": "|".join(self.datasets), "run": RUN_PATTERN, "centres": RUN_PATTERN,
                "seed": r"\d+"}

    def gpu(self) -> int:
        """GPU units per training job: one when CUDA may be used (cap with ``--resources gpu=N``)."""
        return 0 if self.config["device"] == "cpu" or not shutil.which("nvidia-smi") else 1

    def run(self, w) -> dict:
        return self.runs[(w.dataset, w.run, w.seed)]

    def run_json(self, w) -> str:
        return canonical_json(self.run(w))

    def init_run(self, w) -> dict:
        return self.inits[(w.dataset, w.centres, w.seed)]

    def init_json(self, w) -> str:
        """What the centre initialisation depends on (not the method, the rounds, nor evaluation)."""
        return canonical_json(centre_spec(self.init_run(w)))

    def init_path(self, run: dict) -> str:
        return self.init_file.format(dataset=run["dataset"], centres=centre_key(run), seed=run["seed"])

    def checkpoint(self, w) -> str:
        return self.res(f"checkpoints/{w.dataset}/{w.run}/seed{w.seed}.pt")

    def tracking_flag(self) -> str:
        return "--tracking" if self.config["tracking"] is True else "--no-tracking"

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

    def raw_store_of(self, w) -> str:
        return self.raw_store(w.dataset)

    def prepare_json(self, w) -> str:
        return canonical_json(self.datasets[w.dataset]["prepare"])

    def prepare_args(self, w) -> list[str]:
        """`mcfl prepare`'s words for a dataset (a list: the shell command quotes each one)."""
        p = self.datasets[w.dataset]["prepare"]
        args = [p["source"]]
        for key, value in p.items():
            if key == "source":
                continue
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + key.replace("_", "-"))
            elif isinstance(value, list):
                args += [a for v in value for a in (flag, str(v))]
            elif value is not None:
                args += [flag, str(value)]
        src = p["source"]
        return args + (["--raw-dir", f"{self.raw_dir}/{src}"] if src in leaf_raw() else [])

    def partition_of(self, dataset: str) -> dict:
        return resolve_partition(self.datasets[dataset].get("partition"))

    def partition_json(self, w) -> str:
        return canonical_json(self.partition_of(w.dataset))

    def partition_args(self, w) -> list[str]:
        return [a for k, v in self.partition_of(w.dataset).items() if v is not None
                for a in (f"--{k.replace('_', '-')}", str(v))]

    # -- LEAF downloads ------------------------------------------------------------------------------
    def leaf_fetch_settings(self, source: str) -> dict:
        """`origin` and `md5` of the datasets prepared from `source` (they share one download)."""
        blocks = [d["prepare"] for d in self.datasets.values() if d["prepare"]["source"] == source]
        found = {canonical_json({k: b.get(k) for k in ("origin", "md5")}) for b in blocks}
        if len(found) > 1:
            raise ConfigError(f"datasets prepared from {source} must agree on origin and md5: {sorted(found)}")
        return json.loads(found.pop()) if found else {}

    def download_args(self, w) -> list[str]:
        s = self.leaf_fetch_settings(w.source)
        args = ["--source", s["origin"]] if s.get("origin") else []
        return args + [a for m in s.get("md5") or [] for a in ("--md5", m)]

    def download_dir(self, w) -> str:
        return f"{self.raw_dir}/{w.source}"

    @staticmethod
    def download_constraints() -> dict[str, str]:
        raw = leaf_raw()
        return {"source": "|".join(raw) or "^$",
                "file": "|".join(re.escape(f) for fn in raw.values() for f in fn.raw_files) or "^$"}

    def raw_inputs(self, w) -> list[str]:
        """The files a dataset's store is made from: what its source's `inputs` hook names (leaf_json:
        the LEAF files, so editing one re-prepares the store), or a LEAF source's raw files (an
        extracted folder where one sits in place of its zip, in the raw directory or a local origin)."""
        from mcfl.data import source_fn
        from mcfl.data.leaf.fetch import is_url

        prep = self.datasets[w.dataset]["prepare"]
        fn = source_fn(prep["source"])
        if hasattr(fn, "inputs"):
            return fn.inputs(**{k: v for k, v in prep.items() if k != "source"})
        if prep["source"] not in leaf_raw():
            return []
        raw, origin = f"{self.raw_dir}/{prep['source']}", prep.get("origin") or ""
        local = origin if origin and not is_url(origin) else None
        out = []
        for f in fn.raw_files:
            alt = getattr(fn, "raw_alternatives", {}).get(f)
            if alt and os.path.isdir(f"{raw}/{alt}"):
                out.append(f"{raw}/{alt}")
            elif alt and local and not os.path.isfile(f"{local}/{f}") and os.path.isdir(f"{local}/{alt}"):
                out.append(f"{local}/{alt}")          # read in place by prepare (no copy, no checksum)
            else:
                out.append(f"{raw}/{f}")
        return out

    # -- several seeds in one training job (`seeds_per_job: all`) ----------------------------------
    @functools.cached_property
    def grouped(self) -> set[str]:
        """Run ids trained one job per (dataset, run) for all seeds: with `seeds_per_job: all`, the
        ids that exist for every configured seed (and more than one) on every dataset they run on."""
        if self.config.get("seeds_per_job", 1) != "all":
            return set()
        seeds = {str(s) for s in self.config["seeds"]}
        have: dict[tuple, set] = {}
        for d, r, s in self.runs:
            have.setdefault((d, r), set()).add(s)
        ids = {r for _, r in have}
        if len(seeds) < 2:
            return set()
        return {r for r in ids if all(v == seeds for (_, r2), v in have.items() if r2 == r)}

    def run_constraint(self, grouped: bool) -> str:
        """The ``{run}`` wildcard's pattern for the grouped training rule (``grouped``) or the
        per-seed one: the two never match the same run."""
        ids = sorted(self.grouped)
        if grouped:
            return "|".join(re.escape(r) for r in ids)
        # (Snakemake embeds the pattern in the whole path's: "/" follows {run} in every path of
        # rule train, so the look-ahead ends there, not at "$")
        return f"(?!(?:{'|'.join(re.escape(r) for r in ids)})/){RUN_PATTERN}" if ids else RUN_PATTERN

    @property
    def group_seeds(self) -> list[str]:
        return [str(s) for s in self.config["seeds"]]

    def group_files(self, name: str) -> list[str]:
        """``name`` of every seed's run directory of a grouped job (wildcards {dataset}, {run})."""
        return [self.run_file(name).replace("{seed}", s) for s in self.group_seeds]

    def _group_runs(self, w) -> list[dict]:
        return [self.runs[(w.dataset, w.run, s)] for s in self.group_seeds]

    def group_inputs(self, w) -> dict[str, str]:
        """The store, and each seed's centres file and select-k result (``centres<i>``, ``k<i>``)."""
        inputs = {"store": self.store(w.dataset)}
        for i, run in enumerate(self._group_runs(w)):
            if run["needs_centres"]:
                inputs[f"centres{i}"] = self.init_path(run)
            if run["select_k"]:
                inputs[f"k{i}"] = self.k_input(w, run)["k"]
        return inputs

    def group_args(self, w, input) -> list[str]:
        """``mcfl train``'s per-run options of a grouped job, seed by seed (each option repeated)."""
        args = []
        names = set(input.keys())
        for i, (run, s) in enumerate(zip(self._group_runs(w), self.group_seeds)):
            args += ["--run", canonical_json(run),
                     "--out", self.run_dir.format(dataset=w.dataset, run=w.run, seed=s),
                     "--checkpoint", self.res(f"checkpoints/{w.dataset}/{w.run}/seed{s}.pt")]
            if f"centres{i}" in names:
                args += ["--centres", getattr(input, f"centres{i}")]
            if f"k{i}" in names:
                args += ["--k-from", getattr(input, f"k{i}")]
        return args

    # -- K selection, centres, training ----------------------------------------------------------
    def auto_k(self) -> list[tuple]:
        """The (dataset, run, seed) of runs with `K: auto` (each gets a select_k job)."""
        return [k for k, r in self.runs.items() if r["select_k"]]

    def k_input(self, w, run: dict | None = None) -> dict[str, str]:
        """The select_k result a `K: auto` run takes its K from (nothing for other runs)."""
        run = run or self.run(w)
        if not run["select_k"]:
            return {}
        return {"k": self.select_k_file.format(dataset=run["dataset"], run=run["run_id"], seed=run["seed"])}

    # (a job's ``input`` is a list of its files: ``in`` would test the files, not the names)
    @staticmethod
    def k_flag(w, input) -> list[str]:
        return ["--k-from", input.k] if "k" in input.keys() else []  # noqa: SIM118

    @staticmethod
    def centres_flag(w, input) -> list[str]:
        return ["--centres", input.centres] if "centres" in input.keys() else []  # noqa: SIM118

    def init_inputs(self, w) -> dict[str, str]:
        return {"store": self.store(w.dataset), **self.k_input(w, self.init_run(w))}

    def train_inputs(self, w) -> dict[str, str]:
        run = self.run(w)
        inputs = {"store": self.store(w.dataset), **self.k_input(w)}
        if run["needs_centres"]:
            inputs["centres"] = self.init_path(run)
        return inputs

    # -- figures (FeSEM §6.2) ------------------------------------------------------------------------
    def figure_run(self, dataset: str, which: str) -> tuple | None:
        """(dataset, run_id, seed) of the run labelled figures.<which>.run on `dataset`, or None."""
        label, seed = self.config["figures"][which]["run"], str(self.config["seeds"][0])
        return next((k for k, r in self.runs.items() if k[0] == dataset and k[2] == seed
                     and r["label"] == label), None)

    def figure_file(self, which: str, name: str):
        """An input function: ``name`` in the run directory of figures.<which>.run."""
        def path(w):
            d, run, seed = self.figure_run(w.dataset, which)
            return f"{self.run_dir.format(dataset=d, run=run, seed=seed)}/{name}"
        return path

    def figure_run_json(self, w) -> str:
        return canonical_json(self.runs[self.figure_run(w.dataset, "clusters")])

    def figure_cases_title(self, w) -> str:
        return f"{w.dataset}: {self.config['figures']['cases']['run']} clusters, seed {self.config['seeds'][0]}"

    def figure_datasets(self, which: str) -> list[str]:
        """The datasets that have figures.<which>.run. A label that matches no run is reported
        only when the config asked for it (a label other than the schema's default): a config that
        leaves ``figures`` out, or has no such clustered run, skips the figure silently."""
        from mcfl.trainspec import read_schema

        found = [d for d in self.datasets if self.figure_run(d, which)]
        label = self.config["figures"][which]["run"]
        default = read_schema()["properties"]["figures"]["properties"][which]["properties"]["run"]["default"]
        if label and not found and label != default:
            print(f"figures.{which}.run: no dataset has a run labelled {label!r}; figure skipped",
                  file=sys.stderr)
        return found

    # -- FedCG tables ----------------------------------------------------------------------------
    def fedcg_runs(self) -> list[str]:
        """The FedAvg, FedProx and FedCG run directories of every dataset that has a FedCG run."""
        from mcfl.report.fedcg import TABLE5_METHODS

        datasets = {r["dataset"] for r in self.runs.values() if r["method"] == "FedCG"}
        return [self.dir_of(r) for r in self.runs.values()
                if r["dataset"] in datasets and r["method"] in TABLE5_METHODS]

    def fedcg_domain_runs(self, dataset: str | None = None) -> list[str]:
        """FedCG runs that discover their domains (``clustering: classifier``, whose assignments
        give each client's domain shares), of ``dataset`` or of any."""
        return [self.dir_of(r) for r in self.runs.values()
                if r["method"] == "FedCG" and r["params"].get("clustering", "classifier") == "classifier"
                and dataset in (None, r["dataset"])]

    def fedcg_domain_datasets(self) -> list[str]:
        return sorted({r["dataset"] for r in self.runs.values() if self.dir_of(r) in self.fedcg_domain_runs()})

    # -- real-writer protocol table, writer statistics, publishing (issue 29) ----------------------
    @property
    def protocols(self) -> dict:
        """The ``protocols`` block with its fallbacks (reference FedAvg, no paper-protocol results,
        the default title), or ``{}`` when the config has none."""
        p = self.config.get("protocols") or {}
        return {"reference": "FedAvg", "paper_results": "", "title": "", **p} if p else {}

    @staticmethod
    def option(flag: str, value: str) -> list[str]:
        """``[flag, value]`` for a shell command, or nothing when ``value`` is empty (Snakemake's
        ``:q`` renders an empty string as nothing, which would leave ``flag`` without its value)."""
        return [flag, value] if value else []

    def clustered_runs(self) -> list[str]:
        """Run directories of FeSEM / FeSEM-MA runs, when they are all on one dataset (the writer
        statistics are per store); otherwise none."""
        runs = [r for r in self.configured.values() if r["method"] in ("FeSEM", "FeSEM-MA")]
        return [self.dir_of(r) for r in runs] if len({r["dataset"] for r in runs}) == 1 else []

    def clustered_store(self) -> str:
        return self.store(next(r["dataset"] for r in self.configured.values() if r["method"] in ("FeSEM", "FeSEM-MA")))

    @property
    def publish(self) -> dict:
        return self.config.get("publish") or {}

    # -- FedGSP (paper 003 §4.2) -------------------------------------------------------------------
    @property
    def gsp(self) -> dict:
        return self.config.get("fedgsp", {})

    def gsp_out(self, name: str) -> str:
        return self.res(f"fedgsp/{self.gsp['dataset']}/{name}")

    def gsp_main(self) -> list[dict]:
        """The configured runs on ``fedgsp.dataset`` (Table 1, Figs. 3b/3c, 6)."""
        return [r for r in self.configured.values() if r["dataset"] == self.gsp["dataset"]]

    def gsp_sweep(self, kind: str) -> list[dict]:
        return [r for r, _ in self.sweeps[kind]]

    def gsp_cost(self) -> str:
        return canonical_json(self.gsp.get("cost", {}))

    def gsp_train(self, runs: list[dict]) -> str:
        from mcfl.report.fedgsp import train_settings

        return canonical_json(train_settings(runs))

    def gsp_base_params(self) -> dict[str, Any]:
        from mcfl.algorithms import fedgsp
        from mcfl.fedgsp.config import base_entry

        return {**vars(fedgsp.Params()), **base_entry(self.config)}

    def gsp_cpd_groups(self):
        from mcfl.algorithms import fedgsp

        if "cpd_groups" in self.gsp:
            return self.gsp["cpd_groups"]
        ds = self.gsp["dataset"]
        for e in self.config["methods"]:
            if e["method"] == "NaiveGSP+ICG" and ds in e.get("datasets", [ds]):
                return e.get("beta", fedgsp.NaiveICGParams.beta)
        return fedgsp.Params.beta

    # -- what `rule all` asks for besides the report --------------------------------------------
    def targets(self) -> list[str]:
        """The final outputs of the optional stages, each present when the config asks for it."""
        out = [self.res(f"figures/clusters_{d}.png") for d in self.figure_datasets("clusters")]
        out += [self.res(f"figures/cases_{d}.png") for d in self.figure_datasets("cases")]
        if self.gsp:
            out += [self.gsp_out("cpd.png"), self.gsp_out("table.csv")]
            if self.gsp.get("publish"):
                out.append(self.gsp["publish"]["out"] + ".md")
            out += [self.gsp_out(f"{kind}.png") for kind in ("heatmap", "kappa") if self.sweeps[kind]]
        if self.auto_k():
            out.append(self.res("select_k.md"))
        if self.fedcg_runs():
            out += [self.res(f"fedcg/{n}") for n in ("table3.csv", "table4.csv", "table5.csv", "tables.md")]
            out += [self.res(f"fedcg/{d}/writers.md") for d in self.fedcg_domain_datasets()]
        if self.config["tracking"] == "deferred":
            out.append(self.res("mlflow_runs.tsv"))
        if self.protocols:
            out += [self.protocols["out"] + ext for ext in (".csv", ".md")]
            if self.clustered_runs():
                out += [self.protocols["out"] + ext for ext in ("-clusters.csv", "-clusters.md")]
        if self.publish:
            out.append(self.publish["out"] + ".md")
        return out


def leaf_raw() -> dict:
    """LEAF source -> its function (with ``.raw_files``): the sources with files to download."""
    from mcfl.data.leaf.cli import leaf_sources

    return leaf_sources()
