"""FedCG's tables (Caldarola et al. 2021, Tables 3-5) from the runs' own ``metrics.json`` files.

Every FedCG run is described by its hyperparameters, which name its row; numbers are the mean and
sample standard deviation over seeds of the final test accuracy in percent.

* ``table3.csv`` "How to use domain information" (§4.2.1): runs with oracle domains in training
  and at test (``clustering: oracle``, ``test_assignment: source``); columns Model
  (Domain-specific models / GCN / FedCG / Residual, i.e. FedCG without GCN), A (U uniform,
  H Hamming, D distances of Eq. 6), W, ReLU, accuracy.
* ``table4.csv`` "How to identify the domains" (§4.2.2): the other FedCG runs: discovered domains
  (k-means of the client models, or the teacher-student classifier), and oracle domains in training
  with the student's assignment at test (Clusters "oracle": the student then learns the true
  domains, which isolates the test-time assignment from the clustering); columns FedCG layers, A
  init, Clusters, K, and the accuracy with soft and with hard test assignment (both measured on the
  same trained model), overall and on the unseen test domains when the data have them, and their
  paired difference on the unseen domains (soft minus hard per run, then mean and std over seeds:
  the two columns share the model and the test images, so the difference is far less noisy than
  either column). The paired test of that difference: summed over seeds, the unseen test images that
  only soft (``soft_only_unseen``) and only hard (``hard_only_unseen``) assignment gets right, and
  the exact two-sided sign test on them (``sign_p_unseen``; McNemar's exact test, pooling the seeds'
  models).
* ``table5.csv`` the comparison with FedAvg (§4.3): every FedAvg, FedProx and FedCG label per dataset, with
  accuracy overall, on the seen and on the unseen test domains, and for FedCG rows the same paired
  test against FedAvg from the runs' ``predictions.csv``: summed over seeds, the test images only
  this row (``only_this``) and only FedAvg (``only_fedavg``) gets right, each FedCG run paired with
  the FedAvg run of its dataset and seed, and the sign test (``sign_p_fedavg``); the same split
  by the images' domains where the runs have them (``only_this_seen``, ``only_fedavg_seen``,
  ``sign_p_fedavg_seen`` and ``*_unseen``: the runs' ``metrics.json`` name the unseen ids), so that
  a gain on the seen domains is not hidden by a loss on the unseen one, or the reverse. Also the
  learned residual scale alpha of the last residual layer (Eq. 4; the paper: 2.1 on FEMNIST, 0.3 on
  CelebA), mean over seeds; the paper's own Table-5 number where it has one (``paper``: by dataset
  family, FEMNIST or CelebA; their full LEAF splits, not ours); and the machine(s) that trained each row.

``tables.md`` shows the three as Markdown.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mcfl.inputs import present
from mcfl.io import atomic_path, read_run, read_run_csv, staged, write_text
from mcfl.report.format import machines, machines_section, markdown_html, markdown_table, mean_std
from mcfl.metrics import paired_counts, sign_test_p

ADJ = {"uniform": "U", "hamming": "H", "distance": "D"}
CLUSTERS = {"classifier": "Clf", "kmeans": "K-means", "oracle": "oracle"}


def load_runs(run_dirs: list[Path]) -> list[dict]:
    """Each run's ``metrics.json``, with ``hit`` (per test sample: correct?) from its
    ``predictions.csv`` when it has one, and ``unseen`` (per test sample: in an unseen domain?)
    when that file has the samples' domains and ``metrics.json`` the unseen ids."""
    runs = []
    for d in map(Path, run_dirs):
        m = read_run(d, need=("label", "seed", "final"))
        if present(d / "predictions.csv", "run's predictions.csv"):
            p = read_run_csv(d / "predictions.csv", ("y", "pred"), usecols=lambda c: c in ("y", "pred", "domain"))
            m["hit"] = (p["y"] == p["pred"]).to_numpy()
            m["y"], m["path"] = p["y"].to_numpy(), d / "predictions.csv"
            if "domain" in p and "unseen_domains" in m:
                m["unseen"] = p["domain"].isin(m["unseen_domains"]).to_numpy()
        runs.append(m)
    return runs


def _model(p: dict) -> str:
    if not p["agnostic"]:
        return "GCN" if p["gcn"] else "Domain-specific models"
    return "FedCG" if p["gcn"] else "Residual (no GCN)"


def _mark(flag: bool) -> str:
    return "✓" if flag else "✗"


def _describe(m: dict) -> dict:
    p = m["params"]
    gcn = p["gcn"]
    return {"dataset": m["dataset"], "label": m["label"], "Model": _model(p),
            "A": ADJ[p["adjacency"]] if gcn else "-", "W": _mark(gcn and p["projection"]) if gcn else "-",
            "ReLU": _mark(p["relu"]) if gcn else "-", "layers": p["layers"],
            "A init": p["adjacency_init"] if gcn and p["adjacency"] == "distance" else "-",
            "Clusters": CLUSTERS[p["clustering"]], "K": p["K"], "test": p["test_assignment"]}


def _paired(final: dict) -> dict:
    """Soft minus hard accuracy on the unseen domains of one run (absent without unseen domains)."""
    if final.get("soft_acc_unseen") is None or final.get("hard_acc_unseen") is None:
        return {}
    return {"soft_minus_hard_unseen": final["soft_acc_unseen"] - final["hard_acc_unseen"]}


def _aggregate(rows: list[dict], keys: list[str], metrics: dict[str, str],
               counts: tuple[str, ...] = ()) -> pd.DataFrame:
    """Mean and std (ddof=1) over seeds of each metric (percent), and the sum over seeds of each
    count (NaN unless every run has it), one row per distinct keys."""
    if not rows:
        stats = [f"{n}_{s}" for n in metrics for s in ("mean", "std")]
        return pd.DataFrame(columns=keys + ["n_seeds"] + stats + list(counts))
    df = pd.DataFrame(rows)
    out = []
    for key, g in df.groupby(keys, sort=False, dropna=False):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row["n_seeds"] = len(g)
        for name, col in metrics.items():
            v = pd.to_numeric(g[col], errors="coerce").dropna() * 100 if col in g else pd.Series(dtype=float)
            row[f"{name}_mean"] = v.mean() if len(v) else np.nan
            row[f"{name}_std"] = v.std(ddof=1) if len(v) > 1 else np.nan
        for col in counts:
            v = pd.to_numeric(g[col], errors="coerce") if col in g else pd.Series([np.nan])
            row[col] = v.sum() if v.notna().all() else np.nan
        out.append(row)
    return pd.DataFrame(out)


def tables(runs: list[dict]) -> dict[str, pd.DataFrame]:
    fedcg = [{**_describe(m), **m["final"], **_paired(m["final"])} for m in runs if m["method"] == "FedCG"]
    in_t3 = [r["Clusters"] == "oracle" and r["test"] == "source" for r in fedcg]
    t3 = _aggregate([r for r, o in zip(fedcg, in_t3) if o],
                    ["dataset", "label", "Model", "A", "W", "ReLU", "layers", "test"], {"acc": "micro_acc"})
    t4 = _aggregate([r for r, o in zip(fedcg, in_t3) if not o],
                    ["dataset", "label", "layers", "A init", "Clusters", "K"],
                    {"acc": "micro_acc", "soft_acc": "soft_acc", "hard_acc": "hard_acc",
                     "soft_unseen": "soft_acc_unseen", "hard_unseen": "hard_acc_unseen",
                     "soft-hard_unseen": "soft_minus_hard_unseen"},
                    counts=("soft_only_unseen", "hard_only_unseen"))
    t4["sign_p_unseen"] = [_sign_p(a, b) for a, b in zip(t4["soft_only_unseen"], t4["hard_only_unseen"])]
    fedavg = {(m["dataset"], m["seed"]): m for m in runs if m["method"] == "FedAvg"}
    comp = [{"dataset": m["dataset"], "label": m["label"], **m["final"],
             **(_against(m, fedavg.get((m["dataset"], m["seed"]))) if m["method"] != "FedAvg" else {})}
            for m in runs if m["method"] in TABLE5_METHODS]
    t5 = _aggregate(comp, ["dataset", "label"],
                    {"acc": "micro_acc", "seen": "acc_seen", "unseen": "acc_unseen"},
                    counts=tuple(f"only_{w}{s}" for s in ("", "_seen", "_unseen") for w in ("this", "fedavg")))
    for s in ("", "_seen", "_unseen"):
        t5[f"sign_p_fedavg{s}"] = [_sign_p(a, b) for a, b in zip(t5[f"only_this{s}"], t5[f"only_fedavg{s}"])]
    first = {(m["dataset"], m["label"]): m for m in reversed(runs) if m["method"] in TABLE5_METHODS}
    t5["alpha"] = [np.mean([a for m in runs if (m["dataset"], m["label"]) == k
                            and (a := _last_alpha(m["final"])) is not None] or [np.nan])
                   for k in zip(t5["dataset"], t5["label"])]
    t5["paper"] = [paper_table5(first[k]) for k in zip(t5["dataset"], t5["label"])]
    t5["machine"] = [machines(m for m in runs if (m["dataset"], m["label"]) == k)
                     for k in zip(t5["dataset"], t5["label"])]
    return {"table3": t3, "table4": t4, "table5": t5}


#: Table 5's rows: FedCG, the FedAvg it is paired with, and FedProx (the paper quotes FedProx's own
#: FEMNIST number beside them)
TABLE5_METHODS = ("FedAvg", "FedProx", "FedCG")

#: Table 5 of the FedCG paper (Caldarola et al., CVPR-W 2021) (accuracy, %): LEAF's full FEMNIST (3,550 writers) and CelebA. FedCG's row is
#: its Table-5 setting (residuals on the last layer, soft test assignment, identity-initialised A);
#: FedProx's is quoted from the FedProx paper (200 rounds of 10 clients), not run by the authors.
PAPER_TABLE5 = {("femnist", "FedAvg"): 77.81, ("femnist", "FedCG"): 83.41, ("femnist", "FedProx"): 75.00,
                ("celeba", "FedAvg"): 86.88, ("celeba", "FedCG"): 89.18}


def paper_table5(m: dict) -> float:
    """The paper's Table-5 number for a run's row (NaN where the paper has none): by the dataset's
    family (FEMNIST or CelebA, from its name) and method; FedCG only in the paper's setting."""
    family = next((f for f in ("femnist", "celeba") if str(m["dataset"]).lower().startswith(f)), None)
    if m["method"] == "FedCG":
        p = m["params"]
        if not (p.get("agnostic") and p.get("gcn") and p.get("layers") == "last"
                and p.get("test_assignment") == "soft" and p.get("adjacency_init") == "eye"):
            return np.nan
    return PAPER_TABLE5.get((family, m["method"]), np.nan)


def _last_alpha(final: dict) -> float | None:
    """The learned residual scale alpha (Eq. 4) of the deepest layer with domain residuals."""
    alphas = sorted((int(k.split("_")[1]), v) for k, v in final.items()
                    if k.startswith("alpha_") and k.split("_")[1].isdigit())
    return float(alphas[-1][1]) if alphas else None


def _against(run: dict, base: dict | None) -> dict:
    """The test images only ``run`` and only ``base`` classifies correctly (both need predictions),
    overall and, where the runs know them, on the seen and on the unseen domains."""
    if base is None or "hit" not in run or "hit" not in base:
        return {}
    if not np.array_equal(run["y"], base["y"]):
        raise ValueError(f"{run['path']} and {base['path']}: different test samples (labels differ), so "
                         f"they cannot be compared image by image; were they trained on the same store?")
    out = dict(zip(("only_this", "only_fedavg"), paired_counts(run["hit"], base["hit"])))
    if "unseen" in run:
        for s, keep in (("_seen", ~run["unseen"]), ("_unseen", run["unseen"])):
            out.update(zip((f"only_this{s}", f"only_fedavg{s}"),
                           paired_counts(run["hit"][keep], base["hit"][keep])))
    return out


def _sign_p(wins, losses) -> float:
    """:func:`mcfl.metrics.sign_test_p`, NaN where a row has no counts."""
    return np.nan if pd.isna(wins) or pd.isna(losses) else sign_test_p(wins, losses)


#: count and test columns, shown after the percentages: Markdown header and format
TAIL = {"soft_only_unseen": ("soft only (unseen, Σ seeds)", "{:.0f}"),
        "hard_only_unseen": ("hard only (unseen, Σ seeds)", "{:.0f}"),
        "sign_p_unseen": ("sign-test p", "{:.3g}"),
        "only_this": ("only this right (Σ seeds)", "{:.0f}"),
        "only_fedavg": ("only FedAvg right (Σ seeds)", "{:.0f}"),
        "sign_p_fedavg": ("sign-test p", "{:.3g}"),
        "only_this_seen": ("only this right, seen (Σ seeds)", "{:.0f}"),
        "only_fedavg_seen": ("only FedAvg right, seen (Σ seeds)", "{:.0f}"),
        "sign_p_fedavg_seen": ("p, seen", "{:.3g}"),
        "only_this_unseen": ("only this right, unseen (Σ seeds)", "{:.0f}"),
        "only_fedavg_unseen": ("only FedAvg right, unseen (Σ seeds)", "{:.0f}"),
        "sign_p_fedavg_unseen": ("p, unseen", "{:.3g}"),
        "alpha": ("alpha (last layer)", "{:.2f}"),
        "paper": ("paper (002, Table 5, %)", "{:.2f}")}


def to_markdown(name: str, t: pd.DataFrame, title: str) -> str:
    if t.empty:
        return f"### {title}\n\n(no runs)\n"
    # columns no row has (no domains: no seen/unseen split) are left out of the Markdown, not the CSV
    metrics = [c[:-5] for c in t.columns if c.endswith("_mean") and t[c].notna().any()]
    tail = [c for c in TAIL if c in t.columns and t[c].notna().any()]
    keys = [c for c in t.columns if c not in ("n_seeds", "machine", *TAIL) and not c.endswith(("_mean", "_std"))]
    head = keys + ["seeds"] + [f"{m} (%)" for m in metrics] + [TAIL[c][0] for c in tail]
    rows = [[str(r[k]) for k in keys] + [str(int(r["n_seeds"]))]
            + [mean_std(r[f"{m}_mean"], r[f"{m}_std"], 2) for m in metrics]
            + ["" if pd.isna(r[c]) else TAIL[c][1].format(r[c]) for c in tail] for _, r in t.iterrows()]
    return f"### {title}\n\n" + markdown_table(head, rows)


TITLES = {"table3": "Table 3: how to use domain information (oracle domains)",
          "table4": "Table 4: how to identify the domains (soft vs hard test assignment)",
          "table5": "Table 5: FedCG vs FedAvg (accuracy overall, on seen and on unseen domains)"}


def write_fedcg_report(run_dirs: list[Path], out: Path) -> dict[str, pd.DataFrame]:
    ts = tables(load_runs(run_dirs))
    with staged(out) as stage:                  # all five files or none (mcfl.io.staged)
        for name, t in ts.items():
            with atomic_path(stage / f"{name}.csv") as tmp:
                t.round(4).to_csv(tmp, index=False)
        where = machines_section(ts["table5"], {"rows": "machine"}, lambda r: f"{r['label']} ({r['dataset']})")
        md = ("\n".join(to_markdown(n, t, TITLES[n]) for n, t in ts.items())
              + ("\n### Machines (Table 5's rows)\n\n" + "\n".join(where) + "\n" if where else ""))
        write_text(stage / "tables.md", md)
        # the same tables for Snakemake's report, which shows HTML inline (a CSV only as a download)
        write_text(stage / "tables.html", markdown_html(md, "FedCG's tables"))
    return ts
