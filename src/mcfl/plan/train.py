"""Planning of training (``workflow/rules/train.smk``, ``init.smk``, ``select_k.smk``): each training
job's inputs and options, the centre files runs share, the K selections of `K: auto` runs, the
jobs that train every seed of a run at once (`seeds_per_job: all`), and the order in which jobs
start (longest first)."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from mcfl.cluster.spec import centre_key, centre_spec, first_models_key, first_models_spec
from mcfl.cost.workload import data_size, forward_macs, param_count, run_cost, train_defaults
from mcfl.io import canonical_json
from mcfl.plan.runs import RUN_PATTERN, run_key

if TYPE_CHECKING:
    from mcfl.plan import Plan


#: centre files that cluster the same first local models share one ``first_models`` job when those
#: models fit in this many bytes (the file holds all of them; 105 FEMNIST writers' CNNs with
#: hidden 248: 355 MB) ...
FIRST_MODELS_BYTES = 1 << 30
#: ... and making them is worth a job of its own: at least this many million multiply-adds
#: (seconds on a CPU core; the digits CNN's first local models, a fraction of a second, are made
#: again in each centre job, as the job's start-up costs more than they do)
FIRST_MODELS_MIN_WORK = 1e5


class TrainPlan:
    """The training stage of a :class:`~mcfl.plan.Plan`."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.runs = plan.runs

    # -- one run -------------------------------------------------------------------------------------
    def run_json(self, w) -> str:
        return canonical_json(self.plan.run(w))

    def checkpoint(self, w) -> str:
        return self.plan.res(f"checkpoints/{w.dataset}/{w.run}/seed{w.seed}.pt")

    def train_inputs(self, w) -> dict[str, str]:
        run = self.plan.run(w)
        inputs = {"store": self.plan.store(w.dataset), **self.plan.gates_of(w.dataset), **self.k_input(w)}
        if run["needs_centres"]:
            inputs["centres"] = self.init_path(run)
        return inputs

    # (a job's ``input`` is a list of its files: ``in`` would test the files, not the names)
    @staticmethod
    def k_flag(w, input) -> list[str]:
        return ["--k-from", input.k] if "k" in input.keys() else []  # noqa: SIM118

    @staticmethod
    def centres_flag(w, input) -> list[str]:
        return ["--centres", input.centres] if "centres" in input.keys() else []  # noqa: SIM118

    # -- centre initialisation -----------------------------------------------------------------------
    @property
    def init_file(self) -> str:
        """A centre file: {centres} is ``K<K>-<hash>`` (:func:`mcfl.cluster.spec.centre_key`)."""
        return self.plan.res("init/{dataset}/{centres}/seed{seed}.pt")

    def init_run(self, w) -> dict:
        return self.plan.inits[(w.dataset, w.centres, w.seed)]

    def init_json(self, w) -> str:
        """What the centre initialisation depends on (not the method, the rounds, nor evaluation)."""
        return canonical_json(centre_spec(self.init_run(w)))

    def init_path(self, run: dict) -> str:
        return self.init_file.format(dataset=run["dataset"], centres=centre_key(run), seed=run["seed"])

    def init_inputs(self, w) -> dict[str, str]:
        run = self.init_run(w)
        inputs = {"store": self.plan.store(w.dataset), **self.plan.gates_of(w.dataset), **self.k_input(w, run)}
        first = self.first_path(run)
        if first:
            inputs["first"] = first
        return inputs

    @staticmethod
    def first_flag(w, input) -> list[str]:
        return ["--first-models", input.first] if "first" in input.keys() else []  # noqa: SIM118

    # -- first local models shared by centre files ---------------------------------------------------
    @functools.cached_property
    def shared_first(self) -> dict[tuple, dict]:
        """(dataset, first-models key, seed) -> a run, for each set of centre files that cluster the
        same first local models (they differ only in K or in how they cluster: FeSEM(2), (3), (4),
        Robust(3) ... of one seed) where one ``first_models`` job pays: two or more such files, the
        models within :data:`FIRST_MODELS_BYTES`, and their training at least
        :data:`FIRST_MODELS_MIN_WORK`. Every other centre file trains its clients itself."""
        groups: dict[tuple, list[dict]] = {}
        for (d, _, s), run in self.plan.inits.items():
            if not run.get("select_k"):          # K: auto: its own file, after its K selection
                groups.setdefault((d, first_models_key(run), s), []).append(run)
        out = {}
        for key, runs in groups.items():
            run, size = runs[0], self._sizes[key[0]]
            params = param_count(run["model"], tuple(size.x_shape), size.n_classes)
            if (len(runs) >= 2 and params is not None and size.n_clients * params * 4 <= FIRST_MODELS_BYTES
                    and self._work[run_key(run)][1] >= FIRST_MODELS_MIN_WORK):
                out[key] = run
        return out

    @property
    def first_models_file(self) -> str:
        """A first-models file: {first} is ``first-<hash>`` (:func:`mcfl.cluster.spec.first_models_key`)."""
        return self.plan.res("first_models/{dataset}/{first}/seed{seed}.pt")

    def first_path(self, run: dict) -> str | None:
        """The first-models file a centre file of ``run`` clusters, if it shares one."""
        key = (run["dataset"], first_models_key(run), run_key(run)[2])
        if run.get("select_k") or key not in self.shared_first:
            return None
        return self.first_models_file.format(dataset=key[0], first=key[1], seed=key[2])

    def first_json(self, w) -> str:
        """What the first local models depend on (not K, nor how they are clustered)."""
        return canonical_json(first_models_spec(self.shared_first[(w.dataset, w.first, w.seed)]))

    def first_store(self, w) -> str:
        return self.plan.store(w.dataset)

    def first_priority(self, w) -> int:
        """Above every centre file that waits for it."""
        users = [SimpleNamespace(dataset=d, centres=c, seed=s) for (d, c, s), run in self.plan.inits.items()
                 if (d, s) == (w.dataset, w.seed) and self.first_path(run)
                 and first_models_key(run) == w.first]
        return 1 + max(map(self.init_priority, users))

    # -- K selection ---------------------------------------------------------------------------------
    @property
    def select_k_file(self) -> str:
        return self.plan.res("select_k/{dataset}/{run}/seed{seed}.json")

    def auto_k(self) -> list[tuple]:
        """The (dataset, run, seed) of runs with `K: auto` (each gets a select_k job)."""
        return [k for k, r in self.runs.items() if r["select_k"]]

    def select_k_files(self) -> list[str]:
        return [self.select_k_file.format(dataset=d, run=r, seed=s) for d, r, s in self.auto_k()]

    def k_input(self, w, run: dict | None = None) -> dict[str, str]:
        """The select_k result a `K: auto` run takes its K from (nothing for other runs)."""
        run = run or self.plan.run(w)
        if not run["select_k"]:
            return {}
        return {"k": self.select_k_file.format(dataset=run["dataset"], run=run["run_id"], seed=run["seed"])}

    def targets(self) -> list[str]:
        return [self.plan.res("select_k.md")] if self.auto_k() else []

    # -- several seeds in one training job (`seeds_per_job: all`) ----------------------------------
    @functools.cached_property
    def grouped(self) -> set[str]:
        """Run ids trained one job per (dataset, run) for all seeds: with `seeds_per_job: all`, the
        ids that exist for every configured seed (and more than one) on every dataset they run on."""
        if self.plan.config.get("seeds_per_job", 1) != "all":
            return set()
        seeds = set(self.group_seeds)
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
        return [str(s) for s in self.plan.config["seeds"]]

    def group_files(self, name: str) -> list[str]:
        """``name`` of every seed's run directory of a grouped job (wildcards {dataset}, {run})."""
        return [self.plan.run_file(name).replace("{seed}", s) for s in self.group_seeds]

    def _group_runs(self, w) -> list[dict]:
        return [self.runs[(w.dataset, w.run, s)] for s in self.group_seeds]

    def group_inputs(self, w) -> dict[str, str]:
        """The store, and each seed's centres file and select-k result (``centres<i>``, ``k<i>``)."""
        inputs = {"store": self.plan.store(w.dataset), **self.plan.gates_of(w.dataset)}
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
                     "--out", self.plan.run_dir.format(dataset=w.dataset, run=w.run, seed=s),
                     "--checkpoint", self.plan.res(f"checkpoints/{w.dataset}/{w.run}/seed{s}.pt")]
            if f"centres{i}" in names:
                args += ["--centres", getattr(input, f"centres{i}")]
            if f"k{i}" in names:
                args += ["--k-from", getattr(input, f"k{i}")]
        return args

    # -- job order: longest first ---------------------------------------------------------------------
    # Snakemake starts the ready jobs of highest ``priority:`` first. A job's priority is its work
    # (multiply-adds, from the config, the model and the data's size: _work) plus the largest priority
    # among the jobs waiting for it, so a centre file that a long run needs starts before shorter
    # runs, and the DAG does not end on one long run started late (list scheduling by critical path).
    # On a GPU with many jobs at once this is what sets the DAG's end; it changes no output.
    @functools.cached_property
    def _work(self) -> dict[tuple, tuple[float, float]]:
        """Each run's work, keyed like ``plan.runs``: (local training and evaluation, centre
        initialisation) in millions of multiply-adds. The arithmetic of
        :func:`mcfl.cost.workload.run_cost` with a local step counted as three forward passes of its
        batch (forward, input and weight gradients) and a test sample as one, each of the model's
        multiply-adds (:func:`mcfl.cost.workload.forward_macs`; one for a model it does not know). Nothing
        is measured and nothing imports torch: every workflow invocation computes it, dry runs
        included. What a method adds to local training (FedCG's graph, FedDane's gradient pass) and
        its server step are not counted; one pass of centre initialisation."""
        defaults, out = train_defaults(), {}
        for key, run in self.runs.items():
            size = self._sizes[run["dataset"]]
            macs = (forward_macs(run["model"], tuple(size.x_shape), size.n_classes) or 1) / 1e6
            batch = int({**defaults, **run["train"]}["batch_size"])
            c = run_cost(run, size, 3.0 * batch * macs, macs, init_passes=int(bool(run.get("needs_centres"))))
            out[key] = (c.total_s - c.init_s, c.init_s)
        return out

    @functools.cached_property
    def _sizes(self) -> dict:
        """Each dataset's sizes (:func:`mcfl.cost.workload.data_size`), for the runs that train on it."""
        names = dict.fromkeys(run["dataset"] for run in self.runs.values())
        return {name: data_size(self.plan.datasets[name], Path(self.plan.store(name)),
                                Path(self.plan.raw_store(name))) for name in names}

    def train_priority(self, w) -> int:
        """A one-seed training job's priority: its run's work."""
        return _units(self._work[(w.dataset, w.run, w.seed)][0])

    def group_priority(self, w) -> int:
        """A grouped job's priority: the work of every seed it trains."""
        return _units(sum(self._work[(w.dataset, w.run, s)][0] for s in self.group_seeds))

    def _job_priority(self, key: tuple) -> int:
        """The priority of the training job that trains run ``key`` (grouped or one seed)."""
        w = SimpleNamespace(dataset=key[0], run=key[1], seed=key[2])
        return self.group_priority(w) if key[1] in self.grouped else self.train_priority(w)

    def init_priority(self, w) -> int:
        """A centre file's priority: its own work plus the largest priority among the training
        jobs that need it."""
        users = [k for k, r in self.runs.items()
                 if r["needs_centres"] and (k[0], centre_key(r), k[2]) == (w.dataset, w.centres, w.seed)]
        return _units(max(self._work[k][1] for k in users)) + max(map(self._job_priority, users))

    def select_k_priority(self, w) -> int:
        """A K selection's priority: above the centre file and the training job waiting for its K
        (its own work, a search over candidate Ks, is not counted)."""
        return self._chain_priority((w.dataset, w.run, w.seed)) + 1

    def _chain_priority(self, key: tuple) -> int:
        """The priority of the first job run ``key`` waits for after the data: its centre file's
        when it needs one (always above its training job's), else its training job's."""
        run = self.runs[key]
        if not run["needs_centres"]:
            return self._job_priority(key)
        return self.init_priority(SimpleNamespace(dataset=key[0], centres=centre_key(run), seed=key[2]))

    @functools.cached_property
    def data_priority(self) -> int:
        """The data jobs' priority (download, partition, prepare): above every other job, since
        they are short and every job waits for them (a dataset prepared late would hold up its
        longest runs behind those of datasets prepared earlier)."""
        return 1 + max([self._chain_priority(k) + bool(r["select_k"]) for k, r in self.runs.items()] or [0])


def _units(work: float) -> int:
    """A priority from work: a positive integer (Snakemake's default is 0)."""
    return max(1, math.ceil(work))
