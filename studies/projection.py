"""Distortion of the random projection FeSEM's k-means initialisation clusters on at scale
(:class:`mcfl.cluster.init.CountSketch`), measured on real first local models.

For m clients' first local models w_i (one local epoch from the common w0), with u_i = w_i - w0:

* pairwise distortion: r_ij = ||S(u_i - u_j)||^2 / ||u_i - u_j||^2 over all pairs (exact distances
  from a float64 Gram matrix): mean, standard deviation, and the worst |r - 1| (the empirical JL
  epsilon); a dense Gaussian projection has std sqrt(2/k);
* effect on the initialisation: k-means (K clusters, 20 restarts) on the exact and the projected
  features: agreement of the partitions (ARI) and the exact-space inertia of the projected
  solution relative to the exact solution's (1 = as good, < 1 = better). Exact k-means runs on an
  m-dimensional isometric embedding of the models (classical MDS of the exact distances), which
  has the same pairwise distances and hence the same k-means problem.

Models: the LEAF FEMNIST CNN (6.6M parameters) on random FEMNIST-shaped data, and the default
config's digits_cnn on the real digits store (4 rotation clusters).

    python studies/projection.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _common import fake_store, machine  # noqa: E402


def first_updates(fed) -> torch.Tensor:
    """(m, |W|) first local updates w_i - w0, filled in place (no second copy)."""
    from mcfl.cluster.init import first_local_models

    P = fed.model.n_params
    u = torch.empty(fed.n_clients, P)
    for c, res in first_local_models(fed):
        torch.sub(res.weights[:P], fed.w0[:P], out=u[c])
    return u


def sq_dist_matrix(x: torch.Tensor) -> torch.Tensor:
    """Pairwise squared distances of the rows of x, in float64, from blocks of columns."""
    m = len(x)
    gram = torch.zeros(m, m, dtype=torch.float64)
    for a in range(0, x.shape[1], 1 << 18):
        blk = x[:, a:a + (1 << 18)].double()
        gram += blk @ blk.T
    sq = gram.diag()
    return (sq[:, None] + sq[None, :] - 2 * gram).clamp(min=0)


def embed(dist: torch.Tensor) -> np.ndarray:
    """Points in R^m with exactly these pairwise squared distances (classical MDS): k-means on them
    is k-means on the original vectors, without holding an (m, |W|) float64 copy."""
    m = len(dist)
    j = torch.eye(m, dtype=torch.float64) - 1.0 / m
    vals, vecs = torch.linalg.eigh(-0.5 * j @ dist @ j)
    return (vecs * vals.clamp(min=0).sqrt()).numpy()


def kmeans(x: np.ndarray, K: int, seed: int = 0) -> np.ndarray:
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=K, n_init=20, random_state=seed).fit_predict(x.astype(np.float64))


def inertia(dist: torch.Tensor, labels: np.ndarray) -> float:
    """sum_k sum_{i in k} ||u_i - mean_k||^2 = sum_k (1 / 2|k|) sum_{i,j in k} ||u_i - u_j||^2."""
    tot = 0.0
    for k in np.unique(labels):
        idx = torch.from_numpy(np.flatnonzero(labels == k))
        tot += float(dist[idx][:, idx].sum()) / (2 * len(idx))
    return tot


def report(name: str, u: torch.Tensor, K: int, dims) -> None:
    from sklearn.metrics import adjusted_rand_score

    from mcfl.cluster.init import CountSketch

    m, d = u.shape
    dist = sq_dist_matrix(u)
    iu = torch.triu_indices(m, m, 1)
    exact = dist[iu[0], iu[1]]
    labels_exact = kmeans(embed(dist), K)
    best = inertia(dist, labels_exact)
    print(f"\n{name}: m = {m}, d = {d:,}, K = {K}; median pairwise ||u_i - u_j|| = "
          f"{float(exact.median().sqrt()):.3g}")
    print(f"{'k':>6} {'mean r':>7} {'std r':>7} {'sqrt(2/k)':>9} {'max|r-1|':>8} {'ARI':>6} {'inertia':>8}")
    for k in dims:
        f = CountSketch(d, k, seed=1)(u)
        r = (sq_dist_matrix(f)[iu[0], iu[1]] / exact).numpy()
        labels = kmeans(f.numpy(), K)
        print(f"{k:>6} {r.mean():7.3f} {r.std():7.3f} {np.sqrt(2 / k):9.3f} {np.abs(r - 1).max():8.3f} "
              f"{adjusted_rand_score(labels_exact, labels):6.3f} {inertia(dist, labels) / best:8.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--femnist-clients", type=int, default=32)
    ap.add_argument("--dims", type=int, nargs="+", default=[256, 1024, 2048, 4096])
    ap.add_argument("--K", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from mcfl.data import load, prepare
    from mcfl.federation import build_federation

    print(f"# CountSketch distortion on first local models\n# {machine(torch.device('cpu'))}")
    train = {"lr": 0.05, "batch_size": 10, "local_epochs": 1, "rounds": 1}
    with tempfile.TemporaryDirectory() as tmp:
        digits = prepare("digits", Path(tmp) / "digits", clients=100, clusters=4, alpha=0.5,
                         test_fraction=0.2, seed=0)
        fed = build_federation(load(digits), {"name": "digits_cnn"}, train, seed=0)
        report("digits_cnn on digits (default config)", first_updates(fed), args.K, args.dims)
        sizes = np.random.default_rng(0).integers(20, 61, args.femnist_clients)
        store = fake_store(Path(tmp) / "femnist", "femnist_cnn", sizes)
        fed = build_federation(load(store), {"name": "femnist_cnn"}, {**train, "lr": 0.01}, seed=0)
        report("femnist_cnn on FEMNIST-shaped random data", first_updates(fed), args.K, args.dims)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
