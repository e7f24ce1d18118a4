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

IFCA as in its paper (Ghosh et al.; under the name ``IFCA``, two switches give the original):

* ``init_models: independent``: the K models are initialised independently at random (the model's
  own initialisers, seeded by (seed, model, k); hypothesis 0 is the run's common initial model), as
  IFCA's Algorithm 1 and its code do, instead of the k-means initialisation (no centre file is
  then needed). IFCA's random restarts (re-drawing until every model wins enough clients) are not
  modelled.
* ``averaging: gradient``: IFCA's gradient averaging (Algorithm 1, option I): each sampled client
  sends the full-batch gradient of its training loss at its chosen model, and
  theta_j <- theta_j - (lr / m) sum_{i chose j} grad F_i(theta_j), m the number of sampled clients
  (one step per round; the run's ``lr``). ``averaging: model`` (the default) is option II, the
  local SGD and model averaging above.

With K = 1 and model averaging IFCA is FedAvg; with gradient averaging, one full-batch step on the
mean gradient (FedSGD's, unweighted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.base import CentredAlgorithm, CentresState
from mcfl.engine import Task
from mcfl.models import init_weights
from mcfl.streams import MODEL, derive_seed


@dataclass
class Params:
    K: int = 3
    weighted: bool = True
    restarts: int = 20
    init_models: str = "kmeans"      # kmeans | independent (IFCA's random initialisation)
    averaging: str = "model"         # model | gradient (IFCA's option I)

    def __post_init__(self):
        if self.init_models not in ("kmeans", "independent"):
            raise ValueError(f"init_models must be 'kmeans' or 'independent', got {self.init_models!r}")
        if self.averaging not in ("model", "gradient"):
            raise ValueError(f"averaging must be 'model' or 'gradient', got {self.averaging!r}")


State = CentresState   # centres: the K hypotheses; assign: the one each client last picked


class HypoCluster(CentredAlgorithm):
    name = "HypoCluster"
    Params = Params

    @classmethod
    def uses_centres(cls, params: dict) -> bool:
        return params.get("init_models", "kmeans") == "kmeans"

    def init(self) -> State:
        if self.p.init_models == "kmeans":
            return super().init()
        models = independent_models(self.fed, self.p.K)
        return State(models, torch.zeros(self.fed.n_clients, dtype=torch.long))

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
        if self.p.averaging == "gradient":
            return self._gradient_step(state, assign, clients)
        tasks = (Task(int(c), state.centres[int(assign[c])]) for c in clients)
        acc = WeightedSum(K, fed.model.size, fed.device)
        losses = []
        for task, res in fed.trainer.run(tasks, rnd):
            acc.add(int(assign[task.client]), res.weights, res.n_samples if self.p.weighted else 1.0)
            losses.append(res.loss)
        models = torch.stack([acc.mean(k) if acc.has(k) else state.centres[k] for k in range(K)])
        return State(models, assign), {"train_loss": float(np.mean(losses)),
                                       "moved": int((assign != state.assign).sum())}

    def _gradient_step(self, state: State, assign: torch.Tensor, clients: np.ndarray):
        """IFCA option I: theta_j <- theta_j - (lr/m) sum_{i chose j} grad F_i(theta_j)."""
        fed, lr = self.fed, float(self.fed.trainer.spec.lr)
        P = fed.model.n_params
        models, losses = state.centres.clone(), []
        grads = torch.zeros(self.p.K, P, device=fed.device)
        for c in clients:
            k = int(assign[c])
            g, loss = fed.trainer.gradient(state.centres[k], int(c))
            grads[k] += g
            losses.append(loss)
        models[:, :P] -= (lr / max(len(clients), 1)) * grads
        return State(models, assign), {"train_loss": float(np.mean(losses)),
                                       "moved": int((assign != state.assign).sum())}


def independent_models(fed, K: int) -> torch.Tensor:
    """K models initialised independently: model k by the model's initialisers seeded from
    (seed, MODEL, k), model 0 the run's initial weights ``fed.w0``."""
    out = [fed.w0.clone()]
    for k in range(1, K):            # re-initialised in place in the flat vector (every task loads its start)
        init_weights(fed.model.module, derive_seed(fed.seed, MODEL, k))
        out.append(fed.model.get())
    fed.model.load(fed.w0)
    return torch.stack(out)
