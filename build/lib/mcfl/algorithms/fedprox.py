"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020, arXiv:1812.06127; FeSEM §6.1 baseline 8).

FedAvg whose clients minimise the proximal local objective (FedProx Eq. 2)

    h_k(w; w^t) = F_k(w) + (mu/2)·||w - w^t||^2,

with w^t the global model the client started from, so each local SGD step uses the gradient
grad F_k(w) + mu·(w - w^t) (the engine's ``Task(anchor=w^t, mu=mu)``). The server averages as
FedAvg. mu = 0.1 as in FeSEM §6.1; mu = 0 is exactly FedAvg. (The FeSEM authors' FedProx fed the
proximal term through a placeholder, so it had no gradient and their FedProx was FedAvg: reference
notes §1.2.) Li et al.'s optional partial work and device dropping are not modelled: every sampled
client runs the same local epochs or steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mcfl.algorithms.fedavg import FedAvg
from mcfl.engine import Task


@dataclass
class Params:
    mu: float = 0.1

    def __post_init__(self):
        if self.mu < 0:
            raise ValueError(f"mu must be >= 0, got {self.mu}")


class FedProx(FedAvg):
    name = "FedProx"
    Params = Params

    def local_task(self, client: int, w: torch.Tensor) -> Task:
        return Task(client, w, anchor=w, mu=self.p.mu)
