"""HypoCluster(K): hypothesis-based clustering (Mansour, Mohri, Ro, Suresh, "Three Approaches for
Personalization with Applications to Federated Learning", arXiv:2002.10619, algorithm HypCluster; the same
iteration as IFCA: Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, arXiv:2006.04088, Algorithm 1 with model averaging; FeSEM §6.1 baseline 5).

The server keeps K models h_1..h_K. Each round every sampled client i

1. receives all K models and picks the hypothesis with the lowest loss on its own training data,
   k(i) = argmin_k (1/n_i) sum_{(x,y) in D_i} l(h_k(x), y)   (ties: lowest k);
2. runs local SGD from h_k(i);

and the server replaces each h_k by the average of the local models of the clients that picked it
(weighted by their training-set size, as FedAvg within a hypothesis, or plainly with
``weighted: false``); a hypothesis no sampled client picked keeps its weights. A client is tested
with the model it last picked. Initial hypotheses: the k-means centre initialisation shared with
FeSEM (FedJAX's ``hyp_cluster.kmeans_init`` idea; IFCA's random initialisation needs restarts to
succeed), so HypoCluster and FeSEM differ only in how clients choose a cluster: by loss here, by
weight distance in FeSEM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.base import CentredAlgorithm, CentresState
from mcfl.engine import Task


@dataclass
class Params:
    K: int = 3
    weighted: bool = True
    restarts: int = 20


State = CentresState   # centres: the K hypotheses; assign: the one each client last picked


class HypoCluster(CentredAlgorithm):
    name = "HypoCluster"
    Params = Params

    def choose(self, models: torch.Tensor, clients) -> torch.Tensor:
        """Step 1 for each of ``clients``: the hypothesis with the lowest mean loss on the client's
        training data. Each hypothesis predicts all the clients' rows at once (one pass per
        hypothesis, not one per client and hypothesis); each client's mean is over its own rows."""
        rows = [self.fed.dev.client_rows(int(c)) for c in clients]
        if not rows:
            return torch.zeros(0, dtype=torch.long)
        sizes = [len(r) for r in rows]
        losses = torch.stack([
            torch.stack([part.mean() for part in
                         self.fed.trainer.predict(h, torch.cat(rows), split="train")[1].split(sizes)])
            for h in models])                                                  # (K, clients)
        return losses.argmin(0)

    def round(self, state: State, clients: np.ndarray, rnd: int):
        fed, K = self.fed, self.p.K
        assign = state.assign.clone()
        assign[torch.as_tensor(clients, dtype=torch.long)] = self.choose(state.centres, clients).to(assign)
        tasks = (Task(int(c), state.centres[int(assign[c])]) for c in clients)
        acc = WeightedSum(K, fed.model.size, fed.device)
        losses = []
        for task, res in fed.trainer.run(tasks, rnd):
            acc.add(int(assign[task.client]), res.weights, res.n_samples if self.p.weighted else 1.0)
            losses.append(res.loss)
        models = torch.stack([acc.mean(k) if acc.has(k) else state.centres[k] for k in range(K)])
        return State(models, assign), {"train_loss": float(np.mean(losses)),
                                       "moved": int((assign != state.assign).sum())}
