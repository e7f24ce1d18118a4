"""Robust(TKM): clustering by trimmed K-means and coordinate-wise trimmed-mean aggregation (Ghosh,
Hong, Yin, Ramchandran, "Robust Federated Learning in a Heterogeneous Environment",
arXiv:1906.06629: their modular algorithm, one-shot clustering by TKM, then robust optimisation
within each cluster; FeSEM §6.1 baseline 6).

Ghosh et al.'s three steps are (1) local models, (2) trimmed K-means on them, (3) within each
cluster a Byzantine-robust distributed optimisation whose aggregate is the coordinate-wise
beta-trimmed mean. Run, as the FeSEM authors did, inside FeSEM's round structure: each round

1. every sampled client trains from its cluster's model (plain local SGD);
2. TKM re-clusters the new local models: ``lloyd_iters`` Lloyd passes warm-started at the current
   cluster models, each assigning every model to its nearest centre (squared L2 over ``distance``'s
   coordinates) and re-estimating every centre as the ``centre_trim``-trimmed mean of its members;
3. each cluster's model becomes the coordinate-wise ``trim``-trimmed mean of its members' local
   models (a cluster nobody joined keeps its model).

A trim of 0.5 is the coordinate-wise median. The FeSEM authors' code used median centres
(``centre_trim: 0.5``), ``trim: 0.2``, last-layer features (``distance: last_layer``), 8 Lloyd
iterations the first time and 1 after; its aggregation read every client's weights from one shared
model object, so each "trimmed mean" was the last client's weights (docs/methods/original-code.md). Here
both trims default to 0.2, the one beta of Ghosh et al.'s estimator. Initial clusters: FeSEM's
k-means initialisation on the clients' first local models (Ghosh et al.'s step 1). Memory: the
round's local models are held at once (clients per round x |W|), as a trimmed mean needs them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import trimmed_kmeans, trimmed_mean
from mcfl.algorithms.base import CentredAlgorithm, CentresState
from mcfl.engine import Task


@dataclass
class Params:
    K: int = 3
    trim: float = 0.2
    centre_trim: float = 0.2
    lloyd_iters: int = 1
    distance: str = "all"            # all | last_layer
    restarts: int = 20

    def __post_init__(self):
        for key in ("trim", "centre_trim"):
            if not 0 <= getattr(self, key) <= 0.5:
                raise ValueError(f"{key} must be in [0, 0.5], got {getattr(self, key)}")
        if self.lloyd_iters < 1:
            raise ValueError(f"lloyd_iters must be >= 1, got {self.lloyd_iters}")
        if self.distance not in ("all", "last_layer"):
            raise ValueError(f"distance must be 'all' or 'last_layer', got {self.distance!r}")


State = CentresState   # centres: the K cluster models


class Robust(CentredAlgorithm):
    name = "Robust"
    Params = Params

    def round(self, state: State, clients: np.ndarray, rnd: int):
        p, fed = self.p, self.fed
        tasks = (Task(int(c), state.centres[int(state.assign[c])]) for c in clients)
        ids, local, losses = [], [], []
        for task, res in fed.trainer.run(tasks, rnd):                           # step 1
            ids.append(task.client)
            local.append(res.weights)
            losses.append(res.loss)
        local = torch.stack(local)
        labels, centres = trimmed_kmeans(local, state.centres, p.centre_trim, p.lloyd_iters,
                                         fed.model.select(p.distance))           # step 2
        if p.trim != p.centre_trim:          # else TKM's last centres are step 3's trimmed means
            centres = state.centres.clone()
            for k in range(p.K):                                                # step 3
                if (labels == k).any():
                    centres[k] = trimmed_mean(local, p.trim, rows=labels == k)
        assign = state.assign.clone()
        assign[torch.tensor(ids)] = labels.cpu()
        return State(centres, assign), {"train_loss": float(np.mean(losses)),
                                        "moved": int((assign != state.assign).sum())}
