"""Inter-Cluster Grouping (ICG) of FedGSP (Zeng et al., "Heterogeneous Federated Learning via Grouped
Sequential-to-Parallel Training", DASFAA 2022, arXiv:2201.05762; §3.3, Algorithm 2, Eqs. 10-13).

Goal (Eqs. 4-9): split K clients into M equal-size groups whose summed class-count vectors are as
alike as possible (NP-hard). ICG's shortcut (Proposition 2): cluster the clients' class-count vectors
V^k into L clusters of equal size, then build every group from one member of each cluster; each
group's centroid is then an unbiased estimate of the global centroid.

1. Equal-size constrained k-means (Eqs. 10-13; Bradley, Bennett & Demiriz 2000):
   * assignment step: minimise sum_k 1/2 ||V^k - C_l(k)||^2 subject to every cluster holding
     floor(K/L) or ceil(K/L) clients (exactly K/L when L divides K, Eq. 11), solved *exactly* as a
     min-cost flow with OR-Tools' ``SimpleMinCostFlow``: client nodes (supply 1) -> cluster nodes
     (demand floor(K/L)) -> one overflow node (demand K mod L, at most one extra per cluster). OR-Tools
     needs integer unit costs, so the costs are scaled to at most ``COST_SCALE`` and rounded.
   * update step: C_l <- mean of its members (Algorithm 2, line 6);
   * alternate until the assignment (hence the centroids) stops changing, or ``max_iter`` rounds
     (the paper's tau). Initial centroids: k-means++ seeding (scikit-learn's ``kmeans_plusplus``).
2. Group assignment (Algorithm 2, line 8): every cluster, in random order, deals its shuffled
   members to distinct groups, the currently smallest groups first (random ties). So every client is
   in exactly one group and group sizes differ by at most one.

How many clusters and groups. The paper sets L = floor(K / f(r)) and samples L·floor(K/L) clients
(Algorithm 2, line 3) so that L divides the sample; groups then have L members and there are
floor(K/L) of them, which is f(r) when f(r) divides K but more otherwise (K=368, f=130: L=2, 184
groups). ``rounding="paper"`` (default) keeps those counts but does not drop the K mod L leftover
clients: they join the clustering (clusters of floor(K/L) or ceil(K/L)) and add one member to some
groups. ``rounding="exact"`` makes exactly M = min(f(r), K) groups instead, from ceil(K/M) clusters.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

#: Largest integer unit cost handed to OR-Tools (costs are rounded after scaling to this).
COST_SCALE = 10_000_000


def layout(n_clients: int, f: int, rounding: str = "paper") -> tuple[int, int]:
    """(number of clusters L, number of groups) for K clients and f(r) = ``f`` requested groups."""
    K = int(n_clients)
    if K < 1:
        raise ValueError("no clients to group")
    f = max(1, min(int(f), K))
    if rounding == "paper":
        L = max(1, K // f)
        return L, K // L
    if rounding == "exact":
        return -(-K // f), f
    raise ValueError(f"rounding must be 'paper' or 'exact', got {rounding!r}")


def balanced_assignment(cost: np.ndarray) -> np.ndarray:
    """Optimal assignment of K points to L clusters with sizes floor(K/L) or ceil(K/L): the
    assignment step of ICG (Eqs. 10-13) as a min-cost flow. ``cost`` is (K, L), non-negative.
    Returns the cluster of every point."""
    from ortools.graph.python import min_cost_flow

    cost = np.asarray(cost, dtype=np.float64)
    K, L = cost.shape
    if not 1 <= L <= K:
        raise ValueError(f"need 1 <= L <= K clusters, got L={L} for K={K} points")
    top = float(cost.max()) if cost.size else 0.0
    scale = COST_SCALE / top if top > 0 else 0.0
    tails, heads, caps, nodes, supplies = _network(K, L)
    costs = np.concatenate([np.rint(cost * scale).astype(np.int64).ravel(), np.zeros(L, np.int64)])
    flow = min_cost_flow.SimpleMinCostFlow()
    flow.add_arcs_with_capacity_and_unit_cost(tails, heads, caps, costs)
    flow.set_nodes_supplies(nodes, supplies)
    status = flow.solve()
    if status != flow.OPTIMAL:
        raise RuntimeError(f"min-cost flow failed with status {status}")
    return flow.flows(np.arange(K * L, dtype=np.int32)).reshape(K, L).argmax(1)


@functools.lru_cache(maxsize=8)
def _network(K: int, L: int):
    """Arcs (client k -> cluster l, capacity 1; cluster l -> overflow node, capacity 1 if L does
    not divide K) and supplies (clients +1, clusters -floor(K/L), overflow -(K mod L))."""
    lo, extra = divmod(K, L)
    tails = np.concatenate([np.repeat(np.arange(K, dtype=np.int32), L), np.arange(K, K + L, dtype=np.int32)])
    heads = np.concatenate([K + np.tile(np.arange(L, dtype=np.int32), K), np.full(L, K + L, np.int32)])
    caps = np.concatenate([np.ones(K * L, np.int64), np.full(L, 1 if extra else 0, np.int64)])
    supplies = np.concatenate([np.ones(K, np.int64), np.full(L, -lo, np.int64), [-extra]])
    for a in (tails, heads, caps, supplies):
        a.flags.writeable = False
    return tails, heads, caps, np.arange(K + L + 1, dtype=np.int32), supplies


def half_sq_distances(V: np.ndarray, C: np.ndarray) -> np.ndarray:
    """(K, L) matrix of 1/2 ||V^k - C_l||^2 (Eq. 10), by ||v||^2 + ||c||^2 - 2 v.c."""
    d = (V * V).sum(1)[:, None] + (C * C).sum(1)[None, :] - 2.0 * (V @ C.T)
    return 0.5 * np.maximum(d, 0.0)


@dataclass
class Clustering:
    labels: np.ndarray       # (K,) cluster of every client
    centres: np.ndarray      # (L, F)
    iterations: int          # assignment steps run
    converged: bool          # the assignment stopped changing before max_iter
    cost: float              # Eq. 10 at the final assignment


def constrained_kmeans(V: np.ndarray, L: int, rng: np.random.Generator, max_iter: int = 10,
                       early_stop: bool = True) -> Clustering:
    """Equal-size k-means of the rows of ``V`` into ``L`` clusters (Algorithm 2, lines 4-7); stops
    when the assignment repeats (``early_stop``) or after ``max_iter`` assignment steps."""
    from sklearn.cluster import kmeans_plusplus

    V = np.asarray(V, dtype=np.float64)
    K = len(V)
    centres, _ = kmeans_plusplus(V, L, random_state=int(rng.integers(2**31 - 1)))
    labels = None
    it, converged = 0, False
    while it < max_iter:
        new = balanced_assignment(half_sq_distances(V, centres))               # Eq. 10 terms
        it += 1
        if early_stop and labels is not None and np.array_equal(new, labels):
            converged = True
            break
        labels = new
        counts = np.bincount(labels, minlength=L)[:, None]
        centres = np.zeros_like(centres)
        np.add.at(centres, labels, V)
        centres /= counts                                                      # Alg. 2, line 6
    d = half_sq_distances(V, centres)[np.arange(K), labels].sum()
    return Clustering(labels, centres, it, converged, float(d))


def deal(clusters: np.ndarray, n_groups: int, rng: np.random.Generator) -> np.ndarray:
    """Group of every client: each cluster (random order) deals its shuffled members to the currently
    smallest groups (random ties), at most one member per group per pass (Alg. 2, line 8)."""
    clusters = np.asarray(clusters)
    group = np.empty(len(clusters), dtype=np.int64)
    sizes = np.zeros(n_groups, dtype=np.int64)
    for c in rng.permutation(np.unique(clusters)):
        members = rng.permutation(np.flatnonzero(clusters == c))
        for i in range(0, len(members), n_groups):
            chunk = members[i:i + n_groups]
            order = np.lexsort((rng.random(n_groups), sizes))           # smallest first, random ties
            group[chunk] = order[:len(chunk)]
            sizes[order[:len(chunk)]] += 1
    return group


def icg_groups(V: np.ndarray, f: int, rng: np.random.Generator, *, max_iter: int = 10,
               rounding: str = "paper", early_stop: bool = True) -> tuple[np.ndarray, Clustering]:
    """ICG (Algorithm 2): the group of every client (rows of the class-count matrix ``V``) for f(r)
    requested groups, and the constrained clustering it came from."""
    L, n_groups = layout(len(V), f, rounding)
    clustering = constrained_kmeans(V, L, rng, max_iter, early_stop)
    return deal(clustering.labels, n_groups, rng), clustering


def random_groups(n_clients: int, f: int, rng: np.random.Generator, rounding: str = "paper") -> np.ndarray:
    """NaiveGSP's grouping: a random partition into as many groups as ICG would make, sizes differing
    by at most one."""
    _, n_groups = layout(n_clients, f, rounding)
    group = np.empty(n_clients, dtype=np.int64)
    group[rng.permutation(n_clients)] = np.arange(n_clients) % n_groups
    return group


# ------------------------------------------------------------------------------------------ CPD
# The class probability distance of FedGSP (Zeng et al., DASFAA 2022, §4.1, Eq. 14): the squared MMD
# with a Gaussian RBF kernel between two normalised class distributions (the closed form and its
# use as a metric: :mod:`mcfl.fedgsp.metrics`).
def class_counts(labels: np.ndarray, offsets: np.ndarray, n_classes: int) -> np.ndarray:
    """(K, F) class-count matrix V^T from flat labels and per-client offsets."""
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    V = np.zeros((len(offsets) - 1, n_classes), dtype=np.int64)
    np.add.at(V, (owner, np.asarray(labels, dtype=np.int64)), 1)
    return V


def _kernel(n_classes: int, sigma: float) -> np.ndarray:
    from sklearn.metrics.pairwise import rbf_kernel

    return rbf_kernel(np.eye(n_classes), gamma=1.0 / (2.0 * sigma ** 2))


def _normalise(V: np.ndarray) -> np.ndarray:
    V = np.asarray(V, dtype=np.float64)
    s = V.sum(-1, keepdims=True)
    if np.any(s <= 0):
        raise ValueError("a class distribution with no samples cannot be normalised")
    return V / s


def cpd(v1: np.ndarray, v2: np.ndarray, sigma: float = 1.0) -> float:
    """Eq. 14: squared MMD (Gaussian RBF kernel) between two class-count (or probability) vectors."""
    d = _normalise(v1) - _normalise(v2)
    return float(d @ _kernel(len(d), sigma) @ d)


def pairwise_cpd(V: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    """CPD of every pair i < j of the rows of ``V`` (group or client class counts), flattened."""
    P = _normalise(V)
    G = P @ _kernel(P.shape[1], sigma) @ P.T
    d = np.diag(G)
    i, j = np.triu_indices(len(P), k=1)
    return np.maximum(d[i] + d[j] - 2.0 * G[i, j], 0.0)


def group_counts(V: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Class counts of every group (Eq. 8): row m = sum of its members' rows of ``V``."""
    group = np.asarray(group)
    out = np.zeros((int(group.max()) + 1, V.shape[1]), dtype=np.float64)
    np.add.at(out, group, V)
    return out
