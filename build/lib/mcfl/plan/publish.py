"""Planning of the real-writer protocol tables and of publishing (``workflow/rules/protocols.smk``,
``publish.smk``): the ``protocols`` and ``publish`` blocks with their fallbacks, and the FeSEM runs
whose clusters the writer statistics describe."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcfl.plan import Plan

CLUSTERED = ("FeSEM", "FeSEM-MA")


class PublishPlan:
    """The protocols and publish stages of a :class:`~mcfl.plan.Plan`."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.config = plan.config

    @property
    def protocols(self) -> dict:
        """The ``protocols`` block with its fallbacks (reference FedAvg, no paper-protocol or authors' code results,
        the default title), or ``{}`` when the config has none."""
        p = self.config.get("protocols") or {}
        return {"reference": "FedAvg", "paper_results": "", "authors_results": "", "title": "", **p,
                "out": self.plan.page(p["out"])} if p else {}

    @property
    def publish(self) -> dict:
        p = self.config.get("publish") or {}
        return {**p, "out": self.plan.page(p["out"])} if p else {}

    @staticmethod
    def option(flag: str, value: str) -> list[str]:
        """``[flag, value]`` for a shell command, or nothing when ``value`` is empty (Snakemake's
        ``:q`` renders an empty string as nothing, which would leave ``flag`` without its value)."""
        return [flag, value] if value else []

    def clustered_runs(self) -> list[str]:
        """Run directories of FeSEM / FeSEM-MA runs, when they are all on one dataset (the writer
        statistics are per store); otherwise none."""
        runs = [r for r in self.plan.configured.values() if r["method"] in CLUSTERED]
        return [self.plan.dir_of(r) for r in runs] if len({r["dataset"] for r in runs}) == 1 else []

    def clustered_store(self) -> str:
        return self.plan.store(next(r["dataset"] for r in self.plan.configured.values()
                                    if r["method"] in CLUSTERED))

    def targets(self) -> list[str]:
        out = []
        if self.protocols:
            out += [self.protocols["out"] + ext for ext in (".csv", ".md")]
            if self.clustered_runs():
                out += [self.protocols["out"] + ext for ext in ("-clusters.csv", "-clusters.md")]
        if self.publish:
            out.append(self.publish["out"] + ".md")
        return out
