"""Planning of FedCG's tables (``workflow/rules/fedcg.smk``; Caldarola et al., "Cluster-driven Graph
Federated Learning over Multiple Domains", CVPR Workshops 2021, Tables 3-5): which runs the tables
compare, and the writer-share tables of the FedCG runs that discover their domains."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcfl.report.fedcg import TABLE5_METHODS

if TYPE_CHECKING:
    from mcfl.plan import Plan


class FedCGPlan:
    """The FedCG stage of a :class:`~mcfl.plan.Plan`."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.runs = plan.runs

    def table_runs(self) -> list[str]:
        """The FedAvg, FedProx and FedCG run directories of every dataset that has a FedCG run."""
        datasets = {r["dataset"] for r in self.runs.values() if r["method"] == "FedCG"}
        return [self.plan.dir_of(r) for r in self.runs.values()
                if r["dataset"] in datasets and r["method"] in TABLE5_METHODS]

    def domain_runs(self, dataset: str | None = None) -> list[str]:
        """FedCG runs that discover their domains (``clustering: classifier``, whose assignments
        give each client's domain shares), of ``dataset`` or of any."""
        return [self.plan.dir_of(r) for r in self.runs.values()
                if r["method"] == "FedCG" and r["params"].get("clustering", "classifier") == "classifier"
                and dataset in (None, r["dataset"])]

    def domain_datasets(self) -> list[str]:
        found = set(self.domain_runs())
        return sorted({r["dataset"] for r in self.runs.values() if self.plan.dir_of(r) in found})

    def targets(self) -> list[str]:
        if not self.table_runs():
            return []
        out = [self.plan.res(f"fedcg/{n}") for n in ("table3.csv", "table4.csv", "table5.csv", "tables.md")]
        return out + [self.plan.res(f"fedcg/{d}/writers.md") for d in self.domain_datasets()]
