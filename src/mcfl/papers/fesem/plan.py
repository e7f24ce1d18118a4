"""Planning of FeSEM's figures (jobs of ``workflow/rules/papers.smk``; FeSEM §6.2, Figs. 4-5): which
run of each dataset the cluster and case figures draw (the run labelled ``figures.<which>.run``, first
seed). Fig. 3 is drawn by the workflow's report."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from mcfl.io import canonical_json
from mcfl.papers import Job
from mcfl.trainspec import read_schema

if TYPE_CHECKING:
    from mcfl.plan import Plan


class FiguresPlan:
    """The figures stage of a :class:`~mcfl.plan.Plan`."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.config = plan.config

    def figure_run(self, dataset: str, which: str) -> tuple | None:
        """(dataset, run_id, seed) of the run labelled figures.<which>.run on `dataset`, or None."""
        label, seed = self.config["figures"][which]["run"], str(self.config["seeds"][0])
        return next((k for k, r in self.plan.runs.items() if k[0] == dataset and k[2] == seed
                     and r["label"] == label), None)

    def figure_file(self, which: str, name: str):
        """An input function: ``name`` in the run directory of figures.<which>.run."""
        def path(w):
            d, run, seed = self.figure_run(w.dataset, which)
            return f"{self.plan.run_dir.format(dataset=d, run=run, seed=seed)}/{name}"
        return path

    def figure_run_json(self, w) -> str:
        return canonical_json(self.plan.runs[self.figure_run(w.dataset, "clusters")])

    def figure_cases_title(self, w) -> str:
        return f"{w.dataset}: {self.config['figures']['cases']['run']} clusters, seed {self.config['seeds'][0]}"

    def figure_datasets(self, which: str) -> list[str]:
        """The datasets that have figures.<which>.run. A label that matches no run is reported
        only when the config asked for it (a label other than the schema's default): a config that
        leaves ``figures`` out, or has no such clustered run, skips the figure silently."""
        found = [d for d in self.plan.datasets if self.figure_run(d, which)]
        label = self.config["figures"][which]["run"]
        default = read_schema()["properties"]["figures"]["properties"][which]["properties"]["run"]["default"]
        if label and not found and label != default:
            print(f"figures.{which}.run: no dataset has a run labelled {label!r}; figure skipped",
                  file=sys.stderr)
        return found

    # -- the jobs (rules of workflow/rules/papers.smk), per {dataset} --------------------------------
    def jobs(self) -> list[Job]:
        """``figure_clusters`` (Fig. 4) and ``figure_cases`` (Fig. 5), for every dataset with the run."""
        return [self._clusters(), self._cases()]

    def _figure(self, w, which: str) -> str:
        return self.plan.res(f"figures/{which}_{w.dataset}.png")

    def _clusters(self) -> Job:
        fig, state = self.config["figures"], self.figure_file("clusters", "state.pt")

        def args(w) -> list[str]:
            return ["--run", self.figure_run_json(w), "--store", self.plan.store(w.dataset), "--state", state(w),
                    "--out", self._figure(w, "clusters"), "--clients", str(fig["clusters"]["clients"]),
                    "--projection", str(fig["clusters"]["projection"]), "--seed", str(fig["seed"]),
                    "--device", str(self.config["device"]), "--threads", "1"]

        return Job(rule="figure_clusters", command=["paper", "fesem", "clusters"],
                   input={"store": self.plan.store_of, "state": state},
                   outputs={"png": self.plan.res("figures/clusters_{dataset}.png"),
                            "csv": self.plan.res("figures/clusters_{dataset}.csv")},
                   args=args, log=self.plan.logs("figures/clusters_{dataset}.log"),
                   reports={"png": ("clusters.rst", "Figures")},
                   benchmark=self.plan.res("benchmarks/figures/clusters_{dataset}.tsv"), gpu=self.plan.gpu())

    def _cases(self) -> Job:
        fig, assignments = self.config["figures"], self.figure_file("cases", "assignments.csv")

        def args(w) -> list[str]:
            return ["--store", self.plan.store(w.dataset), "--assignments", assignments(w),
                    "--out", self._figure(w, "cases"), "--title", self.figure_cases_title(w),
                    "--clients", str(fig["cases"]["clients"]), "--samples", str(fig["cases"]["samples"]),
                    "--seed", str(fig["seed"])]

        return Job(rule="figure_cases", command=["paper", "fesem", "cases"],
                   input={"store": self.plan.store_of, "assignments": assignments},
                   outputs={"png": self.plan.res("figures/cases_{dataset}.png")},
                   args=args, log=self.plan.logs("figures/cases_{dataset}.log"),
                   reports={"png": ("cases.rst", "Figures")},
                   benchmark=self.plan.res("benchmarks/figures/cases_{dataset}.tsv"))

    def targets(self) -> list[str]:
        return [self.plan.res(f"figures/{which}_{d}.png") for which in ("clusters", "cases")
                for d in self.figure_datasets(which)]
