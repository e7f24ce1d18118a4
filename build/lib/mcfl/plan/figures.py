"""Planning of FeSEM's figures (``workflow/rules/figures.smk``; FeSEM §6.2, Figs. 4-5): which run of
each dataset the cluster and case figures draw (the run labelled ``figures.<which>.run``, first seed)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from mcfl.io import canonical_json
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

    def targets(self) -> list[str]:
        return [self.plan.res(f"figures/{which}_{d}.png") for which in ("clusters", "cases")
                for d in self.figure_datasets(which)]
