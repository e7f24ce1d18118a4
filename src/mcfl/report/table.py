"""Results table and convergence figures.

``table.csv`` has one row per (dataset, partition, method label), in the order the runs are given
(the workflow gives config order); ``partition`` names the partition that made the clients' data
(``natural``, ``iid``, ``dir(0.5)``, ...: :func:`mcfl.data.repartition.label`); then ``n_seeds`` and the mean and sample standard deviation (ddof=1,
blank for one seed) over seeds of micro/macro accuracy and F1 in percent, as in FeSEM's Tables 2-3,
plus ARI and NMI against the true clusters (fractions; blank where the data have no ground truth or
the method does not cluster). ``table.md`` shows the same as ``mean ± std``; ``table.html`` and
``paper_comparison.html`` are the markdown tables as web pages, for Snakemake's report.

Diverged runs (:mod:`mcfl.divergence`: a loss jump during training, recorded in the run's
``metrics.json``) stay in the mean, so the row shows what the configuration gave, and are never
averaged in silently: ``n_diverged`` counts them, ``table.md`` marks the row's cells with ``†`` and
a footnote under the table names the seeds and the round each diverged in.

``figures/convergence_<dataset>.png``: micro accuracy against round for every FeSEM(K) (mean over
seeds, band = ±1 std), FedAvg dashed as the reference (FeSEM Fig. 3); every method where the
dataset has neither (a tuning sweep).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mcfl.io import atomic_path, read_run, staged, write_text
from mcfl.paths import child
from mcfl.report.format import diverged_cell, diverged_note, markdown_html, markdown_table, mean_std
from mcfl.report.paper import write_comparison

METRICS = ["micro_acc", "micro_f1", "macro_acc", "macro_f1"]
CLUSTER = ["ari", "nmi"]


def collect(run_dirs: list[Path], draws: dict[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run with final metrics, all runs' histories stacked). ``draws``: the draw of a
    dataset whose runs name none (a replicated config's original dataset: mcfl.replication)."""
    finals, hists = [], []
    for d in run_dirs:
        m = read_run(d, history=True)
        draw = m.get("draw") or (draws or {}).get(m["dataset"], "")
        finals.append({"dataset": m["dataset"], "partition": m.get("partition", "natural"), "draw": draw,
                       "method": m["label"], "seed": m["seed"], **m["final"],
                       "diverged": m.get("diverged")})
        h = m["history"]
        h["dataset"], h["method"], h["seed"] = m["dataset"], m["label"], m["seed"]
        hists.append(h)
    return pd.DataFrame(finals), pd.concat(hists, ignore_index=True)


def summary_table(finals: pd.DataFrame) -> pd.DataFrame:
    rows = []
    order = list(dict.fromkeys(zip(finals["dataset"], finals["partition"], finals["method"])))
    for ds, part, method in order:
        g = finals[(finals["dataset"] == ds) & (finals["partition"] == part) & (finals["method"] == method)]
        row = {"dataset": ds, "partition": part, "draw": g["draw"].iloc[0], "method": method, "n_seeds": len(g),
               "n_diverged": int(g["diverged"].notna().sum()) if "diverged" in g else 0}
        for k in METRICS:
            v = g[k].astype(float) * 100
            row[f"{k}_mean"], row[f"{k}_std"] = v.mean(), v.std(ddof=1)
        for k in CLUSTER:
            v = g[k].astype(float) if k in g else pd.Series(dtype=float)
            v = v.dropna()
            row[f"{k}_mean"] = v.mean() if len(v) else np.nan
            row[f"{k}_std"] = v.std(ddof=1) if len(v) > 1 else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def to_markdown(t: pd.DataFrame) -> str:
    head = ["dataset", "partition", "method", "seeds", "micro acc", "micro F1", "macro acc", "macro F1", "ARI"]
    rows = [[r["dataset"], r["partition"], r["method"], str(int(r["n_seeds"]))]
            + [diverged_cell(mean_std(r[f"{k}_mean"], r[f"{k}_std"]), r.get("n_diverged")) for k in METRICS]
            + [mean_std(r["ari_mean"], r["ari_std"], 3)] for _, r in t.iterrows()]
    return markdown_table(head, rows)


def divergence_notes(finals: pd.DataFrame) -> str:
    """The footnotes of ``table.md`` on diverged runs ("" if none)."""
    if "diverged" not in finals:
        return ""
    n = finals.groupby(["dataset", "partition", "method"], sort=False)["seed"].transform("size")
    runs = [{**r, "n_seeds": k} for r, k in zip(finals.to_dict("records"), n)]
    for r in runs:
        r["diverged"] = r["diverged"] if isinstance(r["diverged"], dict) else None
    lines = diverged_note(runs, lambda r: f"{r['method']} on {r['dataset']}"
                          + ("" if r["partition"] == "natural" else f" ({r['partition']})"))
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def convergence_figure(hist: pd.DataFrame, dataset: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = hist[(hist["dataset"] == dataset) & hist["micro_acc"].notna()]
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    methods = [m for m in dict.fromkeys(h["method"]) if m.startswith("FeSEM(")]
    methods += ["FedAvg"] if "FedAvg" in set(h["method"]) else []
    methods = methods or list(dict.fromkeys(h["method"]))        # neither (a tuning sweep): every run
    for method in methods:
        g = h[h["method"] == method].groupby("round")["micro_acc"]
        mean, std = g.mean() * 100, g.std(ddof=1).fillna(0) * 100
        style = dict(ls="--", color="k") if method == "FedAvg" else {}
        (line,) = ax.plot(mean.index, mean.values, label=method, **style)
        ax.fill_between(mean.index, mean - std, mean + std, alpha=0.15, color=line.get_color())
    ax.set_xlabel("round")
    ax.set_ylabel("micro accuracy (%)")
    ax.set_title(f"Convergence of FeSEM(K) on {dataset}" if any(m.startswith("FeSEM(") for m in methods)
                 else f"Convergence on {dataset}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def write_report(run_dirs: list[Path], out: Path, sources: dict[str, str] | None = None,
                 draws: dict[str, str] | None = None) -> None:
    """Every file of the report, all or nothing (:func:`mcfl.io.staged`): a failure leaves the
    earlier report as it was. ``draws``: see :func:`collect`."""
    finals, hist = collect(run_dirs, draws)
    table = summary_table(finals)
    with staged(out) as stage:
        with atomic_path(stage / "table.csv") as tmp:
            table.round(4).to_csv(tmp, index=False)
        write_text(stage / "table.md", to_markdown(table) + divergence_notes(finals))
        write_comparison(table, stage, sources)        # paper_comparison.csv/.md (mcfl.report.paper)
        for name, title in (("table", "Results"), ("paper_comparison", "Comparison with the papers")):
            # the same tables for Snakemake's report, which shows HTML inline (a CSV only as a download)
            write_text(stage / f"{name}.html", markdown_html((stage / f"{name}.md").read_text(), title))
        for ds in dict.fromkeys(finals["dataset"]):
            convergence_figure(hist, ds, child(stage / "figures", ds, "metrics.json: dataset",
                                               prefix="convergence_", suffix=".png"))
