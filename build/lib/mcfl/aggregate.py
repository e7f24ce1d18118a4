"""Server-side arithmetic shared by the algorithms: pure functions over flat weight vectors."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch


class WeightedSum:
    """Running sums for K aggregates: ``add(k, w, weight)``, then ``mean(k)``. Memory O(K·|W|)."""

    def __init__(self, k: int, size: int, device: torch.device):
        self.sum = torch.zeros(k, size, device=device)
        self.weight = torch.zeros(k, dtype=torch.float64)

    def add(self, k: int, w: torch.Tensor, weight: float = 1.0) -> None:
        self.sum[k].add_(w, alpha=float(weight))
        self.weight[k] += float(weight)

    def has(self, k: int) -> bool:
        return bool(self.weight[k] > 0)

    def mean(self, k: int) -> torch.Tensor:
        return self.sum[k] / float(self.weight[k])


def weighted_mean(models: Iterable[tuple[torch.Tensor, float]]) -> torch.Tensor:
    """sum_i a_i w_i / sum_i a_i (FedAvg's aggregation, Eq. 2 of FeSEM)."""
    acc = None
    for w, a in models:
        if acc is None:
            acc = WeightedSum(1, w.numel(), w.device)
        acc.add(0, w, a)
    if acc is None:
        raise ValueError("weighted_mean of no models")
    return acc.mean(0)


def sq_distances(w: torch.Tensor, centres: torch.Tensor, sel: slice, block: int = 1 << 20) -> torch.Tensor:
    """||w[sel] - c_k[sel]||^2 for every centre k (FeSEM's Dist, Eq. 8): a (K,) tensor for one
    model ``w`` (d,), an (n, K) one for the rows of ``w`` (n, d). Computed over blocks of about
    ``block`` entries (float64 across blocks), so the temporaries stay ~4 MB instead of
    n x K x |W| arrays (2 x 106 MB per client for K = 4 and the FEMNIST CNN)."""
    c, v = centres[:, sel], w[..., sel]
    rows = v[None] if v.dim() == 1 else v
    step = max(1, block // (len(c) * len(rows)))
    out = torch.zeros(len(rows), len(c), dtype=torch.float64, device=w.device)
    for a in range(0, rows.shape[1], step):
        out += (c[None, :, a:a + step] - rows[:, None, a:a + step]).square_().sum(2)
    out = out.to(w.dtype)
    return out[0] if v.dim() == 1 else out


# ------------------------------------------------------------------ robust and clustered aggregation
def trimmed_mean(x: torch.Tensor, beta: float, block: int = 1 << 15,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
    """Coordinate-wise beta-trimmed mean of the rows of ``x`` (n, d) (Yin et al. 2018; Ghosh et al.
    2019), or of its rows ``rows`` (indices or a boolean mask; no copy of them is made): per
    coordinate, drop the floor(beta·n) smallest and the floor(beta·n) largest values and average the
    rest. ``beta = 0`` is the mean; ``beta = 0.5`` (or any beta that would drop every value) is the
    coordinate-wise median (the mean of the two middle values when n is even). Equals
    ``scipy.stats.trim_mean(x, beta, axis=0)`` for beta < 0.5.

    Computed over column blocks of ``block`` entries (the temporaries stay in cache). For n <= 32
    rows (a round's clients) the sort is an odd-even transposition network of elementwise min/max
    (exact, the same values as ``torch.sort``): about 8x faster than sorting 6.6M columns of 10
    values each."""
    if not 0.0 <= beta <= 0.5:
        raise ValueError(f"trim fraction must be in [0, 0.5], got {beta}")
    if rows is not None and rows.dtype == torch.bool:
        rows = rows.nonzero().flatten()
    n = x.shape[0] if rows is None else len(rows)
    if n == 0:
        raise ValueError("trimmed_mean of no rows")
    g = int(beta * n)
    if 2 * g >= n:                       # the median
        g = (n - 1) // 2
    out = torch.empty(x.shape[1:], dtype=x.dtype, device=x.device)
    for a in range(0, x.shape[1], block):
        b = x[:, a:a + block] if rows is None else x[rows, a:a + block]
        if g == 0:
            torch.mean(b, 0, out=out[a:a + block])
        elif n > 32:
            torch.mean(torch.sort(b, dim=0).values[g:n - g], 0, out=out[a:a + block])
        else:
            r = list(b)
            for p in range(n):
                for i in range(p % 2, n - 1, 2):
                    r[i], r[i + 1] = torch.minimum(r[i], r[i + 1]), torch.maximum(r[i], r[i + 1])
            torch.mean(torch.stack(r[g:n - g]), 0, out=out[a:a + block])
    return out


def trimmed_kmeans(x: torch.Tensor, centres: torch.Tensor, beta: float, iters: int = 1,
                   sel: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Trimmed K-means (TKM, Ghosh et al. 2019, "Robust Federated Learning in a Heterogeneous
    Environment", arXiv:1906.06629): Lloyd's algorithm whose centre step is the coordinate-wise
    beta-trimmed mean of the members instead of their mean. Starts from ``centres`` (K, d), runs
    ``iters`` assign/estimate passes (fewer if the assignment stops changing). Distances are squared
    L2 over the coordinates ``sel`` (default all). A centre without members keeps its value.
    Returns (labels (n,), centres (K, d))."""
    sel = sel or slice(None)
    centres = centres.clone()
    labels = None
    for _ in range(max(1, iters)):
        new = sq_distances(x, centres, sel).argmin(1)
        if labels is not None and torch.equal(new, labels):
            break
        labels = new
        for k in range(centres.shape[0]):
            members = labels == k
            if members.any():
                centres[k] = trimmed_mean(x, beta, rows=members)
    return labels, centres


def cosine_similarities(x: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine similarity of the rows of ``x`` (n, d): alpha_ij = <x_i, x_j>/(|x_i||x_j|)
    (Sattler et al. 2019, the similarity CFL splits by); a zero row has similarity 0 to the others (1 to itself)."""
    norms = x.norm(dim=1, keepdim=True)
    u = x / norms.clamp_min(1e-12)
    s = u @ u.T
    s.fill_diagonal_(1.0)
    return s.clamp(-1.0, 1.0)


def bipartition(similarity: np.ndarray, linkage: str = "single") -> np.ndarray:
    """Split n >= 2 items in two by their pairwise similarities; returns 0/1 labels.

    ``single`` linkage on the distance 1 - alpha merges the most similar pairs first until two groups
    remain: Sattler et al.'s Algorithm 2 ("optimal bipartition"), which minimises the largest
    cross-group similarity max_{i in c1, j in c2} alpha_ij. ``complete`` is what their public code
    (and FL-bench) runs instead. Uses scikit-learn's AgglomerativeClustering(metric="precomputed").
    """
    from sklearn.cluster import AgglomerativeClustering

    s = np.asarray(similarity, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != s.shape[1] or s.shape[0] < 2:
        raise ValueError(f"bipartition needs a square similarity matrix of >= 2 items, got {s.shape}")
    d = np.clip(1.0 - s, 0.0, None)
    np.fill_diagonal(d, 0.0)
    d = (d + d.T) / 2
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage=linkage).fit_predict(d)
    return labels.astype(np.int64)
