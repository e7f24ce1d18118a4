"""Planning of FedGSP's tables and figures (``workflow/rules/fedgsp.smk``; Zeng et al., "FedGSP:
Accelerating Federated Learning on Non-IID Data via Grouped Sequential-to-Parallel Training",
DASFAA 2022, §4.2): the runs behind Table 1 and Figs. 3b/3c/6 (the configured runs on
``fedgsp.dataset``), the sweep runs behind Figs. 4-5 (:func:`mcfl.fedgsp.config.sweep_runs`), the
settings of the CPD figure and of the cost models, and every output path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcfl.fedgsp.config import base_entry
from mcfl.io import canonical_json
from mcfl.report.fedgsp import train_settings

if TYPE_CHECKING:
    from mcfl.plan import Plan


class FedGSPPlan:
    """The FedGSP stage of a :class:`~mcfl.plan.Plan` (empty without a ``fedgsp`` block)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.config = plan.config
        self.sweeps = plan.sweeps

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

    def targets(self) -> list[str]:
        if not self.block:
            return []
        out = [self.out("cpd.png"), self.out("table.csv")]
        if self.block.get("publish"):
            out.append(self.block["publish"]["out"] + ".md")
        return out + [self.out(f"{kind}.png") for kind in ("heatmap", "kappa") if self.sweeps[kind]]
