"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, arXiv:1602.05629).

Each round the sampled clients run local SGD from the global model and the server replaces it by
their average weighted by training-set size: ``w <- sum_i n_i w_i / sum_i n_i`` (FeSEM Eq. 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mcfl.aggregate import WeightedSum
from mcfl.algorithms.base import Algorithm
from mcfl.engine import Task


@dataclass
class State:
    w: torch.Tensor


class FedAvg(Algorithm):
    name = "FedAvg"
    State = State

    def init(self) -> State:
        return State(self.fed.w0.clone())

    # Hooks for the methods that differ from FedAvg in one place only (FedProx, FedDist, FedDWS).
    def local_task(self, client: int, w: torch.Tensor) -> Task:
        """The local update client ``client`` runs from the global model ``w``."""
        return Task(client, w)

    def local_tasks(self, clients: np.ndarray, w: torch.Tensor):
        """The round's local updates (default: ``local_task`` per client)."""
        return (self.local_task(int(c), w) for c in clients)

    def weight(self, res) -> float:
        """The weight of a local model in the server average (its training-set size)."""
        return res.n_samples

    def server_step(self, w: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """The new global model from the old one and the average of the local models."""
        return mean

    def round(self, state: State, clients: np.ndarray, rnd: int):
        acc = WeightedSum(1, state.w.numel(), state.w.device)
        losses = []
        for task, res in self.fed.trainer.run(self.local_tasks(clients, state.w), rnd):
            acc.add(0, res.weights, self.weight(res))
            losses.append(res.loss)
        return State(self.server_step(state.w, acc.mean(0))), {"train_loss": float(np.mean(losses))}

    def eval_models(self, state: State):
        yield state.w, np.arange(self.fed.n_clients)
