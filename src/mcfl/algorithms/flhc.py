"""FL+HC: federated learning with hierarchical clustering of local updates (Briggs, Fan, Andras,
"Federated learning with hierarchical clustering of local updates to improve training on non-IID
data", IJCNN 2020).

1. FedAvg for ``rounds_before`` = n rounds: one global model w.
2. In round n + 1 every client (sampled or not, so that each has an update to cluster) trains from
   the global model and sends its update Delta_i = w_i - w.
3. Agglomerative hierarchical clustering of the updates (scikit-learn's
   ``AgglomerativeClustering``; ``metric`` euclidean, manhattan or cosine and ``linkage`` ward,
   complete, average or single: the pairs the paper sweeps, default euclidean + ward): the tree is
   cut at distance ``threshold`` (the paper's P, so the number of clusters emerges) or, with
   ``threshold: 0``, into ``K`` clusters.
4. Each cluster's model starts as w plus the sample-weighted mean update of its members sampled in
   round n + 1 (that round's FedAvg step within the cluster); from round n + 2 on, FedAvg runs
   independently in each cluster on the sampled members (:func:`fedavg_within_clusters`). The
   clusters are never revised.

Memory: the m updates are clustered on a CountSketch random projection (the one the k-means
initialisation uses, :mod:`mcfl.cluster.init`) when the exact m x |W| matrix would exceed 256 MiB,
so squared L2 distances are kept to about sqrt(2/k) relative error; the cluster models are formed
from the exact updates of the sampled clients (only theirs are kept). Until the clustering round
every client is tested with the global model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.base import Algorithm, per_cluster
from mcfl.cluster.init import CountSketch, projection_dim
from mcfl.engine import Task
from mcfl.streams import SKETCH, derive_seed

METRICS = ("euclidean", "manhattan", "cosine")
LINKAGES = ("ward", "complete", "average", "single")


@dataclass
class Params:
    rounds_before: int = 10          # n: FedAvg rounds before the clustering round
    K: int = 2                       # clusters, when the tree is not cut by distance
    threshold: float = 0.0           # P > 0: cut the tree at this distance (K is then not used)
    metric: str = "euclidean"
    linkage: str = "ward"

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if self.linkage not in LINKAGES:
            raise ValueError(f"linkage must be one of {', '.join(LINKAGES)}, got {self.linkage!r}")
        if self.linkage == "ward" and self.metric != "euclidean":
            raise ValueError(f"linkage 'ward' needs metric 'euclidean', got {self.metric!r}")
        if self.rounds_before < 0:
            raise ValueError(f"rounds_before must be >= 0, got {self.rounds_before}")
        if self.K < 1:
            raise ValueError(f"K must be >= 1, got {self.K}")
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0 (0: cut into K clusters), got {self.threshold}")


@dataclass
class State:
    models: torch.Tensor    # (C, |W|): the global model (C = 1) until clustering, then one per cluster
    assign: torch.Tensor    # (m,) int64: each client's cluster (all 0 until clustering)


def fedavg_within_clusters(fed, models: torch.Tensor, assign: torch.Tensor, clients: np.ndarray,
                           rnd: int) -> tuple[torch.Tensor, list[float]]:
    """One FedAvg round in every cluster at once: each sampled client trains from its cluster's
    model; each cluster's model becomes its sampled members' sample-weighted mean (unchanged if
    none was sampled). Returns the new models and the clients' local losses."""
    tasks = (Task(int(c), models[int(assign[c])]) for c in clients)
    acc = WeightedSum(len(models), fed.model.size, fed.device)
    losses = []
    for task, res in fed.trainer.run(tasks, rnd):
        acc.add(int(assign[task.client]), res.weights, res.n_samples)
        losses.append(res.loss)
    return torch.stack([acc.mean(k) if acc.has(k) else models[k] for k in range(len(models))]), losses


def cluster_updates(features: np.ndarray, p: Params) -> np.ndarray:
    """Step 3: agglomerative clustering of the rows of ``features`` (one update per client), cut at
    ``p.threshold`` or into ``p.K`` clusters; labels 0..C-1."""
    from sklearn.cluster import AgglomerativeClustering

    if len(features) < 2:
        return np.zeros(len(features), dtype=np.int64)
    cut = ({"n_clusters": None, "distance_threshold": p.threshold} if p.threshold > 0
           else {"n_clusters": min(p.K, len(features))})
    hc = AgglomerativeClustering(metric=p.metric, linkage=p.linkage, **cut)
    return hc.fit_predict(features).astype(np.int64)


class FLHC(Algorithm):
    name = "FL+HC"
    Params = Params
    State = State
    clustered = True

    def init(self) -> State:
        return State(self.fed.w0.clone()[None], torch.zeros(self.fed.n_clients, dtype=torch.long))

    def round(self, state: State, clients: np.ndarray, rnd: int):
        if rnd == self.p.rounds_before + 1:
            return self._cluster(state.models[0], clients, rnd)
        models, losses = fedavg_within_clusters(self.fed, state.models, state.assign, clients, rnd)
        return State(models, state.assign), {"train_loss": float(np.mean(losses)), "clusters": len(models)}

    def _cluster(self, w: torch.Tensor, clients: np.ndarray, rnd: int):
        """Steps 2-4: every client's update from the global model ``w``, clustered; each cluster's
        model is ``w`` + the sample-weighted mean update of its members sampled this round (the
        round's FedAvg step within the cluster; ``w`` if none was)."""
        fed, P = self.fed, self.fed.model.n_params
        k = projection_dim(fed.n_clients, P, None)
        sketch = CountSketch(P, k, derive_seed(fed.seed, SKETCH), fed.device) if k else None
        sampled = {int(c): None for c in clients}
        features, losses = [], []
        for task, res in fed.trainer.run((Task(c, w) for c in range(fed.n_clients)), rnd):
            delta = res.weights - w
            features.append((sketch(delta[:P]) if sketch else delta[:P]).double().cpu().numpy())
            if task.client in sampled:
                sampled[task.client] = (delta, res.n_samples)
                losses.append(res.loss)
        labels = cluster_updates(np.stack(features), self.p)
        acc = WeightedSum(int(labels.max()) + 1, fed.model.size, fed.device)
        for c, (delta, n) in sampled.items():
            acc.add(int(labels[c]), delta, n)
        models = torch.stack([w + acc.mean(j) if acc.has(j) else w.clone() for j in range(len(acc.weight))])
        return State(models, torch.from_numpy(labels)), {
            "train_loss": float(np.mean(losses)), "clusters": len(models)}

    def eval_models(self, state: State):
        return per_cluster(state.models, state.assign)

    def assignments(self, state: State) -> np.ndarray:
        return state.assign.numpy().copy()
