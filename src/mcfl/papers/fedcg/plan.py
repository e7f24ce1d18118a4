"""Planning of FedCG's tables (jobs of ``workflow/rules/papers.smk``; Caldarola et al., "Cluster-driven Graph
Federated Learning over Multiple Domains", CVPR Workshops 2021, Tables 3-5): which runs the tables
compare, and the writer-share tables of the FedCG runs that discover their domains."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcfl.papers import Job
from mcfl.papers.fedcg.tables import TABLE5_METHODS

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

    def jobs(self) -> list[Job]:
        """``tables`` (Tables 3-5) when a dataset has a FedCG run, ``writers`` (per dataset: what
        its discovered domains follow) when a FedCG run discovers its domains."""
        out = []
        if self.table_runs():
            runs = self.table_runs()
            names = {"table3": "table3.csv", "table4": "table4.csv", "table5": "table5.csv",
                     "markdown": "tables.md", "html": "tables.html"}
            # Snakemake's report shows HTML inline (a CSV only as a download): the three tables as a page
            out.append(Job(rule="fedcg_tables", command=["paper", "fedcg", "tables"],
                           input={"metrics": [f"{d}/metrics.json" for d in runs],
                                  # Table 5's image-by-image comparison
                                  "predictions": [f"{d}/predictions.csv" for d in runs]},
                           outputs={k: self.plan.res(f"fedcg/{v}") for k, v in names.items()},
                           args=["--out", self.plan.res("fedcg"), *runs], log=self.plan.logs("fedcg_tables.log"),
                           reports={"html": ("fedcg_tables.rst", "FedCG")}))
        if self.domain_datasets():
            out.append(self._writers())
        return out

    def _writers(self) -> Job:
        """Per dataset (a wildcard): its FedCG runs' domain shares against per-writer image statistics."""
        def args(w) -> list[str]:
            return ["--shares", "--store", self.plan.store(w.dataset), "--out",
                    self.plan.res(f"fedcg/{w.dataset}/writers"), *self.domain_runs(w.dataset)]

        return Job(rule="fedcg_writers", command=["report-writers"],
                   input={"store": lambda w: self.plan.store(w.dataset),
                          "assignments": lambda w: [f"{d}/assignments.csv" for d in self.domain_runs(w.dataset)]},
                   outputs={"csv": self.plan.res("fedcg/{dataset}/writers.csv"),
                            "shares": self.plan.res("fedcg/{dataset}/writers-shares.csv"),
                            "markdown": self.plan.res("fedcg/{dataset}/writers.md")},
                   args=args, log=self.plan.logs("fedcg_writers_{dataset}.log"))

    def targets(self) -> list[str]:
        if not self.table_runs():
            return []
        out = [self.plan.res(f"fedcg/{n}") for n in ("table3.csv", "table4.csv", "table5.csv", "tables.md")]
        return out + [self.plan.res(f"fedcg/{d}/writers.md") for d in self.domain_datasets()]
