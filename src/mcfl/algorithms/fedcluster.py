"""FedCluster: Clustered Federated Learning (CFL; Sattler, Müller, Samek, "Clustered Federated
Learning: Model-Agnostic Distributed Multi-Task Optimization under Privacy Constraints", IEEE TNNLS
2020, arXiv:1910.01991: the CFL algorithm and its optimal bipartition; FeSEM §6.1 baseline 4).

Starts with one cluster holding every client. Each round, every sampled client i trains from its
cluster's model theta_c and sends its update dtheta_i = W_i - theta_c. For each cluster c with
sampled members:

* dtheta_c = sum_i n_i dtheta_i / sum_i n_i (``weighted: false``: the plain mean);
* if the cluster is near a stationary point of the joint objective while some clients are not,

      ||dtheta_c|| < eps1   and   max_i ||dtheta_i|| > eps2,

  (and the round is >= ``start_round`` and at least ``min_split_size`` members were sampled), it is
  split in two by the cosine similarities alpha_ij of the members' updates: the bipartition that
  minimises the largest cross-group similarity (Sattler et al.'s optimal bipartition = single
  linkage, or ``complete`` linkage as in their code and FL-bench);
* every resulting cluster c' moves by its members' mean update: theta_c' = theta_c + dtheta_c'.

Splitting is recursive: a child can split again in a later round. Defaults are FL-bench's (eps1 0.4,
eps2 1.6, clusters of more than 2 members, from round 20); the norms depend on model, learning
rate and local work, so they are per-dataset settings. Norms and similarities use the parameters,
not the BatchNorm statistics. Sattler et al. assume every member of a cluster takes part in each
round; with client sampling, members of a splitting cluster that were not sampled join the child
whose model has the lower loss on their training data (our addition). The FeSEM authors' own
FedCluster split on the last layer only with another stopping rule and crashed when it recursed
(docs/methods/original-code.md).

CFL as in its paper (Sattler et al.; under the name ``CFL``): the defaults already take the
paper's optimal bipartition (``linkage: single``) and sample-weighted mean update (``weighted:
true``); ``start_round: 1, min_split_size: 2`` drop the two conditions that come from the authors'
code and FL-bench, so a cluster splits exactly when ||dtheta_c|| < eps1 and max_i ||dtheta_i|| >
eps2. Sattler et al.'s further check of the split's quality (the largest cross-cluster similarity
against the gradient-norm ratio) is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import WeightedSum, bipartition, cosine_similarities
from mcfl.algorithms.base import Algorithm, per_cluster
from mcfl.engine import Task


@dataclass
class Params:
    eps1: float = 0.4
    eps2: float = 1.6
    start_round: int = 20
    min_split_size: int = 3
    linkage: str = "single"          # single (optimal bipartition) | complete (Sattler et al.'s code)
    weighted: bool = True

    def __post_init__(self):
        if self.linkage not in ("single", "complete"):
            raise ValueError(f"linkage must be 'single' or 'complete', got {self.linkage!r}")
        if self.min_split_size < 2:
            raise ValueError(f"min_split_size must be >= 2, got {self.min_split_size}")


@dataclass
class State:
    models: torch.Tensor    # (C, |W|): one model per cluster; C grows as clusters split
    assign: torch.Tensor    # (m,) int64


class FedCluster(Algorithm):
    name = "FedCluster"
    Params = Params
    State = State
    clustered = True

    def init(self) -> State:
        return State(self.fed.w0.clone()[None], torch.zeros(self.fed.n_clients, dtype=torch.long))

    def round(self, state: State, clients: np.ndarray, rnd: int):
        p, fed, P = self.p, self.fed, self.fed.model.n_params
        tasks = (Task(int(c), state.models[int(state.assign[c])]) for c in clients)
        ids, n, losses = [], [], []
        updates = torch.empty(len(clients), fed.model.size, device=fed.device)
        for i, (task, res) in enumerate(fed.trainer.run(tasks, rnd)):
            ids.append(task.client)
            torch.sub(res.weights, task.start, out=updates[i])
            n.append(float(res.n_samples) if p.weighted else 1.0)
            losses.append(res.loss)
        ids, n = np.array(ids), np.array(n)
        norms = updates[:, :P].norm(dim=1)
        models, assign = list(state.models), state.assign.clone()
        splits, mean_norms = 0, []
        for c in range(len(models)):
            rows = np.flatnonzero(state.assign[ids].numpy() == c)
            if not len(rows):
                continue
            base = state.models[c]
            mean_norm = float(_mean(updates, rows, n)[:P].norm())
            mean_norms.append(mean_norm)
            if (rnd >= p.start_round and len(rows) >= p.min_split_size and mean_norm < p.eps1
                    and float(norms[rows].max()) > p.eps2):
                side = bipartition(cosine_similarities(updates[rows, :P]).cpu().numpy(), p.linkage)
                new = len(models)
                models[c] = base + _mean(updates, rows[side == 0], n)
                models.append(base + _mean(updates, rows[side == 1], n))
                assign[torch.from_numpy(ids[rows[side == 1]])] = new
                self._place_absent(assign, c, new, set(ids[rows].tolist()), models)
                splits += 1
            else:
                models[c] = base + _mean(updates, rows, n)
        return State(torch.stack(models), assign), {
            "train_loss": float(np.mean(losses)), "clusters": len(models), "splits": splits,
            "mean_update_norm": max(mean_norms), "max_update_norm": float(norms.max())}

    def _place_absent(self, assign, c, new, sampled, models) -> None:
        """Members of split cluster c not sampled this round join the child with the lower loss."""
        for i in np.flatnonzero(assign.numpy() == c):
            if int(i) in sampled:
                continue
            rows = self.fed.dev.client_rows(int(i))
            loss = [float(self.fed.trainer.predict(models[k], rows, split="train")[1].mean())
                    for k in (c, new)]
            if loss[1] < loss[0]:
                assign[int(i)] = new

    def eval_models(self, state: State):
        return per_cluster(state.models, state.assign)

    def assignments(self, state: State) -> np.ndarray:
        return state.assign.numpy().copy()


def _mean(x: torch.Tensor, rows: np.ndarray, w: np.ndarray) -> torch.Tensor:
    """The ``w``-weighted mean of the rows ``rows`` of ``x`` (no copy of the selected rows)."""
    acc = WeightedSum(1, x.shape[1], x.device)
    for r in rows:
        acc.add(0, x[r], w[r])
    return acc.mean(0)
