"""Our results side by side with FeSEM's published tables.

``paper_tables.csv`` (next to this file) holds every number of the journal version's Tables 2-3
(paper ``journal``, mean ± std) and the conference version's Table 2 (paper ``conference``, no std), one row per
(paper, dataset, method, metric), in percent, under our run labels (``FedDist+WS``, ``Robust(TKM)``,
``FedCluster``, ``FedDane``, ...; ``paper_label`` keeps the paper's own row name).

:func:`comparison` matches them with our ``table.csv`` rows: a dataset of ours counts as a paper
dataset when its data source is ``femnist`` (FEMNIST) or ``celeba`` (FedCelebA); without the source
map, by its name. Every paper value gets a row: our mean and std over seeds and
``delta = ours - paper`` (percentage points), or the status ``not run`` (we ran no dataset from that
source) or ``method not run`` (we ran the dataset, not that method). The markdown shows one table per
paper dataset with a ``paper / ours / delta`` triple per metric and one row per (method, paper).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mcfl.io import atomic_path, write_text
from mcfl.report.format import mean_std

PAPER_TABLES = Path(__file__).with_name("paper_tables.csv")
SOURCES = {"femnist": "FEMNIST", "celeba": "FedCelebA"}
METRICS = ["micro_acc", "micro_f1", "macro_acc", "macro_f1"]
TITLES = {"micro_acc": "Micro-Acc", "micro_f1": "Micro-F1", "macro_acc": "Macro-Acc", "macro_f1": "Macro-F1"}
PAPERS = ("journal", "conference")


def paper_tables() -> pd.DataFrame:
    return pd.read_csv(PAPER_TABLES, comment="#", dtype={"paper": str})


def paper_dataset(name: str, sources: dict[str, str] | None = None) -> str | None:
    """The paper dataset one of our datasets reproduces, or None."""
    src = (sources or {}).get(name, name)
    return SOURCES.get(str(src).lower())


def comparison(ours: pd.DataFrame, sources: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per paper value (and per matching dataset of ours); ``ours`` is table.csv's frame."""
    paper = paper_tables()
    mapped = {d: paper_dataset(d, sources) for d in dict.fromkeys(ours["dataset"])}
    rows = []
    for _, p in paper.iterrows():
        mine = [d for d, pd_ in mapped.items() if pd_ == p["dataset"]]
        base = {"paper": p["paper"], "table": p["table"], "paper_dataset": p["dataset"],
                "method": p["method"], "paper_label": p["paper_label"], "metric": p["metric"],
                "paper_value": p["value"], "paper_std": p["std"]}
        if not mine:
            rows.append({**base, "dataset": "", "status": "not run"})
        for d in mine:
            hit = ours[(ours["dataset"] == d) & (ours["method"] == p["method"])]
            if hit.empty:
                rows.append({**base, "dataset": d, "status": "method not run"})
                continue
            h = hit.iloc[0]
            mean, std = float(h[f"{p['metric']}_mean"]), float(h[f"{p['metric']}_std"])
            rows.append({**base, "dataset": d, "status": "ok", "ours_mean": mean, "ours_std": std,
                         "n_seeds": int(h["n_seeds"]), "delta": mean - float(p["value"])})
    cols = ["paper", "table", "paper_dataset", "dataset", "method", "paper_label", "metric",
            "paper_value", "paper_std", "ours_mean", "ours_std", "n_seeds", "delta", "status"]
    return pd.DataFrame(rows).reindex(columns=cols)


def _row(method: str, paper: str, r: pd.DataFrame) -> str:
    """One markdown row: method, paper (and its own row name), then paper / ours / delta per metric."""
    label = r["paper_label"].iloc[0]
    cells = [method, paper if label == method else f"{paper} ({label})"]
    for m in METRICS:
        x = r[r["metric"] == m]
        if x.empty:
            cells += ["", "", ""]
            continue
        x = x.iloc[0]
        paper_value = mean_std(x["paper_value"], x["paper_std"])
        if x["status"] == "ok":
            cells += [paper_value, mean_std(x["ours_mean"], x["ours_std"]), mean_std(x["delta"], sign=True)]
        else:
            cells += [paper_value, x["status"], ""]
    return "| " + " | ".join(cells) + " |"


def to_markdown(cmp: pd.DataFrame) -> str:
    out = ["# Our results beside FeSEM's published tables", "",
           "Percent; delta = ours - paper (percentage points). journal = Long et al., World Wide Web 2022 "
           "(Tables 2-3, mean ± std), conference = Xie et al., *Multi-Center Federated Learning*, the "
           "conference version (Table 2). `not run`: we ran no dataset from that source.", ""]
    head = ["method", "paper"] + [f"{TITLES[m]} {c}" for m in METRICS for c in ("paper", "ours", "Δ")]
    for (pds, dset), g in cmp.groupby(["paper_dataset", "dataset"], sort=False):
        out += [f"## {pds} ({f'ours: `{dset}`' if dset else 'not run'})", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for method in dict.fromkeys(g["method"]):              # the paper's row order
            for paper in sorted(set(g.loc[g["method"] == method, "paper"])):
                out.append(_row(method, paper, g[(g["method"] == method) & (g["paper"] == paper)]))
        out.append("")
    return "\n".join(out)


def write_comparison(table: pd.DataFrame, out: Path, sources: dict[str, str] | None = None) -> None:
    cmp = comparison(table, sources)
    with atomic_path(out / "paper_comparison.csv") as tmp:
        cmp.round(4).to_csv(tmp, index=False)
    write_text(out / "paper_comparison.md", to_markdown(cmp))
