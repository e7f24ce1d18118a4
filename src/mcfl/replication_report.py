"""Does a paired comparison replicate on other draws of the clients? ``replication.md``/``.csv``/``.png``.

For each method against the reference method, each draw (:mod:`mcfl.replication`) and each
protocol the config scores:

* the paired difference in micro accuracy, points, mean ± std over seeds (this seed's run minus the
  reference's run of the same seed on the same draw);
* under the standard protocol, the test images only this method / only the reference classifies
  correctly (summed over seeds) and their exact two-sided sign test (:func:`mcfl.metrics.sign_test_p`,
  McNemar's test in its exact form); under a named protocol (``v1`` ...), which scores a sample of
  clients that differs from run to run, the same sign test over the seeds' differences;
* per row (method, protocol), Stouffer's combined test over the draws (Stouffer et al., *The
  American Soldier*, 1949; :func:`scipy.stats.combine_pvalues`): each draw's one-sided p in the
  direction of the original draw's difference, z_i = Φ⁻¹(1 - p_i), Z = Σ z_i / √k, p = 1 - Φ(Z), so
  draws that disagree cancel;
* one verdict (:func:`verdict`): **replicates** when every draw's difference has the same sign with
  p < 0.05, **contradicted** when two draws have opposite signs each with p < 0.05, else
  **inconclusive**.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mcfl.data.store import verify_store
from mcfl.io import atomic_path, staged, write_json, write_text
from mcfl.metrics import sign_test_p
from mcfl.report.format import markdown_table, mean_std
from mcfl.report.protocols import METRIC, load, paired

ALPHA = 0.05
STANDARD = "standard"
RULE = (f"*Verdict*: **replicates** when the difference has the same sign with p < {ALPHA} on every draw; "
        f"**contradicted** when two draws have differences of opposite signs, each with p < {ALPHA}; "
        "**inconclusive** otherwise. *p*: the exact two-sided sign test, over the test images only one of "
        "the two classifies correctly (standard protocol, summed over seeds) or over the seeds' "
        "differences (a named protocol, which scores clients that differ from run to run). "
        "*Combined p*: Stouffer's method over the draws on the one-sided p's in the direction of the "
        "first draw's difference (Z = Σ Φ⁻¹(1 - p_i) / √k).")


def verdict(diffs: list[float], ps: list[float], alpha: float = ALPHA) -> str:
    """The verdict of one row from its draws' mean differences and two-sided p's (see :data:`RULE`)."""
    signs = [np.sign(d) for d, p in zip(diffs, ps) if not pd.isna(d) and not pd.isna(p) and p < alpha and d != 0]
    if len(signs) == len(diffs) and len(set(signs)) == 1:
        return "replicates"
    if len(set(signs)) == 2:
        return "contradicted"
    return "inconclusive"


def one_sided_p(wins: int, losses: int, direction: float) -> float:
    """The exact one-sided sign test of ``wins`` against ``losses`` in ``direction`` (> 0: this
    method wins more often; otherwise fewer); 1.0 when there are none."""
    from scipy.stats import binomtest

    n = int(wins) + int(losses)
    return float(binomtest(int(wins), n, 0.5, alternative="greater" if direction > 0 else "less").pvalue) if n else 1.0


def stouffer(one_sided: list[float]) -> float:
    """Stouffer's combined p of one-sided p's (each kept inside (0, 1), where Φ⁻¹ is finite)."""
    from scipy.stats import combine_pvalues

    p = np.clip(np.asarray(one_sided, dtype=float), 1e-300, 1 - 1e-12)
    return float(combine_pvalues(p, method="stouffer").pvalue)


def compare(mine: list[dict], ref: list[dict], protocol: str) -> dict:
    """One method's runs on one draw against the reference's runs there, under ``protocol``:
    seeds, ``diff_mean``/``diff_std`` (points), ``wins``/``losses`` (test images only this / only the
    reference gets right under the standard protocol; seeds it is ahead / behind otherwise) and
    the two-sided sign test ``p``."""
    by_seed = {m["seed"]: m for m in ref}
    key = METRIC if protocol == STANDARD else f"{protocol}/{METRIC}"
    out = paired(mine, by_seed, key=key)
    row = {"seeds": out["paired_seeds"], "diff_mean": out.get("diff_vs_ref_mean", np.nan),
           "diff_std": out.get("diff_vs_ref_std", np.nan)}
    if protocol == STANDARD:
        row["wins"], row["losses"] = out.get("only_this", np.nan), out.get("only_ref", np.nan)
    else:
        d = [m["final"][key] - by_seed[m["seed"]]["final"][key] for m in mine if m["seed"] in by_seed
             and m["final"].get(key) is not None and by_seed[m["seed"]]["final"].get(key) is not None]
        row["wins"], row["losses"] = sum(x > 0 for x in d), sum(x < 0 for x in d)
    row["p"] = np.nan if pd.isna(row["wins"]) else sign_test_p(row["wins"], row["losses"])
    return row


def table(runs: list[dict], reference: str, protocols: list[str], draws: list[str]) -> pd.DataFrame:
    """One row per (method, protocol, draw) with :func:`compare`'s numbers, each row's group's
    one-sided p's, Stouffer's ``combined_p`` and ``verdict``. ``draws``: the original first, the
    draw of every run that names none (the original dataset's runs are the config's runs without
    the section, so their ``metrics.json`` has no ``draw``)."""
    runs = [{**m, "draw": m.get("draw") or draws[0]} for m in runs]
    missing = [d for d in draws if not any(m["draw"] == d and m["label"] == reference for m in runs)]
    if missing:
        raise ValueError(f"replication: no {reference} run on draw {missing[0]!r} among the runs given")
    rows = []
    for label in dict.fromkeys(m["label"] for m in runs if m["label"] != reference):
        for protocol in protocols:
            group = []
            for draw in draws:
                mine = [m for m in runs if m["label"] == label and m["draw"] == draw]
                ref = [m for m in runs if m["label"] == reference and m["draw"] == draw]
                dataset = mine[0]["dataset"] if mine else ""
                group.append({"method": label, "protocol": protocol, "draw": draw, "dataset": dataset,
                              **compare(mine, ref, protocol)})
            direction = next((np.sign(r["diff_mean"]) for r in group if not pd.isna(r["diff_mean"])), 1.0)
            for r in group:
                r["p_one_sided"] = np.nan if pd.isna(r["wins"]) else one_sided_p(r["wins"], r["losses"], direction)
            ones = [r["p_one_sided"] for r in group if not pd.isna(r["p_one_sided"])]
            combined = stouffer(ones) if len(ones) == len(group) else np.nan
            word = verdict([r["diff_mean"] for r in group], [r["p"] for r in group])
            rows += [{**r, "combined_p": combined, "verdict": word} for r in group]
    return pd.DataFrame(rows)


def _p(p: float) -> str:
    return "" if pd.isna(p) else (f"{p:.2g}" if p >= 1e-3 else "<0.001")


def _cell(r: pd.Series) -> str:
    if not r["seeds"]:
        return "not run"
    counts = "" if pd.isna(r["wins"]) else f"; {int(r['wins'])} / {int(r['losses'])}"
    return f"{mean_std(r['diff_mean'], r['diff_std'], sign=True)}{counts}; p {_p(r['p'])}"


def to_markdown(t: pd.DataFrame, reference: str, draws: list[str], title: str) -> str:
    """The page: one row per (method, protocol), one column per draw, the combined p and the
    verdict, the rule under the table."""
    rows = []
    for (label, protocol), g in t.groupby(["method", "protocol"], sort=False):
        cells = {r["draw"]: _cell(r) for _, r in g.iterrows()}
        rows.append([label, protocol, *(cells[d] for d in draws), _p(g["combined_p"].iloc[0]),
                     f"**{g['verdict'].iloc[0]}**"])
    datasets = t.drop_duplicates("draw").set_index("draw")["dataset"].to_dict() if len(t) else {}
    names = ", ".join(f"`{d}` (dataset {datasets.get(d) or '?'})" for d in draws)
    return "\n".join([
        f"# {title}", "",
        f"Each method against {reference}, paired seed by seed on each draw of the clients ({names}): "
        f"Δ micro accuracy in points, mean ± std over seeds; under the standard protocol the test images "
        f"only this method / only {reference} classifies correctly (summed over seeds), under a named "
        f"protocol the seeds it is ahead / behind; then the sign test's p.", "",
        markdown_table(["method", "protocol", *(f"draw `{d}`" for d in draws), "combined p (Stouffer)", "verdict"],
                       rows),
        "", RULE, ""])


def figure(t: pd.DataFrame, draws: list[str], path: Path) -> None:
    """Each row's paired difference (mean ± std over seeds) per draw, a filled marker where p < 0.05."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(t.groupby(["method", "protocol"], sort=False)) if len(t) else []
    fig, ax = plt.subplots(figsize=(6.0, 1.0 + 0.45 * max(len(groups), 1)), dpi=120)
    for j, draw in enumerate(draws):
        for i, ((label, protocol), g) in enumerate(groups):
            r = g[g["draw"] == draw].iloc[0]
            y = i + (j - (len(draws) - 1) / 2) * 0.2
            sig = not pd.isna(r["p"]) and r["p"] < ALPHA
            ax.errorbar(r["diff_mean"], y, xerr=0 if pd.isna(r["diff_std"]) else r["diff_std"], fmt="o",
                        color=f"C{j}", mfc=f"C{j}" if sig else "white", label=draw if i == 0 else None)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(groups)), [f"{lab} ({p})" for (lab, p), _ in groups])
    ax.invert_yaxis()
    ax.set_xlabel("Δ micro accuracy vs reference (points); filled: p < 0.05")
    ax.legend(title="draw", fontsize="small", loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(run_dirs: list[str | Path], out: str | Path, *, reference: str, protocols: list[str],
          draws: list[str], title: str | None = None) -> pd.DataFrame:
    """Write ``<out>.csv``, ``<out>.md`` and ``<out>.png`` from the draws' runs (all three or none)."""
    runs = load(run_dirs)
    t = table(runs, reference, protocols, draws)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with staged(out.parent) as stage:
        with atomic_path(stage / out.with_suffix(".csv").name) as tmp:
            t.round(6).to_csv(tmp, index=False)
        write_text(stage / out.with_suffix(".md").name,
                   to_markdown(t, reference, draws, title or "Does it replicate on other draws of the clients?"))
        figure(t, draws, stage / out.with_suffix(".png").name)
    return t


def check_draws(stores: dict[str, str], sampled: int, out: str | Path) -> dict[str, int]:
    """Before any training: every draw's store (``stores``: draw -> store) passes full verification
    (:func:`mcfl.data.store.verify_store`: metadata and every file's hash) and has at least the
    ``sampled`` clients a round of its runs samples (0: all of them); ``out`` records each draw's
    clients. A draw that fails is one ValueError naming it, and ``out`` is not written."""
    clients = {}
    for draw, store in stores.items():
        try:
            meta = verify_store(store, full=True)
        except ValueError as e:
            raise ValueError(f"replication: draw {draw!r}: {e}") from None
        clients[draw] = len(meta["client_ids"])
        if clients[draw] < sampled:
            raise ValueError(f"replication: draw {draw!r}: {store} has {clients[draw]} clients, fewer than the "
                             f"{sampled} its runs sample each round (train.clients_per_round)")
    write_json(Path(out), {"clients": clients, "sampled": sampled})
    return clients
