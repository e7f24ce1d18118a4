"""Planning of FedGSP's tables and figures (jobs of ``workflow/rules/papers.smk``; Zeng et al., "FedGSP:
Accelerating Federated Learning on Non-IID Data via Grouped Sequential-to-Parallel Training",
DASFAA 2022, §4.2): the runs behind Table 1 and Figs. 3b/3c/6 (the configured runs on
``fedgsp.dataset``), the sweep runs behind Figs. 4-5 (:func:`mcfl.papers.fedgsp.config.sweep_runs`), the
settings of the CPD figure and of the cost models, and every output path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcfl.papers.fedgsp.config import base_entry, sweep_runs
from mcfl.io import canonical_json
from mcfl.papers import Job
from mcfl.papers.fedgsp.tables import train_settings

if TYPE_CHECKING:
    from mcfl.plan import Plan


class FedGSPPlan:
    """The FedGSP stage of a :class:`~mcfl.plan.Plan` (empty without a ``fedgsp`` block)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.config = plan.config
        #: the sweep runs {"heatmap": [(run, point)...], "kappa": [...]} (empty without `fedgsp`)
        self.sweeps: dict[str, list] = (sweep_runs(self.config) if "fedgsp" in self.config
                                        else {"heatmap": [], "kappa": []})

    def added_runs(self) -> list[dict]:
        """The sweep points' runs (Figs. 4-5), which the plan adds to its training jobs."""
        return [run for points in self.sweeps.values() for run, _ in points]

    @property
    def block(self) -> dict:
        """The config's ``fedgsp`` block ({} without one), its ``publish.out`` inside the results
        directory (:meth:`Plan.page`)."""
        g = self.config.get("fedgsp", {})
        if g.get("publish"):
            g = {**g, "publish": {**g["publish"], "out": self.plan.page(g["publish"]["out"])}}
        return g

    def __bool__(self) -> bool:
        return bool(self.block)

    @property
    def dataset(self) -> str:
        return self.block["dataset"]

    def out(self, name: str) -> str:
        return self.plan.res(f"fedgsp/{self.dataset}/{name}")

    def main(self) -> list[dict]:
        """The configured runs on ``fedgsp.dataset`` (Table 1, Figs. 3b/3c, 6)."""
        return [r for r in self.plan.configured.values() if r["dataset"] == self.dataset]

    def sweep(self, kind: str) -> list[dict]:
        return [r for r, _ in self.sweeps[kind]]

    def cost(self) -> str:
        return canonical_json(self.block.get("cost", {}))

    @staticmethod
    def train(runs: list[dict]) -> str:
        return canonical_json(train_settings(runs))

    def base_params(self) -> dict[str, Any]:
        from mcfl.algorithms import fedgsp         # (torch: only when the DAG has FedGSP's figures)

        return {**vars(fedgsp.Params()), **base_entry(self.config)}

    def cpd_groups(self):
        from mcfl.algorithms import fedgsp

        if "cpd_groups" in self.block:
            return self.block["cpd_groups"]
        ds = self.dataset
        for e in self.config["methods"]:
            if e["method"] == "NaiveGSP+ICG" and ds in e.get("datasets", [ds]):
                return e.get("beta", fedgsp.NaiveICGParams.beta)
        return fedgsp.Params.beta

    # -- the jobs (rules of workflow/rules/papers.smk) ---------------------------------------------
    def jobs(self) -> list[Job]:
        """cpd (Fig. 3a), table (Table 1, Figs. 3b/3c, 6), publish (the docs page, when asked), and
        heatmap (Fig. 4) and kappa (Fig. 5) when the config has their sweeps."""
        if not self.block:
            return []
        out = [self._cpd(), self._table()]
        if self.block.get("publish"):
            out.append(self._publish())
        return out + [self._sweep(kind) for kind in ("heatmap", "kappa") if self.sweeps[kind]]

    def _job(self, name: str, input: dict, outputs: dict, args: list, reports: dict) -> Job:
        return Job(rule=f"fedgsp_{name}", command=["paper", "fedgsp", name], input=input, outputs=outputs,
                   args=args, log=self.plan.logs(f"fedgsp/{self.dataset}/{name}.log"),
                   reports={k: (f"fedgsp_{v}.rst", "FedGSP") for k, v in reports.items()})

    def _cpd(self) -> Job:
        p = self.base_params()
        return self._job("cpd", {"store": self.plan.store(self.dataset)},
                         {"csv": self.out("cpd.csv"), "summary": self.out("cpd_summary.csv"),
                          "figure": self.out("cpd.png")},
                         ["--store", self.plan.store(self.dataset), "--groups", str(self.cpd_groups()),
                          "--seeds", *[str(s) for s in self.config["seeds"]], "--rounding", str(p["rounding"]),
                          "--icg-iters", str(p["icg_iters"]), "--sigma", str(self.block.get("sigma", 1.0)),
                          "--out", self.out("")[:-1]], {"figure": "cpd"})

    def _table(self) -> Job:
        main = self.main()
        # Snakemake's report shows HTML inline (a CSV only as a download)
        outputs = {"table": "table.csv", "markdown": "table.md", "html": "table.html", "runs": "runs.csv",
                   "curves": "curves.png", "cost": "cost.png"}
        return self._job("table", {"store": self.plan.store(self.dataset),
                                   "metrics": self.plan.run_outputs("metrics.json", main)},
                         {k: self.out(v) for k, v in outputs.items()},
                         ["--store", self.plan.store(self.dataset), "--target", str(self.block["target"]),
                          "--cost", self.cost(), "--train", self.train(main), "--out", self.out("")[:-1],
                          *self.plan.run_dirs(main)],
                         {"html": "table", "curves": "curves", "cost": "cost"})

    def _sweep(self, kind: str) -> Job:
        runs = self.sweep(kind)
        args = ["--out", self.out("")[:-1], *self.plan.run_dirs(runs)]
        if kind == "kappa":
            args = ["--store", self.plan.store(self.dataset), "--cost", self.cost(), "--train", self.train(runs),
                    *args]
        inputs = {"metrics": self.plan.run_outputs("metrics.json", runs)}
        if kind == "kappa":
            inputs = {"store": self.plan.store(self.dataset), **inputs}
        return self._job(kind, inputs, {"csv": self.out(f"{kind}.csv"), "figure": self.out(f"{kind}.png")},
                         args, {"figure": kind})

    def _publish(self) -> Job:
        """Table 1 and the figures copied into the docs with their provenance (``mcfl publish``):
        those of the sweeps too, when the config has them (their jobs finish first)."""
        page = self.block["publish"]
        figures = ["cpd.png", "curves.png", "cost.png"] + [f"{k}.png" for k in ("heatmap", "kappa") if self.sweeps[k]]
        job = self._job("publish", {"table": self.out("table.md"), "figures": [self.out(f) for f in figures],
                                    "runs": self.plan.run_outputs("metrics.json", self.main())},
                        {"page": page["out"] + ".md"},
                        ["--results", self.out(""), "--figures", ".", "--out", page["out"],
                         "--config", self.plan.config_file, "--title", page["title"],
                         *self.plan.run_dirs(self.main())], {})
        job.command = ["publish"]
        return job

    def targets(self) -> list[str]:
        if not self.block:
            return []
        out = [self.out("cpd.png"), self.out("table.csv")]
        if self.block.get("publish"):
            out.append(self.block["publish"]["out"] + ".md")
        return out + [self.out(f"{kind}.png") for kind in ("heatmap", "kappa") if self.sweeps[kind]]
