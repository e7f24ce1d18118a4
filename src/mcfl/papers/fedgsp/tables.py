"""FedGSP's tables and figures (Zeng et al., DASFAA 2022, §4.2), from the runs' own output files and
the data store; ``mcfl paper fedgsp {cpd,table,heatmap,kappa}`` writes them (:mod:`.cli`).

* ``cpd``: Fig. 3a. CPD (Eq. 14) of every pair of clients (FedAvg: every client its own group), of
  every pair of NaiveGSP's random groups and of every pair of NaiveGSP+ICG's groups, for f groups and
  each seed; the groupings are drawn exactly as those runs draw them before round 1 (server
  generator ``(seed, round 0, GROUPING)``). ``cpd.csv`` (long), ``cpd_summary.csv`` (median, mean,
  and the median's reduction against FedAvg and NaiveGSP) and ``cpd.png`` (box plots, orange line =
  median, green triangle = mean, as in the paper).
* ``table``: Table 1 (final test accuracy and loss, mean ± std over seeds, and rounds to reach the
  target accuracy: mean over the seeds that reach it, "×" if none does), Figs. 3b/3c (accuracy and
  test-loss curves) and Fig. 6 (computation time, communication time and traffic to the target by
  Eqs. 15-17, mean over the seeds that reach it). Where the runs wrote ``predictions.csv``, each row
  is also compared image by image with FedAvg of the same seed (test images only this row / only
  FedAvg gets right, summed over the seeds both have; exact sign test). On a FEMNIST dataset with an
  80% target the paper's own Table-1 row stands beside ours (``PAPER_TABLE1``), and the table ends
  with the machine that made each run.
* ``heatmap``: Fig. 4, final test loss (mean over seeds) over (alpha, beta) per growth function.
* ``kappa``: Fig. 5, final accuracy and normalised T_comp, T_comm over the whole run against kappa.

Cost inputs per run: K and n (mean training samples per client) from the store, e = local epochs;
per round, f(r) and kappa·f(r) are the groups formed and trained (FedGSP's history columns
``groups`` and ``trained_groups``); a FedAvg-style run has f(r) = K and kappa·f(r) = its clients
per round.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mcfl.cluster.icg import icg_groups, random_groups
from mcfl.data.store import load
from mcfl.fedgsp.metrics import (CostModel, class_counts, group_counts, pairwise_cpd,
                                 rounds_to_target, run_cost)
from mcfl.io import atomic_path, read_run, write_text
from mcfl.metrics import paired_counts, sign_test_p
from mcfl.report.format import (diverged_cell, diverged_note, machine, machines_section, markdown_html,
                                markdown_table, mean_std)
from mcfl.streams import GSP_GROUPING as GROUPING
from mcfl.streams import SERVER, derive_seed

#: Table 1 of the FedGSP paper (Zeng et al., DASFAA 2022) (LEAF's FEMNIST, 368 writers, target 80%): accuracy (%), test loss and
#: rounds to the target (None: the paper's ×, never reached). NaiveGSP and NaiveGSP+ICG are not in it.
PAPER_TABLE1 = {"FedAvg": (80.1, 0.602, 470), "FedProx": (78.7, 0.633, None),
                "FedMMD": (81.7, 0.587, 336), "FedFusion": (82.4, 0.554, 230), "IDA": (82.0, 0.567, 256),
                "FedAdagrad": (81.9, 0.582, 297), "FedAdam": (82.1, 0.566, 87), "FedYogi": (83.2, 0.543, 93),
                "FedGSP": (85.4, 0.453, 34)}


def paper_table1(dataset: str, method: str, target: float) -> tuple | None:
    """The paper's Table-1 row (accuracy %, loss, rounds) for a run, or None: only on a FEMNIST
    dataset (by its name) with the paper's 80% target, and only for the rows the paper has."""
    if not str(dataset).lower().startswith("femnist") or not np.isclose(target, 0.8):
        return None
    return PAPER_TABLE1.get(method)


# --------------------------------------------------------------------------------------- helpers
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    _plt().close(fig)


def _csv(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


def _store_stats(store) -> tuple[int, float]:
    d = load(store)
    return d.n_clients, float(np.diff(np.asarray(d.offsets_train)).mean())


def load_runs(run_dirs: list[Path], train: list[dict] | None = None, need: tuple[str, ...] = ()) -> list[dict]:
    """One record per run directory: ``run`` (label, method, dataset, seed, params and machine from
    its metrics.json, and the train settings ``train[i]``: clients_per_round, local_epochs),
    ``final`` metrics, ``hist``, and ``y`` / ``hit`` per test image where it wrote predictions.csv.
    A run without the FedGSP parameters ``need`` (a FedAvg run) is a one-line error naming it."""
    train = train if train is not None else [{}] * len(run_dirs)
    if len(run_dirs) != len(train):
        raise ValueError(f"{len(run_dirs)} run directories but {len(train)} train settings")
    out = []
    for d, t in zip(run_dirs, train):
        m = read_run(d, history=True, predictions=True)
        lacks = [f"{k}" for k in ("label", "seed", "params", "final") if k not in m] or [
            f"final.{k}" for k in ("micro_acc", "test_loss") if k not in (m["final"] or {})] or [
            f"history.csv column {k}" for k in ("round", "micro_acc", "test_loss") if k not in m["history"]]
        if lacks:
            raise ValueError(f"{Path(d)}: no {lacks[0]} (the figures read it from a run `mcfl train` wrote)")
        if missing := [k for k in need if k not in (m.get("params") or {})]:
            raise ValueError(f"{Path(d) / 'metrics.json'}: a {m.get('method', m['label'])} run has no parameter "
                             f"{missing[0]!r}; this figure compares FedGSP runs ({', '.join(need)})")
        run = {"label": m["label"], "method": m.get("method", m["label"]), "dataset": m.get("dataset", ""),
               "seed": m["seed"], "params": m["params"], "train": t, "machine": machine(m), "dir": Path(d),
               "diverged": m.get("diverged")}
        out.append({"run": run, "final": m["final"], "hist": m["history"],
                    **{k: m[k] for k in ("y", "hit") if k in m}})
    return out


def train_settings(runs: list[dict]) -> list[dict]:
    """What the cost models need of each run's train settings (the ``--train`` JSON)."""
    return [{k: r["train"].get(k) for k in ("clients_per_round", "local_epochs")} for r in runs]


def per_round_groups(rec: dict, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(f(r), kappa·f(r)) for every round of a run (see the module docstring)."""
    h = rec["hist"]
    if "groups" in h and "trained_groups" in h:
        return h["groups"].to_numpy(float), h["trained_groups"].to_numpy(float)
    cpr = rec["run"]["train"].get("clients_per_round")
    k = K if cpr is None else min(int(cpr), K)
    return np.full(len(h), float(K)), np.full(len(h), float(k))


def run_summary(rec: dict, target: float, K: int, n: float, cost: CostModel) -> dict:
    h = rec["hist"]
    ev = h[h["micro_acc"].notna()]
    rt = rounds_to_target(ev["round"].to_numpy(), ev["micro_acc"].to_numpy(), target)
    row = {"method": rec["run"]["label"], "seed": rec["run"]["seed"],
           "accuracy": rec["final"]["micro_acc"], "loss": rec["final"]["test_loss"],
           "rounds_to_target": rt,
           "diverged_round": (rec["run"].get("diverged") or {}).get("round", np.nan)}
    f, trained = per_round_groups(rec, K)
    e = float(rec["run"]["train"].get("local_epochs", 1))
    at = run_cost(f[:rt], trained[:rt], K, n, e, cost) if rt else {}
    total = run_cost(f, trained, K, n, e, cost)
    row.update({f"{k}_to_target": at.get(k, np.nan) for k in total})
    row.update({f"{k}_total": v for k, v in total.items()})
    return row


# -------------------------------------------------------------------------------------- Fig. 3a
def cpd_study(store, groups: int, seeds: list[int], *, rounding: str = "paper", icg_iters: int = 10,
              sigma: float = 1.0) -> pd.DataFrame:
    d = load(store)
    V = class_counts(np.asarray(d.y_train), np.asarray(d.offsets_train), d.n_classes)
    rows = [pd.DataFrame({"method": "FedAvg", "seed": s, "cpd": pairwise_cpd(V, sigma)}) for s in seeds]
    for s in seeds:
        rng = np.random.default_rng(derive_seed(s, SERVER, 0, GROUPING))       # = fed.rng(0, GROUPING)
        g = random_groups(len(V), groups, rng, rounding)
        rows.append(pd.DataFrame({"method": "NaiveGSP", "seed": s, "cpd": pairwise_cpd(group_counts(V, g), sigma)}))
        rng = np.random.default_rng(derive_seed(s, SERVER, 0, GROUPING))
        g, _ = icg_groups(V, groups, rng, max_iter=icg_iters, rounding=rounding)
        rows.append(pd.DataFrame({"method": "NaiveGSP+ICG", "seed": s,
                                  "cpd": pairwise_cpd(group_counts(V, g), sigma)}))
    return pd.concat(rows, ignore_index=True)


def cpd_summary(df: pd.DataFrame) -> pd.DataFrame:
    s = df.groupby("method", sort=False)["cpd"].agg(["median", "mean", "count"]).reset_index()
    med = dict(zip(s["method"], s["median"]))
    for ref in ("FedAvg", "NaiveGSP"):
        s[f"median_vs_{ref}_pct"] = (s["median"] / med[ref] - 1.0) * 100
    return s


def write_cpd(store, out: Path, groups: int, seeds: list[int], **kw) -> pd.DataFrame:
    df = cpd_study(store, groups, seeds, **kw)
    summ = cpd_summary(df)
    _csv(df, out / "cpd.csv")
    _csv(summ.round(6), out / "cpd_summary.csv")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.6), dpi=120)
    methods = list(dict.fromkeys(df["method"]))
    ax.boxplot([df.loc[df["method"] == m, "cpd"] for m in methods], showmeans=True, showfliers=False)
    ax.set_xticks(range(1, len(methods) + 1), methods)
    ax.set_yscale("log" if (df["cpd"] > 0).all() else "linear")
    ax.set_ylabel("CPD (squared MMD, Eq. 14)")
    red = summ.set_index("method").loc["NaiveGSP+ICG"]
    ax.set_title(f"CPD, {groups} groups: ICG median {red['median_vs_NaiveGSP_pct']:+.0f}% vs NaiveGSP, "
                 f"{red['median_vs_FedAvg_pct']:+.0f}% vs FedAvg", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    _save(fig, out / "cpd.png")
    return summ


# ---------------------------------------------------------------------------- Table 1, Figs 3, 6
def against_fedavg(rec: dict, recs: list[dict]) -> tuple[float, float]:
    """(test images only ``rec`` gets right, only FedAvg of the same seed gets right); NaN when
    either has no predictions or there is no such FedAvg run (or ``rec`` is it)."""
    base = next((r for r in recs if r["run"]["label"] == "FedAvg" and r["run"]["seed"] == rec["run"]["seed"]),
                None)
    if base is None or base is rec or "hit" not in rec or "hit" not in base:
        return np.nan, np.nan
    if not np.array_equal(rec["y"], base["y"]):
        raise ValueError(f"{rec['run']['dir']} and {base['run']['dir']}: different test images (labels "
                         f"differ), so they cannot be compared image by image; same store?")
    return paired_counts(rec["hit"], base["hit"])


def table(recs: list[dict], target: float, K: int, n: float, cost: CostModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-run rows, per-method Table 1)."""
    per = pd.DataFrame([{**run_summary(r, target, K, n, cost), "machine": r["run"]["machine"],
                         **dict(zip(("only_this", "only_fedavg"), against_fedavg(r, recs)))} for r in recs])
    paper = {r["run"]["label"]: paper_table1(r["run"]["dataset"], r["run"]["method"], target) for r in recs}
    rows = []
    for m, g in per.groupby("method", sort=False):
        reached = g["rounds_to_target"].dropna()
        paired = g.dropna(subset=["only_this"])
        p = paper.get(m)
        row = {"method": m, "n_seeds": len(g), "seeds": ",".join(str(s) for s in g["seed"]), "target": target,
               "n_diverged": int(g["diverged_round"].notna().sum()),
               "accuracy_mean": g["accuracy"].mean(), "accuracy_std": g["accuracy"].std(ddof=1),
               "loss_mean": g["loss"].mean(), "loss_std": g["loss"].std(ddof=1),
               "rounds_to_target_mean": reached.mean() if len(reached) else np.nan,
               "seeds_reaching_target": len(reached)}
        for k in ("t_comp_s", "t_comm_s", "d_comm_bytes"):
            row[f"{k}_to_target"] = g[f"{k}_to_target"].mean() if len(reached) else np.nan
        only = (paired["only_this"].sum(), paired["only_fedavg"].sum()) if len(paired) else (np.nan, np.nan)
        row.update({"only_this": only[0], "only_fedavg": only[1],
                    "sign_p": sign_test_p(*only) if len(paired) else np.nan,
                    "paper_accuracy": p[0] / 100 if p else np.nan, "paper_loss": p[1] if p else np.nan,
                    "paper_rounds": (np.inf if p[2] is None else p[2]) if p else np.nan})
        rows.append(row)
    return per, pd.DataFrame(rows)


def _paper_cell(r: pd.Series) -> str:
    if pd.isna(r.get("paper_accuracy", np.nan)):
        return ""
    rounds = "×" if np.isinf(r["paper_rounds"]) else f"{r['paper_rounds']:.0f}"
    return f"{r['paper_accuracy'] * 100:.1f} / {r['paper_loss']:.3f} / {rounds}"


def table_markdown(t: pd.DataFrame) -> str:
    """Table 1 as markdown; the image-by-image and the paper's columns only where some row has them."""
    paired = "only_this" in t and t["only_this"].notna().any()
    paper = "paper_accuracy" in t and t["paper_accuracy"].notna().any()
    head = ["Algorithm", "Seeds", "Accuracy (%)", "Loss", "Rounds", "T_comp (s)", "T_comm (s)", "Traffic (GB)"]
    head += ["Only this / only FedAvg right", "p"] if paired else []
    head += ["Paper (003): accuracy / loss / rounds"] if paper else []
    rows = []
    for _, r in t.iterrows():
        n, k = int(r["n_seeds"]), int(r["seeds_reaching_target"])
        rounds = "×" if not k else f"{r['rounds_to_target_mean']:.1f}" + ("" if k == n else f" ({k}/{n})")
        bad = r.get("n_diverged", 0)
        row = [r["method"], r.get("seeds", n),
               diverged_cell(mean_std(r["accuracy_mean"], r["accuracy_std"], scale=100), bad),
               diverged_cell(mean_std(r["loss_mean"], r["loss_std"], 3), bad), rounds,
               mean_std(r["t_comp_s_to_target"], digits=2), mean_std(r["t_comm_s_to_target"]),
               mean_std(r["d_comm_bytes_to_target"], digits=2, scale=1e-9)]
        if paired:
            has = pd.notna(r["only_this"])
            row += [f"{r['only_this']:.0f} / {r['only_fedavg']:.0f}" if has else "",
                    f"{r['sign_p']:.2g}" if has else ""]
        rows.append(row + ([_paper_cell(r)] if paper else []))
    notes = ("Target accuracy {:.0f}% (micro); mean ± std over the seeds listed; rounds: mean over the seeds "
             "reaching the target (count in brackets), × if none.").format(t["target"].iloc[0] * 100)
    if paired:
        notes += (" Only this / only FedAvg right: test images, summed over the seeds where FedAvg of the "
                  "same seed has run; p: exact two-sided sign test.")
    if paper:
        notes += (" Paper: Table 1 of Zeng et al. (003) on LEAF's FEMNIST with 368 writers, not these "
                  "writers; × = never reached.")
    return notes + "\n\n" + markdown_table(head, rows)


def divergence_notes(recs: list[dict]) -> str:
    """Footnotes on the diverged runs of Table 1 ("" if none)."""
    n = pd.Series([r["run"]["label"] for r in recs]).value_counts()
    lines = diverged_note([{**r["run"], "n_seeds": int(n[r["run"]["label"]])} for r in recs],
                          lambda r: r["label"])
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def curves_figure(recs: list[dict], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=120)
    h = pd.concat([r["hist"].assign(method=r["run"]["label"]) for r in recs], ignore_index=True)
    h = h[h["micro_acc"].notna()]
    for i, m in enumerate(dict.fromkeys(h["method"])):
        g = h[h["method"] == m].groupby("round")
        # ten colours, then the same ten dashed: Table 1's eleven rows stay told apart
        style = {"lw": 2.2 if m == "FedGSP" else 1.2, "color": f"C{i % 10}", "ls": ("-", "--", ":")[i // 10 % 3]}
        axes[0].plot(g["micro_acc"].mean().index, g["micro_acc"].mean() * 100, label=m, **style)
        axes[1].plot(g["test_loss"].mean().index, g["test_loss"].mean(), label=m, **style)
    axes[1].set_yscale("log")           # an early spike (FedAdagrad's first rounds) hides the rest
    for ax, lab in zip(axes, ("test accuracy (%)", "test loss (log scale)")):
        ax.set_xlabel("round")
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[0].set_title("Accuracy (Fig. 3b)")
    axes[1].set_title("Loss (Fig. 3c)")
    fig.tight_layout()
    _save(fig, path)


def cost_figure(t: pd.DataFrame, path: Path) -> None:
    plt = _plt()
    t = t[t["seeds_reaching_target"] > 0]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=120)
    x = np.arange(len(t))
    axes[0].bar(x, t["t_comp_s_to_target"], label="computation (Eq. 15)")
    axes[0].bar(x, t["t_comm_s_to_target"], bottom=t["t_comp_s_to_target"], label="communication (Eq. 16)")
    axes[0].set_ylabel("time to target (s)")
    axes[0].legend(fontsize=7)
    axes[1].bar(x, t["d_comm_bytes_to_target"] / 1e9, color="tab:green")
    axes[1].set_ylabel("traffic to target (GB, Eq. 17)")
    for ax in axes:
        ax.set_xticks(x, t["method"], rotation=30, ha="right", fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    tgt = t["target"].iloc[0] * 100 if len(t) else float("nan")
    fig.suptitle(f"Time and traffic to reach {tgt:.0f}% accuracy (Fig. 6)", fontsize=9)
    fig.tight_layout()
    _save(fig, path)


def write_table(run_dirs: list[Path], train: list[dict], store, target: float, out: Path,
                cost: CostModel = CostModel()) -> pd.DataFrame:
    recs = load_runs(run_dirs, train)
    K, n = _store_stats(store)
    per, t = table(recs, target, K, n, cost)
    _csv(per.round(6), out / "runs.csv")
    _csv(t.round(6), out / "table.csv")
    where = machines_section(per, {"runs": "machine"}, lambda r: f"{r['method']} seed {r['seed']}")
    md = table_markdown(t) + divergence_notes(recs) + "\n**Machines.**\n\n" + "\n".join(where) + "\n"
    write_text(out / "table.md", md)
    write_text(out / "table.html", markdown_html(md, "FedGSP's Table 1"))   # inline in Snakemake's report
    curves_figure(recs, out / "curves.png")
    cost_figure(t, out / "cost.png")
    return t


# ------------------------------------------------------------------------------------- Figs. 4, 5
def write_heatmap(run_dirs: list[Path], out: Path) -> pd.DataFrame:
    recs = load_runs(run_dirs, need=("growth", "alpha", "beta"))
    df = pd.DataFrame([{**{k: r["run"]["params"][k] for k in ("growth", "alpha", "beta")},
                        "loss": r["final"]["test_loss"], "accuracy": r["final"]["micro_acc"]} for r in recs])
    df = df.groupby(["growth", "alpha", "beta"], sort=False).agg(
        loss=("loss", "mean"), accuracy=("accuracy", "mean"), n_seeds=("loss", "size")).reset_index()
    _csv(df.round(6), out / "heatmap.csv")
    plt = _plt()
    growths = list(dict.fromkeys(df["growth"]))
    fig, axes = plt.subplots(1, len(growths), figsize=(4.2 * len(growths), 3.6), dpi=120, squeeze=False,
                             layout="constrained")
    vmin, vmax = df["loss"].min(), df["loss"].max()
    for ax, gr in zip(axes[0], growths):
        piv = df[df["growth"] == gr].pivot(index="alpha", columns="beta", values="loss")
        im = ax.imshow(piv.to_numpy(), cmap="RdYlGn_r", vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_xticks(range(piv.shape[1]), [str(b) for b in piv.columns])
        ax.set_yticks(range(piv.shape[0]), [f"{a:g}" for a in piv.index])
        for (i, j), v in np.ndenumerate(piv.to_numpy()):
            ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=7)
        ax.set_xlabel("beta")
        ax.set_ylabel("alpha")
        ax.set_title(f"{gr} growth", fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label="final test loss")
    fig.suptitle("FedGSP test loss over (alpha, beta) (Fig. 4)", fontsize=9)
    _save(fig, out / "heatmap.png")
    return df


def write_kappa(run_dirs: list[Path], train: list[dict], store, out: Path,
                cost: CostModel = CostModel()) -> pd.DataFrame:
    recs = load_runs(run_dirs, train, need=("kappa",))
    K, n = _store_stats(store)
    rows = []
    for r in recs:
        f, trained = per_round_groups(r, K)
        c = run_cost(f, trained, K, n, float(r["run"]["train"].get("local_epochs", 1)), cost)
        rows.append({"kappa": r["run"]["params"]["kappa"], "accuracy": r["final"]["micro_acc"], **c})
    df = pd.DataFrame(rows).groupby("kappa").agg(
        accuracy_mean=("accuracy", "mean"), accuracy_std=("accuracy", "std"), t_comp_s=("t_comp_s", "mean"),
        t_comm_s=("t_comm_s", "mean"), d_comm_bytes=("d_comm_bytes", "mean"), n_seeds=("accuracy", "size")).reset_index()
    for k in ("t_comp_s", "t_comm_s"):
        df[f"{k}_norm"] = df[k] / df[k].max()
    _csv(df.round(6), out / "kappa.csv")
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), dpi=120)
    axes[0].errorbar(df["kappa"], df["accuracy_mean"] * 100, yerr=df["accuracy_std"].fillna(0) * 100, marker="o")
    axes[0].set_ylabel("final test accuracy (%)")
    axes[0].set_ylim(0, 100)
    axes[1].plot(df["kappa"], df["t_comp_s_norm"], marker="o")
    axes[1].set_ylabel("normalised T_comp (Eq. 15)")
    axes[2].plot(df["kappa"], df["t_comm_s_norm"], marker="o")
    axes[2].set_ylabel("normalised T_comm (Eq. 16)")
    for ax in axes:
        ax.set_xlabel("kappa")
        ax.grid(alpha=0.3)
    for ax in axes[1:]:
        ax.set_ylim(0, 1.05)
    fig.suptitle("Effect of the group sampling rate kappa (Fig. 5)", fontsize=9)
    fig.tight_layout()
    _save(fig, out / "kappa.png")
    return df
