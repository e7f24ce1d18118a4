"""A paper registered from outside mcfl, whole in one module: the "Toy" paper's Table 1 (each
method's final test accuracy on one dataset, mean over seeds, beside the paper's published value).

Adding a paper's table takes this module (its config section's schema and check, its planner, its
command and its published numbers), its registration (``pyproject.toml``: the ``mcfl.papers`` entry
point) and a config that asks for it (``toy.yaml``): no file of mcfl changes, neither the Snakefile
nor the rule files, the CLI or the schema.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from mcfl.config import ConfigError
from mcfl.papers import Job, Paper

#: the paper's Table 1: final test accuracy (fraction) by method
PUBLISHED = {"FedAvg": 0.9, "NoFed": 0.5}

#: the config's ``toy`` block
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["dataset"],
          "properties": {"dataset": {"type": "string", "description": "the dataset of Table 1"}}}


def check(cfg: dict, source: str) -> None:
    if cfg["toy"]["dataset"] not in cfg["datasets"]:
        raise ConfigError(f"{source}: toy.dataset: unknown dataset {cfg['toy']['dataset']!r}")


class Planner:
    """Table 1 from the configured runs on ``toy.dataset`` (nothing without a ``toy`` block)."""

    def __init__(self, plan):
        self.plan, self.block = plan, plan.config.get("toy")

    def _dirs(self) -> list[str]:
        return self.plan.run_dirs([r for r in self.plan.configured.values() if r["dataset"] == self.block["dataset"]])

    def jobs(self) -> list[Job]:
        if not self.block:
            return []
        out = self.plan.res("toy/table1.csv")
        return [Job(rule="toy_table1", command=["paper", "toy", "table1"],
                    input={"metrics": [f"{d}/metrics.json" for d in self._dirs()]}, outputs={"table": out},
                    args=["--out", out, *self._dirs()], log=self.plan.logs("toy/table1.log"))]

    def targets(self) -> list[str]:
        return [self.plan.res("toy/table1.csv")] if self.block else []


def add_outputs(w) -> None:
    p = w.add_parser("table1", help="Table 1: final test accuracy per method, beside the paper's")
    p.add_argument("--out", required=True, help="CSV to write")
    p.add_argument("runs", nargs="+", help="run directories (metrics.json)")


def write(a) -> int:
    scores: dict[str, list[float]] = {}
    for d in a.runs:
        m = json.loads((Path(d) / "metrics.json").read_text())
        scores.setdefault(m["label"], []).append(m["final"]["micro_acc"])
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "seeds", "micro_acc", "paper"])
        for label, accs in scores.items():
            w.writerow([label, len(accs), round(statistics.mean(accs), 6), PUBLISHED.get(label, "")])
    return 0


PAPER = Paper(name="toy", title="Toy paper, Table 1", planner="toypaper:Planner", cli="toypaper",
              section="toy", schema="toypaper:SCHEMA", check="toypaper:check", published="toypaper:PUBLISHED")
