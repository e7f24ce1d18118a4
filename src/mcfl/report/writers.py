"""What do clusters of writers group by? Simple per-writer image statistics against a run's clusters.

Per writer (client), over its training images (ink = distance of a pixel from the image's
background value, the median pixel, scaled to [0, 1]; a pixel is *inked* when ink > 0.5):

* ``ink_darkness``: mean ink of the inked pixels (how dark the pen is);
* ``ink_fraction``: the share of inked pixels per image (stroke width and character size);
* ``slant``: the ink's shear, second central moments mu11 / mu02 per image (x against y; positive
  leans right with y growing downwards as rows do);
* ``digits``, ``upper``, ``lower``: the share of the writer's labels that are digits (0-9), upper-case
  (10-35) and lower-case letters (36-61) for FEMNIST's 62 classes; ``label_entropy`` in nats;
* ``n_train``: training images.

For each clustered run (``assignments.csv``: client, cluster) and statistic: ``eta2``, the share of
the statistic's variance between clusters (0 = the clusters do not differ in it; 1 = it is constant
within each cluster), and ``kruskal_p``, the Kruskal-Wallis test's p-value of "same distribution in
every cluster" (scipy). The markdown gives, per run label, the mean eta2 over seeds and the median p,
and the per-cluster means of each statistic for the first seed.

Runs whose ``assignments.csv`` also gives each client's mix of discovered domains (FedCG:
``domain_share_<k>``, the share of the writer's training images the student puts in domain k) are
related to the statistics by Spearman's rank correlation between each statistic and each domain's
share (``rho``, ``p``; scipy), over the writers: a majority domain (``cluster``) can hide that every
writer spreads over the same few domains, while the shares still follow style. With
``shares=True`` these rows go to ``<out>-shares.csv`` (label, seed, domain, stat, rho, p).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from mcfl.data.store import load
from mcfl.inputs import check_regular
from mcfl.io import atomic_path, read_run, staged, write_text
from mcfl.report.format import markdown_table

STATS = ["ink_darkness", "ink_fraction", "slant", "digits", "upper", "lower", "label_entropy", "n_train"]


def image_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """Per image: ink darkness, inked fraction and slant; ``x`` is (n, 28, 28) or (n, 784), any scale."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    side = int(round(np.sqrt(x.shape[1])))
    bg = np.median(x, axis=1, keepdims=True)
    ink = np.abs(x - bg)
    ink /= np.maximum(ink.max(axis=1, keepdims=True), 1e-12)
    inked = ink > 0.5
    darkness = np.where(inked.any(1), (ink * inked).sum(1) / np.maximum(inked.sum(1), 1), 0.0)
    w = ink.reshape(len(x), side, side)
    rows, cols = np.mgrid[0:side, 0:side]
    mass = np.maximum(w.sum((1, 2)), 1e-12)
    cy = (w * rows).sum((1, 2)) / mass
    cx = (w * cols).sum((1, 2)) / mass
    dy, dx = rows[None] - cy[:, None, None], cols[None] - cx[:, None, None]
    mu11 = (w * dx * dy).sum((1, 2)) / mass
    mu02 = (w * dy * dy).sum((1, 2)) / mass
    return {"ink_darkness": darkness, "ink_fraction": inked.mean(1), "slant": mu11 / np.maximum(mu02, 1e-12)}


def writer_stats(store) -> pd.DataFrame:
    """One row per client of a loaded store (:func:`mcfl.data.store.load`) with :data:`STATS`."""
    rows = []
    for i, cid in enumerate(store.client_ids):
        x, y = store.train(i)
        s = image_stats(x)
        y = np.asarray(y)
        p = np.bincount(y, minlength=store.n_classes) / max(len(y), 1)
        nz = p[p > 0]
        rows.append({"client": str(cid), **{k: float(v.mean()) for k, v in s.items()},
                     "digits": float((y < 10).mean()), "upper": float(((y >= 10) & (y < 36)).mean()),
                     "lower": float((y >= 36).mean()), "label_entropy": float(-(nz * np.log(nz)).sum()),
                     "n_train": len(y)})
    return pd.DataFrame(rows)


def association(stats: pd.DataFrame, clusters: pd.Series) -> pd.DataFrame:
    """eta2 and the Kruskal-Wallis p of each statistic across ``clusters`` (indexed like ``stats``)."""
    from scipy.stats import kruskal

    out = []
    for k in STATS:
        v = stats[k].to_numpy(dtype=float)
        groups = [v[(clusters == c).to_numpy()] for c in sorted(clusters.unique())]
        total = ((v - v.mean()) ** 2).sum()
        between = sum(len(g) * (g.mean() - v.mean()) ** 2 for g in groups if len(g))
        ok = [g for g in groups if len(g)]
        p = float(kruskal(*ok).pvalue) if len(ok) > 1 and np.ptp(v) > 0 else np.nan
        out.append({"stat": k, "eta2": between / total if total > 0 else np.nan, "kruskal_p": p})
    return pd.DataFrame(out)


SHARE = "domain_share_"


def share_association(stats: pd.DataFrame, shares: pd.DataFrame) -> pd.DataFrame:
    """Spearman's rho and p between each statistic and each ``domain_share_<k>`` column of
    ``shares`` (rows aligned with ``stats``); nan where either side is constant."""
    from scipy.stats import spearmanr

    out = []
    for col in [c for c in shares.columns if c.startswith(SHARE)]:
        d = shares[col].to_numpy(dtype=float)
        for k in STATS:
            v = stats[k].to_numpy(dtype=float)
            rho, p = spearmanr(v, d) if np.ptp(v) > 0 and np.ptp(d) > 0 else (np.nan, np.nan)
            out.append({"domain": int(col[len(SHARE):]), "stat": k, "rho": float(rho), "p": float(p)})
    return pd.DataFrame(out, columns=["domain", "stat", "rho", "p"])


def check_images(store) -> None:
    """The statistics are of handwriting: samples must be one-channel square images (FEMNIST's
    28 x 28, flat or not); else a one-line ValueError naming the store."""
    shape = tuple(store.x_shape)
    size = math.prod(shape)
    side = math.isqrt(size)
    if side < 2 or side * side != size or (len(shape) == 3 and shape[0] != 1):
        raise ValueError(f"{store.path}: samples of shape {list(shape)} are not one-channel square "
                         f"images; report-writers measures handwriting (stores like FEMNIST's)")


def read_assignments(path: Path, clients: pd.Series) -> pd.DataFrame:
    """A run's ``assignments.csv`` checked against the store's ``clients``: every client named
    once and one of the store's (a stray one would be dropped from every statistic without a
    word), every cluster blank (an unclustered method) or an integer from 0 to the number of
    clients - 1. Errors are one-line ValueErrors naming the file."""
    check_regular(path, "run's assignments.csv")
    try:
        a = pd.read_csv(path, dtype={"client": str})
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise ValueError(f"{path}: not a readable assignments CSV ({' '.join(str(e).split())[:120]})") from None
    missing = [c for c in ("client", "cluster") if c not in a.columns]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (expected client, cluster as `mcfl train` writes)")
    known = set(clients)
    stray = [c for c in a["client"] if c not in known]
    if stray:
        raise ValueError(f"{path}: client {stray[0]!r} is not a client of the store "
                         f"({len(known)} clients); is it the store the run trained on?")
    twice = a["client"][a["client"].duplicated()]
    if len(twice):
        raise ValueError(f"{path}: client {twice.iloc[0]!r} is named twice")
    c = pd.to_numeric(a["cluster"], errors="coerce")
    bad = (a["cluster"].notna() & (c.isna() | (c != c.round()) | (c < 0) | (c >= len(known))))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"{path}: client {a['client'].iloc[i]!r} has cluster {a['cluster'].iloc[i]}; "
                         f"a cluster is an integer from 0 to {len(known) - 1} (the store has "
                         f"{len(known)} clients)")
    return a


def write(store_path: str | Path, run_dirs: list[str | Path], out: str | Path, *,
          shares: bool = False) -> pd.DataFrame:
    """``<out>.csv`` (label, seed, stat, eta2, kruskal_p, clusters) and ``<out>.md`` from clustered runs;
    with ``shares``, ``<out>-shares.csv`` too (module docstring)."""
    store = load(store_path)
    check_images(store)
    stats = writer_stats(store)
    rows, means, share_rows, mix = [], {}, [], {}
    for d in run_dirs:
        m = read_run(d)
        a = read_assignments(Path(d) / "assignments.csv", stats["client"])
        if a["cluster"].isna().all():
            continue
        cols = [c for c in a.columns if c.startswith(SHARE)]
        if cols:
            both = stats.merge(a[["client", *cols]], on="client", how="inner")
            share_rows += [{"label": m["label"], "seed": m["seed"], **r}
                           for r in share_association(both, both[cols]).to_dict("records")]
            mix.setdefault(m["label"], []).append(both[cols].to_numpy(dtype=float))
        merged = stats.merge(a[["client", "cluster"]], on="client", how="inner")
        assoc = association(merged, merged["cluster"])
        n = merged["cluster"].nunique()
        rows += [{"label": m["label"], "seed": m["seed"], **r, "clusters": n} for r in assoc.to_dict("records")]
        if m["label"] not in means or m["seed"] < means[m["label"]][0]:
            per = merged.groupby("cluster")[STATS].mean()
            per.insert(0, "writers", merged.groupby("cluster").size())
            means[m["label"]] = (m["seed"], per)
    t = pd.DataFrame(rows, columns=["label", "seed", "stat", "eta2", "kruskal_p", "clusters"])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sh = pd.DataFrame(share_rows, columns=["label", "seed", "domain", "stat", "rho", "p"])
    with staged(out.parent) as stage:          # every file or none (mcfl.io.staged)
        with atomic_path(stage / out.with_suffix(".csv").name) as tmp:
            t.round(6).to_csv(tmp, index=False)
        if shares:
            with atomic_path(stage / f"{out.name}-shares.csv") as tmp:
                sh.round(6).to_csv(tmp, index=False)
        write_text(stage / out.with_suffix(".md").name, to_markdown(t, means) + shares_markdown(sh, mix))
    return t


def shares_markdown(sh: pd.DataFrame, mix: dict[str, list[np.ndarray]]) -> str:
    """Per run label: how writers spread over the domains, and each statistic's strongest
    rank correlation with a domain's share (mean rho over seeds, median p)."""
    if sh.empty:
        return ""
    lines = ["", "", "## Domain shares against the writer statistics", "",
             "Each writer's share of training images in each discovered domain (FedCG's student), "
             "against each statistic: Spearman's rho over the writers, mean over seeds (p: median). "
             "Per statistic the domain with the largest |rho|.", ""]
    labels = list(dict.fromkeys(sh["label"]))
    g = sh.groupby(["label", "stat", "domain"]).agg(rho=("rho", "mean"), p=("p", "median"), seeds=("seed", "nunique"))
    cells = []
    for s in STATS:
        row = [s]
        for lab in labels:
            part = g.loc[(lab, s)] if (lab, s) in g.index.droplevel(2) else None
            if part is None or part["rho"].isna().all():
                row.append("n/a (share or statistic constant)")
                continue
            k = part["rho"].abs().idxmax()
            row.append(f"{part.loc[k, 'rho']:+.2f} (domain {k}, p {part.loc[k, 'p']:.2g})")
        cells.append(row)
    seeds = {lab: int(g.loc[lab]["seeds"].max()) for lab in labels}
    lines.append(markdown_table(["statistic"] + [f"{lab} (seeds {seeds[lab]})" for lab in labels], cells))
    lines += ["", "How the writers spread over the domains (all seeds pooled): mean share, and the "
              "writers with at least half of their images in the domain. *Collapsed*: the seeds in "
              "which the student put every training image of every writer into one domain (then "
              "the shares are constant and have no correlation to show).", ""]
    spread = []
    for lab in labels:
        x = np.concatenate(mix[lab])
        spread.append([lab, f"{sum(map(collapsed, mix[lab]))} of {len(mix[lab])}"]
                      + [f"{x[:, k].mean():.2f} / {(x[:, k] >= 0.5).mean():.0%}" for k in range(x.shape[1])])
    width = max(len(r) for r in spread) - 2
    lines.append(markdown_table(["run", "collapsed"] + [f"domain {k}" for k in range(width)],
                                [r + [""] * (width + 2 - len(r)) for r in spread]))
    return "\n".join(lines) + "\n"


def collapsed(shares: np.ndarray) -> bool:
    """True when one domain holds every image of every writer (shares: writers x domains)."""
    return bool(np.isclose(shares, 1.0).all(axis=0).any())


def to_markdown(t: pd.DataFrame, means: dict) -> str:
    lines = ["# What the clusters of writers group by", "",
             "Per-writer image statistics (mcfl.report.writers) against each clustered run's final "
             "clusters: eta² = share of the statistic's variance between clusters (mean over seeds), "
             "p = Kruskal-Wallis (median over seeds).", ""]
    if t.empty:
        return "\n".join(lines + ["No clustered run.", ""])
    labels = list(dict.fromkeys(t["label"]))
    g = t.groupby(["stat", "label"])
    def cell(s, lab):
        x = g.get_group((s, lab))
        if (x["clusters"] == 1).all():
            return "n/a (one cluster)"
        return f"{x['eta2'].mean():.2f} (p {x['kruskal_p'].median():.2g})"
    lines.append(markdown_table(["statistic"] + [f"{lab} (seeds {g.get_group((STATS[0], lab))['seed'].nunique()})" for lab in labels],
                                [[s] + [cell(s, lab) for lab in labels] for s in STATS]))
    for lab, (seed, per) in means.items():
        lines += [f"## {lab}, seed {seed}: mean of each statistic per cluster", "",
                  markdown_table(["cluster", *per.columns],
                                 [[c, *(f"{v:.3g}" for v in r)] for c, r in per.iterrows()])]
    return "\n".join(lines)
