"""FedSGD (McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017, arXiv:1602.05629, §2 "FederatedSGD"; FeSEM §6.1
baseline 2).

One gradient step per round: every sampled client k computes g_k = grad F_k(w_t), the gradient of
its mean training loss at the global model, and the server steps

    w_{t+1} = w_t - eta · sum_k n_k g_k / sum_k n_k            (eta = the dataset's ``lr``).

It is run as one local SGD step on one batch holding the client's whole training set (or, with
``fraction < 1``, a uniformly drawn max(1, floor(fraction·n_k)) of its samples without replacement:
LEAF's ``--minibatch`` SGD), followed by the sample-weighted average of the resulting models.
Averaging w_t - eta·g_k over k is the step above exactly; doing it through the engine also carries
BatchNorm running statistics, which a bare gradient would leave at their initial values. With full
participation and ``fraction = 1`` a round is one full-batch gradient step on the union of all
clients' data. (The FeSEM authors' FedSGD stepped on each client's first two samples only:
docs/methods/original-code.md.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.fedavg import FedAvg, State
from mcfl.engine import Task


@dataclass
class Params:
    fraction: float = 1.0

    def __post_init__(self):
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")


class FedSGD(FedAvg):
    name = "FedSGD"
    Params = Params

    def round(self, state: State, clients: np.ndarray, rnd: int):
        fed = self.fed
        acc = WeightedSum(1, state.w.numel(), state.w.device)
        losses = []
        for c in clients:
            n = int(fed.n_train[c])
            spec = replace(fed.trainer.spec, batch_size=max(1, int(self.p.fraction * n)), steps=1)
            res = fed.trainer.train(Task(int(c), state.w), rnd, spec=spec)
            acc.add(0, res.weights, res.n_samples)
            losses.append(res.loss)
        return State(acc.mean(0)), {"train_loss": float(np.mean(losses))}
