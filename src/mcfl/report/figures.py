"""FeSEM's clustering figures (Long et al. 2022, §6.2), from a finished run's own output files.

**Fig. 4, clustering analysis** (:func:`clusters_figure`). The paper plots "each device's local model
as one point in the 2D space after PCA" for 400 random devices, with FeSEM(4). FeSEM keeps centres,
not local models: :mod:`mcfl.snapshot` recomputes the sampled clients' local models from the
run's final state (the next round's, exactly), and this module draws them. Points are coloured by the run's final cluster and, in a second panel, by the true cluster where the
data have one (colours of true clusters matched to FeSEM's clusters by the Hungarian method, so equal
colours mean matched clusters). PCA by default, t-SNE (after PCA to 50 dimensions) as an option, both
scikit-learn; the centres are drawn as crosses in the PCA plot. Very large models are projected from a
seeded random subset of coordinates (squared distances scale by the fraction kept, in expectation).
The 2-D points are written next to the PNG as CSV.

**Fig. 5, case study** (:func:`cases_figure`). The paper shows a few writers of each FeSEM(2) cluster.
Here a few random clients of each final cluster (``assignments.csv``), with a few random training
samples each: images side by side with torchvision's ``make_grid``, one row per client, one panel per
cluster; non-image data (feature vectors) as a heatmap, one block of rows per client.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from mcfl.streams import FIGURE_CLIENTS as SAMPLE_CLIENTS
from mcfl.streams import FIGURE_ROWS as SAMPLE_ROWS
from mcfl.streams import derive_seed
from mcfl.data.store import load
from mcfl.io import atomic_path

if TYPE_CHECKING:
    from mcfl.snapshot import ClusterSnapshot



def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    _plt().close(fig)


# ------------------------------------------------------------------------------------------ Fig. 4
def match_colours(assign: np.ndarray, truth: np.ndarray) -> dict[int, int]:
    """true cluster -> colour index: the FeSEM cluster it overlaps most (Hungarian), else a fresh one."""
    from scipy.optimize import linear_sum_assignment

    ks, ts = np.unique(assign), np.unique(truth)
    overlap = np.array([[np.sum((assign == k) & (truth == t)) for k in ks] for t in ts])
    rows, cols = linear_sum_assignment(-overlap)
    colour = {int(ts[r]): int(ks[c]) for r, c in zip(rows, cols)}
    spare = iter(sorted(set(range(len(ks) + len(ts))) - set(colour.values())))
    return {int(t): colour[int(t)] if int(t) in colour else next(spare) for t in ts}


def project(feats: np.ndarray, extra: np.ndarray | None, method: str, seed: int):
    """2-D coordinates of ``feats`` (and of ``extra`` with the same PCA), axis labels."""
    from sklearn.decomposition import PCA

    n = len(feats)
    if method == "pca":
        pca = PCA(n_components=min(2, n, feats.shape[1]), random_state=seed % 2**31).fit(feats)
        xy = _pad2(pca.transform(feats))
        ex = _pad2(pca.transform(extra)) if extra is not None else None
        v = list(pca.explained_variance_ratio_) + [0.0]
        return xy, ex, (f"PC1 ({100 * v[0]:.0f}% of variance)", f"PC2 ({100 * v[1]:.0f}%)")
    if method == "tsne":
        from sklearn.manifold import TSNE

        if n < 4:
            raise ValueError(f"t-SNE needs at least 4 clients, got {n}")
        z = PCA(n_components=min(50, n, feats.shape[1]), random_state=seed % 2**31).fit_transform(feats)
        xy = TSNE(n_components=2, perplexity=min(30.0, (n - 1) / 3), init="pca",
                  random_state=seed % 2**31).fit_transform(z)
        return xy, None, ("t-SNE 1", "t-SNE 2")
    raise ValueError(f"projection must be 'pca' or 'tsne', got {method!r}")


def _pad2(z: np.ndarray) -> np.ndarray:
    return np.hstack([z, np.zeros((len(z), 2 - z.shape[1]))]) if z.shape[1] < 2 else z


def _spread(feats: np.ndarray, assign: np.ndarray, centres: dict) -> float | None:
    """Median distance of a client's local model to its own centre over the median distance
    between centres (None with fewer than two centres): near 0, the figure's clients sit on their
    centres and the projection shows only the centres' layout."""
    if len(centres) < 2 or not all(int(k) in centres for k in np.unique(assign)):
        return None
    own = np.linalg.norm(feats - np.stack([centres[int(k)] for k in assign]), axis=1)
    c = np.stack([centres[k] for k in sorted(centres)])
    between = np.linalg.norm(c[:, None] - c[None], axis=2)[np.triu_indices(len(c), 1)]
    return float(np.median(own) / np.median(between)) if np.median(between) > 0 else None


def clusters_figure(snap: ClusterSnapshot, out: str | Path, *, projection: str = "pca",
                    seed: int = 0) -> str:
    """FeSEM Fig. 4 of a clustered run's local models (:func:`mcfl.snapshot.cluster_snapshot`);
    writes ``out`` (PNG) and ``out`` with suffix .csv."""
    from sklearn.metrics import adjusted_rand_score

    run, data, assign, clients, feats = snap.run, snap.data, snap.assign, snap.clients, snap.feats
    centres, m = snap.centres, data.n_clients
    ks = sorted(centres)
    spread = _spread(feats, assign[clients], centres)
    xy, cxy, axes = project(feats.astype(np.float64),
                            np.stack([centres[k] for k in ks]).astype(np.float64) if ks else None,
                            projection, seed)
    truth = data.true_clusters
    table = pd.DataFrame({"client": [data.client_ids[c] for c in clients], "x": xy[:, 0], "y": xy[:, 1],
                          "cluster": assign[clients],
                          "true_cluster": truth[clients] if truth is not None else -1})
    with atomic_path(Path(out).with_suffix(".csv")) as tmp:
        table.to_csv(tmp, index=False)

    plt = _plt()
    panels = 2 if truth is not None else 1
    fig, axs = plt.subplots(1, panels, figsize=(4.6 * panels, 4.2), dpi=120, squeeze=False)
    cmap = plt.get_cmap("tab10")
    ax = axs[0, 0]
    if cxy is not None:              # under the clients: on real writers they sit on their centre
        for k, (x, y) in zip(ks, cxy):
            ax.scatter([x], [y], marker="X", s=160, color=cmap(k % 10), edgecolor="k", linewidth=1,
                       alpha=0.5, zorder=1)
    for k in np.unique(assign[clients]):
        on = assign[clients] == k
        ax.scatter(xy[on, 0], xy[on, 1], s=14, color=cmap(int(k) % 10), edgecolor="k", linewidth=0.3,
                   label=f"cluster {k} ({int(on.sum())})", alpha=0.8, zorder=2)
    title = f"coloured by {run['label']} cluster (x: centres)"
    if spread is not None:
        title += f"\nclient-to-own-centre / between-centre distance: {spread:.3g} (median)"
    ax.set_title(title, fontsize=8)
    summary = f"{len(clients)} of {m} clients, {projection}"
    if spread is not None:
        summary += f", client-to-centre / between-centre distance {spread:.3g}"
    if truth is not None:
        ari = adjusted_rand_score(truth, assign)
        colour = match_colours(assign[clients], truth[clients])
        ax = axs[0, 1]
        for t in np.unique(truth[clients]):
            on = truth[clients] == t
            ax.scatter(xy[on, 0], xy[on, 1], s=14, color=cmap(colour[int(t)] % 10),
                       label=f"true {t}", alpha=0.8)
        ax.set_title(f"coloured by true cluster (ARI of all {m} clients: {ari:.2f})", fontsize=9)
        summary += f", ARI {ari:.3f}"
    for ax in axs[0]:
        ax.set_xlabel(axes[0], fontsize=8)
        ax.set_ylabel(axes[1], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, markerscale=0.8, loc="best")
        ax.grid(alpha=0.3)
    fig.suptitle(textwrap.fill(f"{run['dataset']}: local models of {len(clients)} clients from "
                               f"{run['label']}, seed {run['seed']}", 48 * panels), fontsize=10)
    fig.tight_layout()
    _save(fig, out)
    return summary


# ------------------------------------------------------------------------------------------ Fig. 5
def pick_cases(assignments: pd.DataFrame, clients_per_cluster: int, seed: int) -> dict[int, np.ndarray]:
    """cluster -> sorted row indices of up to ``clients_per_cluster`` random clients in it."""
    rng = np.random.default_rng(derive_seed(seed, SAMPLE_CLIENTS))
    cl = assignments["cluster"]
    if cl.isna().all():
        raise ValueError("assignments have no clusters (not a clustered run)")
    out = {}
    for k in sorted(int(k) for k in cl.dropna().unique()):
        members = np.flatnonzero(cl.to_numpy() == k)
        out[k] = np.sort(rng.choice(members, size=min(clients_per_cluster, len(members)), replace=False))
    return out


def cases_figure(store: str | Path, assignments: str | Path, out: str | Path, *,
                 clients_per_cluster: int = 3, samples: int = 8, seed: int = 0, title: str = "") -> str:
    """FeSEM Fig. 5: a few training samples of a few clients of each cluster, side by side."""
    data = load(store)
    a = pd.read_csv(assignments, dtype={"client": str})
    if a["client"].tolist() != list(data.client_ids):
        raise ValueError(f"{assignments}: its clients are not those of {store} (wrong store?)")
    cases = pick_cases(a, clients_per_cluster, seed)
    rng = np.random.default_rng(derive_seed(seed, SAMPLE_ROWS))
    image = len(data.x_shape) == 3
    plt = _plt()
    K = len(cases)
    cell = 0.42 if image else 0.0
    fig, axs = plt.subplots(1, K, dpi=120, squeeze=False,
                            figsize=(max(3.2, samples * cell + 1.4) * K if image else 4.2 * K,
                                     1.0 + clients_per_cluster * (0.5 if image else 0.9)))
    for ax, (k, rows) in zip(axs[0], cases.items()):
        blocks, names = [], []
        for i in rows:
            x, _ = data.train(int(i))
            pick = np.sort(rng.choice(len(x), size=min(samples, len(x)), replace=False))
            blocks.append(x[pick])
            t = a["true_cluster"].iloc[i]
            names.append(f"{a['client'].iloc[i]}" + ("" if pd.isna(t) or t < 0 else f" (true {int(t)})"))
        ax.set_yticks(_image_panel(ax, blocks, samples) if image else _vector_panel(ax, blocks))
        ax.set_yticklabels(names, fontsize=7)
        ax.set_xticks([])
        ax.set_title(f"cluster {k}: {int((a['cluster'] == k).sum())} clients", fontsize=9)
    fig.suptitle(title or "samples of clients in each cluster", fontsize=10)
    fig.tight_layout()
    _save(fig, out)
    return "; ".join(f"cluster {k}: " + ", ".join(a["client"].iloc[r]) for k, r in cases.items())


def _image_panel(ax, blocks: list[np.ndarray], samples: int, pad: int = 2) -> list[float]:
    """One row of images per client; returns the rows' vertical centres (pixels)."""
    from torchvision.utils import make_grid

    c, h, w = blocks[0].shape[1:]
    tiles = []
    for b in blocks:                                   # one row per client, blank tiles pad short rows
        blank = np.ones((samples - len(b), c, h, w), dtype=np.float32)
        tiles.append(np.concatenate([np.clip(b, 0, 1), blank]))
    grid = make_grid(torch.from_numpy(np.concatenate(tiles)), nrow=samples, padding=pad, pad_value=1.0)
    ax.imshow(grid.permute(1, 2, 0).numpy(), interpolation="nearest")
    return [pad + i * (h + pad) + h / 2 for i in range(len(blocks))]


def _vector_panel(ax, blocks: list[np.ndarray]) -> list[float]:
    """A heatmap, one block of rows (samples) per client; returns the blocks' vertical centres."""
    x = np.concatenate(blocks)
    lim = float(np.quantile(np.abs(x), 0.99)) or 1.0
    ax.imshow(x, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    for edge in np.cumsum([len(b) for b in blocks])[:-1]:
        ax.axhline(edge - 0.5, color="k", linewidth=1)
    ax.set_xlabel("feature", fontsize=8)
    sizes = np.array([len(b) for b in blocks])
    return list(np.cumsum(sizes) - sizes / 2 - 0.5)
