"""PACFL: clustering clients once by the principal angles between their data subspaces (Vahidian
et al., "Efficient Distribution Similarity Identification in Clustered Federated Learning via
Principal Angles Between Client Data Subspaces", AAAI 2023).

One shot, before training (``init``):

1. Each client k, for every class c it holds, stacks its raw flattened training samples of that
   class as the columns of a d x n_c matrix, takes a truncated SVD and keeps the top ``p`` left
   singular vectors (fewer if n_c < p); their concatenation U_k (d x p·#classes) is all it sends.
   (Scaling the pixels does not change the singular vectors.)
2. The server's proximity matrix A (m x m, zero diagonal), in degrees: ``proximity: entrywise``
   (the default: the authors' code) is min over the entries of arccos(clip(U_i^T U_j, -1, 1)), the
   angle between the closest pair of the two clients' basis vectors (it depends on the singular
   vectors' arbitrary signs, as in that code); ``proximity: principal`` is the smallest principal
   angle between the two spans, arccos(sigma_max(Q_i^T Q_j)) with Q an orthonormal basis of U's
   columns (sign-free; the textbook angle between subspaces, but with many classes the spans fill
   much of pixel space and the angle goes to 0, as on 8 x 8 digits).
3. Hierarchical clustering of A (SciPy's ``linkage`` on the condensed matrix, cut with
   ``fcluster(criterion="distance")``): the closest pair of clusters is merged while its distance is
   at most ``beta`` degrees, so the number of clusters emerges. ``linkage``: ``average`` is the
   authors' (the merged cluster's row is the mean of the two rows: WPGMA, SciPy's ``weighted``),
   or ``complete`` / ``single`` (their ``maximum`` / ``minimum``).

Then the clusters are fixed and each runs FedAvg (sample-weighted) from the common initial model on
its sampled members (:func:`mcfl.algorithms.flhc.fedavg_within_clusters`). Defaults p = 5,
beta = 3.5 degrees, average linkage are the authors' code defaults; beta is dataset-specific
(beta -> infinity gives FedAvg; beta below every off-diagonal entry trains each client alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.algorithms.base import Algorithm, per_cluster
from mcfl.algorithms.flhc import fedavg_within_clusters

#: the authors' linkage names -> SciPy's methods
LINKAGES = {"average": "weighted", "complete": "complete", "single": "single"}


@dataclass
class Params:
    p: int = 5                       # left singular vectors kept per class
    beta: float = 3.5                # merge while the linkage distance is <= beta (degrees)
    linkage: str = "average"         # average (WPGMA, the authors') | complete | single
    proximity: str = "entrywise"     # entrywise (the authors' code) | principal

    def __post_init__(self):
        if self.p < 1:
            raise ValueError(f"p must be >= 1, got {self.p}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0 (degrees), got {self.beta}")
        if self.linkage not in LINKAGES:
            raise ValueError(f"linkage must be one of {', '.join(LINKAGES)}, got {self.linkage!r}")
        if self.proximity not in ("principal", "entrywise"):
            raise ValueError(f"proximity must be 'principal' or 'entrywise', got {self.proximity!r}")


@dataclass
class State:
    models: torch.Tensor    # (C, |W|): one model per cluster
    assign: torch.Tensor    # (m,) int64: each client's cluster, fixed by init


def client_subspace(x: torch.Tensor, y: torch.Tensor, p: int) -> torch.Tensor:
    """Step 1: U_k, the top ``p`` left singular vectors of each class's d x n_c sample matrix
    (``x``: n x d samples as rows, ``y``: their labels), concatenated as columns (float64)."""
    parts = []
    for c in torch.unique(y).tolist():
        cols = x[y == c].double().T                               # d x n_c
        u = torch.linalg.svd(cols, full_matrices=False).U
        parts.append(u[:, :p])
    return torch.cat(parts, 1) if parts else torch.zeros(x.shape[1], 0, dtype=torch.float64)


def proximity_matrix(subspaces: list[torch.Tensor], how: str = "entrywise") -> np.ndarray:
    """Step 2: A_ij in degrees between every pair of clients' subspaces (symmetric, zero diagonal)."""
    if how == "principal":
        subspaces = [torch.linalg.qr(u).Q for u in subspaces]
    m = len(subspaces)
    a = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            prod = subspaces[i].T @ subspaces[j]
            if prod.numel() == 0:
                cos = 0.0
            elif how == "principal":
                cos = float(torch.linalg.svdvals(prod).max())
            else:
                cos = float(prod.max())
            a[i, j] = a[j, i] = np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))
    return a


def cluster_proximity(a: np.ndarray, beta: float, linkage: str = "average") -> np.ndarray:
    """Step 3: labels 0..C-1 (in order of first appearance) of the hierarchical clustering of the
    proximity matrix ``a`` cut at distance ``beta``."""
    from scipy.cluster.hierarchy import fcluster, linkage as hc_linkage
    from scipy.spatial.distance import squareform

    if len(a) < 2:
        return np.zeros(len(a), dtype=np.int64)
    tree = hc_linkage(squareform(a, checks=False), method=LINKAGES[linkage])
    flat = fcluster(tree, t=beta, criterion="distance")
    _, labels = np.unique(flat, return_inverse=True)
    order = {old: new for new, old in enumerate(dict.fromkeys(labels.tolist()))}
    return np.array([order[v] for v in labels.tolist()], dtype=np.int64)


class PACFL(Algorithm):
    name = "PACFL"
    Params = Params
    State = State
    clustered = True

    def subspaces(self) -> list[torch.Tensor]:
        """Every client's U_k (step 1), from its training samples."""
        dev = self.fed.dev
        out = []
        for k in range(self.fed.n_clients):
            rows = dev.client_rows(k)
            x = dev.inputs(rows).reshape(len(rows), -1).cpu()
            out.append(client_subspace(x, dev.y["train"][rows].cpu(), self.p.p))
        return out

    def init(self) -> State:
        a = proximity_matrix(self.subspaces(), self.p.proximity)
        labels = cluster_proximity(a, self.p.beta, self.p.linkage)
        w0 = self.fed.w0
        return State(w0.expand(int(labels.max()) + 1, -1).clone(), torch.from_numpy(labels))

    def round(self, state: State, clients: np.ndarray, rnd: int):
        models, losses = fedavg_within_clusters(self.fed, state.models, state.assign, clients, rnd)
        return State(models, state.assign), {"train_loss": float(np.mean(losses)), "clusters": len(models)}

    def eval_models(self, state: State):
        return per_cluster(state.models, state.assign)

    def assignments(self, state: State) -> np.ndarray:
        return state.assign.numpy().copy()
