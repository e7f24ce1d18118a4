"""FedAvgM: FedAvg with server momentum (Hsu, Qi, Brown, "Measuring the Effects of Non-Identical
Data Distribution for Federated Visual Classification", arXiv:1909.06335, 2019, Algorithm 1).

Each round the sampled clients run local SGD from the global model ``w``; the server averages their
models (weighted by training-set size), takes the pseudo-gradient ``d = w - mean``, keeps a
momentum ``v <- beta v + d`` and steps ``w <- w - server_lr v``. With ``beta = 0`` and
``server_lr = 1`` it is FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch
from annotated_types import Ge, Gt, Lt

from mcfl.algorithms.base import Algorithm, WeightedSum
from mcfl.engine import Task


@dataclass
class Params:
    beta: Annotated[float, Ge(0), Lt(1)] = 0.9      # server momentum
    server_lr: Annotated[float, Gt(0)] = 1.0        # server learning rate


@dataclass
class State:
    w: torch.Tensor         # the global model
    v: torch.Tensor         # the server's momentum


class FedAvgM(Algorithm):
    name = "FedAvgM"
    Params = Params
    State = State

    def init(self) -> State:
        return State(self.fed.w0.clone(), torch.zeros_like(self.fed.w0))

    def round(self, state: State, clients: np.ndarray, rnd: int):
        mean = WeightedSum(1, state.w.numel(), state.w.device)
        losses = []
        for _, res in self.fed.trainer.run((Task(int(c), state.w) for c in clients), rnd):
            mean.add(0, res.weights, res.n_samples)       # folded in the order of `clients`
            losses.append(res.loss)
        v = self.p.beta * state.v + (state.w - mean.mean(0))
        return State(state.w - self.p.server_lr * v, v), {"train_loss": float(np.mean(losses))}

    def eval_models(self, state: State):
        yield state.w, np.arange(self.fed.n_clients)    # every client tested with the global model
